// The YCSB core generators, following the reference driver (site.ycsb.generator.*) exactly.
//
// Thread-safety: Rng and the key/number generators are per thread (each kvbench thread owns its
// own). CounterGenerator and AcknowledgedCounterGenerator are shared by all threads and
// thread-safe. YCSB shares its generators and draws from ThreadLocalRandom; giving every thread
// its own generator with its own random stream draws from the same distributions.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "common/util/mutex.h"
#include "common/util/thread_annotations.h"

namespace rdkv::kvbench {

// xoshiro256** seeded through splitmix64: fast, 2^256 period, good enough for benchmarks.
class Rng {
 public:
  explicit Rng(uint64_t seed);
  uint64_t NextU64();
  // Java's Random.nextLong(): any 64-bit value, as a signed number.
  int64_t NextLong() { return static_cast<int64_t>(NextU64()); }
  // Uniform in [0, 1) with 53 random bits, like Java's nextDouble().
  double NextDouble() { return static_cast<double>(NextU64() >> 11) * 0x1.0p-53; }

 private:
  uint64_t s_[4];
};

// A seed that differs per call and per process (for the per-thread generators).
uint64_t FreshSeed();

// Java's Math.abs(long): the absolute value, except that Long.MIN_VALUE stays negative.
inline int64_t JavaAbs(int64_t v) {
  return v < 0 ? static_cast<int64_t>(0 - static_cast<uint64_t>(v)) : v;
}
// Java's % on longs (C++ has the same truncating semantics; kept as a named helper for clarity).
inline int64_t JavaMod(int64_t a, int64_t b) { return a % b; }

// YCSB Utils.fnvhash64: FNV-1a over the 8 bytes of val, least significant first, with offset basis
// 0xCBF29CE484222325 and prime 1099511628211; the result is Math.abs of the signed hash.
int64_t FnvHash64(int64_t val);

// zeta(n, theta) = sum_{i=1..n} 1/i^theta, summed term by term like YCSB.
double Zeta(uint64_t n, double theta);
// YCSB's incremental form: initial + sum_{i=st+1..n} 1/i^theta (i.e. items st..n-1 added).
double ZetaIncrement(uint64_t st, uint64_t n, double theta, double initial);
// zeta(n, theta) for very large n (YCSB's 10^10 items) by an Euler-Maclaurin tail; exact sums up
// to 10^4 terms, error well below 1e-12 relative.
double ZetaLarge(uint64_t n, double theta);

// Common shape: NextValue draws; LastValue is the previous draw.
class NumberGenerator {
 public:
  virtual ~NumberGenerator() = default;
  virtual int64_t NextValue(Rng& rng) = 0;
  int64_t LastValue() const { return last_; }

 protected:
  int64_t last_ = 0;
};

// UniformLongGenerator: lb + Math.abs(nextLong()) % (ub - lb + 1).
class UniformGenerator final : public NumberGenerator {
 public:
  UniformGenerator(int64_t lb, int64_t ub);
  int64_t NextValue(Rng& rng) override;

 private:
  int64_t lb_, interval_;
};

// ZipfianGenerator (Gray et al., "Quickly Generating Billion-Record Synthetic Databases",
// SIGMOD'94): items min..max, popularity of rank i (0-based) proportional to 1/(i+1)^theta.
//   zetan = zeta(n, theta); alpha = 1/(1-theta);
//   eta = (1 - (2/n)^(1-theta)) / (1 - zeta(2,theta)/zetan)
//   u uniform in [0,1): u*zetan < 1 -> min; < 1 + 0.5^theta -> min+1;
//   else min + (long)(n * (eta*u - eta + 1)^alpha).
// NextLong(itemcount) lets the item count grow: zetan is extended incrementally from the count it
// was last computed for (as YCSB does). YCSB then recomputes eta with its original item count;
// here eta uses the current count, which is the formula above (the difference is confined to
// "latest" over a growing key space and is small).
class ZipfianGenerator final : public NumberGenerator {
 public:
  static constexpr double kZipfianConstant = 0.99;
  // Items min..max; zetan computed here (O(max - min) work).
  ZipfianGenerator(int64_t min, int64_t max, double theta = kZipfianConstant);
  // Items min..max with zetan supplied (precomputed, or from ZetaLarge).
  ZipfianGenerator(int64_t min, int64_t max, double theta, double zetan);

  int64_t NextValue(Rng& rng) override { return NextLong(rng, items_); }
  int64_t NextLong(Rng& rng, int64_t itemcount);

  double zetan() const { return zetan_; }
  double eta() const { return eta_; }
  double theta() const { return theta_; }
  int64_t items() const { return items_; }

 private:
  void SetEta(int64_t n);

  int64_t items_, base_;
  double theta_, zeta2theta_, alpha_, zetan_, eta_;
  int64_t countforzeta_;
};

// ScrambledZipfianGenerator: a zipfian over 10^10 items (constant 0.99: precomputed zetan
// 26.46902820178302; another constant: zeta computed for 10^10 items), then
// min + fnvhash64(v) % itemcount, so the popular items are spread over the key space.
class ScrambledZipfianGenerator final : public NumberGenerator {
 public:
  static constexpr double kZetan = 26.46902820178302;
  static constexpr int64_t kItemCount = 10000000000LL;
  ScrambledZipfianGenerator(int64_t min, int64_t max,
                            double theta = ZipfianGenerator::kZipfianConstant);
  int64_t NextValue(Rng& rng) override;
  int64_t itemcount() const { return itemcount_; }

 private:
  int64_t min_, itemcount_;
  ZipfianGenerator gen_;
};

// HotspotIntegerGenerator: a hotOpnFraction share of draws go uniformly to the first
// hotsetFraction of lb..ub, the rest uniformly to the remainder.
class HotspotGenerator final : public NumberGenerator {
 public:
  HotspotGenerator(int64_t lb, int64_t ub, double hotset_fraction, double hotopn_fraction);
  int64_t NextValue(Rng& rng) override;
  int64_t hot_interval() const { return hot_interval_; }

 private:
  int64_t lb_, hot_interval_, cold_interval_;
  double hotopn_fraction_;
};

// CounterGenerator: start, start+1, ... across all threads.
class CounterGenerator {
 public:
  explicit CounterGenerator(int64_t start) : next_(start) {}
  int64_t NextValue() { return next_.fetch_add(1, std::memory_order_relaxed); }
  int64_t LastValue() const { return next_.load(std::memory_order_relaxed) - 1; }

 private:
  std::atomic<int64_t> next_;
};

// AcknowledgedCounterGenerator: hands out start, start+1, ... and LastValue() is the largest
// value v such that every value <= v has been acknowledged (its insert finished). Readers of
// "latest" keys therefore only ever pick keys whose insert completed. Values may be acknowledged
// out of order; a window of kWindow values may be outstanding (YCSB: 2^20).
class AcknowledgedCounterGenerator {
 public:
  static constexpr int64_t kWindow = 1 << 20;
  explicit AcknowledgedCounterGenerator(int64_t start);
  int64_t NextValue() { return counter_.NextValue(); }
  int64_t LastValue() const { return limit_.load(std::memory_order_acquire); }
  // Marks value done. Returns false (and acknowledges nothing) when value is more than kWindow
  // ahead of LastValue() (YCSB throws there: too many outstanding inserts).
  bool Acknowledge(int64_t value) EXCLUDES(mu_);

 private:
  CounterGenerator counter_;
  rdkv::Mutex mu_;
  std::vector<bool> window_ GUARDED_BY(mu_);
  std::atomic<int64_t> limit_;
};

// SkewedLatestGenerator: max - zipfian.NextLong(max) with max = basis.LastValue(), so recently
// acknowledged inserts are the most popular. The zipfian starts with basis.LastValue() items.
class SkewedLatestGenerator final : public NumberGenerator {
 public:
  // zetan: zeta(basis.LastValue(), theta) precomputed once for all threads (< 0: compute here).
  SkewedLatestGenerator(const AcknowledgedCounterGenerator* basis, double theta, double zetan = -1);
  int64_t NextValue(Rng& rng) override;

 private:
  const AcknowledgedCounterGenerator* basis_;
  ZipfianGenerator zipfian_;
};

// DiscreteGenerator: picks one of the values with probability weight/sum(weights), in YCSB's
// way (one uniform draw walked through the weights in the order they were added).
class DiscreteGenerator {
 public:
  void Add(double weight, int value) { values_.push_back({weight, value}); }
  int Next(Rng& rng) const;
  bool empty() const { return values_.empty(); }

 private:
  struct Entry {
    double weight;
    int value;
  };
  std::vector<Entry> values_;
};

}  // namespace rdkv::kvbench

// A log-linear latency histogram (HdrHistogram-style) in nanoseconds.
//
// Values below 512 ns are counted exactly. Above, every power-of-two range [2^k, 2^(k+1)) is cut
// into 256 equal buckets, so a bucket is at most 1/256 (0.39 %) of its values wide, and the
// bucket midpoint a percentile reports is within 0.2 % of every value in it. Buckets reach
// 2^40 ns (18 minutes); larger values share the last bucket (min, max and mean stay exact).
// Percentiles use the nearest-rank definition: the smallest recorded value v such that at least
// p % of all values are <= v (reported as the midpoint of v's bucket, clamped to [min, max]).
//
// Thread-safety: none; one per thread, merged at the end.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace rdkv::kvbench {

class Histogram {
 public:
  static constexpr int kSubBucketBits = 8;
  static constexpr uint64_t kSubBuckets = 1u << kSubBucketBits;  // 256 per power of two
  static constexpr uint64_t kExactBelow = 2 * kSubBuckets;       // 512 ns
  static constexpr int kMaxBits = 40;                            // 2^40 ns ~ 18 min

  Histogram();

  void Record(uint64_t ns);
  void Merge(const Histogram& other);
  void Reset();

  uint64_t count() const { return count_; }
  uint64_t min() const { return count_ ? min_ : 0; }
  uint64_t max() const { return max_; }
  double mean() const { return count_ ? static_cast<double>(sum_ / count_) : 0.0; }
  // p in [0, 100]. 0 when empty.
  double Percentile(double p) const;

  // Bucket geometry (exposed for tests).
  static size_t BucketIndex(uint64_t ns);
  static uint64_t BucketLow(size_t index);
  static uint64_t BucketWidth(size_t index);
  static size_t NumBuckets();

 private:
  std::vector<uint64_t> counts_;
  uint64_t count_ = 0;
  uint64_t min_ = UINT64_MAX;
  uint64_t max_ = 0;
  long double sum_ = 0;
};

}  // namespace rdkv::kvbench

#include "bench/kvbench/generators.h"

#include <chrono>
#include <cmath>
#include <random>
#include <thread>

namespace rdkv::kvbench {

namespace {

uint64_t SplitMix64(uint64_t& x) {
  uint64_t z = (x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

inline uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

}  // namespace

Rng::Rng(uint64_t seed) {
  for (auto& s : s_) s = SplitMix64(seed);
}

uint64_t Rng::NextU64() {
  const uint64_t result = Rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = Rotl(s_[3], 45);
  return result;
}

uint64_t FreshSeed() {
  static std::atomic<uint64_t> calls{0};
  static const uint64_t process_seed = [] {
    std::random_device rd;
    return (uint64_t(rd()) << 32) ^ rd() ^
           uint64_t(std::chrono::steady_clock::now().time_since_epoch().count());
  }();
  uint64_t x = process_seed + calls.fetch_add(1) * 0x9E3779B97F4A7C15ull;
  return SplitMix64(x);
}

int64_t FnvHash64(int64_t val) {
  // Java: long arithmetic wraps; >> is arithmetic, but only the low 8 bits of each step are used,
  // so the 8 octets are exactly the little-endian bytes of val.
  uint64_t v = static_cast<uint64_t>(val);
  uint64_t hash = 0xCBF29CE484222325ull;
  for (int i = 0; i < 8; ++i) {
    const uint64_t octet = v & 0xff;
    v >>= 8;
    hash ^= octet;
    hash *= 1099511628211ull;
  }
  return JavaAbs(static_cast<int64_t>(hash));
}

double Zeta(uint64_t n, double theta) { return ZetaIncrement(0, n, theta, 0.0); }

double ZetaIncrement(uint64_t st, uint64_t n, double theta, double initial) {
  double sum = initial;
  for (uint64_t i = st; i < n; ++i) sum += 1.0 / std::pow(static_cast<double>(i + 1), theta);
  return sum;
}

double ZetaLarge(uint64_t n, double theta) {
  constexpr uint64_t kExact = 10000;
  if (n <= kExact * 4) return Zeta(n, theta);
  // sum_{i=1}^{n} f(i) = sum_{i=1}^{M-1} f(i) + int_M^n f + (f(M) + f(n))/2
  //                      + (f'(n) - f'(M))/12 - (f'''(n) - f'''(M))/720 + ...,  f(x) = x^-theta.
  const double m = static_cast<double>(kExact);
  const double N = static_cast<double>(n);
  double sum = Zeta(kExact - 1, theta);
  auto f = [&](double x) { return std::pow(x, -theta); };
  auto f1 = [&](double x) { return -theta * std::pow(x, -theta - 1); };
  auto f3 = [&](double x) { return -theta * (theta + 1) * (theta + 2) * std::pow(x, -theta - 3); };
  const double integral = (std::pow(N, 1 - theta) - std::pow(m, 1 - theta)) / (1 - theta);
  sum += integral + (f(m) + f(N)) / 2 + (f1(N) - f1(m)) / 12 - (f3(N) - f3(m)) / 720;
  return sum;
}

UniformGenerator::UniformGenerator(int64_t lb, int64_t ub) : lb_(lb), interval_(ub - lb + 1) {}

int64_t UniformGenerator::NextValue(Rng& rng) {
  last_ = JavaMod(JavaAbs(rng.NextLong()), interval_) + lb_;
  return last_;
}

ZipfianGenerator::ZipfianGenerator(int64_t min, int64_t max, double theta)
    : ZipfianGenerator(min, max, theta, Zeta(static_cast<uint64_t>(max - min + 1), theta)) {}

ZipfianGenerator::ZipfianGenerator(int64_t min, int64_t max, double theta, double zetan)
    : items_(max - min + 1),
      base_(min),
      theta_(theta),
      zeta2theta_(Zeta(2, theta)),
      alpha_(1.0 / (1.0 - theta)),
      zetan_(zetan),
      eta_(0),
      countforzeta_(items_) {
  SetEta(items_);
}

void ZipfianGenerator::SetEta(int64_t n) {
  eta_ = (1 - std::pow(2.0 / static_cast<double>(n), 1 - theta_)) / (1 - zeta2theta_ / zetan_);
}

int64_t ZipfianGenerator::NextLong(Rng& rng, int64_t itemcount) {
  if (itemcount > countforzeta_) {
    zetan_ = ZetaIncrement(static_cast<uint64_t>(countforzeta_), static_cast<uint64_t>(itemcount),
                           theta_, zetan_);
    countforzeta_ = itemcount;
    SetEta(itemcount);
  }
  // (A shrinking count keeps the larger zeta, as YCSB does unless told otherwise.)
  const double u = rng.NextDouble();
  const double uz = u * zetan_;
  if (uz < 1.0) {
    last_ = base_;
    return last_;
  }
  if (uz < 1.0 + std::pow(0.5, theta_)) {
    last_ = base_ + 1;
    return last_;
  }
  last_ = base_ + static_cast<int64_t>(static_cast<double>(itemcount) *
                                       std::pow(eta_ * u - eta_ + 1, alpha_));
  return last_;
}

namespace {
double ScrambledZetan(double theta) {
  if (theta == ZipfianGenerator::kZipfianConstant) return ScrambledZipfianGenerator::kZetan;
  // YCSB sums all 10^10 + 1 terms here (minutes); the Euler-Maclaurin form is as exact.
  return ZetaLarge(static_cast<uint64_t>(ScrambledZipfianGenerator::kItemCount) + 1, theta);
}
}  // namespace

ScrambledZipfianGenerator::ScrambledZipfianGenerator(int64_t min, int64_t max, double theta)
    : min_(min), itemcount_(max - min + 1), gen_(0, kItemCount, theta, ScrambledZetan(theta)) {}

int64_t ScrambledZipfianGenerator::NextValue(Rng& rng) {
  const int64_t v = gen_.NextValue(rng);
  last_ = min_ + JavaMod(FnvHash64(v), itemcount_);
  return last_;
}

HotspotGenerator::HotspotGenerator(int64_t lb, int64_t ub, double hotset_fraction,
                                   double hotopn_fraction) {
  if (hotset_fraction < 0.0 || hotset_fraction > 1.0) hotset_fraction = 0.0;
  if (hotopn_fraction < 0.0 || hotopn_fraction > 1.0) hotopn_fraction = 0.0;
  if (lb > ub) std::swap(lb, ub);
  lb_ = lb;
  const int64_t interval = ub - lb + 1;
  hot_interval_ = static_cast<int64_t>(static_cast<double>(interval) * hotset_fraction);
  cold_interval_ = interval - hot_interval_;
  hotopn_fraction_ = hotopn_fraction;
}

int64_t HotspotGenerator::NextValue(Rng& rng) {
  // YCSB divides by the interval without checking for an empty one; an empty hot (or cold) set
  // sends the draw to the other set instead.
  const bool hot = rng.NextDouble() < hotopn_fraction_;
  if ((hot && hot_interval_ > 0) || cold_interval_ == 0) {
    last_ = lb_ + JavaMod(JavaAbs(rng.NextLong()), hot_interval_);
  } else {
    last_ = lb_ + hot_interval_ + JavaMod(JavaAbs(rng.NextLong()), cold_interval_);
  }
  return last_;
}

AcknowledgedCounterGenerator::AcknowledgedCounterGenerator(int64_t start)
    : counter_(start), window_(kWindow, false), limit_(start - 1) {}

bool AcknowledgedCounterGenerator::Acknowledge(int64_t value) {
  rdkv::MutexLock lock(&mu_);
  int64_t limit = limit_.load(std::memory_order_relaxed);
  if (value <= limit) return true;  // already covered
  if (value - limit > kWindow) return false;
  window_[static_cast<size_t>(value & (kWindow - 1))] = true;
  int64_t index = limit + 1;
  while (window_[static_cast<size_t>(index & (kWindow - 1))]) {
    window_[static_cast<size_t>(index & (kWindow - 1))] = false;
    ++index;
  }
  limit_.store(index - 1, std::memory_order_release);
  return true;
}

SkewedLatestGenerator::SkewedLatestGenerator(const AcknowledgedCounterGenerator* basis,
                                             double theta, double zetan)
    : basis_(basis),
      zipfian_(0, basis->LastValue() - 1, theta,
               zetan >= 0 ? zetan : Zeta(static_cast<uint64_t>(basis->LastValue()), theta)) {}

int64_t SkewedLatestGenerator::NextValue(Rng& rng) {
  const int64_t max = basis_->LastValue();
  last_ = max - zipfian_.NextLong(rng, max);
  return last_;
}

int DiscreteGenerator::Next(Rng& rng) const {
  double sum = 0;
  for (const auto& e : values_) sum += e.weight;
  double val = rng.NextDouble();
  for (const auto& e : values_) {
    const double pw = e.weight / sum;
    if (val < pw) return e.value;
    val -= pw;
  }
  // Rounding can leave val a hair above the last share; the last value is the right answer.
  return values_.back().value;
}

}  // namespace rdkv::kvbench

#include "bench/kvbench/histogram.h"

#include <algorithm>
#include <bit>
#include <cmath>

namespace rdkv::kvbench {

size_t Histogram::NumBuckets() {
  // Exact buckets, then kSubBuckets for each power of two from 2^(kSubBucketBits+1) to 2^kMaxBits.
  return kExactBelow + (kMaxBits - kSubBucketBits - 1) * kSubBuckets;
}

size_t Histogram::BucketIndex(uint64_t ns) {
  if (ns < kExactBelow) return static_cast<size_t>(ns);
  const int msb = 63 - std::countl_zero(ns);  // >= kSubBucketBits + 1
  if (msb >= kMaxBits) return NumBuckets() - 1;
  const int shift = msb - kSubBucketBits;  // >= 1
  return kExactBelow + static_cast<size_t>(shift - 1) * kSubBuckets +
         static_cast<size_t>((ns >> shift) - kSubBuckets);
}

uint64_t Histogram::BucketLow(size_t index) {
  if (index < kExactBelow) return index;
  const size_t rel = index - kExactBelow;
  const int shift = static_cast<int>(rel / kSubBuckets) + 1;
  return (kSubBuckets + rel % kSubBuckets) << shift;
}

uint64_t Histogram::BucketWidth(size_t index) {
  if (index < kExactBelow) return 1;
  return uint64_t{1} << (static_cast<int>((index - kExactBelow) / kSubBuckets) + 1);
}

Histogram::Histogram() : counts_(NumBuckets(), 0) {}

void Histogram::Record(uint64_t ns) {
  ++counts_[BucketIndex(ns)];
  ++count_;
  min_ = std::min(min_, ns);
  max_ = std::max(max_, ns);
  sum_ += static_cast<long double>(ns);
}

void Histogram::Merge(const Histogram& other) {
  for (size_t i = 0; i < counts_.size(); ++i) counts_[i] += other.counts_[i];
  count_ += other.count_;
  min_ = std::min(min_, other.min_);
  max_ = std::max(max_, other.max_);
  sum_ += other.sum_;
}

void Histogram::Reset() {
  std::fill(counts_.begin(), counts_.end(), 0);
  count_ = 0;
  min_ = UINT64_MAX;
  max_ = 0;
  sum_ = 0;
}

double Histogram::Percentile(double p) const {
  if (count_ == 0) return 0;
  p = std::clamp(p, 0.0, 100.0);
  // Nearest rank: ceil(p/100 * count), at least 1. The tiny slack keeps 99.9 % of 1000 at 999
  // despite 99.9/100*1000 being 999.0000000000001 in binary floating point.
  const double exact = p / 100.0 * static_cast<double>(count_);
  uint64_t rank = static_cast<uint64_t>(std::ceil(exact - 1e-9 * std::max(1.0, exact)));
  rank = std::clamp<uint64_t>(rank, 1, count_);
  if (rank == count_) return static_cast<double>(max_);
  if (rank == 1) return static_cast<double>(min_);
  uint64_t seen = 0;
  for (size_t i = 0; i < counts_.size(); ++i) {
    seen += counts_[i];
    if (seen >= rank) {
      const double mid =
          static_cast<double>(BucketLow(i)) + (static_cast<double>(BucketWidth(i)) - 1.0) / 2.0;
      return std::clamp(mid, static_cast<double>(min_), static_cast<double>(max_));
    }
  }
  return static_cast<double>(max_);
}

}  // namespace rdkv::kvbench

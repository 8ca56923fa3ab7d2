// A fixed-bucket histogram for hot paths: Observe is lock-free and allocates nothing (one
// relaxed fetch_add on a bucket, one on the count and one on the sum). Snapshot copies it for
// exporters (Prometheus: server/metrics.cc).
//
// Thread-safety: Observe and Snapshot from any thread. A snapshot taken during Observes may
// see a bucket count and the total count of different moments; every number only grows.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <vector>

namespace rdkv {

struct HistogramSnapshot {
  std::vector<double> upper_bounds;  // ascending; a last implicit bucket holds the rest (+Inf)
  std::vector<uint64_t> counts;      // per bucket (not cumulative), upper_bounds.size() + 1
  uint64_t count = 0;
  double sum = 0;
};

// The q-quantile (0 < q < 1) of a histogram's buckets, estimated as Prometheus's
// histogram_quantile does: the bucket holding rank q * total, linearly interpolated between its
// bounds (the first bucket from 0). A rank in the last (+Inf) bucket gives the highest finite
// bound. 0 when the buckets are empty. Monotone in q: Quantile(0.5) <= Quantile(0.99).
// `counts` are per bucket (not cumulative), upper_bounds.size() + 1 of them (fewer: the missing
// ones count 0).
inline double HistogramQuantile(const std::vector<double>& upper_bounds,
                                const std::vector<uint64_t>& counts, double q) {
  uint64_t total = 0;
  for (uint64_t c : counts) total += c;
  if (total == 0 || upper_bounds.empty()) return 0;
  const double rank = q * static_cast<double>(total);
  uint64_t below = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (counts[i] == 0 || static_cast<double>(below + counts[i]) < rank) {
      below += counts[i];
      continue;
    }
    if (i >= upper_bounds.size()) return upper_bounds.back();
    const double lo = i == 0 ? 0.0 : upper_bounds[i - 1];
    const double hi = upper_bounds[i];
    const double within = (rank - static_cast<double>(below)) / static_cast<double>(counts[i]);
    return lo + (hi - lo) * std::clamp(within, 0.0, 1.0);
  }
  return upper_bounds.back();
}

inline double HistogramQuantile(const HistogramSnapshot& h, double q) {
  return HistogramQuantile(h.upper_bounds, h.counts, q);
}

class AtomicHistogram {
 public:
  explicit AtomicHistogram(std::vector<double> upper_bounds)
      : upper_bounds_(std::move(upper_bounds)),
        counts_(new std::atomic<uint64_t>[upper_bounds_.size() + 1]) {
    for (size_t i = 0; i <= upper_bounds_.size(); ++i) counts_[i].store(0);
  }
  AtomicHistogram(const AtomicHistogram&) = delete;
  AtomicHistogram& operator=(const AtomicHistogram&) = delete;

  void Observe(double value) {
    size_t i = 0;
    while (i < upper_bounds_.size() && value > upper_bounds_[i]) ++i;
    counts_[i].fetch_add(1, std::memory_order_relaxed);
    count_.fetch_add(1, std::memory_order_relaxed);
    sum_.fetch_add(value, std::memory_order_relaxed);
  }

  HistogramSnapshot Snapshot() const {
    HistogramSnapshot s;
    s.upper_bounds = upper_bounds_;
    s.counts.resize(upper_bounds_.size() + 1);
    for (size_t i = 0; i < s.counts.size(); ++i) {
      s.counts[i] = counts_[i].load(std::memory_order_relaxed);
    }
    s.count = count_.load(std::memory_order_relaxed);
    s.sum = sum_.load(std::memory_order_relaxed);
    return s;
  }

  // Bounds for request latencies in seconds: 5 us .. 10 s, about 2.5x apart.
  static std::vector<double> LatencySecondsBounds() {
    return {5e-6,  10e-6, 25e-6, 50e-6,  100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3,
            10e-3, 25e-3, 50e-3, 100e-3, 250e-3, 500e-3, 1,      2.5,  5,      10};
  }

 private:
  const std::vector<double> upper_bounds_;
  const std::unique_ptr<std::atomic<uint64_t>[]> counts_;
  std::atomic<uint64_t> count_{0};
  std::atomic<double> sum_{0};
};

}  // namespace rdkv

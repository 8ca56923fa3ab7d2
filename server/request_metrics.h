// Counts of the requests a Service answered, by op and result, and their latency (from the
// handler taking the request to the answer encoded, deferred answers included), for the Prometheus
// exporter (server/metrics.cc). Slots are fixed at construction: Record takes no lock, looks up no
// label and allocates nothing.
//
// Thread-safety: Record and Snapshot from any thread.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>

#include "common/kv/ops.h"
#include "common/util/histogram.h"
#include "rdkv/status.h"

namespace rdkv::server {

// Op index 0 ("none" in kv::kOpTable) counts requests that did not decode into an op.
inline constexpr size_t kRequestOpSlots = kv::kMaxOp + 1;
inline constexpr size_t kRequestResultSlots = static_cast<size_t>(StatusCode::kProtocolError) + 1;

struct RequestMetricsSnapshot {
  // answered[op][status code]
  std::array<std::array<uint64_t, kRequestResultSlots>, kRequestOpSlots> answered{};
  std::array<HistogramSnapshot, kRequestOpSlots> latency;
};

class RequestMetrics {
 public:
  RequestMetrics() {
    for (auto& h : latency_) {
      h = std::make_unique<AtomicHistogram>(AtomicHistogram::LatencySecondsBounds());
    }
  }

  void Record(uint8_t op, StatusCode result, std::chrono::steady_clock::duration took) {
    const size_t o = op < kRequestOpSlots ? op : 0;
    const size_t r = static_cast<size_t>(result) < kRequestResultSlots
                         ? static_cast<size_t>(result)
                         : static_cast<size_t>(StatusCode::kInternal);
    answered_[o][r].fetch_add(1, std::memory_order_relaxed);
    latency_[o]->Observe(std::chrono::duration<double>(took).count());
  }

  RequestMetricsSnapshot Snapshot() const {
    RequestMetricsSnapshot s;
    for (size_t o = 0; o < kRequestOpSlots; ++o) {
      for (size_t r = 0; r < kRequestResultSlots; ++r) {
        s.answered[o][r] = answered_[o][r].load(std::memory_order_relaxed);
      }
      s.latency[o] = latency_[o]->Snapshot();
    }
    return s;
  }

 private:
  std::array<std::array<std::atomic<uint64_t>, kRequestResultSlots>, kRequestOpSlots> answered_{};
  std::array<std::unique_ptr<AtomicHistogram>, kRequestOpSlots> latency_;
};

}  // namespace rdkv::server

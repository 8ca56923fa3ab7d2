// Request latencies in the STATS JSON (docs/design.md "Wire protocol", STATS): the server's
// per-op histograms (server/request_metrics.h, the same ones /metrics exports) as
//
//   "latency": {"bounds_us": [5, 10, 25, ...],           // bucket upper bounds, microseconds
//               "ops": {"put": {"count": 812, "p50_us": 41.2, "p99_us": 230.5,
//                               "buckets": [0, 3, 160, ...]}, ...}}
//
// `buckets` are per bucket (not cumulative), one more than `bounds_us` (the last: above the
// highest bound). p50/p99 are estimates from the buckets (HistogramQuantile: interpolated
// within a bucket; the bounds are about 2.5x apart), over everything since the server started.
// Readers that sum servers (Client::Stats, kvcli stats --all: SumStats) merge with MergeLatency:
// bucket counts add up, percentiles are recomputed from the sums (percentiles themselves do not
// add). kvcli top takes the difference of two readings (BucketsSince) for the latency of an
// interval.
//
// Header-only; every function is pure (thread-safe on distinct arguments).
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/util/histogram.h"

namespace rdkv {

// The "bounds_us" of a "latency" object; empty when it has none or any is not a number (the
// JSON came over the wire: nothing here throws on a malformed one).
inline std::vector<double> LatencyBounds(const nlohmann::json& latency) {
  std::vector<double> out;
  if (!latency.is_object() || !latency.contains("bounds_us")) return out;
  const nlohmann::json& b = latency["bounds_us"];
  if (!b.is_array()) return out;
  for (const nlohmann::json& v : b) {
    if (!v.is_number()) return {};
    out.push_back(v.get<double>());
  }
  return out;
}

// {"count", "p50_us", "p99_us", "buckets"} of per-bucket counts over bounds in microseconds;
// the percentiles rounded to 0.1 us (the buckets are far coarser).
inline nlohmann::json LatencySummary(const std::vector<double>& bounds_us,
                                     const std::vector<uint64_t>& counts) {
  uint64_t total = 0;
  for (uint64_t c : counts) total += c;
  auto tenth = [](double us) { return std::round(us * 10) / 10; };
  return {{"count", total},
          {"p50_us", tenth(HistogramQuantile(bounds_us, counts, 0.50))},
          {"p99_us", tenth(HistogramQuantile(bounds_us, counts, 0.99))},
          {"buckets", counts}};
}

// Adds op `name`'s histogram (bounds in seconds) to a "latency" object, setting its bounds_us
// on the first call. The count is the buckets' sum (a snapshot taken during Observes may see
// the total and the buckets at different moments; the buckets are what the percentiles use).
inline void AddLatencyOp(nlohmann::json* latency, std::string_view name,
                         const HistogramSnapshot& h) {
  std::vector<double> bounds_us;
  bounds_us.reserve(h.upper_bounds.size());
  for (double b : h.upper_bounds) bounds_us.push_back(b * 1e6);
  if (!latency->contains("bounds_us")) (*latency)["bounds_us"] = bounds_us;
  (*latency)["ops"][std::string(name)] = LatencySummary(bounds_us, h.counts);
}

// The per-bucket counts of `ops` (merged) in `now` minus those in `before` (two "latency"
// objects of one server); a bucket that went down (the server restarted) counts from 0.
// Empty when `now` has no bounds.
inline std::vector<uint64_t> LatencyBucketsSince(const nlohmann::json& now,
                                                 const nlohmann::json& before,
                                                 const std::vector<std::string>& ops) {
  std::vector<uint64_t> out;
  const std::vector<double> bounds = LatencyBounds(now);
  if (bounds.empty()) return out;
  out.assign(bounds.size() + 1, 0);
  auto buckets = [](const nlohmann::json& lat, const std::string& op) -> const nlohmann::json* {
    if (!lat.is_object() || !lat.contains("ops") || !lat["ops"].is_object()) return nullptr;
    const nlohmann::json& o = lat["ops"];
    if (!o.contains(op) || !o[op].is_object() || !o[op].contains("buckets")) return nullptr;
    const nlohmann::json& b = o[op]["buckets"];
    return b.is_array() ? &b : nullptr;
  };
  for (const std::string& op : ops) {
    const nlohmann::json* n = buckets(now, op);
    if (n == nullptr) continue;
    const nlohmann::json* b = buckets(before, op);
    bool restarted = false;
    for (size_t i = 0; b != nullptr && i < n->size() && i < b->size(); ++i) {
      if ((*n)[i].is_number_unsigned() && (*b)[i].is_number_unsigned() &&
          (*n)[i].get<uint64_t>() < (*b)[i].get<uint64_t>()) {
        restarted = true;
      }
    }
    for (size_t i = 0; i < n->size() && i < out.size(); ++i) {
      if (!(*n)[i].is_number_unsigned()) continue;
      uint64_t v = (*n)[i].get<uint64_t>();
      if (!restarted && b != nullptr && i < b->size() && (*b)[i].is_number_unsigned()) {
        v -= (*b)[i].get<uint64_t>();
      }
      out[i] += v;
    }
  }
  return out;
}

// Adds the "latency" object `from` (one server's) into `total` (the sum of servers so far):
// bucket counts per op add up, and each op's count and percentiles are recomputed from them.
// Servers with other bounds than the first one's are left out of the sum (all rdkv servers of
// one build share them).
inline void MergeLatency(nlohmann::json* total, const nlohmann::json& from) {
  const std::vector<double> from_bounds = LatencyBounds(from);
  if (from_bounds.empty() || !from.contains("ops") || !from["ops"].is_object()) return;
  std::vector<double> bounds = LatencyBounds(*total);
  if (bounds.empty()) {
    *total = {{"bounds_us", from_bounds}, {"ops", nlohmann::json::object()}};
    bounds = from_bounds;
  }
  if (bounds != from_bounds) return;
  for (auto& [op, one] : from["ops"].items()) {
    if (!one.is_object() || !one.contains("buckets") || !one["buckets"].is_array()) continue;
    std::vector<uint64_t> sum(bounds.size() + 1, 0);
    auto add = [&sum](const nlohmann::json& b) {
      if (!b.is_array()) return;
      for (size_t i = 0; i < b.size() && i < sum.size(); ++i) {
        if (b[i].is_number_unsigned()) sum[i] += b[i].get<uint64_t>();
      }
    };
    add(one["buckets"]);
    nlohmann::json& ops = (*total)["ops"];
    if (ops.contains(op) && ops[op].is_object() && ops[op].contains("buckets")) {
      add(ops[op]["buckets"]);
    }
    ops[op] = LatencySummary(bounds, sum);
  }
}

// Adds one server's STATS object `from` into `total` (the sum of servers so far; an object):
// every integer and float field adds up, nested objects field by field, "latency" merges
// (MergeLatency). A field whose type differs from the one already in `total` (another
// server's build) is left out, and integer sums saturate: a server's answer cannot make the
// reader throw or overflow.
inline void SumStats(nlohmann::json* total, const nlohmann::json& from) {
  if (!total->is_object() || !from.is_object()) return;
  for (auto& [k, v] : from.items()) {
    auto it = total->find(k);
    const bool have = it != total->end();
    if (k == "latency") {  // histograms: buckets add up, percentiles are recomputed
      if (!have || it->is_object()) MergeLatency(&(*total)[k], v);
    } else if (v.is_object()) {
      if (have && !it->is_object()) continue;
      SumStats(have ? &*it : &((*total)[k] = nlohmann::json::object()), v);
    } else if (v.is_number_integer()) {
      if (have && !it->is_number_integer()) continue;
      const int64_t a = have ? it->get<int64_t>() : 0, b = v.get<int64_t>();
      int64_t sum;
      if (__builtin_add_overflow(a, b, &sum)) {
        sum = b > 0 ? INT64_MAX : INT64_MIN;
      }
      (*total)[k] = sum;
    } else if (v.is_number_float()) {
      if (have && !it->is_number()) continue;
      (*total)[k] = (have ? it->get<double>() : 0.0) + v.get<double>();
    }
  }
}

}  // namespace rdkv

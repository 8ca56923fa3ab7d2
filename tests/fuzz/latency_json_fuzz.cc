// libFuzzer target: the STATS "latency" object as clients read it (common/util/latency_json.h):
// kvcli top takes the difference of two servers' readings, Client::Stats and kvcli stats --all
// merge them. The JSON comes from servers over the wire: no input may throw or crash, and a
// merged op's count is the sum of its buckets.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/util/latency_json.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Two JSON documents, split at the first NUL (the second empty when there is none).
  std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t cut = in.find('\0');
  std::string_view first = in.substr(0, cut);
  std::string_view second = cut == std::string_view::npos ? std::string_view() : in.substr(cut + 1);
  const nlohmann::json a = nlohmann::json::parse(first, nullptr, /*allow_exceptions=*/false);
  const nlohmann::json b = nlohmann::json::parse(second, nullptr, /*allow_exceptions=*/false);

  const std::vector<std::string> ops = {"put", "insert", "delete", "cas", "import"};
  std::vector<uint64_t> interval = rdkv::LatencyBucketsSince(a, b, ops);
  const std::vector<double> bounds = rdkv::LatencyBounds(a);
  if (!interval.empty() && interval.size() != bounds.size() + 1) std::abort();
  // Bounds out of order (a hostile server) give meaningless percentiles, but never a crash.
  if (!interval.empty()) {
    (void)rdkv::HistogramQuantile(bounds, interval, 0.5);
    (void)rdkv::HistogramQuantile(bounds, interval, 0.99);
  }

  nlohmann::json total;
  rdkv::MergeLatency(&total, a);
  rdkv::MergeLatency(&total, b);
  if (total.is_object() && total.contains("ops") && total["ops"].is_object()) {
    for (auto& [op, one] : total["ops"].items()) {
      uint64_t sum = 0;
      for (const nlohmann::json& c : one["buckets"]) sum += c.get<uint64_t>();
      if (one["count"].get<uint64_t>() != sum) std::abort();
    }
  }
  (void)total.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  // Two servers' whole STATS objects summed (Client::Stats): never a throw.
  nlohmann::json sum = nlohmann::json::object();
  rdkv::SumStats(&sum, a);
  rdkv::SumStats(&sum, b);
  (void)sum.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return 0;
}

// ClientMetricSamples / ClientMetricsText (rdkv/client.h): the client's counters for an
// application's own metrics registry.
#include <cinttypes>
#include <cstdio>

#include "rdkv/client.h"

namespace rdkv {

// Twelve counters, one sample each below: a field added to ClientStats must be added here.
static_assert(sizeof(ClientStats) == 12 * sizeof(uint64_t), "a ClientStats field has no sample");

std::vector<MetricSample> ClientMetricSamples(const ClientStats& s) {
  auto d = [](uint64_t v) { return static_cast<double>(v); };
  return {
      {"rdkv_client_gets_total", "Keys looked up (a MultiGet of n keys counts n)", d(s.gets)},
      {"rdkv_client_get_reads_total", "One-sided READs posted by GETs", d(s.get_reads)},
      {"rdkv_client_get_round_trips_total",
       "Batches of one-sided READs GETs posted and waited for (round trips)", d(s.get_round_trips)},
      {"rdkv_client_get_retries_total",
       "GET attempts that failed a check or the deadline and were retried", d(s.get_retries)},
      {"rdkv_client_cache_hits_total", "GETs answered by one READ from the location cache",
       d(s.cache_hits)},
      {"rdkv_client_cache_misses_total",
       "Cached locations that no longer held the key (the GET fell back)", d(s.cache_misses)},
      {"rdkv_client_torn_reads_total", "Items read that failed their checksum", d(s.torn_reads)},
      {"rdkv_client_slow_reads_total", "GET attempts restarted after exceeding read_deadline",
       d(s.slow_reads)},
      {"rdkv_client_writes_total", "Writes sent (put, insert, delete, cas)", d(s.writes)},
      {"rdkv_client_errors_total",
       "Failed calls (not found, already exists and version mismatch are answers, not errors)",
       d(s.errors)},
      {"rdkv_client_reconnects_total", "Connections replaced after a failure", d(s.reconnects)},
      {"rdkv_client_retired_accepts_total",
       "GETs answered with the item their slot READ found, already replaced when it was READ",
       d(s.retired_accepts)},
  };
}

std::string ClientMetricsText(const ClientStats& stats, std::string_view labels) {
  std::string out;
  const std::string braces = labels.empty() ? "" : "{" + std::string(labels) + "}";
  for (const MetricSample& m : ClientMetricSamples(stats)) {
    char value[32];
    std::snprintf(value, sizeof value, "%" PRIu64, static_cast<uint64_t>(m.value));
    out += "# HELP " + m.name + " " + m.help + "\n";
    out += "# TYPE " + m.name + " counter\n";
    out += m.name + braces + " " + value + "\n";
  }
  return out;
}

}  // namespace rdkv

// The kvserver's Prometheus metrics (docs/operations.md "Metrics" lists them): a collector
// that turns one ServerStats, read at scrape time, into metric families. Nothing is counted
// here: the datapath bumps its own atomics (Service's RequestMetrics, the store, the
// persister, the listener) and a scrape reads them.
//
// Thread-safety: the collector may be called from any thread (prometheus-cpp's HTTP threads);
// `read_stats` must be safe to call from any thread (Server::stats() is).
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "server/server.h"

namespace prometheus {
class Collectable;
struct MetricFamily;
}  // namespace prometheus

namespace rdkv::server {

// The families of one ServerStats.
std::vector<prometheus::MetricFamily> ServerMetricFamilies(const ServerStats& stats);

// A collectable for prometheus::Exposer / Registry that calls `read_stats` per scrape.
std::shared_ptr<prometheus::Collectable> MakeMetricsCollector(
    std::function<ServerStats()> read_stats);

}  // namespace rdkv::server

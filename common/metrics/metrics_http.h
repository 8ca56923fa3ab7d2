// The one Prometheus /metrics HTTP endpoint of rdkv's processes (kvserver, kvcoord) and a
// builder for the metric families their collectors return. docs/operations.md "Metrics".
//
//   auto http = metrics::MetricsHttp::Start("127.0.0.1", 0, metrics::MakeCollector([&] {
//     metrics::Families f;
//     f.Gauge("rdkv_x", "help", 1);
//     return f.Take();
//   }));
//   (*http)->port();  // the port it listens on (0 asked for a free one)
//
// Nothing is counted here: a collector reads what its process counts anyway, once per scrape.
// Ownership: MetricsHttp owns its prometheus-cpp exposer (one HTTP thread) and keeps the
// collectable alive; destroying it stops serving. Thread-safety: a collector's function runs on
// the HTTP thread, so it must be safe to call from any thread; Families is not thread-safe (one
// per Collect).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include "common/util/histogram.h"
#include "rdkv/status.h"

namespace prometheus {
class Exposer;
}  // namespace prometheus

namespace rdkv::metrics {

// Metric families in the order they are added.
class Families {
 public:
  void Gauge(std::string name, std::string help, double value);
  void Counter(std::string name, std::string help, double value);
  // A family of `type` with `metrics`; the returned vector is valid until the next Add.
  std::vector<prometheus::ClientMetric>& Add(std::string name, std::string help,
                                             prometheus::MetricType type,
                                             std::vector<prometheus::ClientMetric> metrics = {});

  static prometheus::ClientMetric GaugeMetric(double v);
  static prometheus::ClientMetric CounterMetric(double v);
  // Cumulative buckets with +Inf; sample_count is the +Inf bucket (a snapshot's buckets, read
  // one by one, may be ahead of its count). A default (empty) snapshot is one +Inf bucket of 0.
  static prometheus::ClientMetric HistogramMetric(const HistogramSnapshot& h);

  std::vector<prometheus::MetricFamily> Take() { return std::move(families_); }

 private:
  std::vector<prometheus::MetricFamily> families_;
};

// A collectable that calls `collect` per scrape.
std::shared_ptr<prometheus::Collectable> MakeCollector(
    std::function<std::vector<prometheus::MetricFamily>()> collect);

class MetricsHttp {
 public:
  // Serves http://host:port/metrics (port 0: a free one). kUnavailable naming the address when
  // it cannot listen there (taken, no such address).
  static Result<std::unique_ptr<MetricsHttp>> Start(
      const std::string& host, uint16_t port, std::shared_ptr<prometheus::Collectable> collector);
  ~MetricsHttp();
  MetricsHttp(const MetricsHttp&) = delete;
  MetricsHttp& operator=(const MetricsHttp&) = delete;

  uint16_t port() const { return port_; }

 private:
  MetricsHttp() = default;
  std::shared_ptr<prometheus::Collectable> collector_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  uint16_t port_ = 0;
};

}  // namespace rdkv::metrics

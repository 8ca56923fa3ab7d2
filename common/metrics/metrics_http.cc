#include "common/metrics/metrics_http.h"

#include <prometheus/exposer.h>

#include <limits>

namespace rdkv::metrics {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

void Families::Gauge(std::string name, std::string help, double value) {
  Add(std::move(name), std::move(help), MetricType::Gauge).push_back(GaugeMetric(value));
}

void Families::Counter(std::string name, std::string help, double value) {
  Add(std::move(name), std::move(help), MetricType::Counter).push_back(CounterMetric(value));
}

std::vector<ClientMetric>& Families::Add(std::string name, std::string help, MetricType type,
                                         std::vector<ClientMetric> metrics) {
  families_.push_back(MetricFamily{std::move(name), std::move(help), type, std::move(metrics)});
  return families_.back().metric;
}

ClientMetric Families::GaugeMetric(double v) {
  ClientMetric m;
  m.gauge.value = v;
  return m;
}

ClientMetric Families::CounterMetric(double v) {
  ClientMetric m;
  m.counter.value = v;
  return m;
}

ClientMetric Families::HistogramMetric(const HistogramSnapshot& h) {
  ClientMetric m;
  // A default snapshot has no counts: every bucket is 0.
  auto count = [&h](size_t i) -> uint64_t { return i < h.counts.size() ? h.counts[i] : 0; };
  uint64_t cumulative = 0;
  for (size_t i = 0; i < h.upper_bounds.size(); ++i) {
    cumulative += count(i);
    m.histogram.bucket.push_back({cumulative, h.upper_bounds[i]});
  }
  cumulative += count(h.upper_bounds.size());
  m.histogram.bucket.push_back({cumulative, std::numeric_limits<double>::infinity()});
  m.histogram.sample_count = cumulative;
  m.histogram.sample_sum = h.sum;
  return m;
}

namespace {

class Collector final : public prometheus::Collectable {
 public:
  explicit Collector(std::function<std::vector<MetricFamily>()> collect)
      : collect_(std::move(collect)) {}
  std::vector<MetricFamily> Collect() const override { return collect_(); }

 private:
  const std::function<std::vector<MetricFamily>()> collect_;
};

}  // namespace

std::shared_ptr<prometheus::Collectable> MakeCollector(
    std::function<std::vector<MetricFamily>()> collect) {
  return std::make_shared<Collector>(std::move(collect));
}

Result<std::unique_ptr<MetricsHttp>> MetricsHttp::Start(
    const std::string& host, uint16_t port, std::shared_ptr<prometheus::Collectable> collector) {
  const std::string bind = host + ":" + std::to_string(port);
  std::unique_ptr<MetricsHttp> http(new MetricsHttp());
  try {
    http->exposer_ = std::make_unique<prometheus::Exposer>(bind, /*num_threads=*/1);
  } catch (const std::exception& e) {
    // The HTTP library says "null context when constructing CivetServer" when it cannot bind.
    return Status::Unavailable("cannot serve /metrics on " + bind +
                               ": the address cannot be bound (the port is in use, e.g. by "
                               "this server's own --port, or the host is not local) [" +
                               e.what() + "]");
  }
  http->collector_ = std::move(collector);
  http->exposer_->RegisterCollectable(http->collector_);
  std::vector<int> ports = http->exposer_->GetListeningPorts();
  http->port_ = ports.empty() ? 0 : static_cast<uint16_t>(ports.front());
  return http;
}

MetricsHttp::~MetricsHttp() = default;

}  // namespace rdkv::metrics

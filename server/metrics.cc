#include "server/metrics.h"

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include <cctype>
#include <limits>
#include <string>
#include <string_view>

namespace rdkv::server {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

// "NotFound" -> "not_found", "OK" -> "ok": label values in Prometheus style.
std::string ResultLabel(StatusCode code) {
  if (code == StatusCode::kOk) return "ok";
  std::string out;
  for (char c : StatusCodeName(code)) {
    if (std::isupper(static_cast<unsigned char>(c))) {
      if (!out.empty()) out += '_';
      out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    } else {
      out += c;
    }
  }
  return out;
}

// The op label: kv::kOpTable's name; slot 0 counts requests that did not decode.
std::string OpLabel(size_t op) { return op == 0 ? "invalid" : std::string(kv::kOpTable[op].name); }

class Families {
 public:
  void Gauge(std::string name, std::string help, double value) {
    Add(std::move(name), std::move(help), MetricType::Gauge).push_back(GaugeMetric(value));
  }
  void Counter(std::string name, std::string help, double value) {
    Add(std::move(name), std::move(help), MetricType::Counter).push_back(CounterMetric(value));
  }
  // The returned vector is valid until the next Add.
  std::vector<ClientMetric>& Add(std::string name, std::string help, MetricType type,
                                 std::vector<ClientMetric> metrics = {}) {
    families_.push_back(MetricFamily{std::move(name), std::move(help), type, std::move(metrics)});
    return families_.back().metric;
  }

  static ClientMetric GaugeMetric(double v) {
    ClientMetric m;
    m.gauge.value = v;
    return m;
  }
  static ClientMetric CounterMetric(double v) {
    ClientMetric m;
    m.counter.value = v;
    return m;
  }
  static ClientMetric HistogramMetric(const HistogramSnapshot& h) {
    ClientMetric m;
    uint64_t cumulative = 0;
    for (size_t i = 0; i < h.upper_bounds.size(); ++i) {
      cumulative += h.counts[i];
      m.histogram.bucket.push_back({cumulative, h.upper_bounds[i]});
    }
    cumulative += h.counts.back();
    m.histogram.bucket.push_back({cumulative, std::numeric_limits<double>::infinity()});
    // The buckets, read one by one, may be ahead of the count: keep the +Inf bucket == count.
    m.histogram.sample_count = cumulative;
    m.histogram.sample_sum = h.sum;
    return m;
  }

  std::vector<MetricFamily> Take() { return std::move(families_); }

 private:
  std::vector<MetricFamily> families_;
};

class Collector final : public prometheus::Collectable {
 public:
  explicit Collector(std::function<ServerStats()> read_stats)
      : read_stats_(std::move(read_stats)) {}
  std::vector<MetricFamily> Collect() const override { return ServerMetricFamilies(read_stats_()); }

 private:
  const std::function<ServerStats()> read_stats_;
};

}  // namespace

std::vector<MetricFamily> ServerMetricFamilies(const ServerStats& s) {
  Families f;
  // Requests.
  std::vector<ClientMetric> requests, latency;
  for (size_t op = 0; op < kRequestOpSlots; ++op) {
    const bool write = op != 0 && kv::kOpTable[op].op_class == kv::OpClass::kWrite;
    for (size_t r = 0; r < kRequestResultSlots; ++r) {
      const uint64_t n = s.requests.answered[op][r];
      // Every op's ok series exists from the start (rates need a first sample); others once
      // they happened.
      if (n == 0 && !(r == 0 && op != 0)) continue;
      ClientMetric m = Families::CounterMetric(static_cast<double>(n));
      m.label = {{"op", OpLabel(op)}, {"result", ResultLabel(static_cast<StatusCode>(r))}};
      requests.push_back(std::move(m));
    }
    if (write || s.requests.latency[op].count > 0) {
      ClientMetric m = Families::HistogramMetric(s.requests.latency[op]);
      m.label = {{"op", OpLabel(op)}};
      latency.push_back(std::move(m));
    }
  }
  f.Add("rdkv_requests_total",
        "Two-sided requests answered, by op and result (ok or the error's code; one-sided GET "
        "READs are not requests: see rdkv_nic_reads_served_total)",
        MetricType::Counter, std::move(requests));
  f.Add("rdkv_request_duration_seconds",
        "Seconds from a worker taking a request to its answer (sync-mode writes: until durable), "
        "by op",
        MetricType::Histogram, std::move(latency));
  // Memory and index.
  f.Gauge("rdkv_items", "Live items", static_cast<double>(s.items));
  f.Gauge("rdkv_item_bytes", "Bytes of live items (headers, keys and values)",
          static_cast<double>(s.item_bytes));
  f.Gauge("rdkv_region_bytes", "Size of the registered region (index and heap)",
          static_cast<double>(s.region_bytes));
  f.Gauge("rdkv_heap_bytes", "Size of the region's item heap", static_cast<double>(s.heap_bytes));
  f.Gauge("rdkv_heap_used_bytes", "Heap bytes held by items (size classes rounded up)",
          static_cast<double>(s.used_bytes));
  f.Gauge("rdkv_heap_free_bytes", "Heap bytes free for new items",
          static_cast<double>(s.free_bytes));
  f.Gauge("rdkv_heap_limbo_bytes", "Heap bytes freed but waiting out the grace period",
          static_cast<double>(s.limbo_bytes));
  f.Gauge("rdkv_index_slots", "Slots of the hash index (one item each)",
          static_cast<double>(s.index_slots));
  f.Gauge("rdkv_index_slots_used", "Slots of the hash index holding an item",
          static_cast<double>(s.items));
  // Transport.
  f.Gauge("rdkv_connections", "Clients connected now (past the handshake)",
          static_cast<double>(s.transport.connections_open));
  f.Counter("rdkv_connections_accepted_total", "Client connections accepted",
            static_cast<double>(s.transport.connections_accepted));
  f.Counter("rdkv_connections_refused_total",
            "Client connections refused (bad token, too many, bad handshake)",
            static_cast<double>(s.transport.connections_refused));
  f.Counter("rdkv_nic_reads_served_total",
            "One-sided READs served by the tcp software NIC (0 on verbs: the NIC serves them)",
            static_cast<double>(s.transport.reads_served));
  f.Counter("rdkv_nic_read_bytes_total", "Bytes returned by the READs of the tcp software NIC",
            static_cast<double>(s.transport.read_bytes_served));
  f.Counter("rdkv_nic_reads_refused_total",
            "READs the tcp software NIC refused (bad rkey or out of bounds)",
            static_cast<double>(s.transport.reads_refused));
  // Cluster.
  f.Gauge("rdkv_map_epoch", "Epoch of the cluster map this server holds (0 standalone)",
          static_cast<double>(s.map_epoch));
  f.Gauge("rdkv_shards", "Shards of the cluster map (1 standalone)", static_cast<double>(s.shards));
  f.Gauge("rdkv_shards_owned", "Shards this server owns (1 standalone)",
          static_cast<double>(s.owned_shards));
  // Persistence (only when the server persists).
  if (s.persist) {
    const persistence::PersisterStats& p = *s.persist;
    f.Gauge("rdkv_persist_queue_records", "Applied writes not yet handed to RocksDB",
            static_cast<double>(p.queued_records));
    f.Gauge("rdkv_persist_queue_bytes", "Bytes (keys and values) of those writes",
            static_cast<double>(p.queued_bytes));
    f.Counter("rdkv_persist_records_total", "Writes written to RocksDB",
              static_cast<double>(p.records));
    f.Counter("rdkv_persist_groups_total", "Groups (RocksDB write batches) written",
              static_cast<double>(p.groups));
    f.Counter("rdkv_persist_wal_syncs_total", "WAL fsyncs", static_cast<double>(p.syncs));
    f.Counter("rdkv_persist_admission_waits_total",
              "Writes that waited for room in the persistence queue (backpressure)",
              static_cast<double>(p.admission_waits));
    f.Counter("rdkv_persist_io_errors_total", "Disk errors of the persister",
              static_cast<double>(p.io_errors));
    f.Gauge("rdkv_persist_failing", "1 while writes are refused because the disk fails",
            p.failing ? 1 : 0);
    f.Counter("rdkv_snapshots_total", "Snapshots taken", static_cast<double>(p.snapshots));
    f.Add("rdkv_persist_group_records", "Writes per group commit (one RocksDB write batch)",
          MetricType::Histogram)
        .push_back(Families::HistogramMetric(p.group_records));
    f.Add("rdkv_persist_wal_sync_duration_seconds",
          "Seconds per WAL fsync (sync: a group's write with its fsync; async: one WAL sync)",
          MetricType::Histogram)
        .push_back(Families::HistogramMetric(p.wal_sync_seconds));
  }
  return f.Take();
}

std::shared_ptr<prometheus::Collectable> MakeMetricsCollector(
    std::function<ServerStats()> read_stats) {
  return std::make_shared<Collector>(std::move(read_stats));
}

}  // namespace rdkv::server

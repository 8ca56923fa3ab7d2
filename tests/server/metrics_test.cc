// kvserver's Prometheus /metrics (server/metrics.h): a real in-process server on a free port,
// scraped with a plain HTTP GET; the Grafana dashboard's queries name only exported metrics;
// the client library's registry hook (ClientMetricSamples / ClientMetricsText).
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "coordinator/coordinator.h"
#include "rdkv/admin.h"
#include "rdkv/client.h"
#include "server/metrics.h"
#include "server/server.h"
#include "tests/support/cluster_fixture.h"
#include "tests/support/scrape.h"

namespace rdkv {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

using testing::HttpGet;
using testing::Scrape;
Scrape Parse(const std::string& text) { return testing::ParseExposition(text); }

class MetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("rdkv_metrics_test_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    server::ServerOptions o;
    o.port = 0;
    o.transport = transport::TransportKind::kTcp;
    o.memory_bytes = 32ull << 20;
    o.huge_pages = false;
    o.persist.durability = server::persistence::Durability::kSync;
    o.persist.data_dir = dir_.string();
    o.metrics_port = 0;  // a free port
    auto s = server::Server::Start(o);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    server_ = std::move(*s);
    ASSERT_NE(server_->metrics_port(), 0);
    ClientOptions co;
    co.seed = "127.0.0.1:" + std::to_string(server_->port());
    co.transport = "tcp";
    auto c = Client::Connect(co);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    client_ = std::move(*c);
  }
  void TearDown() override {
    client_.reset();
    server_.reset();
    fs::remove_all(dir_);
  }

  Scrape ScrapeServer() {
    std::string body = HttpGet(server_->metrics_port(), "/metrics");
    EXPECT_FALSE(body.empty()) << "no answer from /metrics";
    return Parse(body);
  }

  fs::path dir_;
  std::unique_ptr<server::Server> server_;
  std::unique_ptr<Client> client_;
};

TEST_F(MetricsTest, ScrapeIsExpositionFormatAndMovesWithTraffic) {
  Scrape before = ScrapeServer();
  const std::string put_ok = R"(rdkv_requests_total{op="put",result="ok"})";
  EXPECT_EQ(before.types["rdkv_requests_total"], "counter");
  EXPECT_EQ(before.types["rdkv_request_duration_seconds"], "histogram");
  EXPECT_EQ(before.types["rdkv_items"], "gauge");
  EXPECT_EQ(before.types["rdkv_persist_wal_sync_duration_seconds"], "histogram");
  EXPECT_EQ(before.at(put_ok), 0);
  EXPECT_EQ(before.at("rdkv_items"), 0);
  EXPECT_GT(before.at("rdkv_region_bytes"), 0);
  EXPECT_GT(before.at("rdkv_index_slots"), 0);
  EXPECT_EQ(before.at("rdkv_connections"), 1);

  constexpr int kPuts = 20;
  const std::string value(300, 'v');
  for (int i = 0; i < kPuts; ++i) {
    ASSERT_TRUE(client_->Put("key" + std::to_string(i), value).ok());
  }
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(client_->Get("key" + std::to_string(i)).ok());
  EXPECT_TRUE(client_->Delete("missing").Is(StatusCode::kNotFound));

  Scrape after = ScrapeServer();
  EXPECT_EQ(after.at(put_ok), kPuts);
  EXPECT_EQ(after.at(R"(rdkv_requests_total{op="delete",result="not_found"})"), 1);
  EXPECT_EQ(after.at(R"(rdkv_request_duration_seconds_count{op="put"})"), kPuts);
  EXPECT_EQ(after.at(R"(rdkv_request_duration_seconds_bucket{op="put",le="+Inf"})"), kPuts);
  EXPECT_GT(after.at(R"(rdkv_request_duration_seconds_sum{op="put"})"), 0);
  EXPECT_EQ(after.at("rdkv_items"), kPuts);
  EXPECT_EQ(after.at("rdkv_index_slots_used"), kPuts);
  EXPECT_GE(after.at("rdkv_heap_used_bytes"), before.at("rdkv_heap_used_bytes") + kPuts * 300);
  EXPECT_GT(after.at("rdkv_item_bytes"), before.at("rdkv_item_bytes"));
  // GETs are one-sided READs the software NIC serves: at least one per GET.
  EXPECT_GE(after.at("rdkv_nic_reads_served_total"), before.at("rdkv_nic_reads_served_total") + 5);
  EXPECT_GT(after.at("rdkv_nic_read_bytes_total"), before.at("rdkv_nic_read_bytes_total"));
  // Sync mode: every acknowledged PUT is in RocksDB and its WAL synced.
  EXPECT_GE(after.at("rdkv_persist_records_total"), kPuts);
  EXPECT_GE(after.at("rdkv_persist_group_records_count"), 1);
  EXPECT_GE(after.at("rdkv_persist_wal_sync_duration_seconds_count"), 1);
  EXPECT_EQ(after.at("rdkv_map_epoch"), 0);
  EXPECT_EQ(after.at("rdkv_shards_owned"), 1);
}

// STATS carries the same histograms as latency percentiles by op (common/util/latency_json.h),
// what kvcli stats and kvcli top show.
TEST_F(MetricsTest, StatsJsonCarriesLatencyPercentilesByOp) {
  constexpr int kPuts = 40;
  for (int i = 0; i < kPuts; ++i) {
    ASSERT_TRUE(client_->Put("lat" + std::to_string(i), std::string(100, 'x')).ok());
  }
  auto text = client_->Stats();
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  nlohmann::json j = nlohmann::json::parse(*text);
  ASSERT_TRUE(j.contains("latency")) << *text;
  const nlohmann::json& lat = j["latency"];
  ASSERT_TRUE(lat["bounds_us"].is_array());
  const std::vector<double> bounds = lat["bounds_us"].get<std::vector<double>>();
  ASSERT_FALSE(bounds.empty());
  EXPECT_DOUBLE_EQ(bounds.front(), 5.0);  // LatencySecondsBounds: 5 us .. 10 s
  ASSERT_TRUE(lat["ops"].contains("put")) << lat.dump();
  const nlohmann::json& put = lat["ops"]["put"];
  EXPECT_EQ(put["count"].get<uint64_t>(), static_cast<uint64_t>(kPuts));
  const std::vector<uint64_t> buckets = put["buckets"].get<std::vector<uint64_t>>();
  ASSERT_EQ(buckets.size(), bounds.size() + 1);
  uint64_t sum = 0;
  for (uint64_t b : buckets) sum += b;
  EXPECT_EQ(sum, static_cast<uint64_t>(kPuts));
  // Sync-mode PUTs wait for a WAL fsync: never 0 us.
  const double p50 = put["p50_us"].get<double>(), p99 = put["p99_us"].get<double>();
  EXPECT_GT(p50, 0);
  EXPECT_LE(p50, p99);
  EXPECT_LE(p99, bounds.back());
  // Ops never answered are left out.
  EXPECT_FALSE(lat["ops"].contains("cas")) << lat.dump();
  // The same histogram as /metrics.
  Scrape scrape = ScrapeServer();
  EXPECT_EQ(scrape.at(R"(rdkv_request_duration_seconds_count{op="put"})"), kPuts);
}

TEST_F(MetricsTest, OffUnlessAPortIsGiven) {
  server::ServerOptions o;
  o.port = 0;
  o.memory_bytes = 16ull << 20;
  o.huge_pages = false;
  auto s = server::Server::Start(o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ((*s)->metrics_port(), 0);
}

// Every family kvserver and kvcoord can export, name -> "counter" / "gauge" / "histogram": a
// clustered, replicated, persisting server's (ServerMetricFamilies of such stats, what its
// collector returns) and kvcoord's (CoordinatorMetricFamilies).
std::map<std::string, std::string> ExportedFamilyTypes() {
  server::ServerStats clustered;
  clustered.clustered = true;
  clustered.persist = server::persistence::PersisterStats{};
  clustered.backups.push_back({1, true, 0, 0});
  clustered.scan_progress.emplace_back(0, 1.0);
  const auto type_name = [](prometheus::MetricType t) -> std::string {
    return t == prometheus::MetricType::Counter     ? "counter"
           : t == prometheus::MetricType::Gauge     ? "gauge"
           : t == prometheus::MetricType::Histogram ? "histogram"
                                                    : "other";
  };
  std::map<std::string, std::string> types;
  for (const prometheus::MetricFamily& f : server::ServerMetricFamilies(clustered)) {
    types[f.name] = type_name(f.type);
  }
  for (const prometheus::MetricFamily& f :
       coordinator::CoordinatorMetricFamilies(coordinator::CoordinatorStats{})) {
    types[f.name] = type_name(f.type);
  }
  return types;
}

// Every metric a query of deploy/grafana/rdkv-dashboard.json names is one that kvserver or
// kvcoord exports (a histogram's _bucket/_sum/_count series by its family): this standalone
// server's scrape, the families a replicated server adds (ServerMetricFamilies of a clustered
// server's stats, what its collector returns; ReplicatedMetricsTest scrapes them live) and
// kvcoord's (CoordinatorMetricFamilies).
TEST_F(MetricsTest, DashboardQueriesNameExportedMetrics) {
  ASSERT_TRUE(client_->Put("k", "v").ok());  // every family has a sample
  Scrape scrape = ScrapeServer();
  for (const auto& [name, type] : ExportedFamilyTypes()) scrape.types[name] = type;
  std::ifstream file(RDKV_DASHBOARD_PATH);
  ASSERT_TRUE(file) << "cannot read " << RDKV_DASHBOARD_PATH;
  nlohmann::json dashboard = nlohmann::json::parse(file);
  std::vector<std::string> exprs;
  std::function<void(const nlohmann::json&)> walk = [&](const nlohmann::json& j) {
    if (j.is_object()) {
      for (auto& [k, v] : j.items()) {
        if (k == "expr" && v.is_string()) exprs.push_back(v.get<std::string>());
        walk(v);
      }
    } else if (j.is_array()) {
      for (const auto& v : j) walk(v);
    }
  };
  walk(dashboard);
  ASSERT_GE(exprs.size(), 8u) << "the dashboard has too few queries";
  static const std::regex kMetric(R"(\b(rdkv_[a-z0-9_]+))");
  std::set<std::string> named;
  for (const std::string& e : exprs) {
    size_t before = named.size();
    for (std::sregex_iterator it(e.begin(), e.end(), kMetric), end; it != end; ++it) {
      named.insert((*it)[1]);
    }
    EXPECT_GT(named.size() + 1, before) << e;
    EXPECT_NE(e.find("rdkv_"), std::string::npos) << "a query that names no rdkv metric: " << e;
  }
  for (const std::string& name : named) {
    std::string family = name;
    for (const char* suffix : {"_bucket", "_sum", "_count"}) {
      const std::string sfx = suffix;
      if (family.size() > sfx.size() &&
          family.compare(family.size() - sfx.size(), sfx.size(), sfx) == 0 &&
          scrape.types.count(family.substr(0, family.size() - sfx.size())) != 0 &&
          scrape.types[family.substr(0, family.size() - sfx.size())] == "histogram") {
        family = family.substr(0, family.size() - sfx.size());
        break;
      }
    }
    EXPECT_EQ(scrape.types.count(family), 1u)
        << "the dashboard names " << name << ", which the server does not export";
  }
}

// docs/operations.md's metric tables and what kvserver and kvcoord export name the same
// families, each with the same type: a metric added without its line, or a line left behind by
// a rename, fails here.
TEST_F(MetricsTest, OperationsDocListsEveryExportedFamilyWithItsType) {
  const std::map<std::string, std::string> exported = ExportedFamilyTypes();
  std::ifstream file(RDKV_OPERATIONS_DOC_PATH);
  ASSERT_TRUE(file) << "cannot read " << RDKV_OPERATIONS_DOC_PATH;
  // "| `rdkv_a`[, `rdkv_b` ...] | type | ..." (the server's table also has a labels column).
  static const std::regex kRow(R"(^\| ((?:`rdkv_[a-z0-9_]+`(?:, )?)+) \| ([a-z]+) \|)");
  static const std::regex kName(R"(`(rdkv_[a-z0-9_]+)`)");
  std::map<std::string, std::string> documented;
  std::string line;
  while (std::getline(file, line)) {
    std::smatch m;
    if (!std::regex_search(line, m, kRow)) continue;
    const std::string names = m[1];
    for (std::sregex_iterator it(names.begin(), names.end(), kName), end; it != end; ++it) {
      const std::string name = (*it)[1];
      EXPECT_EQ(documented.count(name), 0u) << name << " has two lines";
      documented[name] = m[2];
    }
  }
  ASSERT_GE(documented.size(), 40u) << "the tables were not found";
  for (const auto& [name, type] : exported) {
    auto it = documented.find(name);
    if (it == documented.end()) {
      ADD_FAILURE() << name << " (" << type << ") is exported but has no line in operations.md";
    } else {
      EXPECT_EQ(it->second, type) << name;
    }
  }
  for (const auto& [name, type] : documented) {
    EXPECT_EQ(exported.count(name), 1u) << "operations.md lists " << name << ", not exported";
  }
}

// A replicated cluster (3 servers, every shard on 2, shard 0: primary 0, backup 1): the
// replication families of /metrics follow forwards, a backup that does not answer (lag,
// pending forwards, repair), a catch-up copy to server 2 and a promotion.
class ReplicatedMetricsTest : public testing::ClusterTest {
 protected:
  static constexpr uint32_t kShards = 3;
  ReplicatedMetricsTest() : ClusterTest("replicated-metrics", kShards) {}

  server::ServerOptions Options(uint32_t id) const override {
    server::ServerOptions o = ClusterTest::Options(id);
    o.metrics_port = 0;
    o.worker_threads = 4;
    // The default: a loaded CI host must not fail the writes that should succeed; the paused
    // backup's write fails after it.
    o.replication_timeout = std::chrono::milliseconds(2000);
    return o;
  }

  Scrape ScrapeOf(int id) {
    std::string body = HttpGet(servers_[id]->metrics_port(), "/metrics");
    EXPECT_FALSE(body.empty()) << "no answer from server " << id << "'s /metrics";
    return Parse(body);
  }
};

TEST_F(ReplicatedMetricsTest, LagRepairAndCatchUpMove) {
  PickPorts(3);
  std::vector<std::string> addrs;
  for (int i = 0; i < 3; ++i) addrs.push_back("127.0.0.1:" + std::to_string(ports_[i]));
  map_ = cluster::MakeUniformMap(addrs, kShards, 2);
  StartServers(3);
  ASSERT_EQ(map_.OwnerOf(0), 0u);
  ASSERT_EQ(map_.backups[0], std::vector<uint32_t>{1});
  auto client = NewClient(0);
  ASSERT_NE(client, nullptr);
  const std::string backup1 = R"({backup="1"})";

  // Forwards: counted on the primary, applied on the backup; nothing left pending.
  constexpr int kWrites = 30;
  for (int i = 0; i < kWrites; ++i) {
    ASSERT_TRUE(client->Put(KeyIn(0, i, "m"), "v" + std::to_string(i)).ok());
  }
  Scrape primary = ScrapeOf(0);
  EXPECT_GE(primary.at("rdkv_replication_forwarded_writes_total"), kWrites);
  EXPECT_GE(primary.at("rdkv_replication_batches_sent_total"), 1);
  EXPECT_GE(primary.at("rdkv_replication_batched_writes_total"), kWrites);
  EXPECT_EQ(primary.types["rdkv_replication_pending_forwards"], "gauge");
  EXPECT_EQ(primary.at("rdkv_replication_pending_forwards" + backup1), 0);
  EXPECT_EQ(primary.at("rdkv_replication_lag_seconds" + backup1), 0);
  EXPECT_EQ(primary.at("rdkv_replication_backup_connected" + backup1), 1);
  EXPECT_EQ(primary.at("rdkv_replication_repairs_pending"), 0);
  EXPECT_GE(ScrapeOf(1).at("rdkv_replication_applied_total"), kWrites);

  // The backup stops taking requests: a write waits for it (pending, lag grows), fails after
  // the replication timeout and is kept for repair.
  servers_[1]->PauseWorkers(true);
  Status stalled;
  std::thread writer([&] {
    // Longer than the replication timeout (the primary fails the forward first).
    ClientOptions patient;
    patient.op_timeout = 3s;
    auto c = NewClient(0, patient);
    stalled =
        c == nullptr ? Status::Internal("no client") : c->Put(KeyIn(0, 999, "m"), "x").status();
  });
  double pending = 0, lag = 0;
  for (auto until = std::chrono::steady_clock::now() + 5s;
       std::chrono::steady_clock::now() < until && (pending < 1 || lag <= 0);) {
    Scrape s = ScrapeOf(0);
    pending = s.at("rdkv_replication_pending_forwards" + backup1);
    lag = s.at("rdkv_replication_lag_seconds" + backup1);
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_GE(pending, 1) << "no pending forward seen while the backup was paused";
  EXPECT_GT(lag, 0) << "no lag seen while the backup was paused";
  writer.join();
  EXPECT_FALSE(stalled.ok()) << "the write was acknowledged without its paused backup";
  for (auto until = std::chrono::steady_clock::now() + 10s;
       std::chrono::steady_clock::now() < until;) {
    primary = ScrapeOf(0);
    if (primary.at("rdkv_replication_repairs_noted_total") >= 1) break;
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_GE(primary.at("rdkv_replication_forward_errors_total"), 1);
  EXPECT_GE(primary.at("rdkv_replication_repairs_noted_total"), 1);
  EXPECT_GE(primary.at("rdkv_replication_repairs_pending"), 1);
  // Back: the repair pass brings the write to the backup.
  servers_[1]->PauseWorkers(false);
  for (auto until = std::chrono::steady_clock::now() + 10s;
       std::chrono::steady_clock::now() < until;) {
    primary = ScrapeOf(0);
    if (primary.at("rdkv_replication_repairs_pending") == 0) break;
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_EQ(primary.at("rdkv_replication_repairs_pending"), 0);
  EXPECT_GE(primary.at("rdkv_replication_repairs_done_total") +
                primary.at("rdkv_replication_repairs_dropped_total"),
            1);
  EXPECT_EQ(primary.at("rdkv_replication_pending_forwards" + backup1), 0);

  // Catch-up: server 2 becomes a replica of shard 0; the primary's scan went through the whole
  // index, server 2 took at least every copied item.
  Admin admin(*client);
  auto added = admin.AddReplica(0, 2, nullptr);
  ASSERT_TRUE(added.ok()) << added.status().ToString();
  ASSERT_GT(added->items_copied, 0u);
  primary = ScrapeOf(0);
  EXPECT_GE(primary.at("rdkv_shard_scan_items_total"), added->items_copied);
  EXPECT_EQ(primary.at(R"(rdkv_shard_scan_progress_ratio{shard="0"})"), 1);
  Scrape joined = ScrapeOf(2);
  EXPECT_GE(joined.at("rdkv_catchup_items_applied_total"), added->items_copied);
  EXPECT_EQ(joined.at("rdkv_shards_joining"), 0);
  EXPECT_GE(joined.at("rdkv_shards_backup"), 1);

  // A promotion: server 1 takes shard 0 over from server 0.
  EXPECT_EQ(ScrapeOf(1).at("rdkv_promotions_total"), 0);
  auto promoted = admin.Promote(0, 1, nullptr);
  ASSERT_TRUE(promoted.ok()) << promoted.status().ToString();
  EXPECT_EQ(ScrapeOf(1).at("rdkv_promotions_total"), 1);
  EXPECT_EQ(ScrapeOf(0).at("rdkv_promotions_total"), 0);
  EXPECT_EQ(ScrapeOf(0).at("rdkv_fences_total"), 0);
}

TEST(ClientMetricsTest, SamplesAndTextFormat) {
  ClientStats stats;
  stats.gets = 7;
  stats.writes = 3;
  stats.reconnects = 1;
  std::vector<MetricSample> samples = ClientMetricSamples(stats);
  ASSERT_EQ(samples.size(), sizeof(ClientStats) / sizeof(uint64_t));  // one per field
  std::set<std::string> names;
  for (const MetricSample& m : samples) {
    EXPECT_EQ(m.name.rfind("rdkv_client_", 0), 0u) << m.name;
    EXPECT_EQ(m.name.substr(m.name.size() - 6), "_total") << m.name;
    EXPECT_FALSE(m.help.empty()) << m.name;
    names.insert(m.name);
  }
  EXPECT_EQ(names.size(), samples.size()) << "names repeat";

  Scrape text = Parse(ClientMetricsText(stats, R"(app="test")"));
  EXPECT_EQ(text.types["rdkv_client_gets_total"], "counter");
  EXPECT_EQ(text.at(R"(rdkv_client_gets_total{app="test"})"), 7);
  EXPECT_EQ(text.at(R"(rdkv_client_writes_total{app="test"})"), 3);
  EXPECT_EQ(text.at(R"(rdkv_client_reconnects_total{app="test"})"), 1);
  EXPECT_EQ(Parse(ClientMetricsText(stats)).at("rdkv_client_gets_total"), 7);
}

TEST_F(MetricsTest, ClientCountersFollowTheClientsCalls) {
  ASSERT_TRUE(client_->Put("a", "1").ok());
  ASSERT_TRUE(client_->Get("a").ok());
  Scrape text = Parse(ClientMetricsText(client_->stats()));
  EXPECT_EQ(text.at("rdkv_client_writes_total"), 1);
  EXPECT_EQ(text.at("rdkv_client_gets_total"), 1);
  EXPECT_GE(text.at("rdkv_client_get_reads_total"), 1);
  // One GET: at least one round trip, and never more round trips than READs.
  EXPECT_GE(text.at("rdkv_client_get_round_trips_total"), 1);
  EXPECT_LE(text.at("rdkv_client_get_round_trips_total"), text.at("rdkv_client_get_reads_total"));
}

}  // namespace
}  // namespace rdkv

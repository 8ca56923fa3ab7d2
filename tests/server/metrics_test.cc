// kvserver's Prometheus /metrics (server/metrics.h): a real in-process server on a free port,
// scraped with a plain HTTP GET; the Grafana dashboard's queries name only exported metrics;
// the client library's registry hook (ClientMetricSamples / ClientMetricsText).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
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

#include "rdkv/client.h"
#include "server/server.h"

namespace rdkv {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

// GET http://127.0.0.1:<port><path>; the body, or "" on any failure.
std::string HttpGet(uint16_t port, const std::string& path) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string response;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
    const std::string request =
        "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    if (write(fd, request.data(), request.size()) == static_cast<ssize_t>(request.size())) {
      char buf[65536];
      ssize_t n;
      while ((n = read(fd, buf, sizeof buf)) > 0) response.append(buf, static_cast<size_t>(n));
    }
  }
  close(fd);
  if (response.rfind("HTTP/1.", 0) != 0 || response.find(" 200 ") == std::string::npos) return "";
  size_t body = response.find("\r\n\r\n");
  return body == std::string::npos ? "" : response.substr(body + 4);
}

// One scrape: every sample by its series (name and labels as printed) and every family's type.
struct Scrape {
  std::map<std::string, double> samples;     // `rdkv_items` or `rdkv_requests_total{op="put",...}`
  std::map<std::string, std::string> types;  // family name -> counter, gauge, histogram, ...

  double at(const std::string& series) const {
    auto it = samples.find(series);
    return it == samples.end() ? -1 : it->second;
  }
};

// Parses the text exposition format, failing the test on a line that is not in it.
Scrape Parse(const std::string& text) {
  Scrape s;
  static const std::regex kSample(R"(^([a-zA-Z_:][a-zA-Z0-9_:]*(\{[^}]*\})?) (\S+)$)");
  static const std::regex kType(R"(^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (\w+)$)");
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    std::smatch m;
    if (line.empty() || line.rfind("# HELP ", 0) == 0) continue;
    if (std::regex_match(line, m, kType)) {
      s.types[m[1]] = m[2];
    } else if (std::regex_match(line, m, kSample)) {
      s.samples[m[1]] = std::strtod(m[3].str().c_str(), nullptr);
    } else {
      ADD_FAILURE() << "not exposition format: '" << line << "'";
    }
  }
  return s;
}

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

TEST_F(MetricsTest, OffUnlessAPortIsGiven) {
  server::ServerOptions o;
  o.port = 0;
  o.memory_bytes = 16ull << 20;
  o.huge_pages = false;
  auto s = server::Server::Start(o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ((*s)->metrics_port(), 0);
}

// Every metric a query of deploy/grafana/rdkv-dashboard.json names is one the server exports
// (a histogram's _bucket/_sum/_count series by its family).
TEST_F(MetricsTest, DashboardQueriesNameExportedMetrics) {
  ASSERT_TRUE(client_->Put("k", "v").ok());  // every family has a sample
  Scrape scrape = ScrapeServer();
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

TEST(ClientMetricsTest, SamplesAndTextFormat) {
  ClientStats stats;
  stats.gets = 7;
  stats.writes = 3;
  stats.reconnects = 1;
  std::vector<MetricSample> samples = ClientMetricSamples(stats);
  ASSERT_EQ(samples.size(), 10u);  // one per ClientStats field
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
}

}  // namespace
}  // namespace rdkv

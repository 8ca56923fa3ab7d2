// kvbench end to end against a real rdkv cluster (three servers in this process, one cluster
// map, tcp transport on loopback; the client routes each key to its owner):
// every supported workload (A, B, C, D, F) loads and runs briefly through the rdkv backend; the
// counts add up and no operation fails; after D the latest inserts are readable. Then the
// kvbench binary itself runs against the server and its YCSB text and JSON output are parsed
// back.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "bench/kvbench/db.h"
#include "bench/kvbench/driver.h"
#include "bench/kvbench/report.h"
#include "common/cluster/cluster_map.h"
#include "rdkv/client.h"
#include "server/server.h"
#include "tests/support/cluster_fixture.h"

namespace rdkv::kvbench {
namespace {

const std::string kWorkloads = KVBENCH_WORKLOADS_DIR;

// Three servers sharing one cluster map; port() is the seed's. Each has a data dir under
// `root` for its newest map (durability none), removed with the cluster.
struct LocalCluster {
  std::string root;
  std::vector<std::unique_ptr<server::Server>> servers;
  ~LocalCluster() {
    servers.clear();
    std::error_code ec;
    std::filesystem::remove_all(root, ec);
  }
  uint16_t port() const { return servers.front()->port(); }
  // Every server holds some of the keys.
  void ExpectKeysOnEveryServer() const {
    for (size_t i = 0; i < servers.size(); ++i) {
      EXPECT_GT(servers[i]->stats().items, 0u) << "server " << i << " got no keys";
    }
  }
};

std::unique_ptr<LocalCluster> StartServer() {
  std::vector<std::string> addresses;
  std::vector<uint16_t> ports;
  for (int i = 0; i < 3; ++i) {
    ports.push_back(testing::FreePort());
    addresses.push_back("127.0.0.1:" + std::to_string(ports.back()));
  }
  cluster::ClusterMap map = cluster::MakeUniformMap(addresses, 16);
  auto c = std::make_unique<LocalCluster>();
  c->root = testing::MakeTempDir("kvbench");
  for (uint32_t i = 0; i < 3; ++i) {
    server::ServerOptions o;
    o.port = ports[i];
    o.memory_bytes = 64ull << 20;
    o.huge_pages = false;
    o.cluster_map = map;
    o.server_id = i;
    o.persist.data_dir = c->root + "/server-" + std::to_string(i);
    auto s = testing::StartServerRetrying(o);
    if (s == nullptr) return nullptr;
    c->servers.push_back(std::move(s));
  }
  return c;
}

Properties Props(const std::string& file, uint16_t port) {
  Properties p;
  EXPECT_TRUE(p.LoadFile(kWorkloads + "/" + file).ok());
  p.Set("recordcount", "300", "-p");
  p.Set("operationcount", "2000", "-p");
  p.Set("threadcount", "2", "-p");
  p.Set("status.interval", "0", "-p");
  p.Set("rdkv.seed", "127.0.0.1:" + std::to_string(port), "-p");
  p.Set("rdkv.transport", "tcp", "-p");
  return p;
}

const OpSummary* Find(const Report& r, const std::string& name) {
  for (const auto& op : r.ops) {
    if (op.name == name) return &op;
  }
  return nullptr;
}

uint64_t Ops(const Report& r, const std::string& name) {
  const OpSummary* op = Find(r, name);
  return op ? op->operations : 0;
}

double BackendValue(const Report& r, const std::string& name) {
  for (const auto& [n, v] : r.backend_values) {
    if (n == name) return v;
  }
  return -1;
}

TEST(KvbenchE2E, EveryWorkloadAgainstRdkv) {
  for (const char* file : {"workloada", "workloadb", "workloadc", "workloadd", "workloadf"}) {
    SCOPED_TRACE(file);
    auto server = StartServer();
    ASSERT_TRUE(server);
    const Properties props = Props(file, server->port());
    auto config = ParseWorkload(props);
    ASSERT_TRUE(config.ok()) << config.status().ToString();
    auto backend = MakeBackend("rdkv", props);
    ASSERT_TRUE(backend.ok()) << backend.status().ToString();
    CoreWorkload w(*config);

    DriverOptions load;
    load.phase = Phase::kLoad;
    load.status_out = nullptr;
    auto lr = RunPhase(w, **backend, load);
    ASSERT_TRUE(lr.ok()) << lr.status().ToString();
    EXPECT_EQ(lr->operations, 300u);
    ASSERT_NE(Find(*lr, "INSERT"), nullptr);
    EXPECT_EQ(Find(*lr, "INSERT")->returns.at("OK"), 300u);
    EXPECT_TRUE(lr->errors.empty()) << FormatText(*lr);
    server->ExpectKeysOnEveryServer();

    DriverOptions run;
    run.status_out = nullptr;
    auto rr = RunPhase(w, **backend, run);
    ASSERT_TRUE(rr.ok()) << rr.status().ToString();
    const Report& r = *rr;
    EXPECT_EQ(r.operations, 2000u);
    EXPECT_TRUE(r.errors.empty()) << FormatText(r);
    for (const auto& op : r.ops) {
      EXPECT_EQ(op.returns.at("OK"), op.operations) << op.name << "\n" << FormatText(r);
      EXPECT_EQ(op.name.find("FAILED"), std::string::npos) << op.name;
    }
    const uint64_t reads = Ops(r, "READ"), updates = Ops(r, "UPDATE"), inserts = Ops(r, "INSERT"),
                   rmws = Ops(r, "READ-MODIFY-WRITE");
    if (config->readmodifywriteproportion > 0) {
      EXPECT_EQ(reads, 2000u);
      EXPECT_EQ(updates, rmws);
    } else {
      EXPECT_EQ(reads + updates + inserts, 2000u);
    }
    // rdkv's own figures: every GET took at least one READ.
    EXPECT_EQ(BackendValue(r, "GETs"), double(reads));
    EXPECT_GE(BackendValue(r, "READsPerGET"), 1.0);
    // Round trips: at least one per GET, never more than its READs (a batch holds one or more).
    EXPECT_GE(BackendValue(r, "RTTsPerGET"), 1.0);
    EXPECT_LE(BackendValue(r, "RTTsPerGET"), BackendValue(r, "READsPerGET"));
    EXPECT_EQ(BackendValue(r, "ClientErrors"), 0.0);

    if (config->insertproportion > 0) {
      ASSERT_GT(inserts, 0u);
      EXPECT_EQ(w.LastAcknowledged(), 300 + static_cast<int64_t>(inserts) - 1);
      ClientOptions co;
      co.seed = "127.0.0.1:" + std::to_string(server->port());
      co.transport = "tcp";
      auto client = Client::Connect(co);
      ASSERT_TRUE(client.ok()) << client.status().ToString();
      for (int64_t k = 300; k <= w.LastAcknowledged(); ++k) {
        const std::string key = w.BuildKeyName(k);
        auto got = (*client)->Get(key);
        ASSERT_TRUE(got.ok()) << key << ": " << got.status().ToString();
        EXPECT_TRUE(w.CheckValue(key, got->value)) << key;
      }
    }
  }
}

struct CliRun {
  int status = -1;
  std::string out;
};

CliRun Kvbench(const std::string& args) {
  CliRun r;
  const std::string cmd = std::string(KVBENCH_BIN) + " " + args + " 2>/dev/null";
  std::FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

TEST(KvbenchE2E, BinaryOutputParsesBack) {
  auto server = StartServer();
  ASSERT_TRUE(server);
  const std::string common = " -db rdkv -P " + kWorkloads + "/workloadb -p recordcount=200 " +
                             "-p operationcount=1000 -threads 2 -p rdkv.transport=tcp " +
                             "-p rdkv.seed=127.0.0.1:" + std::to_string(server->port());
  CliRun load = Kvbench("load" + common);
  ASSERT_EQ(load.status, 0) << load.out;
  auto ll = ParseYcsbText(load.out);
  EXPECT_EQ(FindMetric(ll, "INSERT", "Return=OK"), 200.0) << load.out;

  CliRun run = Kvbench("run" + common);
  ASSERT_EQ(run.status, 0) << run.out;
  auto rl = ParseYcsbText(run.out);
  EXPECT_EQ(FindMetric(rl, "OVERALL", "Operations"), 1000.0) << run.out;
  ASSERT_TRUE(FindMetric(rl, "OVERALL", "RunTime(ms)").has_value()) << run.out;
  EXPECT_GT(*FindMetric(rl, "OVERALL", "Throughput(ops/sec)"), 0);
  const double reads = FindMetric(rl, "READ", "Operations").value_or(-1);
  const double updates = FindMetric(rl, "UPDATE", "Operations").value_or(-1);
  EXPECT_EQ(reads + updates, 1000.0) << run.out;
  EXPECT_EQ(FindMetric(rl, "READ", "Return=OK"), reads);
  EXPECT_EQ(FindMetric(rl, "UPDATE", "Return=OK"), updates);
  for (const char* m :
       {"AverageLatency(us)", "MinLatency(us)", "MaxLatency(us)", "50thPercentileLatency(us)",
        "95thPercentileLatency(us)", "99thPercentileLatency(us)", "99.9thPercentileLatency(us)"}) {
    ASSERT_TRUE(FindMetric(rl, "READ", m).has_value()) << m;
    EXPECT_GT(*FindMetric(rl, "READ", m), 0) << m;
  }
  EXPECT_LE(*FindMetric(rl, "READ", "MinLatency(us)"),
            *FindMetric(rl, "READ", "50thPercentileLatency(us)"));
  EXPECT_LE(*FindMetric(rl, "READ", "99thPercentileLatency(us)"),
            *FindMetric(rl, "READ", "MaxLatency(us)"));
  EXPECT_GE(FindMetric(rl, "RDKV", "READsPerGET").value_or(0), 1.0) << run.out;
  EXPECT_TRUE(FindMetric(rl, "RDKV", "GETRetries").has_value());

  CliRun json = Kvbench("run --json" + common);
  ASSERT_EQ(json.status, 0) << json.out;
  const auto j = nlohmann::json::parse(json.out);
  EXPECT_EQ(j["overall"]["operations"], 1000);
  EXPECT_EQ(j["db"], "rdkv");
  EXPECT_GE(j["rdkv"]["READsPerGET"].get<double>(), 1.0);
  EXPECT_EQ(j["operations"]["READ"]["return"]["OK"], j["operations"]["READ"]["operations"]);

  // Loading the same records again: rdkv's Insert refuses present keys; kvbench says so.
  CliRun again = Kvbench("load" + common);
  EXPECT_EQ(again.status, 3) << again.out;
  auto al = ParseYcsbText(again.out);
  EXPECT_EQ(FindMetric(al, "INSERT", "Return=ERROR"), 200.0) << again.out;
  EXPECT_EQ(FindMetric(al, "ERRORS", "AlreadyExists"), 200.0) << again.out;
}

}  // namespace
}  // namespace rdkv::kvbench

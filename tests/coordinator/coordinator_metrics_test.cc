// kvcoord's Prometheus /metrics (coordinator/coordinator.h, common/metrics/metrics_http.h):
// the families of a CoordinatorStats as a scrape sees them (no etcd), and a running
// Coordinator with a metrics port against a real etcd (SKIPPED where etcd is not installed).
#include <gtest/gtest.h>

#include <unistd.h>
#include <chrono>
#include <string>
#include <thread>

#include "common/cluster/cluster_map.h"
#include "common/cluster/etcd_map.h"
#include "common/metrics/metrics_http.h"
#include "coordinator/coordinator.h"
#include "tests/support/etcd_fixture.h"
#include "tests/support/scrape.h"

namespace rdkv::coordinator {
namespace {

using namespace std::chrono_literals;
using rdkv::testing::HttpGet;
using rdkv::testing::ParseExposition;
using rdkv::testing::Scrape;

TEST(CoordinatorMetrics, FamiliesAreExposedWithTheirTypesAndValues) {
  CoordinatorStats st;
  st.leader = true;
  st.terms = 2;
  st.maps_committed = 5;
  st.servers_failed = 3;
  st.shards_promoted = 4;
  st.probe_revocations = 1;
  st.replicas_added = 6;
  st.replica_errors = 7;
  st.replica_running = true;
  st.map_epoch = 42;
  st.stranded_shards = 1;
  st.under_replicated_shards = 2;
  AtomicHistogram decisions(AtomicHistogram::LatencySecondsBounds());
  decisions.Observe(0.012);
  decisions.Observe(0.020);
  st.decision_seconds = decisions.Snapshot();
  AtomicHistogram copies({1, 10});
  copies.Observe(3);
  st.rereplication_seconds = copies.Snapshot();

  auto http = metrics::MetricsHttp::Start(
      "127.0.0.1", 0, metrics::MakeCollector([st] { return CoordinatorMetricFamilies(st); }));
  ASSERT_TRUE(http.ok()) << http.status().ToString();
  ASSERT_NE((*http)->port(), 0);
  std::string body = HttpGet((*http)->port(), "/metrics");
  ASSERT_FALSE(body.empty()) << "no answer from /metrics";
  Scrape s = ParseExposition(body);
  EXPECT_EQ(s.types["rdkv_coordinator_is_leader"], "gauge");
  EXPECT_EQ(s.types["rdkv_coordinator_failovers_total"], "counter");
  EXPECT_EQ(s.types["rdkv_coordinator_decision_duration_seconds"], "histogram");
  EXPECT_EQ(s.at("rdkv_coordinator_is_leader"), 1);
  EXPECT_EQ(s.at("rdkv_coordinator_terms_total"), 2);
  EXPECT_EQ(s.at("rdkv_coordinator_decisions_total"), 5);
  EXPECT_EQ(s.at("rdkv_coordinator_failovers_total"), 3);
  EXPECT_EQ(s.at("rdkv_coordinator_promotions_total"), 4);
  EXPECT_EQ(s.at("rdkv_coordinator_probe_revocations_total"), 1);
  EXPECT_EQ(s.at("rdkv_coordinator_rereplications_total"), 6);
  EXPECT_EQ(s.at("rdkv_coordinator_rereplication_errors_total"), 7);
  EXPECT_EQ(s.at("rdkv_coordinator_rereplication_running"), 1);
  EXPECT_EQ(s.at("rdkv_coordinator_map_epoch"), 42);
  EXPECT_EQ(s.at("rdkv_coordinator_stranded_shards"), 1);
  EXPECT_EQ(s.at("rdkv_coordinator_under_replicated_shards"), 2);
  EXPECT_EQ(s.at("rdkv_coordinator_decision_duration_seconds_count"), 2);
  EXPECT_EQ(s.at(R"(rdkv_coordinator_decision_duration_seconds_bucket{le="0.025"})"), 2);
  EXPECT_EQ(s.at(R"(rdkv_coordinator_decision_duration_seconds_bucket{le="0.01"})"), 0);
  EXPECT_NEAR(s.at("rdkv_coordinator_decision_duration_seconds_sum"), 0.032, 1e-9);
  EXPECT_EQ(s.at(R"(rdkv_coordinator_rereplication_duration_seconds_bucket{le="10"})"), 1);
}

TEST(CoordinatorMetrics, AnAddressInUseIsAClearError) {
  auto first = metrics::MetricsHttp::Start(
      "127.0.0.1", 0, metrics::MakeCollector([] { return CoordinatorMetricFamilies({}); }));
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  auto second = metrics::MetricsHttp::Start(
      "127.0.0.1", (*first)->port(),
      metrics::MakeCollector([] { return CoordinatorMetricFamilies({}); }));
  ASSERT_FALSE(second.ok());
  EXPECT_TRUE(second.status().Is(StatusCode::kUnavailable)) << second.status().ToString();
  EXPECT_NE(second.status().message().find("/metrics"), std::string::npos);
}

// A Coordinator with a metrics port, elected in a real etcd, commits its first map (it marks
// the imported map coordinated) and its scrape says so.
TEST(CoordinatorMetrics, ARunningCoordinatorExportsItsElectionAndDecision) {
  rdkv::testing::EtcdCluster etcd(1);
  RDKV_REQUIRE_ETCD(etcd);
  const std::string name = "metrics" + std::to_string(getpid());
  etcd::EtcdOptions eo;
  eo.endpoints = etcd.endpoints();
  auto client = etcd::EtcdClient::Create(eo);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  cluster::ClusterMap map =
      cluster::MakeUniformMap({"127.0.0.1:1", "127.0.0.1:2"}, /*shards=*/4, /*r=*/2);
  ASSERT_TRUE(cluster::ImportMap(**client, name, map).ok());

  CoordinatorOptions o;
  o.etcd = eo;
  o.cluster_name = name;
  o.probe_interval = 0ms;
  o.rereplicate = false;
  o.metrics_port = 0;
  auto c = Coordinator::Start(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_NE((*c)->metrics_port(), 0);
  Scrape s;
  for (auto until = std::chrono::steady_clock::now() + 15s;
       std::chrono::steady_clock::now() < until;) {
    s = ParseExposition(HttpGet((*c)->metrics_port(), "/metrics"));
    if (s.at("rdkv_coordinator_decisions_total") >= 1) break;
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_EQ(s.at("rdkv_coordinator_is_leader"), 1);
  EXPECT_EQ(s.at("rdkv_coordinator_terms_total"), 1);
  EXPECT_EQ(s.at("rdkv_coordinator_decisions_total"), 1);
  EXPECT_EQ(s.at("rdkv_coordinator_decision_duration_seconds_count"), 1);
  EXPECT_EQ(s.at("rdkv_coordinator_map_epoch"), static_cast<double>(map.epoch + 1));
  EXPECT_EQ(s.at("rdkv_coordinator_failovers_total"), 0);
  EXPECT_EQ(s.at("rdkv_coordinator_stranded_shards"), 0);
  EXPECT_EQ(s.at("rdkv_coordinator_under_replicated_shards"), 0);
  (*c)->Stop();
  // Stopped: it left the election; /metrics serves until the Coordinator goes.
  s = ParseExposition(HttpGet((*c)->metrics_port(), "/metrics"));
  EXPECT_EQ(s.at("rdkv_coordinator_is_leader"), 0);
  EXPECT_EQ(s.at("rdkv_coordinator_decisions_total"), 1);
}

}  // namespace
}  // namespace rdkv::coordinator

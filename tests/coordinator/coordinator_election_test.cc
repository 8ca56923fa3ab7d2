// The coordinator's election against a real etcd through tests/support/tcp_proxy.h: an
// election whose transaction applied but whose answer was lost is still won (SKIPPED where
// etcd is not installed).
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>

#include "common/cluster/cluster_map.h"
#include "common/cluster/etcd_map.h"
#include "coordinator/coordinator.h"
#include "tests/support/etcd_fixture.h"
#include "tests/support/tcp_proxy.h"

namespace rdkv::coordinator {
namespace {

using namespace std::chrono_literals;

// The election's PutIf creates the key under the coordinator's lease, and the connection breaks
// before the answer: the client reports an unknown outcome. The next try finds the key taken,
// by its own lease. Before the fix it took that for another coordinator and never led, while
// its own lease kept every other coordinator out: no failover anywhere.
TEST(CoordinatorElection, AnElectionWhoseAnswerWasLostIsWonOnTheNextTry) {
  rdkv::testing::EtcdCluster etcd(1);
  RDKV_REQUIRE_ETCD(etcd);
  const std::string name = "election" + std::to_string(getpid());
  etcd::EtcdOptions direct;
  direct.endpoints = etcd.endpoints();
  auto client = etcd::EtcdClient::Create(direct);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  cluster::ClusterMap map =
      cluster::MakeUniformMap({"127.0.0.1:1", "127.0.0.1:2"}, /*shards=*/4, /*r=*/2);
  ASSERT_TRUE(cluster::ImportMap(**client, name, map).ok());

  rdkv::testing::TcpProxy proxy(rdkv::testing::PortOf(etcd.endpoint(0)));
  ASSERT_TRUE(proxy.ok());
  proxy.DropAnswerTo("/v3/kv/txn");  // the coordinator's first transaction is its election
  CoordinatorOptions o;
  o.etcd.endpoints = {proxy.endpoint()};
  o.cluster_name = name;
  o.probe_interval = 0ms;
  o.rereplicate = false;
  auto c = Coordinator::Start(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  bool leader = false;
  for (auto until = std::chrono::steady_clock::now() + 10s;
       !leader && std::chrono::steady_clock::now() < until;) {
    leader = (*c)->stats().leader;
    if (!leader) std::this_thread::sleep_for(50ms);
  }
  EXPECT_EQ(proxy.answers_dropped(), 1);
  EXPECT_TRUE(leader) << "the coordinator holds the election key but does not lead";
  EXPECT_EQ((*c)->stats().terms, 1u);
  // It acts as the leader: it marks the imported map coordinated (its first decision).
  bool decided = false;
  for (auto until = std::chrono::steady_clock::now() + 10s;
       !decided && std::chrono::steady_clock::now() < until;) {
    decided = (*c)->stats().maps_committed >= 1;
    if (!decided) std::this_thread::sleep_for(50ms);
  }
  EXPECT_TRUE(decided);
  (*c)->Stop();
}

}  // namespace
}  // namespace rdkv::coordinator

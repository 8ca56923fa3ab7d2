// The control plane in etcd (docs/design.md "Control plane"): three in-process servers over tcp
// whose cluster map lives in a real etcd. The map is read from etcd, every server registers
// under a lease and installs each new epoch from its watch; map changes are transactions on the
// map's revision; a server that cannot renew its lease fences itself and serves again once etcd
// is back; a server takes a shard from another primary only after that one released it.
#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "common/etcd/etcd_client.h"
#include "common/kv/admin_wire.h"
#include "rdkv/admin.h"
#include "server/control_plane.h"
#include "tests/support/cluster_fixture.h"
#include "tests/support/etcd_fixture.h"
#include "tests/support/tcp_proxy.h"

namespace rdkv {
namespace {

using testing::ClusterTest;
using Clock = std::chrono::steady_clock;

constexpr uint32_t kShards = 6;

class EtcdClusterTest : public ClusterTest {
 protected:
  EtcdClusterTest() : ClusterTest("etcd-cluster", kShards) {}

  void SetUp() override {
    ClusterTest::SetUp();
    etcd_ = std::make_unique<testing::EtcdCluster>(1);
    if (!etcd_->installed())
      GTEST_SKIP() << "SKIPPED: etcd not installed (deploy/install-deps.sh installs it)";
    ASSERT_TRUE(etcd_->started()) << etcd_->error();
    etcd::EtcdOptions eo;
    eo.endpoints = etcd_->endpoints();
    eo.request_timeout = std::chrono::milliseconds(1000);
    auto c = etcd::EtcdClient::Create(eo);
    ASSERT_TRUE(c.ok());
    client_ = std::move(*c);
  }
  void TearDown() override {
    for (auto& s : servers_) s.reset();
    ClusterTest::TearDown();
  }

  // Servers 0..2, R = `r`, the map imported into etcd.
  void StartWithEtcd(uint32_t r) {
    PickPorts(3);
    std::vector<std::string> addrs;
    for (int i = 0; i < 3; ++i) addrs.push_back("127.0.0.1:" + std::to_string(ports_[i]));
    map_ = cluster::MakeUniformMap(addrs, kShards, r);
    ASSERT_TRUE(server::ImportMap(*client_, kCluster, map_).ok());
    StartServers(3);
  }

  server::ServerOptions Options(uint32_t id) const override {
    server::ServerOptions o = ClusterTest::Options(id);
    o.cluster_map.reset();
    o.etcd_endpoints = server_etcd_.empty() ? etcd_->endpoints() : server_etcd_;
    o.etcd_cluster_name = kCluster;
    o.etcd_lease_ttl_seconds = 2;
    o.worker_threads = 8;
    return o;
  }

  // map_'s successor (epoch 2) that promotes `shard`'s first backup.
  cluster::ClusterMap Promoting(uint32_t shard) const {
    cluster::ClusterMap m = map_;
    m.NormalizeReplicas();
    m.epoch = 2;
    std::swap(m.owners[shard], m.backups[shard][0]);
    return m;
  }
  uint64_t EtcdEpoch() {
    auto m = server::LoadMap(*client_, kCluster);
    return m.ok() ? m->map.epoch : 0;
  }
  // The registration of server `id` (null JSON when absent or etcd is down).
  nlohmann::json Registration(uint32_t id) {
    auto got = client_->Get(server::ServerKey(kCluster, id));
    if (!got.ok() || !got->kv) return nullptr;
    return nlohmann::json::parse(got->kv->value, nullptr, false);
  }
  // Waits until every server reports map epoch `epoch` (CLUSTER_MAP), up to `limit`.
  bool AllAtEpoch(uint64_t epoch, std::chrono::milliseconds limit = std::chrono::seconds(10)) {
    const Clock::time_point end = Clock::now() + limit;
    while (Clock::now() < end) {
      bool all = true;
      for (int id = 0; id < 3 && all; ++id) {
        kv::Response r = Call(id, kv::EncodeMapFetch({}));
        all = r.status.ok() && r.version == epoch;
      }
      if (all) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }

  static constexpr const char* kCluster = "test";
  std::unique_ptr<testing::EtcdCluster> etcd_;
  std::unique_ptr<etcd::EtcdClient> client_;
  std::vector<std::string> server_etcd_;  // the servers' --etcd when not etcd_'s own
  std::vector<uint8_t> buf_a_, buf_b_;
};

TEST_F(EtcdClusterTest, ServersTakeTheMapFromEtcdAndRegister) {
  StartWithEtcd(2);
  for (uint32_t id = 0; id < 3; ++id) {
    nlohmann::json reg = Registration(id);
    ASSERT_TRUE(reg.is_object()) << "server " << id << " is not registered";
    EXPECT_EQ(reg["address"], "127.0.0.1:" + std::to_string(ports_[id]));
    EXPECT_EQ(reg["epoch"], 1);
  }
  auto c = NewClient(1);
  ASSERT_TRUE(c->Put("a", "1").ok());
  auto got = c->Get("a");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->value, "1");
  // A second import is refused: the map is changed by the cluster commands.
  EXPECT_TRUE(server::ImportMap(*client_, kCluster, map_).Is(StatusCode::kAlreadyExists));
  // A stopped server's registration goes with its lease.
  servers_[2].reset();
  EXPECT_TRUE(Registration(2).is_null());
}

TEST_F(EtcdClusterTest, PromotionCommitsToEtcdAndEveryServerFollows) {
  StartWithEtcd(2);
  auto c = NewClient(0);
  Admin admin(*c);
  auto r = admin.Promote(0, 1, nullptr);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(EtcdEpoch(), 2u) << "the promotion did not go through etcd";
  EXPECT_TRUE(AllAtEpoch(2));
  EXPECT_EQ(Registration(0)["released"], 2);
}

TEST_F(EtcdClusterTest, MapWrittenToEtcdIsInstalledEverywhereAndLosesNoWrite) {
  StartWithEtcd(3);
  // Writers run while maps that move primaries arrive only through etcd (no INSTALL_MAP): the
  // servers install them from their watches in any order, and a server takes a shard only after
  // its old primary released it.
  std::atomic<bool> stop{false};
  std::vector<std::map<std::string, std::pair<std::string, uint64_t>>> acked(3);
  std::array<std::atomic<uint64_t>, 3> puts_ok{};  // per writer, for the end (below)
  std::vector<std::thread> writers;
  for (int t = 0; t < 3; ++t) {
    writers.emplace_back([&, t] {
      auto c = NewClient(t);
      for (int i = 0; !stop; ++i) {
        std::string key = "k" + std::to_string(t) + "-" + std::to_string(i % 40);
        std::string value = std::to_string(i);
        auto v = c->Put(key, value);
        if (v.ok()) {
          acked[t][key] = {value, *v};
          puts_ok[t].fetch_add(1);
        } else {
          acked[t].erase(key);
        }
      }
    });
  }
  cluster::ClusterMap m = map_;
  m.NormalizeReplicas();
  uint64_t last_epoch = 0;
  for (int round = 0; round < 4; ++round) {
    // Rounds 0 and 1 wait for every server; rounds 2 and 3 follow each other at once, so a
    // watch may deliver only the newer one (an applier that skips an epoch).
    if (round < 3) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    auto cur = server::LoadMap(*client_, kCluster);
    ASSERT_TRUE(cur.ok());
    cluster::ClusterMap next = cur->map;
    next.epoch += 1;
    for (uint32_t s = 0; s < kShards; ++s) {  // rotate: the first backup becomes primary
      std::vector<uint32_t> reps = next.ReplicasOf(s);
      std::rotate(reps.begin(), reps.begin() + 1, reps.end());
      next.owners[s] = reps[0];
      next.backups[s].assign(reps.begin() + 1, reps.end());
    }
    auto put = client_->PutIf(server::MapKey(kCluster), next.ToJson(), cur->mod_revision);
    if (!put.ok() || !put->succeeded) {
      // Stop the writers before failing (a test body left with running threads aborts).
      stop = true;
      for (auto& w : writers) w.join();
      FAIL() << "round " << round << ": writing map epoch " << next.epoch << " to etcd: "
             << (put.ok() ? "the map's mod_revision moved since it was read (another writer)"
                          : put.status().ToString());
    }
    last_epoch = next.epoch;
    if (round < 2) {
      EXPECT_TRUE(AllAtEpoch(next.epoch))
          << "epoch " << next.epoch << " did not reach every server";
    }
  }
  EXPECT_TRUE(AllAtEpoch(last_epoch)) << "epoch " << last_epoch << " did not reach every server";
  // Every writer makes a full pass over its 40 keys under the last map before they stop, however
  // slow the host (a sanitizer build beside other tests): what is checked below does not depend
  // on speed.
  std::array<uint64_t, 3> at_last_map;
  for (int t = 0; t < 3; ++t) at_last_map[t] = puts_ok[t].load();
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  for (int t = 0; t < 3; ++t) {
    while (puts_ok[t].load() < at_last_map[t] + 40 && std::chrono::steady_clock::now() < give_up) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  stop = true;
  for (auto& w : writers) w.join();
  auto reader = NewClient(2);
  size_t checked = 0;
  for (const auto& per : acked) {
    for (const auto& [key, item] : per) {
      auto got = reader->Get(key);
      ASSERT_TRUE(got.ok()) << key << ": " << got.status().ToString();
      EXPECT_EQ(got->value, item.first) << key;
      EXPECT_EQ(got->version, item.second) << key;
      ++checked;
    }
  }
  EXPECT_GT(checked, 60u);
}

TEST_F(EtcdClusterTest, TwoConcurrentMapChangesOnlyOneWins) {
  StartWithEtcd(2);
  const cluster::ClusterMap a = Promoting(0), b = Promoting(1);
  kv::Response ra, rb;
  std::thread ta(
      [&] { ra = testing::CallRaw(*Raw(2), kv::EncodeMapInstall({a.ToJson()}), &buf_a_); });
  std::thread tb(
      [&] { rb = testing::CallRaw(*Raw(2), kv::EncodeMapInstall({b.ToJson()}), &buf_b_); });
  ta.join();
  tb.join();
  EXPECT_NE(ra.status.ok(), rb.status.ok())
      << ra.status.ToString() << " / " << rb.status.ToString();
  EXPECT_EQ(EtcdEpoch(), 2u);
}

// A change computed from a map that another writer has replaced since (etcd holds a newer
// epoch, or a different map of the same epoch) lost the race: kBusy, which a promotion answers
// by starting again from the newest map (ReplicationTest.APromotionStartsAgain...).
TEST_F(EtcdClusterTest, AChangeThatLostTheMapToAnotherWriterIsBusy) {
  StartWithEtcd(2);
  const cluster::ClusterMap a = Promoting(0), b = Promoting(1);
  kv::Response first = Call(2, kv::EncodeMapInstall({a.ToJson()}));
  ASSERT_TRUE(first.status.ok()) << first.status.ToString();
  kv::Response again = Call(2, kv::EncodeMapInstall({a.ToJson()}));
  EXPECT_TRUE(again.status.ok()) << "the same map again: " << again.status.ToString();
  kv::Response different = Call(2, kv::EncodeMapInstall({b.ToJson()}));
  EXPECT_EQ(different.status.code(), StatusCode::kBusy) << different.status.ToString();
  cluster::ClusterMap c = a;
  c.epoch = 3;
  kv::Response third = Call(1, kv::EncodeMapInstall({c.ToJson()}));
  ASSERT_TRUE(third.status.ok()) << third.status.ToString();
  const cluster::ClusterMap& stale = b;  // epoch 2, computed before epoch 3 was committed
  kv::Response older = Call(0, kv::EncodeMapInstall({stale.ToJson()}));
  EXPECT_EQ(older.status.code(), StatusCode::kBusy) << older.status.ToString();
  EXPECT_NE(older.status.message().find("another writer"), std::string::npos)
      << older.status.ToString();
  EXPECT_EQ(EtcdEpoch(), 3u);
  EXPECT_TRUE(AllAtEpoch(3));
}

TEST_F(EtcdClusterTest, EtcdDownFencesThenServesAgain) {
  StartWithEtcd(2);
  auto c = NewClient(0);
  ASSERT_TRUE(c->Put("before", "x").ok());
  ASSERT_TRUE(etcd_->Stop(0));
  const Clock::time_point stopped = Clock::now();
  // Within the lease (2 s) less one ownership lease and the margin, the data path goes on.
  EXPECT_TRUE(c->Put("during", "y").ok());
  // Map changes wait for etcd, and say so.
  cluster::ClusterMap next = map_;
  next.NormalizeReplicas();
  next.epoch = 2;
  std::swap(next.owners[0], next.backups[0][0]);
  kv::Response install = Call(1, kv::EncodeMapInstall({next.ToJson()}));
  EXPECT_FALSE(install.status.ok());
  EXPECT_NE(install.status.message().find("etcd"), std::string::npos) << install.status.ToString();
  // After the lease, every server has fenced itself: no write is acknowledged, no GET served.
  std::this_thread::sleep_until(stopped + std::chrono::milliseconds(2500));
  ClientOptions quick;
  quick.op_timeout = std::chrono::milliseconds(300);
  auto q = NewClient(0, quick);
  auto w = q->Put("fenced", "z");
  EXPECT_FALSE(w.ok()) << "a fenced primary acknowledged a write";
  auto g = q->Get("before");
  EXPECT_FALSE(g.ok()) << "a fenced primary served a GET";
  // etcd back: the servers register again and serve.
  ASSERT_TRUE(etcd_->Start(0));
  const Clock::time_point back = Clock::now();
  Status put;
  while (Clock::now() - back < std::chrono::seconds(10)) {
    put = c->Put("after", "w").status();
    if (put.ok()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(put.ok()) << put.ToString();
  auto got = c->Get("during");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->value, "y");
  for (uint32_t id = 0; id < 3; ++id) EXPECT_TRUE(Registration(id).is_object()) << id;
  // /metrics' rdkv_fences_total and rdkv_fenced read these. The other servers register again
  // on their own time (one put above went through one of them): up to 10 s more for all.
  for (int id = 0; id < 3; ++id) {
    if (servers_[id] == nullptr) continue;
    const Clock::time_point until = Clock::now() + std::chrono::seconds(10);
    while (servers_[id]->stats().fenced && Clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    server::ServerStats st = servers_[id]->stats();
    EXPECT_GE(st.fences, 1u) << "server " << id << " did not count its fence";
    EXPECT_FALSE(st.fenced) << "server " << id;
  }
}

// A server fenced by a lost lease that registers again but cannot read the map (here etcd holds
// a map that does not parse) stays fenced, and unfences once the map reads again. Before, one
// failed read after the new registration left it fenced for good: it held its new lease, and
// only a server without one tried again.
TEST_F(EtcdClusterTest, AServerThatCannotReadTheMapAfterAFenceUnfencesOnceItCan) {
  StartWithEtcd(1);
  auto c = NewClient(0);
  ASSERT_TRUE(c->Put("before", "x").ok());
  const std::string key = cluster::MapKey(kCluster);
  auto good = client_->Get(key);
  ASSERT_TRUE(good.ok() && good->kv) << good.status().ToString();
  ASSERT_TRUE(client_->Put(key, "not a map").ok());  // the servers' watches log it and go on
  ASSERT_TRUE(etcd_->Stop(0));
  auto wait_all = [&](bool fenced, std::chrono::seconds limit) {
    const Clock::time_point until = Clock::now() + limit;
    for (int id = 0; id < 3; ++id) {
      while (servers_[id]->stats().fenced != fenced && Clock::now() < until) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      if (servers_[id]->stats().fenced != fenced) return false;
    }
    return true;
  };
  ASSERT_TRUE(wait_all(true, std::chrono::seconds(5))) << "the servers did not fence";
  ASSERT_TRUE(etcd_->Start(0));
  // They register again (new leases), but the map does not parse: fenced still.
  const Clock::time_point restarted = Clock::now();
  for (uint32_t id = 0; id < 3; ++id) {
    while (!Registration(id).is_object() && Clock::now() - restarted < std::chrono::seconds(10)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ASSERT_TRUE(Registration(id).is_object()) << "server " << id << " did not register again";
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  for (int id = 0; id < 3; ++id) EXPECT_TRUE(servers_[id]->stats().fenced) << "server " << id;
  // The map back: every server unfences (it retries every 500 ms) and serves.
  ASSERT_TRUE(client_->Put(key, good->kv->value).ok());
  EXPECT_TRUE(wait_all(false, std::chrono::seconds(10))) << "a server stayed fenced";
  auto put = c->Put("after", "y");
  EXPECT_TRUE(put.ok()) << put.status().ToString();
  auto got = c->Get("before");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->value, "x");
}

// A server whose etcd writes hang (its registration publication keeps failing and being
// retried) and then loses etcd altogether must still fence by its lease's deadline: the thread
// that fences never waits for etcd while it holds a lease. Before, it retried the publication
// itself, each try up to the 2 s request timeout, and fenced up to that much late: past the
// lease's real expiry, when a promotion elsewhere may already serve the shard.
TEST_F(EtcdClusterTest, AServerWhosePublicationsHangStillFencesByItsLeaseDeadline) {
  testing::TcpProxy proxy(testing::PortOf(etcd_->endpoint(0)));
  ASSERT_TRUE(proxy.ok());
  server_etcd_ = {proxy.endpoint()};
  StartWithEtcd(2);
  for (int id = 0; id < 3; ++id) ASSERT_FALSE(servers_[id]->stats().fenced) << id;
  // Transactions (the servers' registration writes) hang from now; lease renewals, reads and
  // the watch still pass. A new map (written directly) makes every server publish its epochs:
  // those publications hang and are retried.
  proxy.Swallow("/v3/kv/txn");
  auto cur = server::LoadMap(*client_, kCluster);
  ASSERT_TRUE(cur.ok()) << cur.status().ToString();
  auto put = client_->PutIf(server::MapKey(kCluster), Promoting(0).ToJson(), cur->mod_revision);
  ASSERT_TRUE(put.ok() && put->succeeded);
  std::this_thread::sleep_for(std::chrono::milliseconds(3000));  // failed tries, retries going
  for (int id = 0; id < 3; ++id) ASSERT_FALSE(servers_[id]->stats().fenced) << id;
  // Then etcd is gone for them: the newest lease renewal was sent before this point, so each
  // lease's deadline (renewal sent + TTL 2 s, less one ownership lease and the margin) is
  // before cut + 2 s.
  const Clock::time_point cut = Clock::now();
  proxy.Swallow("");
  std::array<double, 3> fenced_after_ms{-1, -1, -1};
  while (Clock::now() < cut + std::chrono::milliseconds(4500)) {
    for (int id = 0; id < 3; ++id) {
      if (fenced_after_ms[id] < 0 && servers_[id]->stats().fenced) {
        fenced_after_ms[id] = std::chrono::duration<double, std::milli>(Clock::now() - cut).count();
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::printf("fenced after the cut: %.0f, %.0f, %.0f ms (TTL 2000 ms)\n", fenced_after_ms[0],
              fenced_after_ms[1], fenced_after_ms[2]);
  for (int id = 0; id < 3; ++id) {
    EXPECT_GE(fenced_after_ms[id], 0) << "server " << id << " never fenced";
    EXPECT_LE(fenced_after_ms[id], 2050) << "server " << id << " fenced after its lease expired";
  }
  proxy.Swallow(std::nullopt);
}

}  // namespace
}  // namespace rdkv

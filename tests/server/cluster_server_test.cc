// A server in a cluster: ownership checks and redirects on writes, the map op, and the shard
// move ops (scan, import, drop), over tcp with raw requests.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <string>

#include "common/cluster/cluster_map.h"
#include "common/kv/admin_wire.h"
#include "common/kv/layout.h"
#include "common/kv/wire.h"
#include "server/server.h"
#include "tests/support/cluster_fixture.h"

namespace rdkv::server {
namespace {

using Clock = std::chrono::steady_clock;

class ClusterServerTest : public rdkv::testing::ClusterTest {
 protected:
  static constexpr uint32_t kShards = 8;
  ClusterServerTest() : ClusterTest("cluster-server", kShards) {}

  // Server `id` of `map` on a port of its own choosing (the map's addresses are not dialled).
  std::unique_ptr<Server> StartServer(uint32_t id, const cluster::ClusterMap& map) {
    ServerOptions o;
    o.port = 0;
    o.memory_bytes = 16 << 20;
    o.cluster_map = map;
    o.server_id = id;
    o.persist.data_dir = DataDir(id);
    o.ownership_lease = std::chrono::milliseconds(150);
    auto s = Server::Start(o);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? std::move(*s) : nullptr;
  }
  std::unique_ptr<transport::Connection> Connect(const Server& s) { return ConnectTo(s.port()); }
  // A key whose shard is `shard`.
  std::string KeyIn(uint32_t shard, int n) const { return ClusterTest::KeyIn(shard, n, "k"); }
};

TEST_F(ClusterServerTest, WritesToOtherShardsAreRedirected) {
  cluster::ClusterMap map = cluster::MakeUniformMap({"127.0.0.1:1", "127.0.0.1:2"}, kShards);
  map.epoch = 5;
  auto s0 = StartServer(0, map);
  ASSERT_TRUE(s0);
  auto c = Connect(*s0);
  kv::Response r = Call(*c, {kv::Op::kPut, KeyIn(0, 1), "mine", 0});
  EXPECT_TRUE(r.status.ok()) << r.status.ToString();
  r = Call(*c, {kv::Op::kPut, KeyIn(1, 1), "theirs", 0});
  EXPECT_EQ(r.status.code(), StatusCode::kWrongOwner);
  EXPECT_EQ(r.version, 5u) << "a redirect carries the map epoch";
  EXPECT_NE(r.status.message().find("server 1 (127.0.0.1:2)"), std::string::npos)
      << r.status.message();
  r = Call(*c, kv::EncodeMapFetch({}));
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(r.version, 5u);
  auto parsed = cluster::ParseClusterMap(r.body);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->owners, map.owners);
  EXPECT_EQ(s0->stats().items, 1u);
}

TEST_F(ClusterServerTest, MovingAShardClearsOwnershipAfterTheLeaseAndCarriesTheData) {
  cluster::ClusterMap map = cluster::MakeUniformMap({"127.0.0.1:1", "127.0.0.1:2"}, kShards);
  auto s0 = StartServer(0, map);
  auto s1 = StartServer(1, map);
  ASSERT_TRUE(s0 && s1);
  auto c0 = Connect(*s0);
  auto c1 = Connect(*s1);
  std::set<std::string> moved;
  for (int n = 0; n < 20; ++n) {
    std::string k = KeyIn(2, n);
    ASSERT_TRUE(Call(*c0, {kv::Op::kPut, k, "v" + k, 0}).status.ok());
    moved.insert(k);
  }
  ASSERT_TRUE(Call(*c0, {kv::Op::kPut, KeyIn(4, 0), "stays", 0}).status.ok());

  // Shard 2 moves from server 0 to server 1 (epoch 2): the old owner first.
  cluster::ClusterMap next = map;
  next.epoch = 2;
  next.owners[2] = 1;
  auto t0 = Clock::now();
  kv::Response r = Call(*c0, kv::EncodeMapInstall({next.ToJson()}));
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  EXPECT_GE(Clock::now() - t0, std::chrono::milliseconds(150)) << "acknowledged before the lease";
  EXPECT_EQ(Call(*c0, {kv::Op::kPut, *moved.begin(), "late", 0}).status.code(),
            StatusCode::kWrongOwner);
  // An older or equal epoch is refused.
  EXPECT_EQ(Call(*c0, kv::EncodeMapInstall({map.ToJson()})).status.code(),
            StatusCode::kInvalidArgument);

  // Copy the shard, then hand it to the new owner.
  uint64_t cursor = 0;
  std::set<std::string> copied;
  std::string scratch;
  do {
    r = Call(*c0, kv::EncodeShardScan({2, cursor}, &scratch));
    ASSERT_TRUE(r.status.ok()) << r.status.ToString();
    const std::string body(r.body);  // the next Call reuses the response buffer
    auto answer = kv::DecodeShardScanAnswer(cursor, r.version, body, kv::WireLimits{});
    ASSERT_TRUE(answer.ok()) << answer.status().ToString();
    for (const kv::ScanEntry& e : answer->entries) {
      EXPECT_EQ(e.value, "v" + std::string(e.key));
      ASSERT_TRUE(Call(*c1, kv::EncodeImport({e.key, e.value, e.version})).status.ok());
      copied.insert(std::string(e.key));
    }
    cursor = answer->next_cursor;
  } while (cursor != kv::kScanDone);
  EXPECT_EQ(copied, moved);
  ASSERT_TRUE(Call(*c1, kv::EncodeMapInstall({next.ToJson()})).status.ok());
  r = Call(*c1, {kv::Op::kCas, *moved.begin(), "after-move", 0});
  EXPECT_EQ(r.status.code(), StatusCode::kVersionMismatch) << "the import kept a real version";
  EXPECT_GT(r.version, 0u);
  EXPECT_TRUE(Call(*c1, {kv::Op::kPut, *moved.begin(), "after-move", 0}).status.ok());

  // The old owner drops its stale copy, keeps the rest.
  r = Call(*c0, kv::EncodeDropShard({2, 0}, &scratch));
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  EXPECT_EQ(r.version, moved.size());
  EXPECT_EQ(s0->stats().items, 1u);
  EXPECT_EQ(Call(*c1, kv::EncodeDropShard({2, 0}, &scratch)).status.code(),
            StatusCode::kInvalidArgument)
      << "an owned shard cannot be dropped";
  EXPECT_EQ(Call(*c0, kv::EncodeShardScan({99, 0}, &scratch)).status.code(),
            StatusCode::kInvalidArgument);
}

// The install of wire version 1 (a CLUSTER_MAP carrying a map) is refused, saying what
// replaced it, and installs nothing.
TEST_F(ClusterServerTest, AClusterMapCarryingAMapIsRefused) {
  cluster::ClusterMap map = cluster::MakeUniformMap({"127.0.0.1:1", "127.0.0.1:2"}, kShards);
  map.epoch = 5;
  auto s0 = StartServer(0, map);
  ASSERT_TRUE(s0);
  auto c = Connect(*s0);
  cluster::ClusterMap next = map;
  next.epoch = 6;
  next.owners[1] = 0;
  const std::string next_json = next.ToJson();
  kv::Request old_install = kv::EncodeMapFetch({});
  old_install.value = next_json;
  kv::Response r = Call(*c, old_install);
  EXPECT_EQ(r.status.code(), StatusCode::kProtocolError) << r.status.ToString();
  EXPECT_NE(r.status.message().find("install_map"), std::string::npos) << r.status.message();
  r = Call(*c, kv::EncodeMapFetch({}));
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  EXPECT_EQ(r.version, 5u) << "nothing was installed";
  EXPECT_EQ(Call(*c, {kv::Op::kPut, KeyIn(1, 1), "theirs", 0}).status.code(),
            StatusCode::kWrongOwner);
}

TEST_F(ClusterServerTest, StandaloneServerHasNoMap) {
  ServerOptions o;
  o.port = 0;
  o.memory_bytes = 8 << 20;
  auto s = Server::Start(o);
  ASSERT_TRUE(s.ok());
  auto c = Connect(**s);
  kv::Response r = Call(*c, kv::EncodeMapFetch({}));
  EXPECT_TRUE(r.status.ok());
  EXPECT_TRUE(r.body.empty());
  EXPECT_EQ(r.version, 0u);
  cluster::ClusterMap m = cluster::MakeUniformMap({"127.0.0.1:1"}, 4);
  EXPECT_EQ(Call(*c, kv::EncodeMapInstall({m.ToJson()})).status.code(), StatusCode::kNotSupported);
}

}  // namespace
}  // namespace rdkv::server

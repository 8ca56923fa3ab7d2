#include "common/cluster/cluster_map.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <string>

#include "common/kv/layout.h"

namespace rdkv::cluster {
namespace {

TEST(ClusterMapTest, ParsesAndRoundTrips) {
  Result<ClusterMap> m = ParseClusterMap(R"({"epoch": 3, "shards": 4,
      "servers": [{"id": 0, "address": "10.0.0.1:7400"}, {"id": 5, "address": "h:1"}],
      "owners": [0, 5, 5, 0]})");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->epoch, 3u);
  EXPECT_EQ(m->OwnerOf(1), 5u);
  EXPECT_EQ(m->ShardsOf(0), (std::vector<uint32_t>{0, 3}));
  EXPECT_EQ(m->FindServer(5)->address, "h:1");
  EXPECT_EQ(m->FindServer(1), nullptr);
  Result<ClusterMap> again = ParseClusterMap(m->ToJson());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->owners, m->owners);
}

// The map travels in one message: compact, and never longer than kMaxMapJsonBytes, which
// servers size their message limit with. The largest map: every bound at its maximum.
TEST(ClusterMapTest, CompactJsonOfTheLargestMapFitsTheBound) {
  ClusterMap m;
  m.epoch = kMaxMapEpoch;
  m.shards = kMaxShards;
  for (uint32_t i = 0; i < kMaxServers; ++i) {
    std::string port = ":" + std::to_string(65535 - i);
    std::string host(kMaxAddressBytes - port.size(), 'h');
    m.servers.push_back({i, host + port});
  }
  for (uint32_t s = 0; s < kMaxShards; ++s) m.owners.push_back(kMaxServers - 1 - s % 10);
  // Every shard with as many joining replicas as it may have, each with the largest join epoch.
  for (uint32_t s = 0; s < kMaxShards; ++s) {
    for (uint32_t k = 0; k + 1 < kMaxReplicas; ++k) m.SetJoining(s, 200 + k, m.epoch);
  }
  const std::string compact = m.ToJson();
  EXPECT_LE(compact.size(), kMaxMapJsonBytes);
  EXPECT_EQ(compact.find('\n'), std::string::npos);
  EXPECT_EQ(compact.find(' '), std::string::npos);
  Result<ClusterMap> back = ParseClusterMap(compact);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->owners, m.owners);
  EXPECT_EQ(back->joining, m.joining);
  EXPECT_EQ(back->JoinedAt(kMaxShards - 1, 203), kMaxMapEpoch);
  Result<ClusterMap> pretty = ParseClusterMap(m.ToPrettyJson());
  ASSERT_TRUE(pretty.ok()) << pretty.status().ToString();
  EXPECT_EQ(pretty->epoch, m.epoch);
  // 1024 shards over 2 servers: about 2 bytes per shard, not 7 (the pretty form).
  ClusterMap small = MakeUniformMap({"10.0.0.1:7400", "10.0.0.2:7400"}, 1024);
  EXPECT_LT(small.ToJson().size(), 2200u) << small.ToJson().size();

  m.servers[0].address = std::string(kMaxAddressBytes - 5, 'h') + ":7400" + "0";
  Result<ClusterMap> too_long = ParseClusterMap(m.ToJson());
  ASSERT_FALSE(too_long.ok());
  EXPECT_NE(too_long.status().message().find("longer than"), std::string::npos)
      << too_long.status().message();
}

TEST(ClusterMapTest, DefaultOwnersAreRoundRobin) {
  Result<ClusterMap> m = ParseClusterMap(
      R"({"epoch": 1, "shards": 5, "servers": [{"id": 0, "address": "a:1"}, {"id": 1, "address": "b:1"}]})");
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->owners, (std::vector<uint32_t>{0, 1, 0, 1, 0}));
}

// Each joining pair's join epoch goes through JSON and back; a pair that left joining keeps no
// epoch (added again, it gets its new one).
TEST(ClusterMapTest, JoinEpochsRoundTripAndGoWithTheirPair) {
  ClusterMap m = MakeUniformMap({"a:1", "b:1", "c:1"}, 4);
  m.epoch = 9;
  m.SetJoining(1, 0, 7);
  m.SetJoining(1, 2, 9);
  m.SetJoining(3, 1, 8);
  for (const std::string& text : {m.ToJson(), m.ToPrettyJson()}) {
    Result<ClusterMap> back = ParseClusterMap(text);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(back->JoinedAt(1, 0), 7u);
    EXPECT_EQ(back->JoinedAt(1, 2), 9u);
    EXPECT_EQ(back->JoinedAt(3, 1), 8u);
    EXPECT_EQ(back->JoinedAt(0, 1), 0u) << "not joining";
  }
  std::erase(m.joining[1], 0u);
  EXPECT_EQ(m.JoinedAt(1, 0), 0u);
  Result<ClusterMap> left = ParseClusterMap(m.ToJson());
  ASSERT_TRUE(left.ok()) << left.status().ToString();
  EXPECT_EQ(left->joined_at.count({1, 0}), 0u) << m.ToJson();
  m.SetJoining(1, 0, 9);
  EXPECT_EQ(m.JoinedAt(1, 0), 9u);
  m.SetJoining(1, 2, 5);
  EXPECT_EQ(m.JoinedAt(1, 2), 9u) << "a pair still joining keeps its join";
  EXPECT_EQ(m.joining[1], (std::vector<uint32_t>{2, 0}));
  // A map of an older writer says nothing: it parses, with no join epochs.
  Result<ClusterMap> older = ParseClusterMap(
      R"({"epoch": 3, "shards": 1, "servers": [{"id": 0, "address": "a:1"}, {"id": 1, "address": "b:1"}], "joining": {"0": [1]}})");
  ASSERT_TRUE(older.ok()) << older.status().ToString();
  EXPECT_TRUE(older->IsJoining(0, 1));
  EXPECT_EQ(older->JoinedAt(0, 1), 0u);
}

TEST(ClusterMapTest, BadMapsNameTheProblem) {
  struct Case {
    const char* json;
    const char* expect;
  };
  for (
      const Case& c : {
          Case{"{", "JSON"},
          Case{R"({"epoch": 0, "shards": 1, "servers": [{"id": 0, "address": "a:1"}]})", "epoch"},
          Case{
              R"({"epoch": 18446744073709551615, "shards": 1, "servers": [{"id": 0, "address": "a:1"}]})",
              "epoch"},
          Case{R"({"epoch": 1, "shards": 0, "servers": [{"id": 0, "address": "a:1"}]})", "shards"},
          Case{R"({"epoch": 1, "shards": 1, "servers": []})", "servers"},
          Case{R"({"epoch": 1, "shards": 1, "servers": [{"id": 0, "address": "nope"}]})",
               "host:port"},
          Case{
              R"({"epoch": 1, "shards": 1, "servers": [{"id": 0, "address": "a:1"}, {"id": 0, "address": "b:1"}]})",
              "twice"},
          Case{
              R"({"epoch": 1, "shards": 2, "servers": [{"id": 0, "address": "a:1"}], "owners": [0]})",
              "owners"},
          Case{
              R"({"epoch": 1, "shards": 1, "servers": [{"id": 0, "address": "a:1"}], "owners": [3]})",
              "shard 0"},
          // 2^32: not server 0 by its low 32 bits.
          Case{
              R"({"epoch": 1, "shards": 1, "servers": [{"id": 0, "address": "a:1"}], "owners": [4294967296]})",
              "shard 0"},
          Case{
              R"({"epoch": 1, "shards": 1, "servers": [{"id": 0, "address": "a:1"}, {"id": 1, "address": "b:1"}], "joining": {"0": [4294967297]}})",
              "not a server id"},
          Case{R"({"epoch": 1, "shards": 1, "servers": [{"id": 0, "address": "a:1"}], "extra": 1})",
               "unknown field"},
          Case{R"({"epoch": 1, "shards": 1, "servers": [{"id": 0, "address": "a\"b:1"}]})",
               "printable ASCII"},
          Case{R"({"epoch": 1, "shards": 1, "servers": [{"id": 0, "address": "a\u0001:1"}]})",
               "printable ASCII"},
          Case{
              R"({"epoch": 3, "shards": 1, "servers": [{"id": 0, "address": "a:1"}, {"id": 1, "address": "b:1"}], "joining": {"0": [1]}, "joined_at": {"0": {"0": 2}}})",
              "not one of its joining servers"},
          Case{
              R"({"epoch": 3, "shards": 1, "servers": [{"id": 0, "address": "a:1"}, {"id": 1, "address": "b:1"}], "joining": {"0": [1]}, "joined_at": {"0": {"1": 4}}})",
              "must be an epoch 1..3"},
          Case{
              R"({"epoch": 3, "shards": 1, "servers": [{"id": 0, "address": "a:1"}, {"id": 1, "address": "b:1"}], "joining": {"0": [1]}, "joined_at": {"0": {"1": 0}}})",
              "must be an epoch 1..3"},
          Case{
              R"({"epoch": 3, "shards": 1, "servers": [{"id": 0, "address": "a:1"}, {"id": 1, "address": "b:1"}], "joining": {"0": [1]}, "joined_at": {"1": {"1": 2}}})",
              "not a shard number below 1"},
          Case{
              R"({"epoch": 3, "shards": 1, "servers": [{"id": 0, "address": "a:1"}, {"id": 1, "address": "b:1"}], "joining": {"0": [1]}, "joined_at": {"0": [1]}})",
              "'joined_at' must be an object"},
      }) {
    Result<ClusterMap> m = ParseClusterMap(c.json);
    ASSERT_FALSE(m.ok()) << c.json;
    EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(m.status().message().find(c.expect), std::string::npos) << m.status().message();
  }
}

TEST(ClusterMapTest, KeysSpreadOverShards) {
  std::map<uint32_t, int> count;
  for (int i = 0; i < 64000; ++i) count[ShardOf(kv::KeyHash("user" + std::to_string(i)), 64)]++;
  ASSERT_EQ(count.size(), 64u);
  for (auto& [s, n] : count) {
    EXPECT_GT(n, 800) << "shard " << s;
    EXPECT_LT(n, 1200) << "shard " << s;
  }
}

}  // namespace
}  // namespace rdkv::cluster

#include "common/cluster/cluster_map.h"

#include <gtest/gtest.h>

#include <map>

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

TEST(ClusterMapTest, DefaultOwnersAreRoundRobin) {
  Result<ClusterMap> m = ParseClusterMap(
      R"({"epoch": 1, "shards": 5, "servers": [{"id": 0, "address": "a:1"}, {"id": 1, "address": "b:1"}]})");
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->owners, (std::vector<uint32_t>{0, 1, 0, 1, 0}));
}

TEST(ClusterMapTest, BadMapsNameTheProblem) {
  struct Case { const char* json; const char* expect; };
  for (const Case& c : {
           Case{"{", "JSON"},
           Case{R"({"epoch": 0, "shards": 1, "servers": [{"id": 0, "address": "a:1"}]})", "epoch"},
           Case{R"({"epoch": 1, "shards": 0, "servers": [{"id": 0, "address": "a:1"}]})", "shards"},
           Case{R"({"epoch": 1, "shards": 1, "servers": []})", "servers"},
           Case{R"({"epoch": 1, "shards": 1, "servers": [{"id": 0, "address": "nope"}]})", "host:port"},
           Case{R"({"epoch": 1, "shards": 1, "servers": [{"id": 0, "address": "a:1"}, {"id": 0, "address": "b:1"}]})", "twice"},
           Case{R"({"epoch": 1, "shards": 2, "servers": [{"id": 0, "address": "a:1"}], "owners": [0]})", "owners"},
           Case{R"({"epoch": 1, "shards": 1, "servers": [{"id": 0, "address": "a:1"}], "owners": [3]})", "shard 0"},
           Case{R"({"epoch": 1, "shards": 1, "servers": [{"id": 0, "address": "a:1"}], "extra": 1})", "unknown field"},
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

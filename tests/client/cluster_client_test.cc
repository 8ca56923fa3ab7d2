// The client in a cluster: three in-process servers on 127.0.0.1 (tcp) with a map listing
// them. Routing of every operation, any server as seed, a server down and back, a write
// redirect after a map change, and the stale-map test: a client holding the old map and the
// old owner's lease never returns the old owner's value after the move was acknowledged.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/cluster/cluster_map.h"
#include "common/kv/admin_wire.h"
#include "common/kv/layout.h"
#include "common/kv/wire.h"
#include "rdkv/admin.h"
#include "rdkv/client.h"
#include "server/server.h"
#include "tests/support/cluster_fixture.h"

namespace rdkv {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr uint32_t kShards = 16;

class ClusterClientTest : public testing::ClusterTest {
 protected:
  ClusterClientTest() : ClusterTest("cluster-client", kShards) {}
  void SetUp() override {
    ClusterTest::SetUp();
    if (HasFatalFailure()) return;
    PickPorts();
    StartServers();
  }

  // Copies shard `shard` from `from` to `to` (scan + import); `rewrite` may change values.
  void CopyShard(transport::Connection& from, transport::Connection& to, uint32_t shard,
                 const std::function<std::string(std::string_view, std::string_view)>& rewrite) {
    uint64_t cursor = 0;
    do {
      std::string scratch;
      kv::Response r = Call(from, kv::EncodeShardScan({shard, cursor}, &scratch));
      ASSERT_TRUE(r.status.ok()) << r.status.ToString();
      const std::string body(r.body);  // the imports below reuse the response buffer
      cursor = r.version;
      auto entries = kv::DecodeScanEntries(body, kv::WireLimits{});
      ASSERT_TRUE(entries.ok());
      for (const kv::ScanEntry& e : *entries) {
        std::string v = rewrite(e.key, e.value);
        ASSERT_TRUE(Call(to, kv::EncodeImport({e.key, v, e.version})).status.ok());
      }
    } while (cursor != kv::kScanDone);
  }
};

TEST_F(ClusterClientTest, AllOperationsSpreadOverEveryServerFromAnySeed) {
  auto c = NewClient(0);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(Admin(*c).map_epoch(), 1u);
  std::vector<std::string> keys;
  for (int i = 0; i < 200; ++i) keys.push_back("user:" + std::to_string(i));
  for (const auto& k : keys) ASSERT_TRUE(c->Put(k, "v-" + k).ok()) << k;
  for (int i = 0; i < 3; ++i) EXPECT_GT(servers_[i]->stats().items, 0u) << "server " << i;
  uint64_t total = 0;
  for (int i = 0; i < 3; ++i) total += servers_[i]->stats().items;
  EXPECT_EQ(total, keys.size()) << "each key on exactly one server";

  for (int seed = 0; seed < 3; ++seed) {
    auto r = NewClient(seed);
    ASSERT_NE(r, nullptr);
    for (const auto& k : keys) {
      auto g = r->Get(k);
      ASSERT_TRUE(g.ok()) << "seed " << seed << " " << k << ": " << g.status().ToString();
      EXPECT_EQ(g->value, "v-" + k);
    }
    std::vector<std::string_view> views(keys.begin(), keys.end());
    views.push_back("absent-key");
    auto many = r->MultiGet(views);
    ASSERT_EQ(many.size(), views.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      ASSERT_TRUE(many[i].ok()) << keys[i] << ": " << many[i].status().ToString();
      EXPECT_EQ(many[i]->value, "v-" + keys[i]);
    }
    EXPECT_EQ(many.back().status().code(), StatusCode::kNotFound);
  }

  EXPECT_EQ(c->Insert(keys[0], "x").status().code(), StatusCode::kAlreadyExists);
  auto v = c->Get(keys[1]);
  ASSERT_TRUE(v.ok());
  auto cas = c->Cas(keys[1], v->version, "cas");
  ASSERT_TRUE(cas.ok()) << cas.status().ToString();
  EXPECT_EQ(c->Cas(keys[1], v->version, "again").status().code(), StatusCode::kVersionMismatch);
  EXPECT_EQ(c->Get(keys[1])->value, "cas");
  EXPECT_TRUE(c->Delete(keys[2]).ok());
  EXPECT_EQ(c->Get(keys[2]).status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(c->Insert(keys[2], "back").ok());
  EXPECT_TRUE(c->Ping().ok());

  auto servers = Admin(*c).Servers(true);
  ASSERT_EQ(servers.size(), 3u);
  size_t shards = 0;
  for (const ServerInfo& s : servers) {
    EXPECT_TRUE(s.reachable) << s.error;
    EXPECT_EQ(s.map_epoch, 1u);
    EXPECT_NE(s.stats.find("items"), std::string::npos) << s.stats;
    shards += s.shards.size();
  }
  EXPECT_EQ(shards, kShards);
  auto stats = c->Stats();
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  EXPECT_NE(stats->find("\"reachable\":3"), std::string::npos) << *stats;
  EXPECT_NE(stats->find("\"items\":" + std::to_string(keys.size())), std::string::npos) << *stats;
  // Latency percentiles do not add up: the totals' are those of the servers' buckets summed.
  nlohmann::json j = nlohmann::json::parse(*stats);
  const nlohmann::json& total_put = j["total"]["latency"]["ops"]["put"];
  uint64_t puts = 0;
  double highest_p99 = 0;
  for (const nlohmann::json& one : j["per_server"]) {
    const nlohmann::json& lat = one["stats"]["latency"]["ops"];
    if (!lat.contains("put")) continue;
    puts += lat["put"]["count"].get<uint64_t>();
    highest_p99 = std::max(highest_p99, lat["put"]["p99_us"].get<double>());
  }
  EXPECT_GT(puts, 0u);
  EXPECT_EQ(total_put["count"].get<uint64_t>(), puts) << total_put.dump();
  EXPECT_GT(total_put["p50_us"].get<double>(), 0);
  EXPECT_LE(total_put["p50_us"].get<double>(), total_put["p99_us"].get<double>());
  EXPECT_LE(total_put["p99_us"].get<double>(), highest_p99) << "a sum of percentiles, not a merge";
}

TEST_F(ClusterClientTest, ThreadsShareOneClientAcrossServers) {
  auto c = NewClient(1);
  ASSERT_NE(c, nullptr);
  constexpr int kThreads = 4, kKeys = 50;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<std::string> keys;
      for (int i = 0; i < kKeys; ++i)
        keys.push_back("t" + std::to_string(t) + ":" + std::to_string(i));
      for (int round = 0; round < 3; ++round) {
        for (const auto& k : keys) {
          if (!c->Put(k, k + "/" + std::to_string(round)).ok()) failures.fetch_add(1);
        }
        std::vector<std::string_view> views(keys.begin(), keys.end());
        auto many = c->MultiGet(views);
        for (size_t i = 0; i < keys.size(); ++i) {
          if (!many[i].ok() || many[i]->value != keys[i] + "/" + std::to_string(round)) {
            failures.fetch_add(1);
          }
        }
        for (const auto& k : keys) {
          auto g = c->Get(k);
          if (!g.ok() || g->value != k + "/" + std::to_string(round)) failures.fetch_add(1);
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  for (int i = 0; i < 3; ++i) EXPECT_GT(servers_[i]->stats().items, 0u) << "server " << i;
}

TEST_F(ClusterClientTest, ServerDownFailsOnlyItsKeysThenReconnects) {
  auto c = NewClient(0);
  ASSERT_NE(c, nullptr);
  std::string k1 = KeyIn(1, 0), k0 = KeyIn(0, 0), k2 = KeyIn(2, 0);  // shard s -> server s % 3
  for (const auto& k : {k0, k1, k2}) ASSERT_TRUE(c->Put(k, "v").ok());
  ASSERT_TRUE(c->Get(k1).ok());

  servers_[1].reset();
  // The first call may see the broken connection; then it fails fast, naming the server.
  Status last;
  auto until = Clock::now() + 5s;
  while (Clock::now() < until) {
    last = c->Get(k1).status();
    if (last.Is(StatusCode::kUnavailable)) break;
  }
  ASSERT_EQ(last.code(), StatusCode::kUnavailable) << last.ToString();
  EXPECT_NE(last.message().find("server 1 (127.0.0.1:" + std::to_string(ports_[1]) + ")"),
            std::string::npos)
      << last.message();
  auto t0 = Clock::now();
  EXPECT_EQ(c->Put(k1, "w").status().code(), StatusCode::kUnavailable);
  EXPECT_LT(Clock::now() - t0, 400ms) << "fails fast";
  // Other shards keep working.
  EXPECT_TRUE(c->Put(k0, "w0").ok());
  EXPECT_EQ(c->Get(k2)->value, "v");
  std::vector<std::string_view> ks = {k0, k1, k2};
  auto many = c->MultiGet(ks);
  EXPECT_TRUE(many[0].ok());
  EXPECT_EQ(many[1].status().code(), StatusCode::kUnavailable);
  EXPECT_TRUE(many[2].ok());
  auto servers = Admin(*c).Servers(false);
  ASSERT_EQ(servers.size(), 3u);
  EXPECT_FALSE(servers[1].reachable);
  EXPECT_TRUE(servers[0].reachable && servers[2].reachable);

  servers_[1] = StartServer(1);  // same port, fresh empty store
  ASSERT_NE(servers_[1], nullptr);
  Status put;
  until = Clock::now() + 5s;
  while (Clock::now() < until) {
    put = c->Put(k1, "again").status();
    if (put.ok()) break;
    std::this_thread::sleep_for(50ms);
  }
  ASSERT_TRUE(put.ok()) << put.ToString();
  EXPECT_EQ(c->Get(k1)->value, "again");
  EXPECT_GE(c->stats().reconnects, 1u);
}

// MultiGet has every owner's batch in flight together (docs/design.md, "MultiGet: every owner's
// batch in flight together"): keys spread over three owners cost the round trips (waits) of keys
// on one owner, 2 cold (buckets, then items) and 1 warm; asked one owner after another they
// would cost three times as many.
TEST_F(ClusterClientTest, MultiGetOverThreeOwnersCostsTheRoundTripsOfOne) {
  constexpr int kPerServer = 8;
  std::vector<std::string> one, spread;  // all on server 0; kPerServer on each server
  for (int n = 0; n < kPerServer * 3; ++n) one.push_back(KeyIn(0, n, "mg"));
  for (int n = 0; n < kPerServer; ++n) {
    for (uint32_t s = 0; s < 3; ++s) spread.push_back(KeyIn(s, n, "mg"));  // shard s: server s
  }
  {
    auto w = NewClient(0);
    ASSERT_NE(w, nullptr);
    for (const auto& k : one) ASSERT_TRUE(w->Put(k, "v-" + k).ok()) << k;
    for (const auto& k : spread) ASSERT_TRUE(w->Put(k, "v-" + k).ok()) << k;
  }
  // Round trips of one MultiGet of `keys` by `c`, checking every value.
  auto round_trips = [](Client& c, const std::vector<std::string>& keys) -> uint64_t {
    std::vector<std::string_view> views(keys.begin(), keys.end());
    const uint64_t before = c.stats().get_round_trips;
    auto many = c.MultiGet(views);
    const uint64_t after = c.stats().get_round_trips;
    EXPECT_EQ(many.size(), keys.size());
    for (size_t i = 0; i < keys.size() && i < many.size(); ++i) {
      EXPECT_TRUE(many[i].ok()) << keys[i] << ": " << many[i].status().ToString();
      if (many[i].ok()) {
        EXPECT_EQ(many[i]->value, "v-" + keys[i]);
      }
    }
    return after - before;
  };
  // Fresh clients (no cached locations) whose sessions to every server are open (a PUT each
  // opens them; their locations are of other keys), so that only GET batches are counted.
  auto fresh = [&]() {
    auto c = NewClient(1);
    for (uint32_t s = 0; s < 3; ++s) {
      const std::string k = KeyIn(s, 0, "warm");
      EXPECT_TRUE(c != nullptr && c->Put(k, "x").ok());
    }
    return c;
  };
  auto c1 = fresh();
  auto c3 = fresh();
  ASSERT_NE(c1, nullptr);
  ASSERT_NE(c3, nullptr);
  const uint64_t cold_one = round_trips(*c1, one);
  const uint64_t cold_spread = round_trips(*c3, spread);
  EXPECT_EQ(cold_one, 2u) << "buckets, then items";
  EXPECT_EQ(cold_spread, cold_one) << "three owners' batches in flight together";
  const uint64_t warm_one = round_trips(*c1, one);
  const uint64_t warm_spread = round_trips(*c3, spread);
  EXPECT_EQ(warm_one, 1u) << "cached locations: one READ each, one batch";
  EXPECT_EQ(warm_spread, warm_one);
}

// Threads sharing one client whose connections have few READ slots: a fanned-out batch often
// finds its connection's slots taken by another thread's (PostReads says kBusy) and is posted
// and waited for with ReadAndWait instead. Every value still comes back right.
TEST_F(ClusterClientTest, FannedOutMultiGetsShareScarceReadSlots) {
  ClientOptions o;
  o.max_outstanding_reads = 8;
  o.max_batch_reads = 8;  // a MultiGet of 12 keys takes several batches per owner
  auto c = NewClient(2, o);
  ASSERT_NE(c, nullptr);
  std::vector<std::string> keys;
  for (int n = 0; n < 4; ++n) {
    for (uint32_t s = 0; s < 3; ++s) keys.push_back(KeyIn(s, n, "busy"));
  }
  for (const auto& k : keys) ASSERT_TRUE(c->Put(k, "v-" + k).ok()) << k;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      std::vector<std::string_view> views(keys.begin(), keys.end());
      for (int round = 0; round < 50; ++round) {
        auto many = c->MultiGet(views);
        for (size_t i = 0; i < keys.size(); ++i) {
          if (!many[i].ok() || many[i]->value != "v-" + keys[i]) failures.fetch_add(1);
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
}

// A dead owner fails only its own keys while the other owners' batches of the same rounds are
// answered: its session was open (its batch fails at the post or the READ), not refused at
// connect as in ServerDownFailsOnlyItsKeysThenReconnects.
TEST_F(ClusterClientTest, MultiGetWithOneOwnerDeadAnswersTheOthers) {
  auto c = NewClient(0);
  ASSERT_NE(c, nullptr);
  std::vector<std::string> keys;
  for (int n = 0; n < 6; ++n) {
    for (uint32_t s = 0; s < 3; ++s) keys.push_back(KeyIn(s, n, "iso"));
  }
  for (const auto& k : keys) ASSERT_TRUE(c->Put(k, "v-" + k).ok()) << k;
  std::vector<std::string_view> views(keys.begin(), keys.end());
  for (const auto& r : c->MultiGet(views)) ASSERT_TRUE(r.ok()) << r.status().ToString();

  servers_[2].reset();  // its session stays open in the client until a batch finds it broken
  for (int attempt = 0; attempt < 2; ++attempt) {  // the broken session, then a refused connect
    auto many = c->MultiGet(views);
    ASSERT_EQ(many.size(), keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      if (ShardOfKey(keys[i]) % 3 == 2) {
        EXPECT_FALSE(many[i].ok()) << keys[i];
        EXPECT_TRUE(many[i].status().Is(StatusCode::kUnavailable) ||
                    many[i].status().Is(StatusCode::kConnectionLost))
            << many[i].status().ToString();
      } else {
        ASSERT_TRUE(many[i].ok()) << "attempt " << attempt << " " << keys[i] << ": "
                                  << many[i].status().ToString();
        EXPECT_EQ(many[i]->value, "v-" + keys[i]);
      }
    }
  }
}

TEST_F(ClusterClientTest, WriteFollowsRedirectAfterMapChange) {
  auto c = NewClient(2);
  ASSERT_NE(c, nullptr);
  std::string k = KeyIn(3, 0);  // shard 3: server 0
  ASSERT_TRUE(c->Put(k, "before").ok());
  auto raw0 = Raw(0), raw1 = Raw(1), raw2 = Raw(2);
  cluster::ClusterMap next = map_;
  next.epoch = 2;
  next.owners[3] = 1;
  ASSERT_TRUE(Call(*raw0, kv::EncodeMapInstall({next.ToJson()})).status.ok());
  CopyShard(*raw0, *raw1, 3, [](std::string_view, std::string_view v) { return std::string(v); });
  ASSERT_TRUE(Call(*raw1, kv::EncodeMapInstall({next.ToJson()})).status.ok());
  ASSERT_TRUE(Call(*raw2, kv::EncodeMapInstall({next.ToJson()})).status.ok());

  EXPECT_EQ(Admin(*c).map_epoch(), 1u);
  auto put = c->Put(k, "after");
  ASSERT_TRUE(put.ok()) << put.status().ToString();
  EXPECT_EQ(Admin(*c).map_epoch(), 2u);
  auto got = c->Get(k);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->value, "after");
  // The write landed on the new owner.
  kv::Response r = Call(*raw1, {kv::Op::kCas, k, "x", 1});
  EXPECT_EQ(r.status.code(), StatusCode::kVersionMismatch);
  EXPECT_EQ(put.value(), r.version);
}

TEST_F(ClusterClientTest, StaleMapNeverReturnsTheOldOwnersValue) {
  const std::string k = KeyIn(3, 7);  // shard 3: server 0 (A) -> server 1 (B)
  auto writer = NewClient(0);
  ASSERT_NE(writer, nullptr);
  ASSERT_TRUE(writer->Put(k, "old").ok());

  // Readers created before the move: they hold the old map, A's lease and the cached location.
  constexpr int kReaders = 2;
  std::vector<std::unique_ptr<Client>> readers;
  for (int i = 0; i < kReaders; ++i) {
    readers.push_back(NewClient(i));
    ASSERT_NE(readers.back(), nullptr);
    auto g = readers.back()->Get(k);
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    ASSERT_EQ(g->value, "old");
  }

  std::atomic<bool> stop{false};
  // Client-clock instants (steady_clock ticks; 0 = not yet).
  std::atomic<int64_t> acked{0}, new_written{0};
  std::mutex mu;
  std::vector<std::string> violations;
  std::atomic<uint64_t> after_ack{0}, new_seen{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kReaders; ++i) {
    threads.emplace_back([&, i] {
      while (!stop.load()) {
        int64_t started = Clock::now().time_since_epoch().count();
        int64_t a = acked.load(), n = new_written.load();
        auto g = readers[i]->Get(k);
        if (a != 0 && started > a) {
          after_ack.fetch_add(1);
          if (g.ok() && g->value == "old") {
            std::lock_guard<std::mutex> l(mu);
            violations.push_back("reader " + std::to_string(i) +
                                 " returned A's old value after the move was acknowledged");
          }
          if (n != 0 && started > n && !(g.ok() && g->value == "new") && g.ok()) {
            std::lock_guard<std::mutex> l(mu);
            violations.push_back("reader " + std::to_string(i) + " returned '" + g->value +
                                 "' after the new value was written");
          }
          if (g.ok() && g->value == "new") new_seen.fetch_add(1);
        }
      }
    });
  }

  std::this_thread::sleep_for(50ms);
  auto raw0 = Raw(0), raw1 = Raw(1), raw2 = Raw(2);
  cluster::ClusterMap next = map_;
  next.epoch = 2;
  next.owners[3] = 1;
  // A clears its bit, waits the lease, then acknowledges.
  ASSERT_TRUE(Call(*raw0, kv::EncodeMapInstall({next.ToJson()})).status.ok());
  acked.store(Clock::now().time_since_epoch().count());
  // The copy is marked, so a value from A and one from B can be told apart.
  CopyShard(*raw0, *raw1, 3, [](std::string_view, std::string_view v) {
    return std::string(v) == "old" ? std::string("copied") : std::string(v);
  });
  ASSERT_TRUE(Call(*raw1, kv::EncodeMapInstall({next.ToJson()})).status.ok());
  ASSERT_TRUE(Call(*raw2, kv::EncodeMapInstall({next.ToJson()})).status.ok());
  std::this_thread::sleep_for(100ms);
  ASSERT_TRUE(Call(*raw1, {kv::Op::kPut, k, "new", 0}).status.ok());
  new_written.store(Clock::now().time_since_epoch().count());
  std::this_thread::sleep_for(500ms);
  stop.store(true);
  for (auto& t : threads) t.join();

  std::lock_guard<std::mutex> l(mu);
  for (const auto& v : violations) ADD_FAILURE() << v;
  EXPECT_GT(after_ack.load(), 0u);
  EXPECT_GT(new_seen.load(), 0u) << "readers followed the move";
  // A still holds its stale copy (not dropped): only the lease kept readers away from it.
  std::string scratch;
  auto a = Call(*raw0, kv::EncodeShardScan({3, 0}, &scratch));
  EXPECT_TRUE(a.status.ok());
  for (auto& r : readers) {
    auto g = r->Get(k);
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    EXPECT_EQ(g->value, "new");
    EXPECT_EQ(Admin(*r).map_epoch(), 2u);
  }
}

}  // namespace
}  // namespace rdkv

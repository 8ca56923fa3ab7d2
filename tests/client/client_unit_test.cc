// Unit tests of the client library's pure parts and of its GET algorithm against an in-process
// fake fabric (tests/client/fake_fabric.h): torn, retired, foreign and slow items, READ
// errors, reconnects and header validation, without a real transport or server.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "client/client_internal.h"
#include "client/cluster_admin.h"
#include "client/location_cache.h"
#include "client/read_buffers.h"
#include "client/session.h"
#include "client/shard_move.h"
#include "common/kv/admin_wire.h"
#include "common/util/units.h"
#include "rdkv/admin.h"
#include "tests/client/fake_fabric.h"

namespace rdkv {
namespace {

// The client reads a server address with the one parser (ParseHostPort) into a
// client::ServerAddress, which writes it back with the one formatter (FormatHostPort).
Result<client::ServerAddress> ParseServerAddress(std::string_view text) {
  client::ServerAddress a;
  RDKV_RETURN_IF_ERROR(ParseHostPort(text, &a.host, &a.port));
  return a;
}
using testing::FakeFabric;
using testing::FakeServer;

// --- server addresses ---

TEST(ServerAddressTest, Parses) {
  auto a = ParseServerAddress("127.0.0.1:7400");
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->host, "127.0.0.1");
  EXPECT_EQ(a->port, 7400);
  EXPECT_EQ(a->ToString(), "127.0.0.1:7400");
  auto b = ParseServerAddress("kv-3.example.com:1");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->host, "kv-3.example.com");
  auto c = ParseServerAddress("[::1]:65535");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->host, "::1");
  EXPECT_EQ(c->port, 65535);
  EXPECT_EQ(c->ToString(), "[::1]:65535");
}

// Client::Stats sums what servers send. An unreachable server's reason may quote a server's
// REFUSED text (any bytes, before authentication), and two builds may give a field different
// types: neither may throw into the application.
TEST(AggregateStatsTest, ServersTextsAndMixedTypesDoNotThrow) {
  std::vector<ServerInfo> servers(4);
  servers[0].id = 0;
  servers[0].reachable = false;
  servers[0].error = std::string("refused: \xff\xfe not UTF-8");
  servers[1].id = 1;
  servers[1].reachable = true;
  servers[1].stats = R"({"puts": 2, "store": {"items": 3}, "latency": 5})";
  servers[2].id = 2;
  servers[2].reachable = true;
  servers[2].stats = R"({"puts": 3, "store": 1, "latency": {"bounds_us": [1]}})";
  // Nested a million levels deep: left out with an error, not a stack overflow.
  servers[3].id = 3;
  servers[3].reachable = true;
  servers[3].stats =
      R"({"puts": )" + std::string(1'000'000, '[') + std::string(1'000'000, ']') + "}";
  Result<std::string> out = client::AggregateStats(servers);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  nlohmann::json j = nlohmann::json::parse(*out);
  EXPECT_EQ(j["reachable"].get<int>(), 2);
  EXPECT_EQ(j["total"]["puts"].get<int64_t>(), 5);
  EXPECT_EQ(j["total"]["store"]["items"].get<int64_t>(), 3);
  EXPECT_NE(j["per_server"][0]["error"].get<std::string>().find("refused"), std::string::npos);
  EXPECT_TRUE(j["per_server"][3].contains("error"));
  EXPECT_FALSE(j["per_server"][3].contains("stats"));
}

TEST(ServerAddressTest, RejectsWithClearMessages) {
  struct Case {
    const char* text;
    const char* why;
  } cases[] = {
      {"", "is empty"},
      {"localhost", "has no ':port'"},
      {":7400", "empty host"},
      {"host:", "empty port"},
      {"host:74x0", "not a number"},
      {"host:-1", "not a number"},
      {"host:+80", "not a number"},
      {"host:0", "outside 1..65535"},
      {"host:65536", "outside 1..65535"},
      {"host:99999999999999999999", "not a number"},
      {"::1:7400", "more than one ':'"},
      {"[::1:7400", "unclosed '['"},
      {"[::1]7400", "no ':port' after"},
      {"ho st:1", "invalid character"},
  };
  for (const Case& c : cases) {
    auto r = ParseServerAddress(c.text);
    ASSERT_FALSE(r.ok()) << c.text;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << c.text;
    EXPECT_NE(r.status().message().find(c.why), std::string::npos)
        << c.text << " -> " << r.status().message();
    EXPECT_NE(r.status().message().find("host:port"), std::string::npos);
  }
}

// --- location cache ---

TEST(LocationCacheTest, StoreLookupErase) {
  client::LocationCache cache(1024);
  EXPECT_EQ(cache.entries(), 1024u);
  uint64_t h = kv::KeyHash("a");
  EXPECT_FALSE(cache.Lookup(h).has_value());
  cache.Store(h, {123, 4});
  auto loc = cache.Lookup(h);
  ASSERT_TRUE(loc.has_value());
  EXPECT_EQ(loc->offset_units, 123u);
  EXPECT_EQ(loc->units, 4);
  // Erase of another location leaves it; erase of this one removes it.
  cache.Erase(h, client::CachedLocation{124, 4});
  EXPECT_TRUE(cache.Lookup(h).has_value());
  cache.Erase(h, client::CachedLocation{123, 4});
  EXPECT_FALSE(cache.Lookup(h).has_value());
  cache.Store(h, {1, 1});
  cache.Erase(h);
  EXPECT_FALSE(cache.Lookup(h).has_value());
  // The bucket choice round-trips and is part of the location (Erase compares it).
  cache.Store(h, {0xfffffffe, 0xffff, 1});
  loc = cache.Lookup(h);
  ASSERT_TRUE(loc.has_value());
  EXPECT_EQ(loc->offset_units, 0xfffffffeu);
  EXPECT_EQ(loc->units, 0xffff);
  EXPECT_EQ(loc->choice, 1);
  cache.Erase(h, client::CachedLocation{0xfffffffe, 0xffff, 0});
  EXPECT_TRUE(cache.Lookup(h).has_value());
  cache.Erase(h, client::CachedLocation{0xfffffffe, 0xffff, 1});
  EXPECT_FALSE(cache.Lookup(h).has_value());
  // So does the contended mark, next to every other field at its maximum.
  cache.Store(h, {0xffffffff, 0xffff, 1, true});
  loc = cache.Lookup(h);
  ASSERT_TRUE(loc.has_value());
  EXPECT_TRUE(loc->contended);
  EXPECT_EQ(loc->offset_units, 0xffffffffu);
  EXPECT_EQ(loc->units, 0xffff);
  EXPECT_EQ(loc->choice, 1);
  cache.Store(h, {7, 2, 0, false});
  EXPECT_FALSE(cache.Lookup(h)->contended);
}

TEST(LocationCacheTest, BoundedAndClear) {
  client::LocationCache cache(64);
  int stored = 0;
  for (int i = 0; i < 10000; ++i) {
    cache.Store(kv::KeyHash("k" + std::to_string(i)), {static_cast<uint32_t>(i), 1});
    ++stored;
  }
  int present = 0;
  for (int i = 0; i < 10000; ++i) {
    auto loc = cache.Lookup(kv::KeyHash("k" + std::to_string(i)));
    if (loc.has_value()) {
      ++present;
      // A hit for key i is key i's location, or that of a key whose hash has the same tag (the
      // top 14 bits): an alias, harmless because every item read is checked.
      const uint32_t j = loc->offset_units;
      if (j != static_cast<uint32_t>(i)) {
        ASSERT_LT(j, 10000u);
        auto tag = [](uint64_t h) { return (h >> 50) == 0 ? uint64_t{1} : h >> 50; };
        EXPECT_EQ(tag(kv::KeyHash("k" + std::to_string(i))),
                  tag(kv::KeyHash("k" + std::to_string(j))))
            << "key " << i << " found key " << j << "'s location without a tag alias";
      }
    }
  }
  // What is stored, plus aliases: about 10,000 lookups x 8 ways / 16,384 tags = 5 expected.
  EXPECT_LE(present, 64 + 20);
  EXPECT_GT(present, 0);
  cache.Clear();
  for (int i = 0; i < 10000; ++i) {
    EXPECT_FALSE(cache.Lookup(kv::KeyHash("k" + std::to_string(i))).has_value());
  }
}

// Keys whose entries would collide in a direct-mapped array keep their entries: a set holds
// kWays of them, and a cache a third full keeps practically every key.
TEST(LocationCacheTest, KeysOfOneSetAndAThirdFullCacheAllStay) {
  client::LocationCache one_set(client::LocationCache::kWays);
  ASSERT_EQ(one_set.entries(), client::LocationCache::kWays);
  for (uint32_t i = 0; i < client::LocationCache::kWays; ++i) {
    one_set.Store(kv::KeyHash("s" + std::to_string(i)), {i + 1, 1});
  }
  for (uint32_t i = 0; i < client::LocationCache::kWays; ++i) {
    auto loc = one_set.Lookup(kv::KeyHash("s" + std::to_string(i)));
    ASSERT_TRUE(loc.has_value()) << "key " << i << " was evicted from a set with room";
    EXPECT_EQ(loc->offset_units, i + 1);
  }
  // Storing a key again takes its own way, not another's.
  one_set.Store(kv::KeyHash("s0"), {100, 2});
  for (uint32_t i = 1; i < client::LocationCache::kWays; ++i) {
    EXPECT_TRUE(one_set.Lookup(kv::KeyHash("s" + std::to_string(i))).has_value());
  }
  auto again = one_set.Lookup(kv::KeyHash("s0"));
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->offset_units, 100u);
  // A full set gives up a way at random: after 64 more keys, hardly any of the first eight is
  // left ((7/8)^64 each; a victim chosen the same way every time would keep seven).
  for (uint32_t i = 0; i < 64; ++i) one_set.Store(kv::KeyHash("t" + std::to_string(i)), {i, 1});
  int left = 0;
  for (uint32_t i = 0; i < client::LocationCache::kWays; ++i) {
    if (one_set.Lookup(kv::KeyHash("s" + std::to_string(i))).has_value()) ++left;
  }
  EXPECT_LE(left, 2);

  // 20,000 keys in 65,536 entries (the default size): a direct-mapped array keeps about 86 %
  // of them.
  client::LocationCache cache(65536);
  constexpr int kKeys = 20000;
  for (int i = 0; i < kKeys; ++i) {
    cache.Store(kv::KeyHash("key" + std::to_string(i)), {static_cast<uint32_t>(i), 1});
  }
  int kept = 0;
  for (int i = 0; i < kKeys; ++i) {
    auto loc = cache.Lookup(kv::KeyHash("key" + std::to_string(i)));
    if (loc.has_value() && loc->offset_units == static_cast<uint32_t>(i)) ++kept;
  }
  // About 15 keys overflow sets of more than eight and a few alias: 99.5 % leaves room.
  EXPECT_GE(kept, kKeys * 995 / 1000) << "of " << kKeys << " keys";
}

TEST(LocationCacheTest, DisabledCacheIsEmpty) {
  client::LocationCache cache(0);
  cache.Store(1, {1, 1});
  EXPECT_FALSE(cache.Lookup(1).has_value());
  cache.Clear();
}

// The pool's shape in a cluster only grows: a link to a server with small items connecting
// while (or after) one with large items did must not shrink the scratches below what the large
// server's items need.
TEST(ScratchPoolTest, GrowShapeNeverLowersACapacity) {
  client::ScratchPool pool(nullptr);
  const client::ScratchShape big = client::ScratchShapeFor(64, 1 << 20);
  const client::ScratchShape small = client::ScratchShapeFor(64, 1 << 10);
  ASSERT_GT(big.item_capacity, small.item_capacity);
  pool.GrowShape(big);
  pool.GrowShape(small);
  EXPECT_EQ(pool.shape().item_capacity, big.item_capacity);
  // Concurrent growers end at the largest of them, whatever the order.
  std::vector<std::thread> growers;
  for (int i = 0; i < 8; ++i) {
    growers.emplace_back([&pool, i] {
      for (int n = 0; n < 1000; ++n) {
        pool.GrowShape(client::ScratchShapeFor(64, uint64_t{1} << (10 + (i + n) % 12)));
      }
    });
  }
  for (auto& t : growers) t.join();
  EXPECT_EQ(pool.shape().item_capacity,
            client::ScratchShapeFor(64, uint64_t{1} << 21).item_capacity);
  // Standalone, SetShape follows the one server, down as well.
  pool.SetShape(small);
  EXPECT_EQ(pool.shape().item_capacity, small.item_capacity);
}

// A thread's released scratch is the one its next Acquire gets (the GET fast path: no lock, no
// registration); one of an old shape is never handed out; and under many threads acquiring and
// releasing at once no scratch is held by two of them.
TEST(ScratchPoolTest, ThreadPlaceGivesBackTheThreadsOwnScratch) {
  FakeServer server;
  FakeFabric fabric(&server);
  client::ScratchPool pool(&fabric);
  pool.SetShape(client::ScratchShapeFor(8, 1 << 10));
  auto first = pool.Acquire();
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  client::ReadScratch* const raw = first->get();
  pool.Release(std::move(*first));
  auto again = pool.Acquire();
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->get(), raw) << "the thread's own scratch should come back";
  // Another thread finds it too (in this thread's place) rather than registering a new one:
  // calls that move between threads keep as many scratches as run at once.
  pool.Release(std::move(*again));
  client::ReadScratch* other_got = nullptr;
  std::thread([&] {
    auto s = pool.Acquire();
    ASSERT_TRUE(s.ok());
    other_got = s->get();
    pool.Release(std::move(*s));
  }).join();
  EXPECT_EQ(other_got, raw) << "another thread registered a new scratch while one was free";
  again = pool.Acquire();
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->get(), raw);
  // A larger shape: the old scratch is dropped on release, and a new one fits.
  pool.SetShape(client::ScratchShapeFor(8, 1 << 16));
  pool.Release(std::move(*again));
  auto grown = pool.Acquire();
  ASSERT_TRUE(grown.ok());
  EXPECT_GE((*grown)->item_capacity, pool.shape().item_capacity);
  pool.Release(std::move(*grown));

  std::atomic<int> owners_clash{0};
  // More threads than the pool has thread places (64), so that some share one.
  std::vector<std::thread> threads;
  for (int t = 0; t < 80; ++t) {
    threads.emplace_back([&] {
      for (int n = 0; n < 300; ++n) {
        auto s = pool.Acquire();
        if (!s.ok()) {
          owners_clash.fetch_add(1000);
          return;
        }
        // Mark it as ours; a second holder would find the mark set.
        if ((*s)->tags.size() != 0) owners_clash.fetch_add(1);
        (*s)->tags.push_back(1);
        std::this_thread::yield();
        (*s)->tags.clear();
        pool.Release(std::move(*s));
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(owners_clash.load(), 0);
}

// The ownership lease's refresh: only one batch per connection carries the ownership READ
// while the lease is valid but older than half; everyone probes when there is no lease or it
// has expired; an abandoned claim (its READ failed) passes on after half a lease.
TEST(SessionLeaseTest, OneRefreshAtATimeWhileTheLeaseIsValid) {
  using namespace std::chrono_literals;
  client::ScratchPool pool(nullptr);
  client::Session s(nullptr, kv::RegionHeader{}, transport::RegionDescriptor{}, &pool);
  const auto half = 50ms;
  const auto t = std::chrono::steady_clock::now();
  uint8_t ownership[kv::kOwnershipBytes] = {};
  // No lease yet: every batch probes.
  EXPECT_TRUE(s.ClaimLeaseRefresh(t, half));
  EXPECT_TRUE(s.ClaimLeaseRefresh(t, half));
  s.UpdateLease(t, ownership);
  // Fresh: nobody probes.
  EXPECT_FALSE(s.ClaimLeaseRefresh(t + 10ms, half));
  // Older than half: the first claims the refresh, the others ride on the valid lease.
  EXPECT_TRUE(s.ClaimLeaseRefresh(t + 60ms, half));
  EXPECT_FALSE(s.ClaimLeaseRefresh(t + 61ms, half));
  EXPECT_FALSE(s.ClaimLeaseRefresh(t + 70ms, half));
  // Expired (older than a whole lease): everyone probes again, claim or not.
  EXPECT_TRUE(s.ClaimLeaseRefresh(t + 100ms, half));
  EXPECT_TRUE(s.ClaimLeaseRefresh(t + 101ms, half));
  // A recorded refresh ends the claim; the next stale period starts a new one.
  s.UpdateLease(t + 100ms, ownership);
  EXPECT_FALSE(s.ClaimLeaseRefresh(t + 120ms, half));
  EXPECT_TRUE(s.ClaimLeaseRefresh(t + 151ms, half));
  EXPECT_FALSE(s.ClaimLeaseRefresh(t + 152ms, half));
  // Nobody records the claimed refresh (its READ failed): once the lease expires, every batch
  // probes again.
  EXPECT_FALSE(s.ClaimLeaseRefresh(t + 199ms, half));
  EXPECT_TRUE(s.ClaimLeaseRefresh(t + 200ms, half));
  EXPECT_TRUE(s.ClaimLeaseRefresh(t + 201ms, half));
}

TEST(DescribeKeyTest, EscapesAndShortens) {
  EXPECT_EQ(client::DescribeKey("abc"), "key 'abc'");
  EXPECT_EQ(client::DescribeKey(std::string("a\0b'", 4)), "key 'a\\x00b\\x27'");
  std::string long_key(300, 'x');
  std::string d = client::DescribeKey(long_key);
  EXPECT_LT(d.size(), 100u);
  EXPECT_NE(d.find("300 bytes"), std::string::npos);
}

// --- item verdicts ---

std::vector<uint8_t> MakeItem(std::string_view key, std::string_view value, uint64_t version,
                              uint32_t state = kv::kStateLive) {
  kv::ItemHeader h{};
  h.state = state;
  h.key_bytes = static_cast<uint32_t>(key.size());
  h.value_bytes = static_cast<uint32_t>(value.size());
  h.units = kv::UnitsFor(kv::ItemBytes(key.size(), value.size()));
  h.version = version;
  h.checksum = kv::ItemChecksum(h, key, value);
  std::vector<uint8_t> b(h.units * kv::kUnit);
  std::memcpy(b.data(), &h, sizeof(h));
  std::memcpy(b.data() + sizeof(h), key.data(), key.size());
  std::memcpy(b.data() + sizeof(h) + key.size(), value.data(), value.size());
  return b;
}

TEST(ClassifyItemTest, Verdicts) {
  std::string_view v;
  uint64_t ver = 0;
  bool torn = false;
  auto live = MakeItem("k", "value", 7);
  EXPECT_EQ(client::ClassifyItem(live.data(), live.size(), "k", &v, &ver, &torn),
            client::Verdict::kAccept);
  EXPECT_EQ(v, "value");
  EXPECT_EQ(ver, 7u);
  auto dead = MakeItem("k", "value", 7, kv::kStateDead);
  EXPECT_EQ(client::ClassifyItem(dead.data(), dead.size(), "k", &v, &ver, &torn),
            client::Verdict::kRetry);
  EXPECT_FALSE(torn);
  // Reached through a slot READ first, a retired (or just linked) item is the answer.
  bool was_live = true;
  v = {};
  ver = 0;
  EXPECT_EQ(client::ClassifyItem(dead.data(), dead.size(), "k", &v, &ver, &torn,
                                 client::Reach::kSlotReadFirst, &was_live),
            client::Verdict::kAccept);
  EXPECT_FALSE(was_live);
  EXPECT_EQ(v, "value");
  EXPECT_EQ(ver, 7u);
  auto pending = MakeItem("k", "next", 8, kv::kStatePending);
  EXPECT_EQ(client::ClassifyItem(pending.data(), pending.size(), "k", &v, &ver, &torn),
            client::Verdict::kRetry);
  // PENDING never: it is the slot's item only if the grace period outlasts read_deadline.
  EXPECT_EQ(client::ClassifyItem(pending.data(), pending.size(), "k", &v, &ver, &torn,
                                 client::Reach::kSlotReadFirst, &was_live),
            client::Verdict::kRetry);
  EXPECT_FALSE(torn);
  EXPECT_EQ(client::ClassifyItem(live.data(), live.size(), "k", &v, &ver, &torn,
                                 client::Reach::kSlotReadFirst, &was_live),
            client::Verdict::kAccept);
  EXPECT_TRUE(was_live);
  // A torn retired item is still torn, however it was reached.
  auto torn_dead = dead;
  torn_dead[sizeof(kv::ItemHeader) + 2] ^= 1;
  EXPECT_EQ(client::ClassifyItem(torn_dead.data(), torn_dead.size(), "k", &v, &ver, &torn,
                                 client::Reach::kSlotReadFirst, &was_live),
            client::Verdict::kRetry);
  EXPECT_TRUE(torn);
  auto bad = live;
  bad[sizeof(kv::ItemHeader) + 2] ^= 1;  // a value byte
  EXPECT_EQ(client::ClassifyItem(bad.data(), bad.size(), "k", &v, &ver, &torn),
            client::Verdict::kRetry);
  EXPECT_TRUE(torn);
  auto other = MakeItem("another-key", "x", 3);
  EXPECT_EQ(client::ClassifyItem(other.data(), other.size(), "k", &v, &ver, &torn),
            client::Verdict::kForeign);
  auto other_dead = MakeItem("kk", "x", 3, kv::kStateDead);
  EXPECT_EQ(client::ClassifyItem(other_dead.data(), other_dead.size(), "k", &v, &ver, &torn),
            client::Verdict::kForeign);
  // Garbage claiming another key: not proof of anything.
  auto garbage = other;
  garbage[sizeof(kv::ItemHeader)] ^= 1;
  EXPECT_EQ(client::ClassifyItem(garbage.data(), garbage.size(), "k", &v, &ver, &torn),
            client::Verdict::kRetry);
  std::vector<uint8_t> zeros(64, 0);
  EXPECT_EQ(client::ClassifyItem(zeros.data(), zeros.size(), "k", &v, &ver, &torn),
            client::Verdict::kRetry);
  EXPECT_EQ(client::ClassifyItem(live.data(), 16, "k", &v, &ver, &torn), client::Verdict::kRetry);
}

// --- the client against the fake fabric ---

class FakeClientTest : public ::testing::Test {
 protected:
  Result<std::unique_ptr<Client>> Connect(ClientOptions o = {}) {
    if (o.seed.empty()) o.seed = "127.0.0.1:1";
    // The fake reuses no block for 20 s (its grace period), so a long deadline is safe; it keeps
    // sanitizer slowness from adding retries to the READ counts the tests check (the slow-path
    // test sets its own).
    if (o.read_deadline == ClientOptions{}.read_deadline)
      o.read_deadline = std::chrono::seconds(10);
    auto f = std::make_unique<FakeFabric>(&server_);
    fabric_ = f.get();
    return client::ConnectWithFabric(o, std::move(f));
  }
  std::unique_ptr<Client> MustConnect(ClientOptions o = {}) {
    auto c = Connect(std::move(o));
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::move(c).value() : nullptr;
  }
  kv::RegionHeader header() { return server_.header(); }
  bool IsItemRead(uint64_t offset) { return offset >= header().heap_offset; }
  // The next `count` READs of items come back with the byte at `at` (from the item's start)
  // changed, as a READ that overlapped a rewrite would: the item fails its checksum.
  void TearNextItemReads(int count, size_t at) {
    tears_left_ = count;
    server_.on_read = [this, at](transport::ReadOp& op, uint64_t offset) {
      if (IsItemRead(offset) && tears_left_ > 0) {
        --tears_left_;
        op.local[at] ^= 0x55;
      }
      return transport::ReadStatus::kOk;
    };
  }

  FakeServer server_;
  int tears_left_ = 0;  // TearNextItemReads
  FakeFabric* fabric_ = nullptr;
};

TEST_F(FakeClientTest, PutGetAndReadsPerGet) {
  auto c = MustConnect();
  ASSERT_NE(c, nullptr);
  auto v1 = c->Put("user:1", "alice");
  ASSERT_TRUE(v1.ok()) << v1.status().ToString();
  auto g = c->Get("user:1");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->value, "alice");
  EXPECT_EQ(g->version, *v1);
  ClientStats s = c->stats();
  EXPECT_EQ(s.gets, 1u);
  EXPECT_EQ(s.get_reads, 3u);        // both candidate buckets + item
  EXPECT_EQ(s.get_round_trips, 2u);  // a cold GET: buckets in one batch, then the item
  EXPECT_EQ(s.cache_hits, 0u);
  g = c->Get("user:1");
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->value, "alice");
  s = c->stats();
  EXPECT_EQ(s.get_reads, 4u);        // the cached location: one READ
  EXPECT_EQ(s.get_round_trips, 3u);  // a warm GET: one round trip
  EXPECT_EQ(s.cache_hits, 1u);
  // Registered memory is allocated once (header + one scratch), not per GET.
  int allocations = fabric_->allocations.load();
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(c->Get("user:1").ok());
  EXPECT_EQ(fabric_->allocations.load(), allocations);
  EXPECT_TRUE(c->Get("nobody").status().Is(StatusCode::kNotFound));
  EXPECT_EQ(c->stats().errors, 0u);
}

TEST_F(FakeClientTest, CacheDisabledAlwaysTwoReads) {
  ClientOptions o;
  o.location_cache_entries = 0;
  auto c = MustConnect(o);
  ASSERT_TRUE(c->Put("k", "v").ok());
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(c->Get("k").ok());
  EXPECT_EQ(c->stats().get_reads, 15u);
  EXPECT_EQ(c->stats().get_round_trips, 10u);
  EXPECT_EQ(c->stats().cache_hits, 0u);
}

TEST_F(FakeClientTest, StaleCacheFallsBackToIndex) {
  auto c = MustConnect();
  ASSERT_TRUE(c->Put("k", "v1").ok());
  ASSERT_TRUE(c->Get("k").ok());  // caches v1's location
  // Another client replaces the value (this client's cache still points at v1, now DEAD).
  uint64_t ver = 0;
  ASSERT_TRUE(server_.Apply(kv::Op::kPut, "k", "v2", 0, &ver).ok());
  auto g = c->Get("k");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->value, "v2");
  EXPECT_EQ(g->version, ver);
  EXPECT_EQ(c->stats().cache_misses, 1u);
  EXPECT_EQ(c->stats().get_reads, 3u + 4u);  // cache READ failed, buckets + item
  EXPECT_EQ(c->stats().get_round_trips, 2u + 3u);
  // The block of v1 reused by another key: the cache READ sees a foreign item.
  kv::SlotFields v2loc = kv::UnpackSlot(*server_.FindSlot("k"));
  ASSERT_TRUE(c->Get("k").ok());
  ASSERT_TRUE(server_.Apply(kv::Op::kDelete, "k", "", 0, &ver).ok());
  server_.ReuseNext(v2loc.offset_units);
  ASSERT_TRUE(server_.Apply(kv::Op::kPut, "x", "other", 0, &ver).ok());
  EXPECT_TRUE(c->Get("k").status().Is(StatusCode::kNotFound));
  EXPECT_EQ(c->stats().cache_misses, 2u);
}

// Fault injected by hand: a new item linked while the old one is still LIVE (server/store.cc
// marks the old item DEAD before it stores the slot; an older store did not). A GET through
// the index already returns the new value. A cached GET that starts afterwards must not return
// the old one; with cache_checks_slot it sees the slot moved and falls back.
TEST_F(FakeClientTest, CacheChecksSlotNeverGoesBackInTime) {
  ClientOptions o;
  o.cache_checks_slot = true;
  auto a = MustConnect(o);
  ClientOptions ob;
  ob.location_cache_entries = 0;
  auto b = MustConnect(ob);
  uint64_t v1 = 0;
  ASSERT_TRUE(server_.Apply(kv::Op::kPut, "k", "old", 0, &v1).ok());
  ASSERT_TRUE(a->Get("k").ok());
  ClientStats s0 = a->stats();
  ASSERT_TRUE(a->Get("k").ok());  // a cache hit: item + the bucket that held it, one batch
  EXPECT_EQ(a->stats().get_reads - s0.get_reads, 2u);
  EXPECT_EQ(a->stats().cache_hits - s0.cache_hits, 1u);

  uint64_t* slot = server_.FindSlot("k");
  uint64_t old = *slot;
  *slot = server_.WriteItem("k", "new", v1 + 1);  // linked; the old item is still LIVE
  auto gb = b->Get("k");
  ASSERT_TRUE(gb.ok());
  EXPECT_EQ(gb->value, "new");
  auto ga = a->Get("k");
  ASSERT_TRUE(ga.ok());
  EXPECT_EQ(ga->value, "new");
  EXPECT_EQ(ga->version, v1 + 1);
  server_.Retire(old);
}

// cache_checks_slot READs the bucket the cache says held the key: keys in either candidate
// bucket (the cache remembers which) are cache hits, each one round trip of two READs.
TEST_F(FakeClientTest, CacheChecksSlotReadsTheBucketThatHeldTheKey) {
  ClientOptions o;
  o.cache_checks_slot = true;
  o.location_cache_entries = 1 << 20;  // room for every key of the test
  auto c = MustConnect(o);
  constexpr int kKeys = 500;
  size_t in_second = 0;
  for (int i = 0; i < kKeys; ++i) {
    std::string key = "key-" + std::to_string(i);
    ASSERT_TRUE(c->Put(key, "value-" + std::to_string(i)).ok());
  }
  for (int i = 0; i < kKeys; ++i) {
    std::string key = "key-" + std::to_string(i);
    uint64_t* slot = server_.FindSlot(key);
    uint64_t* second = server_.Bucket(key, 1);
    in_second += slot >= second && slot < second + kv::kSlotsPerBucket;
    ASSERT_TRUE(c->Get(key).ok());  // cold: caches the location and the bucket
  }
  EXPECT_GT(in_second, 50u) << "keys in both candidate buckets";
  EXPECT_LT(in_second, kKeys - 50u) << "keys in both candidate buckets";
  ClientStats s0 = c->stats();
  for (int i = 0; i < kKeys; ++i) {
    auto g = c->Get("key-" + std::to_string(i));
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    EXPECT_EQ(g->value, "value-" + std::to_string(i));
  }
  ClientStats s1 = c->stats();
  EXPECT_EQ(s1.cache_hits - s0.cache_hits, uint64_t{kKeys});
  EXPECT_EQ(s1.cache_misses - s0.cache_misses, 0u);
  EXPECT_EQ(s1.get_reads - s0.get_reads, 2u * kKeys);
  EXPECT_EQ(s1.get_round_trips - s0.get_round_trips, uint64_t{kKeys});
}

TEST_F(FakeClientTest, WritesInvalidateOwnCacheEntry) {
  auto c = MustConnect();
  ASSERT_TRUE(c->Put("k", "v1").ok());
  ASSERT_TRUE(c->Get("k").ok());
  ASSERT_TRUE(c->Put("k", "v2").ok());
  uint64_t reads = c->stats().get_reads;
  auto g = c->Get("k");
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->value, "v2");
  EXPECT_EQ(c->stats().get_reads - reads, 3u);  // straight to the index, no wasted READ
  EXPECT_EQ(c->stats().cache_misses, 0u);
}

TEST_F(FakeClientTest, FingerprintCollisionWithAbsentKeyIsNotFound) {
  auto c = MustConnect();
  // An intact item of another key sits in "wanted"'s first bucket under its fingerprint.
  uint64_t word = server_.WriteItem("impostor", "value", 1);
  kv::SlotFields f = kv::UnpackSlot(word);
  f.fingerprint = kv::FingerprintOf(kv::KeyHash("wanted"));
  server_.Bucket("wanted", 0)[3] = kv::PackSlot(f);
  auto g = c->Get("wanted");
  EXPECT_TRUE(g.status().Is(StatusCode::kNotFound)) << g.status().ToString();
  EXPECT_EQ(c->stats().get_retries, 0u);
  // With the key present too (in its emptier bucket), the right one is returned.
  uint64_t ver = 0;
  ASSERT_TRUE(server_.Apply(kv::Op::kPut, "wanted", "mine", 0, &ver).ok());
  g = c->Get("wanted");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->value, "mine");
  EXPECT_EQ(c->stats().get_reads, 3u + 4u);  // buckets + both candidates in one batch
  EXPECT_EQ(c->stats().get_round_trips, 2u + 2u);
}

TEST_F(FakeClientTest, TornReadsAreRetriedNeverReturned) {
  ClientOptions o;
  o.location_cache_entries = 0;
  auto c = MustConnect(o);
  ASSERT_TRUE(c->Put("k", std::string(500, 'a')).ok());
  TearNextItemReads(3, 100);  // a value byte from "another write"
  auto g = c->Get("k");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->value, std::string(500, 'a'));
  ClientStats s = c->stats();
  EXPECT_EQ(s.torn_reads, 3u);
  EXPECT_EQ(s.get_retries, 3u);
  EXPECT_EQ(s.get_reads, 12u);  // four attempts of buckets + item
}

// A cached READ that overlapped an in-place rewrite (the key's item, its checksum failing) says
// nothing against the location: the GET goes through the index this time, but the entry stays
// and the key is not marked contended, so the next GET is one READ again (docs/design.md
// "In-place updates").
TEST_F(FakeClientTest, ATornCachedReadKeepsTheLocationAndNoContendedMark) {
  auto c = MustConnect();
  ASSERT_TRUE(c->Put("k", std::string(200, 'a')).ok());  // the answer's location is cached
  TearNextItemReads(1, sizeof(kv::ItemHeader) + 50);     // a value byte of "the next version"
  auto g = c->Get("k");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->value, std::string(200, 'a'));
  ClientStats s1 = c->stats();
  EXPECT_EQ(s1.torn_reads, 1u);
  g = c->Get("k");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  ClientStats s2 = c->stats();
  EXPECT_EQ(s2.get_reads - s1.get_reads, 1u) << "the location was dropped or marked contended";
  EXPECT_EQ(s2.cache_hits - s1.cache_hits, 1u);
}

TEST_F(FakeClientTest, PersistentCorruptionIsAnErrorNotAValue) {
  ClientOptions o;
  o.max_get_attempts = 5;
  auto c = MustConnect(o);
  ASSERT_TRUE(c->Put("k", "value").ok());
  server_.on_read = [&](transport::ReadOp& op, uint64_t offset) {
    if (IsItemRead(offset)) op.local[sizeof(kv::ItemHeader) + 1] ^= 1;
    return transport::ReadStatus::kOk;
  };
  auto g = c->Get("k");
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), StatusCode::kCorruption) << g.status().ToString();
  EXPECT_NE(g.status().message().find("5 attempts"), std::string::npos) << g.status().message();
  EXPECT_NE(g.status().message().find("checksum"), std::string::npos) << g.status().message();
  EXPECT_EQ(c->stats().errors, 1u);
}

// The item READ races with an update: its slot was READ (pointing at "old") before the update,
// the item is READ after it, DEAD. "old" was the key's value at the slot READ, inside the GET:
// the answer, in one attempt (docs/design.md "index path, found"). The next GET sees "new".
TEST_F(FakeClientTest, RetiredItemReachedThroughItsSlotIsTheValueAtTheSlotRead) {
  ClientOptions o;
  o.location_cache_entries = 0;
  auto c = MustConnect(o);
  ASSERT_TRUE(c->Put("k", "old").ok());
  bool raced = false;
  server_.on_read = [&](transport::ReadOp& op, uint64_t offset) {
    if (IsItemRead(offset) && !raced) {
      raced = true;
      uint64_t ver = 0;
      EXPECT_TRUE(server_.Apply(kv::Op::kPut, "k", "new", 0, &ver).ok());
      std::memcpy(op.local, reinterpret_cast<const void*>(op.remote_addr), op.length);
    }
    return transport::ReadStatus::kOk;
  };
  auto g = c->Get("k");
  ASSERT_TRUE(raced);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->value, "old");
  EXPECT_EQ(c->stats().get_retries, 0u);
  EXPECT_EQ(c->stats().retired_accepts, 1u);
  EXPECT_EQ(c->stats().torn_reads, 0u);
  auto g2 = c->Get("k");
  ASSERT_TRUE(g2.ok()) << g2.status().ToString();
  EXPECT_EQ(g2->value, "new");
  EXPECT_GT(g2->version, g->version);
}

// A key rewritten between every slot READ and item READ (a hot key under a write storm). Before
// the slot-first rule every attempt found its item DEAD and the GET failed with kCorruption
// after max_get_attempts; now each GET answers at once with the value its slot READ saw: never
// older than the last write acknowledged before the GET began.
TEST_F(FakeClientTest, AKeyRewrittenBeforeEveryItemReadStillAnswers) {
  ClientOptions o;
  o.location_cache_entries = 0;
  o.max_get_attempts = 4;
  auto c = MustConnect(o);
  uint64_t acked = 0;
  ASSERT_TRUE(server_.Apply(kv::Op::kPut, "k", "v0", 0, &acked).ok());
  int writes = 0;
  uint64_t last = acked;  // the version of the newest write
  server_.on_read = [&](transport::ReadOp& op, uint64_t offset) {
    if (IsItemRead(offset)) {
      EXPECT_TRUE(server_.Apply(kv::Op::kPut, "k", "v" + std::to_string(++writes), 0, &last).ok());
      std::memcpy(op.local, reinterpret_cast<const void*>(op.remote_addr), op.length);
    }
    return transport::ReadStatus::kOk;
  };
  for (int i = 0; i < 20; ++i) {
    const int before = writes;  // "v<before>" (version `acked`) is acknowledged before this GET
    auto g = c->Get("k");
    ASSERT_TRUE(g.ok()) << i << ": " << g.status().ToString();
    EXPECT_EQ(g->value, "v" + std::to_string(before)) << i;
    EXPECT_EQ(g->version, acked) << i;
    acked = last;  // the write the GET raced with is acknowledged now: the next GET's floor
  }
  EXPECT_EQ(writes, 20);
  EXPECT_EQ(c->stats().get_retries, 0u);
  EXPECT_EQ(c->stats().retired_accepts, 20u);
  EXPECT_EQ(c->stats().errors, 0u);
}

// The cache path keeps refusing a retired item: its location was remembered, not just READ.
TEST_F(FakeClientTest, CachedLocationOfARetiredItemFallsBackToTheIndex) {
  auto c = MustConnect(ClientOptions{});
  ASSERT_TRUE(c->Put("k", "old").ok());
  ASSERT_TRUE(c->Get("k").ok());  // cached
  uint64_t ver = 0;
  ASSERT_TRUE(server_.Apply(kv::Op::kPut, "k", "new", 0, &ver).ok());  // another writer
  ClientStats s0 = c->stats();
  auto g = c->Get("k");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->value, "new");
  EXPECT_EQ(c->stats().cache_misses - s0.cache_misses, 1u);
  EXPECT_EQ(c->stats().retired_accepts, 0u);
}

TEST_F(FakeClientTest, SlowAttemptIsRestartedFromTheIndex) {
  ClientOptions o;
  o.location_cache_entries = 0;
  o.read_deadline = std::chrono::milliseconds(5);
  auto c = MustConnect(o);
  ASSERT_TRUE(c->Put("k", "v").ok());
  int slow = 1;
  server_.on_read = [&](transport::ReadOp&, uint64_t offset) {
    if (IsItemRead(offset) && slow-- > 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    return transport::ReadStatus::kOk;
  };
  auto g = c->Get("k");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(c->stats().slow_reads, 1u);
  EXPECT_EQ(c->stats().get_retries, 1u);
  EXPECT_EQ(c->stats().get_reads, 6u);
  // Always slow: no value is returned after the attempts (kTimedOut: nothing was wrong but time).
  slow = 1000;
  o.max_get_attempts = 3;
  auto c2 = MustConnect(o);
  g = c2->Get("k");
  EXPECT_EQ(g.status().code(), StatusCode::kTimedOut) << g.status().ToString();
}

TEST_F(FakeClientTest, RemoteAccessErrorFailsTheGetAndReconnects) {
  auto c = MustConnect();
  ASSERT_TRUE(c->Put("k", "v").ok());
  server_.on_read = [&](transport::ReadOp&, uint64_t offset) {
    return IsItemRead(offset) ? transport::ReadStatus::kRemoteAccessError
                              : transport::ReadStatus::kOk;
  };
  auto g = c->Get("k");
  EXPECT_EQ(g.status().code(), StatusCode::kRemoteAccessError) << g.status().ToString();
  server_.on_read = nullptr;
  g = c->Get("k");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(c->stats().reconnects, 1u);
}

TEST_F(FakeClientTest, ReconnectsAfterRestartAndDropsCache) {
  auto c = MustConnect();
  ASSERT_TRUE(c->Put("k", "v").ok());
  ASSERT_TRUE(c->Get("k").ok());
  // The server restarts: every connection dies, the region is a new incarnation.
  server_.down = true;
  auto g = c->Get("k");
  EXPECT_EQ(g.status().code(), StatusCode::kUnavailable) << g.status().ToString();
  EXPECT_NE(g.status().message().find("127.0.0.1:1"), std::string::npos) << g.status().message();
  auto p = c->Put("k", "v");
  EXPECT_EQ(p.status().code(), StatusCode::kUnavailable);
  server_.Format();
  server_.down = false;
  uint64_t ver = 0;
  ASSERT_TRUE(server_.Apply(kv::Op::kPut, "k", "after", 0, &ver).ok());
  uint64_t reads = c->stats().get_reads;
  g = c->Get("k");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->value, "after");
  EXPECT_EQ(c->stats().get_reads - reads, 3u);  // cache dropped: buckets + item
  EXPECT_EQ(c->stats().reconnects, 1u);
  // A connection that merely broke (same incarnation) keeps the cache.
  ++server_.generation;
  reads = c->stats().get_reads;
  ASSERT_TRUE(c->Get("k").ok());
  EXPECT_EQ(c->stats().get_reads - reads, 1u);
  EXPECT_EQ(c->stats().reconnects, 2u);
}

TEST_F(FakeClientTest, ConnectionLostDuringReadIsAnError) {
  auto c = MustConnect();
  ASSERT_TRUE(c->Put("k", "v").ok());
  server_.on_read = [&](transport::ReadOp&, uint64_t) {
    return transport::ReadStatus::kConnectionLost;
  };
  EXPECT_EQ(c->Get("k").status().code(), StatusCode::kConnectionLost);
  server_.on_read = nullptr;
  EXPECT_TRUE(c->Get("k").ok());
}

// Threads spread over connections_per_server connections, opened as threads first need them;
// one thread never opens a second one.
TEST_F(FakeClientTest, ThreadsSpreadOverConnectionsPerServer) {
  for (uint32_t per_server : {1u, 3u}) {
    ClientOptions o;
    o.connections_per_server = per_server;
    auto c = MustConnect(o);
    ASSERT_NE(c, nullptr);
    ASSERT_TRUE(c->Put("k", "v").ok());
    const int after_first = fabric_->connects.load();
    for (int i = 0; i < 5; ++i) ASSERT_TRUE(c->Get("k").ok());
    EXPECT_EQ(fabric_->connects.load(), after_first) << "one thread keeps its one connection";
    std::vector<std::thread> threads;
    std::atomic<int> failures{0};
    for (int t = 0; t < 6; ++t) {
      threads.emplace_back([&] {
        for (int i = 0; i < 20; ++i) failures += c->Get("k").ok() ? 0 : 1;
      });
    }
    for (auto& t : threads) t.join();
    EXPECT_EQ(failures.load(), 0);
    // Seven threads over `per_server` slots: every slot is used, none twice.
    EXPECT_EQ(fabric_->connects.load(), static_cast<int>(per_server)) << per_server;
  }
  ClientOptions bad;
  bad.connections_per_server = 0;
  EXPECT_EQ(Connect(bad).status().code(), StatusCode::kInvalidArgument);
  bad.connections_per_server = 65;
  EXPECT_EQ(Connect(bad).status().code(), StatusCode::kInvalidArgument);
}

// A thread whose own connection cannot be opened (e.g. the server refuses it at its
// --max_connections) uses another open connection to the same server instead of failing, and
// does not try to open its own again on every call.
TEST_F(FakeClientTest, AThreadWhoseConnectionIsRefusedUsesAnotherOne) {
  ClientOptions o;
  o.connections_per_server = 2;
  auto c = MustConnect(o);
  ASSERT_NE(c, nullptr);
  ASSERT_TRUE(c->Put("k", "v").ok());
  ASSERT_EQ(fabric_->connects.load(), 1);
  server_.refuse_connects = true;  // the open connection keeps working
  // Two new threads: consecutive thread numbers, so one of them has the other slot.
  for (int t = 0; t < 2; ++t) {
    std::thread([&] {
      for (int i = 0; i < 10; ++i) {
        auto g = c->Get("k");
        EXPECT_TRUE(g.ok()) << g.status().ToString();
      }
    }).join();
  }
  EXPECT_EQ(fabric_->connects.load(), 1) << "the refused slot was not opened";
  server_.refuse_connects = false;
  ASSERT_TRUE(c->Put("k2", "v2").ok());
}

TEST_F(FakeClientTest, ConnectErrors) {
  ClientOptions o;
  o.seed = "nonsense";
  auto c = Connect(o);
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  o.seed = "127.0.0.1:1";
  o.auth_token = "wrong";
  c = Connect(o);
  EXPECT_EQ(c.status().code(), StatusCode::kPermissionDenied) << c.status().ToString();
  o.auth_token = "";
  o.max_get_attempts = 0;
  EXPECT_EQ(Connect(o).status().code(), StatusCode::kInvalidArgument);
  o.max_get_attempts = 16;
  o.busy_poll = std::chrono::microseconds(-1);
  EXPECT_EQ(Connect(o).status().code(), StatusCode::kInvalidArgument) << "negative busy_poll";
  o.busy_poll = std::chrono::milliseconds(11);
  EXPECT_EQ(Connect(o).status().code(), StatusCode::kInvalidArgument) << "busy_poll above 10 ms";
  o.busy_poll = std::chrono::microseconds(0);
  server_.down = true;
  c = Connect(o);
  EXPECT_EQ(c.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(c.status().message().find("127.0.0.1:1"), std::string::npos);
  // The public entry point checks the seed before touching any transport.
  ClientOptions pub;
  EXPECT_EQ(Client::Connect(pub).status().code(), StatusCode::kInvalidArgument);
  pub.seed = "x:y";
  EXPECT_EQ(Client::Connect(pub).status().code(), StatusCode::kInvalidArgument);
  pub.seed = "127.0.0.1:7400";
  pub.transport = "carrier-pigeon";
  EXPECT_EQ(Client::Connect(pub).status().code(), StatusCode::kInvalidArgument);
}

// A server of layout version 2 (index v2 with 64-byte units) is refused by this client (layout
// 3, 32-byte units) with a message that names both versions: at the transport's region
// descriptor, and at the region header when the descriptor is not the one that tells.
TEST_F(FakeClientTest, RefusesLayoutVersion2Region) {
  ASSERT_EQ(kv::kLayoutVersion, 3u);
  server_.advertised_layout_version = 2;
  auto c = Connect();
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kProtocolError);
  EXPECT_NE(c.status().message().find(
                "layout version 2 (a server from before compact items: 64-byte units), this "
                "client reads 3"),
            std::string::npos)
      << c.status().message();
  server_.advertised_layout_version = kv::kLayoutVersion;
  kv::RegionHeader good = header();
  kv::RegionHeader h = good;
  h.layout_version = 2;
  h.header_checksum = kv::HeaderChecksum(h);
  server_.SetHeader(h);
  c = Connect();
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kProtocolError);
  EXPECT_NE(c.status().message().find("server region header: layout version 2 (a server from "
                                      "before compact items: 64-byte units), this client reads 3"),
            std::string::npos)
      << c.status().message();
  server_.SetHeader(good);
  EXPECT_TRUE(Connect().ok());
}

TEST_F(FakeClientTest, RefusesBadRegionHeaders) {
  kv::RegionHeader good = header();
  auto expect_refused = [&](kv::RegionHeader h, const char* why) {
    server_.SetHeader(h);
    auto c = Connect();
    ASSERT_FALSE(c.ok()) << why;
    EXPECT_EQ(c.status().code(), StatusCode::kProtocolError) << why;
    EXPECT_NE(c.status().message().find(why), std::string::npos) << c.status().message();
  };
  kv::RegionHeader h = good;
  h.magic ^= 1;
  expect_refused(h, "magic");
  // A server of the layout before index v2 (its header otherwise intact), and a newer one.
  h = good;
  h.layout_version = 1;
  h.header_checksum = kv::HeaderChecksum(h);
  expect_refused(h, "layout version 1 (a server from before index v2), this client reads 3");
  h = good;
  h.layout_version = 4;
  h.header_checksum = kv::HeaderChecksum(h);
  expect_refused(h, "layout version 4 (a newer server)");
  h = good;
  h.bucket_count = 1;  // two choices need two buckets
  h.header_checksum = kv::HeaderChecksum(h);
  expect_refused(h, "geometry");
  h = good;
  h.max_value_bytes += 1;  // not re-checksummed
  expect_refused(h, "checksum");
  h = good;
  h.region_bytes = good.region_bytes * 2;
  h.header_checksum = kv::HeaderChecksum(h);
  expect_refused(h, "larger than");
  h = good;
  h.heap_offset = good.index_offset;
  h.header_checksum = kv::HeaderChecksum(h);
  expect_refused(h, "geometry");
  server_.SetHeader(good);
  EXPECT_TRUE(Connect().ok());
}

TEST_F(FakeClientTest, WriteErrorsAndValidation) {
  auto c = MustConnect();
  EXPECT_EQ(c->max_value_bytes(), 64u << 10);
  uint64_t calls = server_.calls;
  EXPECT_EQ(c->Put("", "v").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c->Get("").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c->Put(std::string(1025, 'k'), "v").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c->Get(std::string(1025, 'k')).status().code(), StatusCode::kInvalidArgument);
  auto big = c->Put("k", std::string((64 << 10) + 1, 'v'));
  EXPECT_EQ(big.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(big.status().message().find("65536"), std::string::npos) << big.status().message();
  EXPECT_EQ(server_.calls, calls);  // none of these reached the server
  EXPECT_TRUE(c->Put(std::string(1024, 'k'), std::string(64 << 10, 'v')).ok());

  auto v1 = c->Insert("k", "a");
  ASSERT_TRUE(v1.ok());
  auto again = c->Insert("k", "b");
  EXPECT_EQ(again.status().code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(again.status().message(), "key exists");  // the server's text
  auto cas = c->Cas("k", *v1 + 100, "c");
  EXPECT_EQ(cas.status().code(), StatusCode::kVersionMismatch);
  EXPECT_NE(cas.status().message().find(std::to_string(*v1)), std::string::npos);
  auto v2 = c->Cas("k", *v1, "c");
  ASSERT_TRUE(v2.ok());
  EXPECT_GT(*v2, *v1);
  EXPECT_TRUE(c->Delete("k").ok());
  EXPECT_EQ(c->Delete("k").code(), StatusCode::kNotFound);
  EXPECT_EQ(c->Cas("k", *v2, "d").status().code(), StatusCode::kNotFound);
  auto v3 = c->Insert("k", "again");
  ASSERT_TRUE(v3.ok());
  EXPECT_GT(*v3, *v2);  // versions grow across delete and re-insert

  EXPECT_TRUE(c->Ping().ok());
  auto stats = c->Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(*stats, R"({"items":1})");
  EXPECT_EQ(c->stats().errors, 5u);  // the invalid arguments above; answers are not errors

  server_.calls_time_out = true;
  EXPECT_EQ(c->Put("k", "v").status().code(), StatusCode::kTimedOut);
  server_.calls_time_out = false;
  EXPECT_TRUE(c->Put("k", "v").ok());  // a timeout does not drop the connection
  EXPECT_EQ(c->stats().reconnects, 0u);
}

// A write the server refused (kUnavailable: a replicated primary could not get it acknowledged,
// e.g. its backup has another admin secret) is retried with the same id; when that retry times
// out, the error keeps the refusal's reason instead of a bare timeout (seen with kvcli in
// tests/security/session_cluster_secrets_test.sh on a loaded host).
TEST_F(FakeClientTest, AWriteRetryThatTimesOutKeepsTheServersRefusal) {
  auto c = MustConnect();
  ASSERT_NE(c, nullptr);
  int calls = 0;
  server_.on_call = [&calls]() -> Status {
    if (++calls == 1) {
      return Status::Unavailable(
          "shard 0: the write was not acknowledged: backup server 1 could not prove the admin "
          "secret");
    }
    return Status::TimedOut("fake: no response within 80 ms (the request may have been applied)");
  };
  auto p = c->Put("k", "v");
  server_.on_call = nullptr;
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(p.status().code(), StatusCode::kTimedOut) << p.status().ToString();
  EXPECT_NE(p.status().message().find("no response within 80 ms"), std::string::npos)
      << p.status().ToString();
  EXPECT_NE(p.status().message().find("Unavailable: shard 0: the write was not acknowledged"),
            std::string::npos)
      << p.status().ToString();
  EXPECT_NE(p.status().message().find("could not prove the admin secret"), std::string::npos)
      << p.status().ToString();
}

TEST_F(FakeClientTest, MultiGetBatchesAndMissingKeys) {
  ClientOptions o;
  o.max_batch_reads = 7;  // several bucket batches, candidate batches split by op count
  auto c = MustConnect(o);
  std::vector<std::string> names;
  for (int i = 0; i < 50; ++i) {
    names.push_back("key-" + std::to_string(i));
    if (i % 3 != 0) {
      ASSERT_TRUE(c->Put(names.back(), "value-" + std::to_string(i)).ok());
    }
  }
  names.push_back("");  // invalid
  std::vector<std::string_view> keys(names.begin(), names.end());
  auto results = c->MultiGet(keys);
  ASSERT_EQ(results.size(), keys.size());
  for (int i = 0; i < 50; ++i) {
    if (i % 3 == 0) {
      EXPECT_TRUE(results[i].status().Is(StatusCode::kNotFound)) << i;
    } else {
      ASSERT_TRUE(results[i].ok()) << i << " " << results[i].status().ToString();
      EXPECT_EQ(results[i]->value, "value-" + std::to_string(i));
    }
  }
  EXPECT_EQ(results[50].status().code(), StatusCode::kInvalidArgument);
  ClientStats s = c->stats();
  EXPECT_EQ(s.gets, 50u);
  EXPECT_EQ(s.get_reads, 100u + 33u);  // two buckets per key, an item per present key
  // Again: the 33 present keys come from the cache with one READ each.
  results = c->MultiGet(keys);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(results[i].ok(), i % 3 != 0);
  s = c->stats();
  EXPECT_EQ(s.cache_hits, 33u);
  EXPECT_EQ(s.get_reads, 133u + 33u + 34u);
  EXPECT_TRUE(c->MultiGet({}).empty());
}

TEST_F(FakeClientTest, MultiGetLargeItemsSplitAcrossBuffer) {
  // Items of 40 KiB: the scratch's item area (max item + 64 KiB) holds three at a time.
  ClientOptions o;
  o.location_cache_entries = 0;
  auto c = MustConnect(o);
  std::vector<std::string> names;
  for (int i = 0; i < 12; ++i) {
    names.push_back("big-" + std::to_string(i));
    ASSERT_TRUE(c->Put(names.back(), std::string(40 << 10, static_cast<char>('a' + i))).ok());
  }
  int tear = 2;
  server_.on_read = [&](transport::ReadOp& op, uint64_t offset) {
    if (IsItemRead(offset) && tear-- > 0) op.local[1000] ^= 1;
    return transport::ReadStatus::kOk;
  };
  std::vector<std::string_view> keys(names.begin(), names.end());
  auto results = c->MultiGet(keys);
  for (int i = 0; i < 12; ++i) {
    ASSERT_TRUE(results[i].ok()) << results[i].status().ToString();
    EXPECT_EQ(results[i]->value, std::string(40 << 10, static_cast<char>('a' + i)));
  }
  EXPECT_EQ(c->stats().torn_reads, 2u);
  EXPECT_EQ(c->stats().get_retries, 2u);
}

TEST_F(FakeClientTest, MultiGetReadErrorFailsUnresolvedKeys) {
  auto c = MustConnect();
  ASSERT_TRUE(c->Put("a", "1").ok());
  ASSERT_TRUE(c->Put("b", "2").ok());
  ASSERT_TRUE(c->Get("a").ok());  // cached
  server_.on_read = [&](transport::ReadOp&, uint64_t offset) {
    return offset < header().heap_offset ? transport::ReadStatus::kConnectionLost
                                         : transport::ReadStatus::kOk;
  };
  std::string_view keys[] = {"a", "b"};
  auto results = c->MultiGet(keys);
  EXPECT_TRUE(results[0].ok());  // answered by the cache READ before the failure
  EXPECT_EQ(results[1].status().code(), StatusCode::kConnectionLost);
}

// --- rdkv::Admin ---

// A Client that is not the library's (an application's test double).
class OtherClient final : public Client {
 public:
  Result<GetResult> Get(std::string_view) override { return Status::NotSupported("other"); }
  std::vector<Result<GetResult>> MultiGet(std::span<const std::string_view>) override { return {}; }
  Result<uint64_t> Put(std::string_view, std::string_view) override {
    return Status::NotSupported("other");
  }
  Result<uint64_t> Insert(std::string_view, std::string_view) override {
    return Status::NotSupported("other");
  }
  Status Delete(std::string_view) override { return Status::NotSupported("other"); }
  Result<uint64_t> Cas(std::string_view, uint64_t, std::string_view) override {
    return Status::NotSupported("other");
  }
  Result<std::string> Stats() override { return Status::NotSupported("other"); }
  Status Ping() override { return Status::NotSupported("other"); }
  ClientStats stats() const override { return {}; }
  uint64_t max_value_bytes() const override { return 0; }
};

TEST_F(FakeClientTest, AdminOfAStandaloneServerHasNoMapToChange) {
  auto c = MustConnect();
  ASSERT_NE(c, nullptr);
  Admin admin(*c);
  EXPECT_EQ(admin.map_epoch(), 0u);
  const uint32_t shard = 0;
  auto moved = admin.MoveShards(std::span<const uint32_t>(&shard, 1), 1, nullptr);
  EXPECT_EQ(moved.status().code(), StatusCode::kNotSupported) << moved.status().ToString();
  EXPECT_NE(moved.status().message().find("standalone"), std::string::npos);
}

TEST(AdminTest, NeedsAClientMadeByTheLibrary) {
  OtherClient other;
  Admin admin(other);
  EXPECT_EQ(admin.Snapshot("x").status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(admin.Servers(true).empty());
  EXPECT_EQ(admin.map_epoch(), 0u);
  const uint32_t shard = 0;
  EXPECT_EQ(admin.MoveShards(std::span<const uint32_t>(&shard, 1), 1, nullptr).status().code(),
            StatusCode::kInvalidArgument);
}

// CopyRetryIds against scripted servers: pages go from the source to the target in order, a
// server that predates SHARD_IDS / RECORD_IDS ("unknown operation") skips the ids with a
// warning instead of failing the copy, and any other error fails it naming the step.
class ScriptedChannel : public client::AdminChannel {
 public:
  Status Call(const cluster::ServerEntry& server, const kv::Request& request, uint64_t* version,
              std::string* body) override {
    std::lock_guard<std::mutex> lock(mu);
    calls.push_back(server.id * 100 + static_cast<uint32_t>(request.op));
    if (server.id == 1) {  // the source
      if (!source_error.ok()) return source_error;
      if (request.expected_version == 0) {
        *version = 5;
        std::vector<kv::AnsweredWrite> page;
        for (uint64_t i = 1; i <= first_page; ++i) page.push_back({2 + i, 9, i});
        *body = kv::EncodeAnsweredWrites(page);
      } else {
        *version = kv::kScanDone;
        *body = kv::EncodeAnsweredWrites({{0, 9, 3}});
      }
      return Status::Ok();
    }
    if (!target_error.ok() && records_before_error-- <= 0) return target_error;
    Result<kv::RecordIdsRequest> m = kv::DecodeRecordIds(request);
    if (!m.ok()) return m.status();
    const std::vector<kv::AnsweredWrite> ids = kv::DecodeAnsweredWrites(m->ids);
    for (const kv::AnsweredWrite& w : ids) seqs.insert(w.request_seq);
    *version = ids.size();
    return Status::Ok();
  }
  uint64_t first_page = 2;  // ids in the source's first page (then one more page of one)
  std::mutex mu;            // RECORD_IDS come from several threads
  std::vector<uint32_t> calls;
  std::multiset<uint64_t> seqs;  // the ids the target recorded, by seq
  Status source_error, target_error;
  int records_before_error = 0;
};

TEST(CopyRetryIdsTest, CopiesEveryPageAndSkipsServersThatPredateTheOps) {
  const cluster::ServerEntry from{1, "127.0.0.1:1"}, to{2, "127.0.0.1:2"};
  {
    ScriptedChannel ch;
    uint64_t ids = 0;
    std::string warning;
    ASSERT_TRUE(client::CopyRetryIds(ch, from, to, 4, &ids, &warning).ok());
    EXPECT_EQ(ids, 3u);
    EXPECT_EQ(ch.seqs, (std::multiset<uint64_t>{1, 2, 3}));
    EXPECT_TRUE(warning.empty()) << warning;
    EXPECT_EQ(ch.calls, (std::vector<uint32_t>{114, 215, 114, 215}));
  }
  {
    // A page of 1,000: in RECORD_IDS of kMaxIdsPerRecord, every id once.
    ScriptedChannel ch;
    ch.first_page = 1000;
    uint64_t ids = 0;
    std::string warning;
    ASSERT_TRUE(client::CopyRetryIds(ch, from, to, 4, &ids, &warning).ok());
    EXPECT_EQ(ids, 1001u);
    ASSERT_EQ(ch.seqs.size(), 1001u);
    for (uint64_t seq = 1; seq <= 1000; ++seq) EXPECT_EQ(ch.seqs.count(seq), seq == 3 ? 2u : 1u);
    EXPECT_EQ(std::count(ch.calls.begin(), ch.calls.end(), 215u),
              (1000 + kv::kMaxIdsPerRecord - 1) / kv::kMaxIdsPerRecord + 1);
    // One of the parallel RECORD_IDS failing fails the copy.
    ScriptedChannel failing;
    failing.first_page = 1000;
    failing.target_error = Status::Unavailable("gone");
    failing.records_before_error = 3;
    Status s = client::CopyRetryIds(failing, from, to, 4, &ids, &warning);
    EXPECT_TRUE(s.Is(StatusCode::kUnavailable)) << s.ToString();
  }
  for (bool old_source : {true, false}) {
    ScriptedChannel ch;
    (old_source ? ch.source_error : ch.target_error) =
        Status::ProtocolError(old_source ? "unknown operation 14" : "unknown operation 15");
    uint64_t ids = 0;
    std::string warning;
    EXPECT_TRUE(client::CopyRetryIds(ch, from, to, 4, &ids, &warning).ok());
    EXPECT_EQ(ids, 0u);
    EXPECT_NE(warning.find(old_source ? "SHARD_IDS" : "RECORD_IDS"), std::string::npos) << warning;
    EXPECT_NE(warning.find("upgrade"), std::string::npos) << warning;
  }
  for (bool source : {true, false}) {
    ScriptedChannel ch;
    (source ? ch.source_error : ch.target_error) = Status::Unavailable("connection reset");
    uint64_t ids = 0;
    std::string warning;
    Status s = client::CopyRetryIds(ch, from, to, 4, &ids, &warning);
    EXPECT_TRUE(s.Is(StatusCode::kUnavailable)) << s.ToString();
    EXPECT_NE(s.message().find(source ? "SHARD_IDS" : "RECORD_IDS"), std::string::npos)
        << s.ToString();
    EXPECT_NE(s.message().find("shard 4"), std::string::npos) << s.ToString();
  }
}

}  // namespace
}  // namespace rdkv

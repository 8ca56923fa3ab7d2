// The GET engine (client/get_engine.h) on its own, against the in-process fake of a server's
// region (tests/client/fake_fabric.h): no Client facade, no writes through the wire. Each test
// lays the region out as it needs (items, slots, ownership words), resolves keys with
// GetEngine::ResolveOn and checks the result and the counters.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "client/call.h"
#include "client/counters.h"
#include "client/get_engine.h"
#include "client/links.h"
#include "client/read_buffers.h"
#include "client/router.h"
#include "common/cluster/cluster_map.h"
#include "common/kv/layout.h"
#include "tests/client/fake_fabric.h"

namespace rdkv::client {
namespace {

using namespace std::chrono_literals;
using testing::FakeFabric;
using testing::FakeServer;

class GetEngineTest : public ::testing::Test {
 protected:
  GetEngineTest() {
    options_.seed = "127.0.0.1:1";
    options_.read_deadline = 1000ms;  // no slow attempts on a loaded test machine
    options_.max_get_attempts = 4;
  }

  // Builds the parts (after the test has set options_).
  void Start() {
    links_ = std::make_unique<Links>(options_, ServerAddress{"127.0.0.1", 1}, &fabric_, &pool_,
                                     &counters_);
    caller_ = std::make_unique<Caller>(options_, links_.get(), &counters_);
    router_ = std::make_unique<Router>(links_.get(), caller_.get());
    engine_ =
        std::make_unique<GetEngine>(options_, links_.get(), router_.get(), &pool_, &counters_);
  }

  // Makes the engine a cluster client (one server, one shard) that judges every result by
  // the ownership words of the fake's region.
  void StartCluster() {
    Start();
    router_->Install(cluster::MakeUniformMap({"127.0.0.1:1"}, 1));
    ASSERT_TRUE(router_->cluster());
  }

  // The fake server's ownership words: map epoch 1, shard 0 served or not.
  void SetOwnership(bool owns_shard0) {
    uint64_t epoch = 1;
    uint64_t word0 = owns_shard0 ? 1 : 0;
    std::memcpy(server_.region() + kv::kOwnershipOffset, &epoch, 8);
    std::memcpy(server_.region() + kv::kOwnershipOffset + 8, &word0, 8);
  }

  uint64_t Put(std::string_view key, std::string_view value) {
    uint64_t version = 0;
    Status s = server_.Apply(kv::Op::kPut, key, value, 0, &version);
    EXPECT_TRUE(s.ok()) << s.ToString();
    return version;
  }

  // One key through ResolveOn on the seed's link (shard 0).
  Result<GetResult> Resolve(std::string_view key, KeyJob* out_job = nullptr) {
    std::optional<Result<GetResult>> out;
    KeyJob job;
    job.key = key;
    job.out = &out;
    Status s = engine_->ResolveOn(links_->seed(), std::span<KeyJob>(&job, 1));
    if (out_job != nullptr) *out_job = job;
    if (!s.ok()) return s;
    if (!out.has_value()) return Status::Internal("unresolved");
    return std::move(*out);
  }

  ClientStats stats() const { return counters_.Snapshot(); }

  // The next `count` item READs (every one when negative) return a torn item: a byte of the
  // value of "k" flipped, so its checksum fails.
  void TearItemReads(int count) {
    auto left = std::make_shared<int>(count);
    server_.on_read = [this, left](transport::ReadOp& op, uint64_t offset) {
      if (IsItemRead(offset) && *left != 0) {
        if (*left > 0) --*left;
        op.local[sizeof(kv::ItemHeader) + 1] ^= 0xff;
      }
      return transport::ReadStatus::kOk;
    };
  }

  // While *races > 0, each item READ races a rewrite of "k" to "new": the rewrite retires the
  // item the READ copied, and the READ copies it again, so it shows the item DEAD.
  void RewriteKDuringItemReads(int* races) {
    server_.on_read = [this, races](transport::ReadOp& op, uint64_t offset) {
      if (IsItemRead(offset) && *races > 0) {
        --*races;
        Put("k", "new");
        std::memcpy(op.local, reinterpret_cast<const void*>(op.remote_addr), op.length);
      }
      return transport::ReadStatus::kOk;
    };
  }

  // The shard arrives (`key` written, the ownership bit set) right after the next GET's two
  // bucket images were copied: neither shows the key.
  void MoveInAfterTheBuckets(std::string key, std::string value) {
    auto bucket_reads = std::make_shared<int>(0);
    server_.on_read = [this, bucket_reads, key, value](transport::ReadOp&, uint64_t offset) {
      if (IsBucketRead(offset) && ++*bucket_reads == 2) {
        Put(key, value);
        SetOwnership(true);
      }
      return transport::ReadStatus::kOk;
    };
  }

  // Every READ of a GET of `key` fails (connection lost): the GET ends with that error after
  // one round trip, counted once as a GET and once as an error, as the engine would.
  void ExpectALostReadEndsTheGet(std::string_view key) {
    const ClientStats before = stats();
    server_.on_read = [&](transport::ReadOp&, uint64_t) {
      return transport::ReadStatus::kConnectionLost;
    };
    auto lost = engine_->Get(key);
    EXPECT_TRUE(lost.status().Is(StatusCode::kConnectionLost)) << lost.status().ToString();
    EXPECT_EQ(stats().gets, before.gets + 1);
    EXPECT_EQ(stats().errors, before.errors + 1);
    EXPECT_EQ(stats().get_round_trips, before.get_round_trips + 1);
    server_.on_read = nullptr;
  }
  bool IsItemRead(uint64_t offset) const { return offset >= server_.header().heap_offset; }
  // A READ of an index bucket (not the region header READ at connect, nor an ownership READ).
  bool IsBucketRead(uint64_t offset) const {
    return offset >= server_.header().index_offset && offset < server_.header().heap_offset;
  }

  FakeServer server_{4 << 20};  // room in its injection area for an item of ~130 KiB
  FakeFabric fabric_{&server_};
  ClientOptions options_;
  ScratchPool pool_{&fabric_};
  Counters counters_;
  std::unique_ptr<Links> links_;
  std::unique_ptr<Caller> caller_;
  std::unique_ptr<Router> router_;
  std::unique_ptr<GetEngine> engine_;
};

TEST(ReadTagTest, PacksAndUnpacks) {
  ReadTag t{123456, 15, (1u << 24) - 1};
  ReadTag u = ReadTag::Unpack(t.Pack());
  EXPECT_EQ(u.job, 123456u);
  EXPECT_EQ(u.candidate, 15);
  EXPECT_EQ(u.offset, (1u << 24) - 1);
}

TEST_F(GetEngineTest, CachedLocationHitIsOneRead) {
  Start();
  uint64_t v = Put("user:1", "alice");
  auto g = Resolve("user:1");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->value, "alice");
  EXPECT_EQ(g->version, v);
  EXPECT_EQ(stats().get_reads, 3u);  // both buckets + item
  EXPECT_EQ(stats().get_round_trips, 2u);
  EXPECT_EQ(stats().cache_hits, 0u);
  g = Resolve("user:1");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->value, "alice");
  EXPECT_EQ(stats().get_reads, 4u);  // the cached item only
  EXPECT_EQ(stats().get_round_trips, 3u);
  EXPECT_EQ(stats().cache_hits, 1u);
  EXPECT_EQ(stats().gets, 2u);
}

TEST_F(GetEngineTest, StaleCachedLocationFallsBackToTheIndex) {
  Start();
  Put("k", "old");
  ASSERT_TRUE(Resolve("k").ok());  // caches the old item's location
  uint64_t v2 = Put("k", "new");   // a new item; the old one is retired
  auto g = Resolve("k");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->value, "new");
  EXPECT_EQ(g->version, v2);
  EXPECT_EQ(stats().cache_misses, 1u);
  EXPECT_EQ(stats().cache_hits, 0u);
  EXPECT_EQ(stats().get_reads, 3u + 1u + 3u);  // index, stale cached item, index again
  EXPECT_EQ(stats().get_round_trips, 2u + 1u + 2u);
  EXPECT_EQ(stats().get_retries, 0u);
}

TEST_F(GetEngineTest, ForeignItemUnderTheKeysFingerprintIsNotTheKey) {
  Start();
  // A slot in "mine"'s window with "mine"'s fingerprint, pointing at an intact item of
  // another key: a fingerprint collision, not a torn read.
  uint64_t mine = kv::KeyHash("mine");
  kv::SlotFields f = kv::UnpackSlot(server_.WriteItem("other", "x", 7));
  f.fingerprint = kv::FingerprintOf(mine);
  server_.Bucket("mine", 1)[0] = kv::PackSlot(f);
  auto g = Resolve("mine");
  EXPECT_EQ(g.status().code(), StatusCode::kNotFound) << g.status().ToString();
  EXPECT_EQ(stats().get_retries, 0u);
  EXPECT_EQ(stats().torn_reads, 0u);
  // The key itself in another slot of the same window is found past the foreign one.
  uint64_t v = Put("mine", "value");
  g = Resolve("mine");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->value, "value");
  EXPECT_EQ(g->version, v);
  EXPECT_EQ(stats().get_retries, 0u);
}

TEST_F(GetEngineTest, TornReadIsRetriedThenReported) {
  Start();
  Put("k", "value");
  // Two torn item READs, then intact ones: the GET retries and returns the value.
  TearItemReads(2);
  options_.location_cache_entries = 0;  // every GET through the index
  Start();
  auto g = Resolve("k");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->value, "value");
  EXPECT_EQ(stats().torn_reads, 2u);
  EXPECT_EQ(stats().get_retries, 2u);

  // Always torn: after max_get_attempts the GET fails with kCorruption, never a value.
  TearItemReads(-1);
  g = Resolve("k");
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), StatusCode::kCorruption) << g.status().ToString();
  EXPECT_NE(g.status().message().find("4 attempts"), std::string::npos) << g.status().message();
  EXPECT_NE(g.status().message().find("checksum"), std::string::npos) << g.status().message();
  EXPECT_EQ(stats().torn_reads, 2u + 4u);
  server_.on_read = nullptr;
}

TEST_F(GetEngineTest, ResultsWaitForAValidOwnershipLease) {
  options_.ownership_lease = 2ms;
  StartCluster();
  SetOwnership(true);
  Put("k", "value");
  // Every ownership READ completes later than the lease it grants: no result may be
  // returned (a value read under an expired lease could be stale), only retried.
  server_.on_read = [&](transport::ReadOp&, uint64_t offset) {
    if (offset == kv::kOwnershipOffset) std::this_thread::sleep_for(10ms);
    return transport::ReadStatus::kOk;
  };
  auto g = Resolve("k");
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), StatusCode::kCorruption) << g.status().ToString();
  EXPECT_NE(g.status().message().find("ownership lease"), std::string::npos)
      << g.status().message();
  EXPECT_EQ(stats().get_retries, 3u);
  auto absent = Resolve("absent");  // NotFound waits for the lease as well
  EXPECT_EQ(absent.status().code(), StatusCode::kCorruption) << absent.status().ToString();

  // READs that complete within the lease: the value, and NotFound for an absent key.
  server_.on_read = nullptr;
  options_.ownership_lease = 10s;
  StartCluster();
  g = Resolve("k");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->value, "value");
  EXPECT_EQ(Resolve("absent").status().code(), StatusCode::kNotFound);
}

// A retired item is an answer only when the shard's ownership was READ before the slot that
// led to it (docs/design.md "index path, found"): a lease from the ownership READ that rides
// in the slots' own batch may begin after the slots were read.
TEST_F(GetEngineTest, ARetiredItemNeedsALeaseFromBeforeItsSlotRead) {
  options_.location_cache_entries = 0;  // every GET through the index
  options_.ownership_lease = 10s;
  StartCluster();
  SetOwnership(true);
  Put("k", "old");
  int races = 1;
  RewriteKDuringItemReads(&races);
  // No lease before the first attempt: its retired "old" is not taken; the second attempt,
  // under the lease the first one READ, finds "new".
  auto g = Resolve("k");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->value, "new");
  EXPECT_EQ(stats().get_retries, 1u);
  EXPECT_EQ(stats().retired_accepts, 0u);
  // Under a lease READ earlier: the retired item is the answer, at once.
  races = 1;
  g = Resolve("k");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->value, "new");
  EXPECT_EQ(stats().get_retries, 1u);
  EXPECT_EQ(stats().retired_accepts, 1u);
  server_.on_read = nullptr;
}

// The same for NotFound: slots read before the server owned the shard prove nothing. Here the
// shard arrives (the key imported, the ownership bit set) after the buckets were READ and
// before the ownership READ of the same batch: the GET must not answer NotFound.
TEST_F(GetEngineTest, NotFoundNeedsALeaseFromBeforeItsSlotRead) {
  options_.location_cache_entries = 0;
  options_.ownership_lease = 10s;
  StartCluster();
  SetOwnership(false);
  MoveInAfterTheBuckets("k", "moved-in");
  auto g = Resolve("k");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->value, "moved-in");
  EXPECT_EQ(stats().get_retries, 1u);
  server_.on_read = nullptr;
  // With the lease READ earlier, an absent key is NotFound in one attempt.
  EXPECT_EQ(Resolve("absent").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(stats().get_retries, 1u);
}

// --- Get's single-key cached path (docs/design.md "The single-key cached path") ---

TEST_F(GetEngineTest, TheCachedPathIsOneReadAndCountsLikeTheEngine) {
  Start();
  uint64_t v = Put("k", "value");
  auto g = engine_->Get("k");  // cold: the engine (buckets, then item)
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(stats().get_round_trips, 2u);
  g = engine_->Get("k");  // warm: the cached path
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->value, "value");
  EXPECT_EQ(g->version, v);
  EXPECT_EQ(stats().gets, 2u);
  EXPECT_EQ(stats().get_reads, 3u + 1u);
  EXPECT_EQ(stats().get_round_trips, 2u + 1u);
  EXPECT_EQ(stats().cache_hits, 1u);

  // Rewritten: the cached item is retired, which the cached path never returns; the engine
  // finds the new one, and keeps its location as contended (its GETs READ the buckets too).
  uint64_t v2 = Put("k", "new");
  g = engine_->Get("k");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->value, "new");
  EXPECT_EQ(g->version, v2);
  EXPECT_EQ(stats().gets, 3u);
  EXPECT_EQ(stats().cache_misses, 1u);
  EXPECT_EQ(stats().get_round_trips, 3u + 1u + 2u);  // the stale item, then buckets and item
  auto loc = links_->seed().cache.Lookup(kv::KeyHash("k"));
  ASSERT_TRUE(loc.has_value());
  EXPECT_TRUE(loc->contended);

  // A failed READ of the cached item ends the GET with the engine's error (standalone: no
  // second try), counted once.
  Put("other", "x");
  ASSERT_TRUE(engine_->Get("other").ok());  // cached now (not contended)
  uint64_t hits = stats().cache_hits;
  ASSERT_TRUE(engine_->Get("other").ok());
  ASSERT_EQ(stats().cache_hits, hits + 1) << "not the cached path";
  ExpectALostReadEndsTheGet("other");
}

TEST_F(GetEngineTest, TheCachedPathWaitsForAValidOwnershipLease) {
  options_.ownership_lease = 20ms;
  options_.op_timeout = 2000ms;  // room for every attempt's 40 ms ownership READ when loaded
  StartCluster();
  SetOwnership(true);
  Put("k", "value");
  ASSERT_TRUE(engine_->Get("k").ok());  // caches the location
  ASSERT_TRUE(router_->routing()->owners[0]->cache.Lookup(kv::KeyHash("k")).has_value());
  // Every ownership READ now completes later than the lease it grants: the cached item may
  // not be returned (it could be a value the shard's new owner has since overwritten).
  server_.on_read = [&](transport::ReadOp&, uint64_t offset) {
    if (offset == kv::kOwnershipOffset) std::this_thread::sleep_for(40ms);
    return transport::ReadStatus::kOk;
  };
  std::this_thread::sleep_for(30ms);  // the lease from the first GET has expired
  const uint64_t hits = stats().cache_hits;
  auto g = engine_->Get("k");
  ASSERT_FALSE(g.ok()) << "returned '" << g->value << "' without a valid lease";
  EXPECT_EQ(g.status().code(), StatusCode::kCorruption) << g.status().ToString();
  EXPECT_EQ(stats().cache_hits, hits);
  server_.on_read = nullptr;

  // The shard is no longer served here: the cached item is not an answer either.
  std::this_thread::sleep_for(30ms);
  SetOwnership(false);
  ASSERT_TRUE(engine_->Get("k").ok() == false);
  EXPECT_EQ(stats().cache_hits, hits);
}

// In a cluster the cache pass keeps the tail of the scratch's item buffer for the ownership
// READ, so an item just under item_capacity (which the index path reads) fits no cache batch.
// Such a cached location must send the key to the index path, not stall the pass: this test
// hung in CachePass before that.
TEST_F(GetEngineTest, ACachedItemTooLargeForACacheBatchGoesThroughTheIndex) {
  StartCluster();
  SetOwnership(true);
  const size_t capacity = ScratchShapeFor(BatchLimit(options_), 64 << 10).item_capacity;
  const std::string key = "big";
  const std::string value(capacity - sizeof(kv::ItemHeader) - key.size(), 'v');
  ASSERT_EQ(kv::UnitsFor(kv::ItemBytes(key.size(), value.size())) * kv::kUnit, capacity);
  server_.Bucket(key, 0)[0] = server_.WriteItem(key, value, 7);
  for (int i = 0; i < 3; ++i) {  // cold (index), then with the location cached
    auto g = engine_->Get(key);
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    EXPECT_EQ(g->value.size(), value.size());
    EXPECT_EQ(g->version, 7u);
  }
  std::vector<std::string_view> keys = {key, key};
  for (const auto& r : engine_->MultiGet(keys)) ASSERT_TRUE(r.ok()) << r.status().ToString();
  // Such a location is not cached at all: every GET of it is an index GET, no cache miss.
  EXPECT_FALSE(router_->routing()->owners[0]->cache.Lookup(kv::KeyHash(key)).has_value());
  EXPECT_EQ(stats().cache_hits, 0u);
  EXPECT_EQ(stats().cache_misses, 0u);
}

// --- Get's single-key index path (docs/design.md "The single-key index path") ---

TEST_F(GetEngineTest, TheIndexPathAnswersAColdGetOnItsOwnInTwoRoundTrips) {
  options_.location_cache_entries = 0;  // every GET through the index
  Start();
  const uint64_t v = Put("k", "value");
  auto g = engine_->Get("k");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->value, "value");
  EXPECT_EQ(g->version, v);
  EXPECT_EQ(counters_.single_key_index.load(), 1u) << "the engine answered, not the path";
  EXPECT_EQ(stats().gets, 1u);
  EXPECT_EQ(stats().get_round_trips, 2u);  // buckets, then the item
  EXPECT_EQ(stats().get_reads, 3u);
  // Absent: the buckets alone answer, in one round trip.
  EXPECT_EQ(engine_->Get("absent").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(counters_.single_key_index.load(), 2u);
  EXPECT_EQ(stats().get_round_trips, 3u);
  // A slot with "mine"'s fingerprint pointing at another key's intact item: NotFound, no retry.
  kv::SlotFields f = kv::UnpackSlot(server_.WriteItem("other", "x", 7));
  f.fingerprint = kv::FingerprintOf(kv::KeyHash("mine"));
  server_.Bucket("mine", 1)[0] = kv::PackSlot(f);
  EXPECT_EQ(engine_->Get("mine").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(counters_.single_key_index.load(), 3u);
  // ... and the key itself, in a slot of its buckets beside the foreign one, is found.
  const uint64_t mine = Put("mine", "value");
  g = engine_->Get("mine");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->version, mine);
  EXPECT_EQ(counters_.single_key_index.load(), 4u);
  EXPECT_EQ(stats().gets, 4u);
  EXPECT_EQ(stats().get_retries, 0u);
  EXPECT_EQ(stats().errors, 0u);

  // A failed READ ends the GET with its error, counted once, as the engine would.
  ExpectALostReadEndsTheGet("k");
}

// An attempt the rules retry is handed to the engine as the GET's first: max_get_attempts
// counts both paths' attempts together.
TEST_F(GetEngineTest, AnAttemptTheIndexPathRetriesCountsTowardsMaxGetAttempts) {
  options_.location_cache_entries = 0;
  Start();
  Put("k", "value");
  TearItemReads(2);
  auto g = engine_->Get("k");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->value, "value");
  EXPECT_EQ(stats().torn_reads, 2u);
  EXPECT_EQ(stats().get_retries, 2u);
  EXPECT_EQ(stats().gets, 1u);
  EXPECT_EQ(counters_.single_key_index.load(), 0u);  // the engine's third attempt answered

  TearItemReads(-1);
  g = engine_->Get("k");
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), StatusCode::kCorruption) << g.status().ToString();
  EXPECT_NE(g.status().message().find("4 attempts"), std::string::npos) << g.status().message();
  EXPECT_EQ(stats().torn_reads, 2u + 4u);  // max_get_attempts READs of the item, no more
  EXPECT_EQ(stats().gets, 2u);
  EXPECT_EQ(stats().errors, 1u);
  server_.on_read = nullptr;
}

// A slot the layout forbids (past the heap) is judged as the engine judges it: the other
// candidates still answer; alone, it is retried, and every attempt counts.
TEST_F(GetEngineTest, TheIndexPathSkipsASlotOutsideTheHeapAndCountsItsAttempts) {
  options_.location_cache_entries = 0;
  Start();
  const uint64_t v = Put("k", "value");  // in slot 0 of one of its buckets
  // (Forged after the PUT: the fake server would follow it.)
  kv::SlotFields bad{kv::FingerprintOf(kv::KeyHash("k")), 1, 0xfffffff0u};
  server_.Bucket("k", 0)[63] = kv::PackSlot(bad);
  server_.Bucket("k", 1)[63] = kv::PackSlot(bad);
  auto g = engine_->Get("k");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->version, v);
  EXPECT_EQ(counters_.single_key_index.load(), 1u);
  EXPECT_EQ(stats().get_reads, 3u);  // two buckets and the one readable candidate
  EXPECT_EQ(stats().get_retries, 0u);

  bad.fingerprint = kv::FingerprintOf(kv::KeyHash("only-bad"));
  server_.Bucket("only-bad", 0)[0] = kv::PackSlot(bad);
  const ClientStats before = stats();
  g = engine_->Get("only-bad");
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), StatusCode::kCorruption) << g.status().ToString();
  EXPECT_NE(g.status().message().find("4 attempts"), std::string::npos) << g.status().message();
  EXPECT_NE(g.status().message().find("outside the heap"), std::string::npos)
      << g.status().message();
  // max_get_attempts bucket batches, and no READ of the forbidden slot.
  EXPECT_EQ(stats().get_round_trips, before.get_round_trips + 4);
  EXPECT_EQ(stats().get_reads, before.get_reads + 8);
  EXPECT_EQ(counters_.single_key_index.load(), 1u);
}

// Candidates that need more than one batch are the engine's, and the bucket READs that found
// them do not count as an attempt (they judged nothing): max_get_attempts = 1 still allows the
// engine's one attempt.
TEST_F(GetEngineTest, CandidatesForMoreThanOneBatchAreTheEnginesWithoutAnAttemptCounted) {
  options_.location_cache_entries = 0;
  options_.max_batch_reads = kMinBatchReads;  // 3 READs a batch
  options_.max_get_attempts = 1;
  Start();
  Put("k", "value");
  uint64_t word = 0;
  uint64_t* bucket = nullptr;
  for (size_t c = 0; c < kv::kChoices && bucket == nullptr; ++c) {
    for (size_t i = 0; i < kv::kSlotsPerBucket; ++i) {
      if (server_.Bucket("k", c)[i] != 0) {
        bucket = server_.Bucket("k", c);
        word = bucket[i];
        break;
      }
    }
  }
  ASSERT_NE(bucket, nullptr);
  for (size_t i = 60; i < 64; ++i) bucket[i] = word;  // 5 candidates in all, each the item
  auto g = engine_->Get("k");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(counters_.single_key_index.load(), 0u);  // the engine's batches of 3, then 2

  TearItemReads(-1);
  g = engine_->Get("k");
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), StatusCode::kCorruption) << g.status().ToString();
  EXPECT_NE(g.status().message().find("failed 1 attempts"), std::string::npos)
      << g.status().message();
  server_.on_read = nullptr;
}

// A shard the server does not serve: the path hands the key to the engine to re-route (here
// there is no other owner, so it ends with the kWrongOwner once op_timeout has run out).
TEST_F(GetEngineTest, TheIndexPathHandsAShardNotServedToTheEngineToReRoute) {
  options_.location_cache_entries = 0;
  options_.op_timeout = 100ms;
  options_.ownership_lease = 4ms;
  StartCluster();
  SetOwnership(true);
  Put("k", "value");
  ASSERT_TRUE(engine_->Get("k").ok());
  SetOwnership(false);
  std::this_thread::sleep_for(10ms);  // that lease has expired: the next batch READs ownership
  const auto t0 = std::chrono::steady_clock::now();
  auto g = engine_->Get("k");
  const auto took = std::chrono::steady_clock::now() - t0;
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), StatusCode::kWrongOwner) << g.status().ToString();
  EXPECT_NE(g.status().message().find("does not serve shard 0"), std::string::npos)
      << g.status().message();
  EXPECT_GE(took, 100ms) << "ended before op_timeout: not re-routed";
  EXPECT_EQ(counters_.single_key_index.load(), 1u);  // only the first GET
}

// The index path's lease rules hold on this path too (the rules are the engine's own): a
// retired item, and NotFound, only under a lease READ before the slots were.
TEST_F(GetEngineTest, TheIndexPathTakesARetiredItemOrNotFoundOnlyUnderAnEarlierLease) {
  options_.location_cache_entries = 0;
  options_.ownership_lease = 10s;
  StartCluster();
  SetOwnership(true);
  Put("k", "old");
  int races = 1;
  RewriteKDuringItemReads(&races);
  // No lease before the first attempt: its retired "old" is not taken.
  auto g = engine_->Get("k");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->value, "new");
  EXPECT_EQ(stats().get_retries, 1u);
  EXPECT_EQ(stats().retired_accepts, 0u);
  EXPECT_EQ(counters_.single_key_index.load(), 0u);
  // Under a lease READ earlier: the retired item is the answer, on this path.
  races = 1;
  g = engine_->Get("k");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->value, "new");
  EXPECT_EQ(stats().retired_accepts, 1u);
  EXPECT_EQ(counters_.single_key_index.load(), 1u);
  server_.on_read = nullptr;

  // NotFound: the shard arrives after the buckets were READ (a fresh client: no lease yet).
  StartCluster();
  SetOwnership(false);
  MoveInAfterTheBuckets("moved", "in");
  const uint64_t index_before = counters_.single_key_index.load();
  g = engine_->Get("moved");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->value, "in");
  EXPECT_EQ(counters_.single_key_index.load(), index_before);
  server_.on_read = nullptr;
  EXPECT_EQ(engine_->Get("absent").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(counters_.single_key_index.load(), index_before + 1);
}

TEST_F(GetEngineTest, ShardNotServedIsWrongOwner) {
  StartCluster();
  SetOwnership(false);
  Put("k", "value");
  KeyJob job;
  auto g = Resolve("k", &job);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), StatusCode::kWrongOwner) << g.status().ToString();
  EXPECT_TRUE(job.wrong_owner);
  EXPECT_NE(g.status().message().find("does not serve shard 0"), std::string::npos)
      << g.status().message();
  EXPECT_EQ(stats().get_retries, 0u);
  // Not even an absent key is answered by a server that does not serve its shard.
  EXPECT_EQ(Resolve("absent").status().code(), StatusCode::kWrongOwner);
  // Served again: answered.
  SetOwnership(true);
  StartCluster();
  g = Resolve("k");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->value, "value");
}

}  // namespace
}  // namespace rdkv::client

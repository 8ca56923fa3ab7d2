#include "server/store.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <thread>
#include <vector>

namespace rdkv::server {
namespace {

class StoreTest : public ::testing::Test {
 protected:
  void Make(size_t bytes, StoreOptions o = {}) {
    region_.assign(bytes, 0xee);
    Result<std::unique_ptr<Store>> s = Store::Format(region_.data(), bytes, o);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    store_ = std::move(*s);
  }
  // The slots of `key`'s candidate bucket `choice`.
  const uint64_t* Bucket(std::string_view key, size_t choice) const {
    const kv::RegionHeader& h = store_->header();
    kv::Buckets b = kv::BucketsOf(kv::KeyHash(key), kv::SecondHash(key), h.bucket_count);
    return reinterpret_cast<const uint64_t*>(region_.data() + h.index_offset +
                                             b.b[choice] * kv::kBucketBytes);
  }
  // The words of both candidate buckets that carry `key`'s fingerprint.
  std::vector<uint64_t> CandidateWords(std::string_view key) const {
    std::vector<uint64_t> out;
    for (size_t c = 0; c < kv::kChoices; ++c) {
      const uint64_t* w = Bucket(key, c);
      for (size_t i = 0; i < kv::kSlotsPerBucket; ++i) {
        if (w[i] != 0 && kv::UnpackSlot(w[i]).fingerprint == kv::FingerprintOf(kv::KeyHash(key)))
          out.push_back(w[i]);
      }
    }
    return out;
  }
  // Reads the item a key's slot points at, as a client would (both buckets, then items).
  kv::ItemCheck ClientRead(std::string_view key, std::string* value, uint64_t* version) {
    const kv::RegionHeader& h = store_->header();
    for (uint64_t word : CandidateWords(key)) {
      kv::SlotFields s = kv::UnpackSlot(word);
      std::string_view v;
      kv::ItemCheck c =
          kv::CheckItem(region_.data() + h.heap_offset + uint64_t{s.offset_units} * kv::kUnit,
                        uint64_t{s.units} * kv::kUnit, key, &v, version);
      if (c == kv::ItemCheck::kWrongKey) continue;
      *value = std::string(v);
      return c;
    }
    return kv::ItemCheck::kWrongKey;
  }
  std::vector<uint8_t> region_;
  std::unique_ptr<Store> store_;
};

TEST_F(StoreTest, HeaderDescribesTheRegion) {
  Make(1 << 20);
  const kv::RegionHeader& h = store_->header();
  EXPECT_EQ(h.magic, kv::kRegionMagic);
  EXPECT_EQ(h.layout_version, kv::kLayoutVersion);
  EXPECT_EQ(h.header_checksum, kv::HeaderChecksum(h));
  EXPECT_EQ(h.region_bytes, 1u << 20);
}

// Layout 3 (32-byte units): a 16-byte key with a 32-byte value takes 96 bytes of heap (128 in
// layout 2), and a 24-byte key with a 1000-byte value 1088 (its 1056 bytes of item in the
// allocator's next class), within 10% of its 1024 bytes of payload.
TEST_F(StoreTest, SmallItemsTakeNinetySixBytesOfHeap) {
  Make(8 << 20);
  constexpr int kItems = 1000;
  const std::string value(32, 'v');
  for (int i = 0; i < kItems; ++i) {
    char key[17];
    std::snprintf(key, sizeof(key), "k%015d", i);
    ASSERT_TRUE(store_->Put(std::string_view(key, 16), value).ok()) << i;
  }
  EXPECT_EQ(store_->allocator_stats().used_units * kv::kUnit, uint64_t{kItems} * 96);
  const uint64_t before = store_->allocator_stats().used_units;
  ASSERT_TRUE(store_->Put(std::string(24, 'r'), std::string(1000, 'x')).ok());
  const uint64_t record = (store_->allocator_stats().used_units - before) * kv::kUnit;
  EXPECT_EQ(record, 1088u);
  EXPECT_LE(record, 1024 * 11 / 10);
}

TEST_F(StoreTest, OperationsAndVersions) {
  Make(1 << 20);
  Result<uint64_t> v1 = store_->Put("a", "1");
  ASSERT_TRUE(v1.ok());
  Result<uint64_t> v2 = store_->Put("a", "2");
  ASSERT_TRUE(v2.ok());
  EXPECT_GT(*v2, *v1);
  uint64_t cur = 0;
  EXPECT_EQ(store_->Insert("a", "x", &cur).status().code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(cur, *v2);
  EXPECT_EQ(store_->Cas("a", *v1, "x", &cur).status().code(), StatusCode::kVersionMismatch);
  EXPECT_EQ(cur, *v2);
  Result<uint64_t> v3 = store_->Cas("a", *v2, "3");
  ASSERT_TRUE(v3.ok());
  EXPECT_GT(*v3, *v2);
  std::string value;
  uint64_t ver = 0;
  ASSERT_EQ(ClientRead("a", &value, &ver), kv::ItemCheck::kOk);
  EXPECT_EQ(value, "3");
  EXPECT_EQ(ver, *v3);
  ASSERT_TRUE(store_->Delete("a").ok());
  EXPECT_EQ(store_->Delete("a").code(), StatusCode::kNotFound);
  EXPECT_EQ(store_->Cas("a", *v3, "x").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(store_->Get("a").status().code(), StatusCode::kNotFound);
  Result<uint64_t> v4 = store_->Insert("a", "again");
  ASSERT_TRUE(v4.ok());
  EXPECT_GT(*v4, *v3) << "versions grow across delete and re-insert";
  EXPECT_EQ(store_->counters().items, 1u);
}

TEST_F(StoreTest, OverwrittenItemIsDeadBeforeTheWriteReturns) {
  Make(1 << 20);
  ASSERT_TRUE(store_->Put("k", "old").ok());
  const kv::RegionHeader& h = store_->header();
  std::vector<uint64_t> words = CandidateWords("k");
  ASSERT_EQ(words.size(), 1u);
  uint64_t old_word = words[0];
  ASSERT_TRUE(store_->Put("k", std::string(200, 'n')).ok());  // longer: a new item
  kv::SlotFields s = kv::UnpackSlot(old_word);
  std::string_view v;
  uint64_t ver;
  EXPECT_EQ(kv::CheckItem(region_.data() + h.heap_offset + uint64_t{s.offset_units} * kv::kUnit,
                          uint64_t{s.units} * kv::kUnit, "k", &v, &ver),
            kv::ItemCheck::kDead);
}

// docs/design.md "In-place updates": a write whose item needs as many units as the key's
// current one rewrites that item (the slot word and every cached location stay right); any
// other length makes a new item and retires the old one.
TEST_F(StoreTest, AnUpdateOfTheSameLengthRewritesTheItemWhereItIs) {
  Make(1 << 20);
  kv::ItemLocation first, where;
  Result<uint64_t> v1 = store_->Put("k", "aaaaaaaaaa", &first);
  ASSERT_TRUE(v1.ok());
  const std::vector<uint64_t> words = CandidateWords("k");
  ASSERT_EQ(words.size(), 1u);
  auto expect_item = [&](const std::string& want, uint64_t want_version) {
    std::string value;
    uint64_t version = 0;
    EXPECT_EQ(ClientRead("k", &value, &version), kv::ItemCheck::kOk);
    EXPECT_EQ(value, want);
    EXPECT_EQ(version, want_version);
    EXPECT_EQ(store_->counters().items, 1u);
    EXPECT_EQ(store_->counters().item_bytes, kv::ItemBytes(1, want.size()));
  };
  // PUT of the same length, then a shorter value of the same units, CAS and a backup's apply.
  Result<uint64_t> v2 = store_->Put("k", "bbbbbbbbbb", &where);
  ASSERT_TRUE(v2.ok());
  EXPECT_GT(*v2, *v1);
  EXPECT_EQ(where.offset_units, first.offset_units);
  EXPECT_EQ(where.units, first.units);
  EXPECT_EQ(where.choice, first.choice);
  EXPECT_EQ(CandidateWords("k"), words) << "the slot word changed";
  expect_item("bbbbbbbbbb", *v2);
  uint64_t current = 0;
  Result<uint64_t> v3 = store_->Cas("k", *v2, "ccc", &current, &where);
  ASSERT_TRUE(v3.ok());
  EXPECT_EQ(where.offset_units, first.offset_units);
  expect_item("ccc", *v3);
  // Refused writes change nothing.
  EXPECT_TRUE(store_->Cas("k", *v2, "ddd", &current).status().Is(StatusCode::kVersionMismatch));
  EXPECT_EQ(current, *v3);
  bool applied = true;
  ASSERT_TRUE(store_->ApplyVersioned("k", "eee", *v3, &applied, &current).ok());
  EXPECT_FALSE(applied) << "a version not newer than the item's was applied";
  EXPECT_TRUE(store_->Insert("k", "fff", &current).status().Is(StatusCode::kAlreadyExists));
  expect_item("ccc", *v3);
  ASSERT_TRUE(store_->ApplyVersioned("k", "ggg", *v3 + 10, &applied, &current, &where).ok());
  EXPECT_TRUE(applied);
  EXPECT_EQ(where.offset_units, first.offset_units);
  expect_item("ggg", *v3 + 10);
  EXPECT_EQ(store_->counters().in_place_updates, 3u);
  EXPECT_EQ(CandidateWords("k"), words);
  // Another length: a new item, the old one DEAD.
  const std::string longer(300, 'h');
  Result<uint64_t> v4 = store_->Put("k", longer, &where);
  ASSERT_TRUE(v4.ok());
  EXPECT_NE(where.offset_units, first.offset_units);
  expect_item(longer, *v4);
  std::string_view old_value;
  uint64_t old_version = 0;
  EXPECT_EQ(kv::CheckItem(region_.data() + store_->header().heap_offset +
                              uint64_t{first.offset_units} * kv::kUnit,
                          uint64_t{first.units} * kv::kUnit, "k", &old_value, &old_version),
            kv::ItemCheck::kDead);
  EXPECT_EQ(store_->counters().in_place_updates, 3u);
}

// A large item is never rewritten in place (a READ of it overlaps a rewrite for longer; see
// kInPlaceMaxItemBytes): the same length makes a new item.
TEST_F(StoreTest, ALargeItemIsNotRewrittenInPlace) {
  Make(4 << 20);
  const std::string a(8000, 'a'), b(8000, 'b');
  kv::ItemLocation first, where;
  ASSERT_TRUE(store_->Put("big", a, &first).ok());
  ASSERT_TRUE(store_->Put("big", b, &where).ok());
  EXPECT_NE(where.offset_units, first.offset_units);
  EXPECT_EQ(store_->counters().in_place_updates, 0u);
  const std::string small(kv::kInPlaceMaxItemBytes - 64, 's');
  ASSERT_TRUE(store_->Put("edge", small, &first).ok());
  ASSERT_TRUE(store_->Put("edge", std::string(small.size(), 't'), &where).ok());
  EXPECT_EQ(where.offset_units, first.offset_units) << "an item within the limit moved";
}

TEST_F(StoreTest, WithoutInPlaceUpdatesEveryWriteMakesANewItem) {
  StoreOptions o;
  o.update_in_place = false;
  Make(1 << 20, o);
  kv::ItemLocation first, where;
  ASSERT_TRUE(store_->Put("k", "aaaaaaaaaa", &first).ok());
  ASSERT_TRUE(store_->Put("k", "bbbbbbbbbb", &where).ok());
  EXPECT_NE(where.offset_units, first.offset_units);
  EXPECT_EQ(store_->counters().in_place_updates, 0u);
  std::string value;
  uint64_t version = 0;
  EXPECT_EQ(ClientRead("k", &value, &version), kv::ItemCheck::kOk);
  EXPECT_EQ(value, "bbbbbbbbbb");
}

TEST_F(StoreTest, LimitsAreClearErrors) {
  StoreOptions o;
  o.max_value_bytes = 1000;
  o.grace = std::chrono::milliseconds(10);
  Make(1 << 20, o);
  EXPECT_EQ(store_->Put("", "v").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->Put(std::string(1025, 'k'), "v").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->Put("k", std::string(1001, 'v')).status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(store_->Put(std::string(1024, 'k'), std::string(1000, 'v')).ok());
  EXPECT_TRUE(store_->Put("empty", "").ok());
  EXPECT_EQ(*store_->Get("empty"), "");
}

TEST_F(StoreTest, FullRegionFailsWithoutHarmingStoredData) {
  StoreOptions o;
  o.max_value_bytes = 4096;
  o.grace = std::chrono::milliseconds(10);
  Make(256 << 10, o);
  std::map<std::string, std::string> stored;
  Status last;
  for (int i = 0; i < 100000; ++i) {
    std::string key = "key-" + std::to_string(i);
    std::string value(1000, static_cast<char>('a' + i % 26));
    Result<uint64_t> r = store_->Put(key, value);
    if (!r.ok()) {
      last = r.status();
      break;
    }
    stored[key] = value;
  }
  ASSERT_EQ(last.code(), StatusCode::kOutOfSpace) << last.ToString();
  EXPECT_GT(stored.size(), 100u);
  for (auto& [k, v] : stored) {
    std::string got;
    uint64_t ver;
    ASSERT_EQ(ClientRead(k, &got, &ver), kv::ItemCheck::kOk) << k;
    EXPECT_EQ(got, v);
  }
  // Deleting makes room again once the grace period has passed (the write waits for it).
  ASSERT_TRUE(store_->Delete(stored.begin()->first).ok());
  EXPECT_TRUE(store_->Put("after-delete", std::string(1000, 'z')).ok());
}

// The heap is not carved for good: after the region filled with small items and they were
// deleted, it takes large items in their space (free blocks merge once out of limbo), and
// small items again after those (a large free block is split).
TEST_F(StoreTest, SpaceOfDeletedSmallItemsTakesLargeItemsAndBack) {
  StoreOptions o;
  o.max_value_bytes = 8192;
  o.grace = std::chrono::milliseconds(5);
  Make(512 << 10, o);
  auto fill = [&](const std::string& prefix, size_t value_bytes) {
    std::vector<std::string> keys;
    for (int i = 0;; ++i) {
      std::string key = prefix + std::to_string(i);
      Result<uint64_t> r = store_->Put(key, std::string(value_bytes, 'v'));
      if (!r.ok()) {
        EXPECT_EQ(r.status().code(), StatusCode::kOutOfSpace) << r.status().ToString();
        break;
      }
      keys.push_back(key);
    }
    return keys;
  };
  auto drop = [&](const std::vector<std::string>& keys) {
    for (const std::string& k : keys) ASSERT_TRUE(store_->Delete(k).ok()) << k;
  };
  const std::vector<std::string> small = fill("small-", 40);
  ASSERT_GT(small.size(), 500u);
  drop(small);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // out of limbo
  const std::vector<std::string> large = fill("large-", 6000);
  // The heap is the region less the index: the large items fill most of what the small ones
  // took (each of those took 96 bytes; each large one about 6.1 KiB).
  EXPECT_GE(large.size() * 6000, small.size() * 96 * 8 / 10)
      << large.size() << " large items where " << small.size() << " small ones were";
  for (const std::string& k : large) {
    std::string got;
    uint64_t ver;
    ASSERT_EQ(ClientRead(k, &got, &ver), kv::ItemCheck::kOk) << k;
    ASSERT_EQ(got, std::string(6000, 'v'));
  }
  drop(large);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const std::vector<std::string> again = fill("again-", 40);
  EXPECT_GE(again.size(), small.size() * 9 / 10) << "small items after the large ones";
}

// Issue 13: with uniformly random 16-byte keys the two-choice index takes writes until at least
// 90% of its slots are used; the first refusal is a clear kOutOfSpace that changes nothing.
TEST_F(StoreTest, IndexFillsToNinetyPercentBeforeTheFirstRefusal) {
  for (uint64_t seed : {1u, 2u, 3u}) {
    StoreOptions o;
    o.index_fraction = 0.05;  // 20 MiB x 0.05 = 2048 buckets (131072 slots); 19 MiB of heap
    Make(20 << 20, o);
    const kv::RegionHeader& h = store_->header();
    ASSERT_EQ(h.bucket_count, 2048u);
    const uint64_t slots = h.bucket_count * kv::kSlotsPerBucket;
    std::mt19937_64 rng(seed);
    std::vector<std::string> keys;
    std::string value(32, 'v');
    Status refused;
    while (true) {
      std::string key(16, '\0');
      for (size_t i = 0; i < key.size(); i += 8) {
        uint64_t r = rng();
        std::memcpy(key.data() + i, &r, 8);
      }
      std::memcpy(value.data(), key.data(), 16);
      Result<uint64_t> r = store_->Insert(key, value);
      if (!r.ok()) {
        if (r.status().Is(StatusCode::kAlreadyExists)) continue;  // a repeated random key
        refused = r.status();
        break;
      }
      keys.push_back(std::move(key));
    }
    ASSERT_EQ(refused.code(), StatusCode::kOutOfSpace) << refused.ToString();
    EXPECT_NE(refused.message().find("index buckets"), std::string::npos) << refused.ToString();
    EXPECT_NE(refused.message().find("--index_fraction"), std::string::npos);
    const double used = double(keys.size()) / double(slots);
    std::printf("seed %llu: first refusal at %zu of %llu slots (%.2f%%)\n",
                static_cast<unsigned long long>(seed), keys.size(),
                static_cast<unsigned long long>(slots), 100 * used);
    EXPECT_GE(used, 0.90) << "the index refused a write at " << 100 * used << "% slot use";
    EXPECT_EQ(store_->counters().items, keys.size()) << "the refusal stored nothing";
    // Every stored key is where a one-sided reader looks, exactly once.
    for (size_t i = 0; i < keys.size(); i += 97) {
      std::string got;
      uint64_t ver = 0;
      ASSERT_EQ(ClientRead(keys[i], &got, &ver), kv::ItemCheck::kOk);
      EXPECT_EQ(got.substr(0, 16), keys[i]);
    }
    // Deleting makes room again for a key of a now emptier bucket.
    ASSERT_TRUE(store_->Delete(keys.back()).ok());
    EXPECT_TRUE(store_->Insert(keys.back(), value).ok());
  }
}

// A key goes to the emptier of its two buckets and never moves while it exists.
TEST_F(StoreTest, InsertTakesTheEmptierBucketAndUpdatesStayInPlace) {
  StoreOptions o;
  o.index_fraction = 0.001;
  Make(4 << 20, o);  // 8 buckets
  ASSERT_EQ(store_->header().bucket_count, 8u);
  // Fill many keys, then check each sits in one of its own candidate buckets, in one slot.
  for (int i = 0; i < 300; ++i) ASSERT_TRUE(store_->Put("key" + std::to_string(i), "v").ok());
  std::vector<size_t> used(2, 0);
  for (int i = 0; i < 300; ++i) {
    std::string key = "key" + std::to_string(i);
    size_t in[2] = {0, 0};
    for (size_t c = 0; c < kv::kChoices; ++c) {
      const uint64_t* w = Bucket(key, c);
      for (size_t s = 0; s < kv::kSlotsPerBucket; ++s) {
        if (w[s] == 0) continue;
        const uint8_t* it = region_.data() + store_->header().heap_offset +
                            uint64_t{kv::UnpackSlot(w[s]).offset_units} * kv::kUnit;
        kv::ItemHeader ih;
        std::memcpy(&ih, it, sizeof(ih));
        if (std::string_view(reinterpret_cast<const char*>(it) + sizeof(ih), ih.key_bytes) == key)
          ++in[c];
      }
    }
    ASSERT_EQ(in[0] + in[1], 1u) << key;
    ++used[in[1]];
  }
  EXPECT_GT(used[0], 30u) << "both choices are used";
  EXPECT_GT(used[1], 30u) << "both choices are used";
  // An update replaces the word in place.
  std::vector<uint64_t> before = CandidateWords("key7");
  const uint64_t* slot = nullptr;
  for (size_t c = 0; c < kv::kChoices && slot == nullptr; ++c) {
    for (size_t s = 0; s < kv::kSlotsPerBucket; ++s) {
      if (Bucket("key7", c)[s] == before[0]) slot = &Bucket("key7", c)[s];
    }
  }
  ASSERT_NE(slot, nullptr);
  ASSERT_TRUE(store_->Put("key7", "a longer value than before, in another block").ok());
  EXPECT_NE(*slot, before[0]);
  EXPECT_EQ(kv::UnpackSlot(*slot).fingerprint, kv::FingerprintOf(kv::KeyHash("key7")));
  std::string got;
  uint64_t ver;
  ASSERT_EQ(ClientRead("key7", &got, &ver), kv::ItemCheck::kOk);
  EXPECT_EQ(got, "a longer value than before, in another block");
}

// The location a write reports (what its client caches) is the slot's: same block, same
// length, and the candidate bucket that holds the slot.
TEST_F(StoreTest, WritesReportWhereTheirItemIs) {
  StoreOptions o;
  o.index_fraction = 0.001;
  Make(4 << 20, o);  // 8 buckets: both choices get used
  size_t choice_used[2] = {0, 0};
  auto check = [&](const std::string& key, const kv::ItemLocation& where) {
    bool found = false;
    for (size_t c = 0; c < kv::kChoices; ++c) {
      const uint64_t* w = Bucket(key, c);
      for (size_t s = 0; s < kv::kSlotsPerBucket; ++s) {
        if (w[s] == 0) continue;
        const kv::SlotFields f = kv::UnpackSlot(w[s]);
        if (f.offset_units != where.offset_units) continue;
        EXPECT_EQ(f.units, where.units) << key;
        // Both choices may name one bucket (a key whose two hashes collide).
        EXPECT_TRUE(where.choice == c || Bucket(key, where.choice) == Bucket(key, c)) << key;
        found = true;
      }
    }
    EXPECT_TRUE(found) << key << ": no slot points at the reported block";
    std::string_view value;
    uint64_t version = 0;
    EXPECT_EQ(kv::CheckItem(region_.data() + store_->header().heap_offset +
                                uint64_t{where.offset_units} * kv::kUnit,
                            uint64_t{where.units} * kv::kUnit, key, &value, &version),
              kv::ItemCheck::kOk)
        << key;
    ++choice_used[where.choice];
  };
  for (int i = 0; i < 300; ++i) {
    const std::string key = "key" + std::to_string(i);
    kv::ItemLocation where;
    ASSERT_TRUE(store_->Put(key, "v", &where).ok());
    check(key, where);
  }
  kv::ItemLocation where;
  uint64_t current = 0;
  ASSERT_TRUE(store_->Insert("fresh", "value", &current, &where).ok());
  check("fresh", where);
  Result<uint64_t> v = store_->Put("fresh", std::string(300, 'x'), &where);
  ASSERT_TRUE(v.ok());
  check("fresh", where);
  ASSERT_TRUE(store_->Cas("fresh", *v, "third", &current, &where).ok());
  check("fresh", where);
  bool applied = false;
  ASSERT_TRUE(store_->ApplyVersioned("fresh", "fourth", *v + 100, &applied, nullptr, &where).ok());
  ASSERT_TRUE(applied);
  check("fresh", where);
  EXPECT_GT(choice_used[0], 20u);
  EXPECT_GT(choice_used[1], 20u);
}

TEST_F(StoreTest, ConcurrentWritersKeepOneSlotPerKey) {
  Make(8 << 20);
  constexpr int kThreads = 4, kKeys = 64, kIters = 3000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kIters; ++i) {
        std::string key = "k" + std::to_string((i * 7 + t) % kKeys);
        if (i % 5 == 4) {
          store_->Delete(key).IgnoreError();  // may be absent
        } else {
          ASSERT_TRUE(store_->Put(key, std::to_string(i)).ok());
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  const kv::RegionHeader& h = store_->header();
  const uint64_t* slots = reinterpret_cast<const uint64_t*>(region_.data() + h.index_offset);
  size_t used = 0;
  for (uint64_t i = 0; i < h.bucket_count * kv::kSlotsPerBucket; ++i) used += slots[i] != 0;
  EXPECT_EQ(used, store_->counters().items);
  size_t present = 0;
  for (int k = 0; k < kKeys; ++k) present += store_->Get("k" + std::to_string(k)).ok();
  EXPECT_EQ(present, used);
}

TEST_F(StoreTest, RestoreKeepsTheVersionAndLeavesTheCounterAlone) {
  Make(1 << 20);
  ASSERT_TRUE(store_->Restore("a", "alpha", 1000).ok());
  ASSERT_TRUE(store_->Restore("b", "", 7).ok());
  std::string value;
  uint64_t ver = 0;
  ASSERT_EQ(ClientRead("a", &value, &ver), kv::ItemCheck::kOk) << "restored items are LIVE";
  EXPECT_EQ(value, "alpha");
  EXPECT_EQ(ver, 1000u);
  ASSERT_EQ(ClientRead("b", &value, &ver), kv::ItemCheck::kOk);
  EXPECT_EQ(value, "");
  EXPECT_EQ(ver, 7u);
  EXPECT_EQ(store_->counters().items, 2u);
  // The counter did not move: the caller raises it after recovery.
  Result<uint64_t> next = store_->Put("c", "x");
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(*next, 1u);
  store_->EnsureVersionAbove(1000);
  Result<uint64_t> after = store_->Put("a", "beta");
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(*after, 1001u);
}

TEST_F(StoreTest, RestoreRefusesPresentKeysVersionZeroAndBadInput) {
  Make(1 << 20);
  ASSERT_TRUE(store_->Restore("a", "1", 5).ok());
  EXPECT_EQ(store_->Restore("a", "2", 6).code(), StatusCode::kAlreadyExists);
  uint64_t ver = 0;
  EXPECT_EQ(*store_->Get("a", &ver), "1") << "a refused restore changes nothing";
  EXPECT_EQ(ver, 5u);
  EXPECT_EQ(store_->Restore("z", "1", 0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->Restore("", "1", 3).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->Restore(std::string(kv::kMaxKeyBytes + 1, 'k'), "1", 3).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->counters().items, 1u);
}

TEST_F(StoreTest, ConcurrentRestoresOfDisjointKeys) {
  Make(16 << 20);
  constexpr int kThreads = 4, kKeys = 5000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = t; i < kKeys; i += kThreads) {
        ASSERT_TRUE(store_->Restore("k" + std::to_string(i), std::to_string(i * 3), 10 + i).ok());
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(store_->counters().items, static_cast<uint64_t>(kKeys));
  for (int i = 0; i < kKeys; ++i) {
    std::string value;
    uint64_t ver = 0;
    ASSERT_EQ(ClientRead("k" + std::to_string(i), &value, &ver), kv::ItemCheck::kOk) << i;
    EXPECT_EQ(value, std::to_string(i * 3));
    EXPECT_EQ(ver, static_cast<uint64_t>(10 + i));
  }
}

}  // namespace
}  // namespace rdkv::server

#include "server/store.h"

#include <gtest/gtest.h>

#include <map>
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
  // Reads the item a key's slot points at, as a client would (index window, then item).
  kv::ItemCheck ClientRead(std::string_view key, std::string* value, uint64_t* version) {
    const kv::RegionHeader& h = store_->header();
    uint64_t hash = kv::KeyHash(key);
    const uint64_t* w = reinterpret_cast<const uint64_t*>(
        region_.data() + h.index_offset + kv::BucketOf(hash, h.bucket_count) * kv::kBucketBytes);
    for (size_t i = 0; i < 16; ++i) {
      kv::SlotFields s = kv::UnpackSlot(w[i]);
      if (w[i] == 0 || s.fingerprint != kv::FingerprintOf(hash)) continue;
      std::string_view v;
      kv::ItemCheck c =
          kv::CheckItem(region_.data() + h.heap_offset + uint64_t{s.offset_units} * 64,
                        uint64_t{s.units} * 64, key, &v, version);
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
  uint64_t hash = kv::KeyHash("k");
  const uint64_t* w = reinterpret_cast<const uint64_t*>(
      region_.data() + h.index_offset + kv::BucketOf(hash, h.bucket_count) * kv::kBucketBytes);
  uint64_t old_word = 0;
  for (size_t i = 0; i < 16; ++i)
    if (w[i]) old_word = w[i];
  ASSERT_NE(old_word, 0u);
  ASSERT_TRUE(store_->Put("k", "new").ok());
  kv::SlotFields s = kv::UnpackSlot(old_word);
  std::string_view v;
  uint64_t ver;
  EXPECT_EQ(kv::CheckItem(region_.data() + h.heap_offset + uint64_t{s.offset_units} * 64,
                          uint64_t{s.units} * 64, "k", &v, &ver),
            kv::ItemCheck::kDead);
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
  for (uint64_t i = 0; i < (h.bucket_count + 1) * 8; ++i) used += slots[i] != 0;
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

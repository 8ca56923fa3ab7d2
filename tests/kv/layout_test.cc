#include "common/kv/layout.h"

#include <gtest/gtest.h>
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

namespace rdkv::kv {
namespace {

std::vector<uint8_t> MakeItem(std::string_view key, std::string_view value, uint64_t version,
                              uint32_t state = kStateLive) {
  ItemHeader h{};
  h.state = state;
  h.key_bytes = static_cast<uint32_t>(key.size());
  h.value_bytes = static_cast<uint32_t>(value.size());
  h.units = UnitsFor(ItemBytes(key.size(), value.size()));
  h.version = version;
  h.checksum = ItemChecksum(h, key, value);
  std::vector<uint8_t> out(h.units * kUnit, 0);
  std::memcpy(out.data(), &h, sizeof(h));
  std::memcpy(out.data() + sizeof(h), key.data(), key.size());
  std::memcpy(out.data() + sizeof(h) + key.size(), value.data(), value.size());
  return out;
}

// The checksum's definition, written out: XXH3-64 over the header from key_bytes to the
// checksum, the key and the value, xor the state's own hash. Small items take a faster route in
// ItemChecksum; both routes must give this, or old and new readers and writers disagree.
uint64_t ReferenceChecksum(const ItemHeader& h, std::string_view key, std::string_view value) {
  XXH3_state_t st;
  XXH3_64bits_reset(&st);
  XXH3_64bits_update(&st, reinterpret_cast<const uint8_t*>(&h) + 4, 20);
  XXH3_64bits_update(&st, key.data(), key.size());
  XXH3_64bits_update(&st, value.data(), value.size());
  const uint32_t state = h.state;
  return XXH3_64bits_digest(&st) ^ XXH3_64bits_withSeed(&state, sizeof(state), 0x5eed);
}

TEST(LayoutTest, ItemChecksumIsTheDefinitionOnBothSidesOfTheSmallItemRoute) {
  static_assert(offsetof(ItemHeader, checksum) == 24);
  std::string value;
  for (size_t key_bytes : {1, 16, 200}) {
    const std::string key(key_bytes, 'k');
    for (size_t n = 0; n <= 320; ++n) {  // 20 + key + value crosses 256 for every key size
      value.assign(n, static_cast<char>('a' + n % 26));
      ItemHeader h{};
      h.state = n % 2 == 0 ? kStateLive : kStateDead;
      h.key_bytes = static_cast<uint32_t>(key.size());
      h.value_bytes = static_cast<uint32_t>(value.size());
      h.units = UnitsFor(ItemBytes(key.size(), value.size()));
      h.version = 1000 + n;
      ASSERT_EQ(ItemChecksum(h, key, value), ReferenceChecksum(h, key, value))
          << "key " << key_bytes << " bytes, value " << n << " bytes";
    }
  }
}

TEST(LayoutTest, MatchFingerprintsFindsExactlyTheSlotsWithTheFingerprint) {
  std::vector<uint64_t> words(kSlotsPerBucket);
  uint64_t seed = 0x9e3779b97f4a7c15ull;
  auto next = [&] {
    seed ^= seed << 13;
    seed ^= seed >> 7;
    seed ^= seed << 17;
    return seed;
  };
  for (int round = 0; round < 200; ++round) {
    const uint16_t fp = FingerprintOf(next());
    for (uint64_t& w : words) {
      switch (next() % 5) {
        case 0:
          w = 0;  // empty
          break;
        case 1:  // the fingerprint, with anything else
          w = PackSlot(
              SlotFields{fp, static_cast<uint16_t>(next()), static_cast<uint32_t>(next())});
          break;
        case 2:  // the fingerprint's 16 bits in another field only
          w = (uint64_t{static_cast<uint16_t>(fp + 1)} << 48) | (uint64_t{fp} << 32) | fp;
          break;
        default:
          w = next();
      }
    }
    uint64_t want = 0;
    for (size_t s = 0; s < kSlotsPerBucket; ++s) {
      if (words[s] != 0 && UnpackSlot(words[s]).fingerprint == fp) want |= uint64_t{1} << s;
    }
    std::vector<uint8_t> image(kBucketBytes);
    std::memcpy(image.data(), words.data(), kBucketBytes);
    ASSERT_EQ(MatchFingerprints(image.data(), fp), want) << "round " << round;
  }
}

TEST(LayoutTest, SlotRoundTrip) {
  SlotFields s{0xbeef, 0x1234, 0xdeadbeef};
  SlotFields t = UnpackSlot(PackSlot(s));
  EXPECT_EQ(t.fingerprint, 0xbeef);
  EXPECT_EQ(t.units, 0x1234);
  EXPECT_EQ(t.offset_units, 0xdeadbeefu);
  EXPECT_NE(PackSlot(SlotFields{FingerprintOf(0), 1, 0}), 0u) << "a used slot is never zero";
}

TEST(LayoutTest, GeometryFitsRegion) {
  for (double fraction : {0.001, 1.0 / 16, kDefaultIndexFraction, 0.5}) {
    for (uint64_t bytes : {uint64_t{1} << 20, uint64_t{64} << 20, uint64_t{3} << 30}) {
      Geometry g = ComputeGeometry(bytes, fraction);
      ASSERT_GE(g.bucket_count, 2u);
      EXPECT_EQ(g.index_offset, kHeaderBytes);
      EXPECT_EQ(g.index_offset % kBucketBytes, 0u);
      EXPECT_GE(g.heap_offset, g.index_offset + g.bucket_count * kBucketBytes);
      EXPECT_EQ(g.heap_offset % kUnit, 0u);
      EXPECT_LE(g.heap_offset + g.heap_bytes, bytes);
      // The index gets its share (to within a bucket, at least two buckets).
      EXPECT_LE(g.bucket_count * kBucketBytes,
                std::max<uint64_t>(2 * kBucketBytes, uint64_t(double(bytes) * fraction)));
      EXPECT_GT((g.bucket_count + 1) * kBucketBytes, uint64_t(double(bytes) * fraction));
    }
  }
  EXPECT_EQ(ComputeGeometry(1000, 1.0 / 16).bucket_count, 0u) << "too small";
}

TEST(LayoutTest, VersionThreeGeometryConstants) {
  EXPECT_EQ(kLayoutVersion, 3u);
  EXPECT_EQ(kSlotsPerBucket, 64u);
  EXPECT_EQ(kBucketBytes, 512u);
  EXPECT_EQ(kCandidateSlots, 128u);
  EXPECT_EQ(kHeaderBytes % kBucketBytes, 0u) << "buckets stay aligned";
}

// Layout 3's 32-byte units: a 16-byte key with a 32-byte value takes 96 B (three units; 128 B
// in layout 2), the largest item (largest key, largest value) fits the slot's 16-bit length,
// and 32-bit offsets reach the largest heap ComputeGeometry hands out.
TEST(LayoutTest, VersionThreeUnitsAreCompact) {
  EXPECT_EQ(kUnit, 32u);
  EXPECT_EQ(UnitsFor(ItemBytes(16, 32)) * kUnit, 96u);
  EXPECT_EQ(UnitsFor(ItemBytes(1, 0)), 2u) << "the smallest item: header + one key byte";
  EXPECT_EQ(UnitsFor(ItemBytes(24, 1000)) * kUnit, 1056u);
  EXPECT_LE(UnitsFor(ItemBytes(kMaxKeyBytes, kMaxValueBytes)), kMaxItemUnits);
  Geometry g = ComputeGeometry(uint64_t{1} << 38, 1.0 / 8);  // 256 GiB region
  EXPECT_EQ(g.heap_bytes, (uint64_t{1} << 32) * kUnit) << "heap capped at 2^32 units";
  SlotFields last{1, 1, static_cast<uint32_t>(g.heap_bytes / kUnit - 1)};
  RegionHeader h{};
  h.heap_offset = g.heap_offset;
  h.heap_bytes = g.heap_bytes;
  ASSERT_TRUE(SlotItemOffset(h, UnpackSlot(PackSlot(last))).has_value());
  EXPECT_EQ(*SlotItemOffset(h, UnpackSlot(PackSlot(last))), g.heap_offset + g.heap_bytes - kUnit);
}

// The two candidate buckets: in range, always different, stable, and spread independently.
TEST(LayoutTest, TwoCandidateBucketsAreDistinctAndIndependent) {
  for (uint64_t n : {uint64_t{2}, uint64_t{3}, uint64_t{1000}, uint64_t{1} << 20}) {
    for (int i = 0; i < 2000; ++i) {
      std::string key = "k" + std::to_string(i);
      Buckets b = BucketsOf(KeyHash(key), SecondHash(key), n);
      ASSERT_LT(b.b[0], n);
      ASSERT_LT(b.b[1], n);
      ASSERT_NE(b.b[0], b.b[1]) << key << " n=" << n;
      Buckets again = BucketsOf(KeyHash(key), SecondHash(key), n);
      EXPECT_EQ(again.b[0], b.b[0]);
      EXPECT_EQ(again.b[1], b.b[1]);
    }
  }
  // Equal raw choices move the second to the next bucket (wrapping).
  EXPECT_EQ(BucketsOf(uint64_t{5} << 20, 5, 10).b[1], 6u);
  EXPECT_EQ(BucketsOf(uint64_t{9} << 20, 9, 10).b[1], 0u);
  // Keys that share their first bucket spread over the others with their second.
  const uint64_t n = 64;
  std::vector<int> second(n, 0);
  int shared = 0;
  for (int i = 0; i < 200000 && shared < 2000; ++i) {
    std::string key = "x" + std::to_string(i);
    Buckets b = BucketsOf(KeyHash(key), SecondHash(key), n);
    if (b.b[0] != 7) continue;
    ++shared;
    ++second[b.b[1]];
  }
  ASSERT_EQ(shared, 2000);
  int distinct = 0;
  for (uint64_t i = 0; i < n; ++i) distinct += second[i] > 0;
  EXPECT_GE(distinct, 60) << "second choices independent of the first";
}

// The header round-trips through its bytes: a reader recomputes the same checksum, and a
// version-1 header (the layout before index v2) is told apart by its version field.
TEST(LayoutTest, HeaderRoundTripAndVersion) {
  std::vector<uint8_t> page(kHeaderBytes, 0);
  RegionHeader h{};
  h.magic = kRegionMagic;
  h.layout_version = kLayoutVersion;
  h.header_bytes = kHeaderBytes;
  h.region_bytes = 1 << 20;
  h.index_offset = kHeaderBytes;
  h.bucket_count = 16;
  h.heap_offset = kHeaderBytes + 16 * kBucketBytes;
  h.heap_bytes = (1 << 20) - h.heap_offset;
  h.header_checksum = HeaderChecksum(h);
  std::memcpy(page.data(), &h, sizeof(h));
  RegionHeader back;
  std::memcpy(&back, page.data(), sizeof(back));
  EXPECT_EQ(back.layout_version, 3u);
  EXPECT_EQ(back.bucket_count, 16u);
  EXPECT_EQ(HeaderChecksum(back), back.header_checksum);
  back.layout_version = 1;
  EXPECT_NE(HeaderChecksum(back), h.header_checksum) << "the version is covered";
}

TEST(LayoutTest, CheckItemAcceptsOnlyTheLiveItemOfTheKey) {
  auto item = MakeItem("alpha", "value-1", 7);
  std::string_view v;
  uint64_t ver = 0;
  ASSERT_EQ(CheckItem(item.data(), item.size(), "alpha", &v, &ver), ItemCheck::kOk);
  EXPECT_EQ(v, "value-1");
  EXPECT_EQ(ver, 7u);
  EXPECT_EQ(CheckItem(item.data(), item.size(), "alphA", &v, &ver), ItemCheck::kWrongKey);
  EXPECT_EQ(CheckItem(item.data(), item.size(), "alph", &v, &ver), ItemCheck::kWrongKey);
  EXPECT_EQ(CheckItem(item.data(), 16, "alpha", &v, &ver), ItemCheck::kTooShort);
  EXPECT_EQ(CheckItem(item.data(), sizeof(ItemHeader) + 6, "alpha", &v, &ver),
            ItemCheck::kBadLengths);

  auto dead = MakeItem("alpha", "value-1", 7, kStateDead);
  EXPECT_EQ(CheckItem(dead.data(), dead.size(), "alpha", &v, &ver), ItemCheck::kDead);
}

TEST(LayoutTest, EveryFlippedByteIsCaught) {
  auto item = MakeItem("key", "some value bytes", 42);
  size_t used = ItemBytes(3, 16);
  for (size_t i = 0; i < used; ++i) {
    auto copy = item;
    copy[i] ^= 0x5a;
    std::string_view v;
    uint64_t ver;
    EXPECT_NE(CheckItem(copy.data(), copy.size(), "key", &v, &ver), ItemCheck::kOk) << "byte " << i;
  }
}

TEST(LayoutTest, TornStateChecksumPairIsRejected) {
  // Retiring rewrites state then checksum: the in-between states must both fail.
  auto live = MakeItem("k", "v", 3, kStateLive);
  auto dead = MakeItem("k", "v", 3, kStateDead);
  auto mix1 = live;  // state DEAD, checksum still LIVE's
  std::memcpy(mix1.data(), dead.data(), 4);
  auto mix2 = dead;  // state LIVE (reused block), checksum DEAD's
  std::memcpy(mix2.data(), live.data(), 4);
  std::string_view v;
  uint64_t ver;
  EXPECT_EQ(CheckItem(mix1.data(), mix1.size(), "k", &v, &ver), ItemCheck::kBadChecksum);
  EXPECT_EQ(CheckItem(mix2.data(), mix2.size(), "k", &v, &ver), ItemCheck::kBadChecksum);
}

TEST(LayoutTest, RestatingTheChecksumEqualsRecomputingIt) {
  for (uint32_t from : {kStatePending, kStateLive, kStateDead}) {
    for (uint32_t to : {kStatePending, kStateLive, kStateDead}) {
      auto a = MakeItem("key", "value", 9, from);
      auto b = MakeItem("key", "value", 9, to);
      ItemHeader ha, hb;
      std::memcpy(&ha, a.data(), sizeof(ha));
      std::memcpy(&hb, b.data(), sizeof(hb));
      EXPECT_EQ(RestateChecksum(ha.checksum, from, to), hb.checksum);
    }
  }
  auto pending = MakeItem("key", "value", 9, kStatePending);
  std::string_view v;
  uint64_t ver;
  EXPECT_EQ(CheckItem(pending.data(), pending.size(), "key", &v, &ver), ItemCheck::kPending)
      << "a PENDING item is not returned";
}

}  // namespace
}  // namespace rdkv::kv

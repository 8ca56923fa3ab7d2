#include "common/kv/layout.h"

#include <gtest/gtest.h>

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

TEST(LayoutTest, SlotRoundTrip) {
  SlotFields s{0xbeef, 0x1234, 0xdeadbeef};
  SlotFields t = UnpackSlot(PackSlot(s));
  EXPECT_EQ(t.fingerprint, 0xbeef);
  EXPECT_EQ(t.units, 0x1234);
  EXPECT_EQ(t.offset_units, 0xdeadbeefu);
  EXPECT_NE(PackSlot(SlotFields{FingerprintOf(0), 1, 0}), 0u) << "a used slot is never zero";
}

TEST(LayoutTest, GeometryFitsRegion) {
  for (uint64_t bytes : {uint64_t{1} << 20, uint64_t{64} << 20, uint64_t{3} << 30}) {
    Geometry g = ComputeGeometry(bytes, 1.0 / 16);
    ASSERT_GT(g.bucket_count, 0u);
    EXPECT_EQ(g.index_offset, kHeaderBytes);
    EXPECT_GE(g.heap_offset, g.index_offset + (g.bucket_count + 1) * kBucketBytes);
    EXPECT_EQ(g.heap_offset % kUnit, 0u);
    EXPECT_LE(g.heap_offset + g.heap_bytes, bytes);
  }
  EXPECT_EQ(ComputeGeometry(1000, 1.0 / 16).bucket_count, 0u) << "too small";
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
  EXPECT_EQ(CheckItem(pending.data(), pending.size(), "key", &v, &ver), ItemCheck::kDead)
      << "a PENDING item is not returned";
}

}  // namespace
}  // namespace rdkv::kv

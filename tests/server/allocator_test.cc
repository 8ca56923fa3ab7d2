#include "server/allocator.h"

#include <gtest/gtest.h>

#include <set>
#include <thread>

namespace rdkv::server {
namespace {

TEST(AllocatorTest, ClassesCoverEverySizeTightly) {
  uint32_t prev = 0;
  for (uint32_t u = 1; u <= 0x9000; ++u) {
    uint32_t c = Allocator::ClassOf(u);
    uint32_t size = Allocator::ClassUnits(c);
    ASSERT_GE(size, u) << u;
    ASSERT_LE(size, 0xffffu);
    ASSERT_LE(size - u, std::max<uint32_t>(u / 16, 1)) << "waste over 6.25% at " << u;
    if (u <= 32) {
      ASSERT_EQ(size, u) << "exact classes up to 32 units";
    }
    ASSERT_GE(c, prev);
    prev = c;
  }
}

TEST(AllocatorTest, BlocksDoNotOverlapAndFullHeapFails) {
  Allocator a(1000, std::chrono::milliseconds(50));
  std::set<uint32_t> used;
  uint64_t total = 0;
  for (;;) {
    Result<Block> b = a.Allocate(3);
    if (!b.ok()) {
      EXPECT_EQ(b.status().code(), StatusCode::kOutOfSpace);
      break;
    }
    for (uint32_t u = 0; u < b->units; ++u) ASSERT_TRUE(used.insert(b->offset_units + u).second);
    total += b->units;
  }
  EXPECT_GT(total, 990u);
  EXPECT_LE(total, 1000u);
}

TEST(AllocatorTest, RetiredBlocksWaitOutTheGracePeriod) {
  const auto grace = std::chrono::milliseconds(80);
  Allocator a(4, grace);
  Result<Block> b = a.Allocate(4);
  ASSERT_TRUE(b.ok());
  auto retired_at = Allocator::Clock::now();
  a.Retire(*b);
  Allocator::Clock::duration wait{};
  Result<Block> again = a.Allocate(4, &wait);
  EXPECT_EQ(again.status().code(), StatusCode::kOutOfSpace) << "reused inside the grace period";
  EXPECT_GT(wait, Allocator::Clock::duration::zero());
  EXPECT_EQ(a.stats().limbo_units, 4u);
  std::this_thread::sleep_for(wait + std::chrono::milliseconds(1));
  again = a.Allocate(4);
  ASSERT_TRUE(again.ok());
  EXPECT_GE(Allocator::Clock::now() - retired_at, grace);
  EXPECT_EQ(again->offset_units, b->offset_units);
}

TEST(AllocatorTest, ReleasedBlocksAreReusedAtOnce) {
  Allocator a(4, std::chrono::hours(1));
  Result<Block> b = a.Allocate(4);
  ASSERT_TRUE(b.ok());
  a.Release(*b);
  EXPECT_TRUE(a.Allocate(4).ok());
}

}  // namespace
}  // namespace rdkv::server

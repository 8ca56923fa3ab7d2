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

// Every failure while limbo holds blocks says how long to wait, and never "now or earlier":
// a writer that waits only for a positive time would otherwise give up on a heap that is about
// to have room.
TEST(AllocatorTest, AFullHeapWithBlocksInLimboAlwaysSaysAPositiveWait) {
  const auto grace = std::chrono::milliseconds(1);
  Allocator heap(100, grace);
  std::vector<Block> blocks;
  for (int i = 0; i < 10; ++i) {
    Result<Block> got = heap.Allocate(10);
    ASSERT_TRUE(got.ok());
    blocks.push_back(*got);
  }
  // The heap stays full: every block that comes out of limbo goes back in at once, so each of
  // the 300 rounds ends at the moment a block becomes reusable.
  for (const Block& blk : blocks) heap.Retire(blk);
  int failures = 0;
  for (int reused = 0; reused < 300;) {
    Allocator::Clock::duration retry_after{};
    Result<Block> got = heap.Allocate(10, &retry_after);
    if (got.ok()) {
      heap.Retire(*got);
      ++reused;
      continue;
    }
    ++failures;
    ASSERT_GT(retry_after.count(), 0)
        << "after " << failures << " failures, " << reused << " blocks reused";
    ASSERT_LE(retry_after, grace);
  }
  EXPECT_GT(failures, 0);
}

// HasRoomNow counts the blocks an item of that size can take, not free bytes in general, and
// says no while a writer waits for limbo.
TEST(AllocatorTest, HasRoomNowCountsOnlyBlocksTheItemCanTake) {
  Allocator a(200, std::chrono::milliseconds(0));
  std::vector<Block> ones;
  for (;;) {
    Result<Block> b = a.Allocate(1);
    if (!b.ok()) break;
    ones.push_back(*b);
  }
  ASSERT_EQ(ones.size(), 200u);
  for (const Block& b : ones) a.Release(b);
  EXPECT_EQ(a.stats().free_units, 200u);
  EXPECT_TRUE(a.HasRoomNow(1, 64));
  EXPECT_FALSE(a.HasRoomNow(1, 200)) << "200 blocks, none to spare";
  EXPECT_FALSE(a.HasRoomNow(20, 0)) << "200 free units, but no block of 20";
  EXPECT_FALSE(a.Allocate(20).ok());
  {
    Allocator::WaitScope waiting(a);
    EXPECT_FALSE(a.HasRoomNow(1, 0)) << "a writer waits for limbo";
  }
  EXPECT_TRUE(a.HasRoomNow(1, 0));
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

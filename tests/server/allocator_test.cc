#include "server/allocator.h"

#include <gtest/gtest.h>

#include <set>
#include <thread>
#include <vector>

namespace rdkv::server {
namespace {

// Allocate, and once more after the wait a failure names (a merge due after its interval), as
// the store does.
Result<Block> AllocateWaiting(Allocator& a, uint32_t units) {
  Allocator::Clock::duration wait{};
  Result<Block> b = a.Allocate(units, &wait);
  if (b.ok() || wait <= Allocator::Clock::duration::zero()) return b;
  std::this_thread::sleep_for(wait);
  return a.Allocate(units);
}

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

// HasRoomNow counts the blocks an item of that size can take without merging, not free bytes
// in general, and says no while a writer waits for limbo. Allocate merges.
TEST(AllocatorTest, HasRoomNowCountsOnlyBlocksTheItemCanTake) {
  Allocator a(200, std::chrono::milliseconds(0), std::chrono::milliseconds(0));
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
  EXPECT_FALSE(a.HasRoomNow(20, 0)) << "200 free units, but no block of 20 before a merge";
  {
    Allocator::WaitScope waiting(a);
    EXPECT_FALSE(a.HasRoomNow(1, 0)) << "a writer waits for limbo";
  }
  EXPECT_TRUE(a.HasRoomNow(1, 0));
  EXPECT_TRUE(a.Allocate(20).ok()) << "the 200 adjacent free units merge";
  EXPECT_TRUE(a.HasRoomNow(20, 8)) << "180 units at the bump pointer";
  EXPECT_FALSE(a.HasRoomNow(20, 9));
}

// Space freed by small items serves large ones: adjacent free blocks merge, and the run that
// reaches the bump pointer gives it back.
TEST(AllocatorTest, FreedSmallBlocksMergeIntoLargeOnes) {
  Allocator a(1000, std::chrono::milliseconds(0), std::chrono::milliseconds(0));
  std::vector<Block> small;
  for (;;) {
    Result<Block> b = a.Allocate(3);
    if (!b.ok()) break;
    small.push_back(*b);
  }
  ASSERT_GE(small.size(), 330u);
  EXPECT_FALSE(a.Allocate(100).ok()) << "full";
  for (const Block& b : small) a.Release(b);
  Result<Block> large = a.Allocate(512);
  ASSERT_TRUE(large.ok()) << large.status().ToString();
  EXPECT_EQ(a.stats().merges, 1u);
  EXPECT_EQ(large->offset_units, 0u) << "the whole heap was one free run";
  Result<Block> second = a.Allocate(480);  // 992 units in all: both are class sizes
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_TRUE(a.Allocate(8).ok());
  EXPECT_EQ(a.stats().used_units, 1000u);
}

// Only adjacent free blocks merge: a free block between two used ones stays on its own.
TEST(AllocatorTest, OnlyAdjacentFreeBlocksMerge) {
  Allocator a(100, std::chrono::milliseconds(0), std::chrono::milliseconds(0));
  std::vector<Block> tens;
  for (int i = 0; i < 10; ++i) {
    Result<Block> b = a.Allocate(10);
    ASSERT_TRUE(b.ok());
    tens.push_back(*b);
  }
  for (int i = 0; i < 10; i += 2) a.Release(tens[i]);  // 0, 20, 40, 60, 80 free
  EXPECT_FALSE(a.Allocate(20).ok()) << "50 units free, no two of them adjacent";
  a.Release(tens[3]);  // 20..49 free now
  Result<Block> thirty = AllocateWaiting(a, 30);
  ASSERT_TRUE(thirty.ok()) << thirty.status().ToString();
  EXPECT_EQ(thirty->offset_units, 20u);
}

// A free block larger than asked is split, its rest kept: small items fill space a large one
// left, all of it.
TEST(AllocatorTest, ALargeFreeBlockIsSplitForSmallItems) {
  Allocator a(1024, std::chrono::milliseconds(0), std::chrono::milliseconds(0));
  Result<Block> large = a.Allocate(992);  // a class size, as is 32
  ASSERT_TRUE(large.ok());
  Result<Block> rest = a.Allocate(32);
  ASSERT_TRUE(rest.ok());
  a.Release(*large);
  uint64_t got = 0;
  std::set<uint32_t> units;
  for (;;) {
    Result<Block> b = a.Allocate(3);
    if (!b.ok()) break;
    for (uint32_t u = 0; u < b->units; ++u) ASSERT_TRUE(units.insert(b->offset_units + u).second);
    got += b->units;
  }
  EXPECT_EQ(got, 990u) << "330 blocks of 3 in the 992 units freed";
  for (uint32_t u : units) ASSERT_LT(u, 992u) << "a block outside the freed space";
}

// Merges are at most one per merge interval: a heap that stays fragmented does not sort its
// free blocks on every refused allocation; once the interval has passed, the next one merges.
TEST(AllocatorTest, MergesAreAtMostOnePerInterval) {
  Allocator a(100, std::chrono::milliseconds(0), std::chrono::milliseconds(200));
  std::vector<Block> tens;
  for (int i = 0; i < 10; ++i) {
    Result<Block> b = a.Allocate(10);
    ASSERT_TRUE(b.ok());
    tens.push_back(*b);
  }
  for (int i = 0; i < 10; i += 2) a.Release(tens[i]);
  EXPECT_FALSE(a.Allocate(20).ok());
  EXPECT_EQ(a.stats().merges, 1u);
  a.Release(tens[3]);  // 20..49 free now
  EXPECT_FALSE(a.Allocate(30).ok()) << "a second merge inside the interval";
  EXPECT_EQ(a.stats().merges, 1u);
  std::this_thread::sleep_for(std::chrono::milliseconds(250));
  Result<Block> thirty = a.Allocate(30);
  ASSERT_TRUE(thirty.ok()) << thirty.status().ToString();
  EXPECT_EQ(a.stats().merges, 2u);
}

// Retired blocks merge too, once out of limbo, and a run longer than the largest size class is
// listed as several blocks: a heap of more than 2^16 units, freed through limbo, is whole again.
TEST(AllocatorTest, RetiredBlocksMergeOnceOutOfLimboAndLongRunsAreListed) {
  constexpr uint32_t kHeap = 3 * 65536 + 1000;
  Allocator a(kHeap, std::chrono::milliseconds(20), std::chrono::milliseconds(0));
  std::vector<Block> blocks;
  for (;;) {
    Result<Block> b = a.Allocate(100);
    if (!b.ok()) break;
    blocks.push_back(*b);
  }
  for (size_t i = 0; i + 1 < blocks.size(); ++i) a.Retire(blocks[i]);  // all but the last
  EXPECT_FALSE(a.Allocate(65535).ok()) << "merged before the grace period";
  std::this_thread::sleep_for(std::chrono::milliseconds(40));
  std::vector<Block> large;
  for (int i = 0; i < 3; ++i) {
    Result<Block> b = a.Allocate(65535);  // the largest item: a block of 65536
    ASSERT_TRUE(b.ok()) << i << ": " << b.status().ToString();
    large.push_back(*b);
  }
  std::set<uint32_t> starts;
  for (const Block& b : large) {
    EXPECT_LE(uint64_t{b.offset_units} + b.units, blocks.back().offset_units);
    starts.insert(b.offset_units);
  }
  EXPECT_EQ(starts.size(), 3u);
}

// Random allocations and frees: blocks never overlap or leave the heap, the counts add up, and
// once everything is freed the whole heap is one block again.
TEST(AllocatorTest, RandomAllocationsNeverOverlapAndAFreedHeapIsWhole) {
  constexpr uint32_t kHeap = 8192;
  Allocator a(kHeap, std::chrono::milliseconds(0), std::chrono::milliseconds(0));
  std::vector<bool> taken(kHeap, false);
  std::vector<Block> live;
  uint64_t live_units = 0, failures = 0;
  uint64_t seed = 12345;
  auto next = [&seed] {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<uint32_t>(seed >> 33);
  };
  for (int op = 0; op < 40000; ++op) {
    if (!live.empty() && next() % 100 < 45) {
      const size_t i = next() % live.size();
      const Block b = live[i];
      live[i] = live.back();
      live.pop_back();
      for (uint32_t u = 0; u < b.units; ++u) taken[b.offset_units + u] = false;
      live_units -= b.units;
      a.Release(b);
      continue;
    }
    const uint32_t want = 1 + (next() % 8 == 0 ? next() % 600 : next() % 40);
    Result<Block> b = a.Allocate(want);
    if (!b.ok()) {
      ASSERT_EQ(b.status().code(), StatusCode::kOutOfSpace);
      ++failures;
      continue;
    }
    ASSERT_GE(b->units, want);
    ASSERT_LE(uint64_t{b->offset_units} + b->units, kHeap) << "a block past the heap";
    for (uint32_t u = 0; u < b->units; ++u) {
      ASSERT_FALSE(taken[b->offset_units + u]) << "overlap at unit " << b->offset_units + u;
      taken[b->offset_units + u] = true;
    }
    live.push_back(*b);
    live_units += b->units;
    const AllocatorStats st = a.stats();
    ASSERT_EQ(st.used_units, live_units);
    ASSERT_EQ(st.used_units + st.free_units + st.limbo_units, uint64_t{kHeap});
  }
  EXPECT_GT(failures, 0u) << "the heap never filled: the test did not reach the merge";
  EXPECT_GT(a.stats().merges, 0u);
  for (const Block& b : live) a.Release(b);
  // A merge may be due but wait for its interval: the failure says how long (as the store
  // waits for it).
  Allocator::Clock::duration wait{};
  Result<Block> whole = a.Allocate(kHeap, &wait);
  if (!whole.ok()) {
    ASSERT_GT(wait.count(), 0) << whole.status().ToString();
    std::this_thread::sleep_for(wait);
    whole = a.Allocate(kHeap);
  }
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  EXPECT_EQ(whole->offset_units, 0u);
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

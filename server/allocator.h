// The item heap's allocator: segregated free lists by size class, a bump pointer, and limbo.
//
// Blocks are measured in kv::kUnit (32-byte) units and addressed by their offset (in units)
// from the heap start. A block freed after it was published (reachable by READs) goes to limbo
// and is reused only `grace` later; a block that was never published can be released at once.
// A block larger than asked is split (the rest goes back to the lists), and when nothing fits,
// adjacent free blocks are merged (a free run that reaches the bump pointer lowers it), so
// space freed by items of one size serves items of any other (docs/design.md "Allocator").
//
// Thread-safety: all methods are thread-safe (one internal mutex; the write path holds it for
// a few list operations).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

#include "common/util/mutex.h"
#include "common/util/thread_annotations.h"
#include "rdkv/status.h"

namespace rdkv::server {

struct Block {
  uint32_t offset_units = 0;
  uint32_t units = 0;  // the class size actually reserved (>= what was asked)
};

struct AllocatorStats {
  uint64_t heap_units = 0;
  uint64_t used_units = 0;   // handed out and not freed
  uint64_t limbo_units = 0;  // freed, waiting out the grace period
  uint64_t free_units = 0;   // on free lists or never carved
  uint64_t merges = 0;       // passes that merged adjacent free blocks
};

class Allocator {
 public:
  using Clock = std::chrono::steady_clock;

  // `merge_interval`: the least time between two merges of free blocks (each sorts every
  // free block under the lock); a merge also waits ten times the last one's duration.
  Allocator(uint64_t heap_units, std::chrono::milliseconds grace,
            std::chrono::milliseconds merge_interval = std::chrono::milliseconds(0));

  // Size class helpers (public for tests): classes are exact up to 32 units (1 KiB), then 16
  // per doubling (each about 6.25% larger than the previous, so a 1 KB record wastes at most
  // ~6% of its block).
  static uint32_t ClassOf(uint32_t units);
  static uint32_t ClassUnits(uint32_t cls);

  // A block of at least `units` units: its class's free list, the bump pointer, the run left
  // of the last larger block it split, then the smallest larger free block, split. When none fits
  // and something was freed since the last merge, adjacent free blocks are merged (a pass
  // sorts every free block, under the lock; passes are at least ten times the last one's
  // duration apart) and it looks again. kOutOfSpace
  // when nothing fits, with *retry_after set when limbo holds blocks that will be free within that
  // time (zero duration when waiting cannot help); also set to the wait for a merge that is due.
  Result<Block> Allocate(uint32_t units, Clock::duration* retry_after = nullptr) EXCLUDES(mu_);
  // For a block that was published: reused no earlier than now + grace.
  void Retire(Block b) EXCLUDES(mu_);
  // For a block that was never published: reused at once.
  void Release(Block b) EXCLUDES(mu_);

  // Whether Allocate(units) would find a block now without merging, with `spare` more such
  // blocks left over (on the free lists of its class and the larger ones, split, or room for
  // them at the bump pointer): a
  // thread that must not wait checks this first, so that a heap whose free room is all in
  // other size classes, or in limbo, sends the write to one that may wait. False while a
  // writer waits for blocks to leave limbo (WaitScope): the blocks that come out go to the
  // writers that wait, not to those that would pass them.
  bool HasRoomNow(uint32_t units, uint64_t spare) EXCLUDES(mu_);
  // Held by a writer while it waits for blocks to leave limbo.
  class WaitScope {
   public:
    explicit WaitScope(Allocator& a) : a_(a) {
      a_.waiting_.fetch_add(1, std::memory_order_relaxed);
    }
    ~WaitScope() { a_.waiting_.fetch_sub(1, std::memory_order_relaxed); }
    WaitScope(const WaitScope&) = delete;
    WaitScope& operator=(const WaitScope&) = delete;

   private:
    Allocator& a_;
  };

  AllocatorStats stats() const EXCLUDES(mu_);

 private:
  // Moves the limbo blocks whose grace period ended to the free lists.
  void ReclaimLocked(Clock::time_point now) REQUIRES(mu_);
  // Takes a block off class `c`'s (non-empty) free list.
  Block TakeLocked(uint32_t c) REQUIRES(mu_);
  // A block of class size `size` (class `cls`) without merging, if one is free.
  std::optional<Block> TryAllocateLocked(uint32_t cls, uint32_t size) REQUIRES(mu_);
  // Lists the free run [offset, offset + units) as blocks of exact class sizes, largest first
  // (every run is a sum of them: the classes up to kExact units are exact).
  void ListRunLocked(uint64_t offset, uint64_t units) REQUIRES(mu_);
  // Merges adjacent listed blocks and lists the runs again; a run that ends at the bump
  // pointer moves it down. False (nothing done) unless enough was listed since the last one.
  bool MergeLocked() REQUIRES(mu_);
  // The least time from one merge to the next; how long until the next merge may run when one
  // is due (something was freed since the last), else zero.
  Clock::duration NextMergeLocked() const REQUIRES(mu_);
  Clock::duration MergeWaitLocked(Clock::time_point now) const REQUIRES(mu_);
  static constexpr uint32_t kExact = 32;
  static constexpr uint32_t kClasses = kExact + 16 * 11;  // enough for 2^16 units

  const uint64_t heap_units_;
  const Clock::duration grace_;
  const Clock::duration merge_interval_;
  mutable Mutex mu_;
  uint64_t bump_ GUARDED_BY(mu_) = 0;  // units carved so far
  uint64_t used_ GUARDED_BY(mu_) = 0;
  uint64_t limbo_units_ GUARDED_BY(mu_) = 0;
  uint64_t listed_units_ GUARDED_BY(mu_) = 0;
  uint64_t freed_since_merge_ GUARDED_BY(mu_) = 0;  // units released or out of limbo since
  // A free run (on no list) that blocks are cut from, in order, after a larger block was split.
  uint64_t carve_offset_ GUARDED_BY(mu_) = 0;
  uint64_t carve_units_ GUARDED_BY(mu_) = 0;
  uint64_t merges_ GUARDED_BY(mu_) = 0;
  Clock::time_point last_merge_ GUARDED_BY(mu_);
  Clock::duration last_merge_cost_ GUARDED_BY(mu_){};
  std::vector<std::vector<uint32_t>> free_ GUARDED_BY(mu_);  // per class: offsets
  struct Retired {
    Block block;
    Clock::time_point reusable_at;
  };
  std::deque<Retired> limbo_ GUARDED_BY(mu_);  // in retire order, so reusable_at is non-decreasing
  std::atomic<int> waiting_{0};                // writers in a WaitScope
};

}  // namespace rdkv::server

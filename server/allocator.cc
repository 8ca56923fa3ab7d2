#include "server/allocator.h"

#include <algorithm>
#include <bit>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "common/kv/layout.h"

namespace rdkv::server {

Allocator::Allocator(uint64_t heap_units, std::chrono::milliseconds grace,
                     std::chrono::milliseconds merge_interval)
    : heap_units_(heap_units), grace_(grace), merge_interval_(merge_interval), free_(kClasses) {}

uint32_t Allocator::ClassOf(uint32_t units) {
  if (units <= kExact) return units == 0 ? 0 : units - 1;
  // units in (2^k, 2^(k+1)] with k >= 5: 16 sub-classes of width 2^(k-4).
  uint32_t v = units - 1;
  uint32_t k = 31 - static_cast<uint32_t>(std::countl_zero(v));  // 2^k <= v < 2^(k+1)
  uint32_t sub = (v >> (k - 4)) & 15;
  return kExact + (k - 5) * 16 + sub;
}

uint32_t Allocator::ClassUnits(uint32_t cls) {
  if (cls < kExact) return cls + 1;
  uint32_t k = (cls - kExact) / 16 + 5;
  uint32_t sub = (cls - kExact) % 16;
  return (1u << k) + (sub + 1) * (1u << (k - 4));
}

void Allocator::ReclaimLocked(Clock::time_point now) {
  while (!limbo_.empty() && limbo_.front().reusable_at <= now) {
    Block b = limbo_.front().block;
    limbo_.pop_front();
    limbo_units_ -= b.units;
    listed_units_ += b.units;
    freed_since_merge_ += b.units;
    free_[ClassOf(b.units)].push_back(b.offset_units);
  }
}

Result<Block> Allocator::Allocate(uint32_t units, Clock::duration* retry_after) {
  if (units == 0 || units > kv::kMaxItemUnits) {
    return Status::InvalidArgument("item of " + std::to_string(units) +
                                   " units is outside the allocator's range");
  }
  uint32_t cls = ClassOf(units);
  uint32_t size = ClassUnits(cls);
  MutexLock lock(&mu_);
  const Clock::time_point now = Clock::now();
  ReclaimLocked(now);
  if (std::optional<Block> b = TryAllocateLocked(cls, size)) return *b;
  if (MergeLocked()) {
    if (std::optional<Block> b = TryAllocateLocked(cls, size)) return *b;
  }
  // A merge that is due but waits for its interval: the write may find room after it.
  const Clock::duration merge_wait = MergeWaitLocked(now);
  if (retry_after != nullptr) {
    // Measured from the reclaim's `now`: the front's time is after it (or it would have been
    // reclaimed), so a wait is never zero or negative while limbo holds blocks.
    *retry_after = limbo_.empty() ? Clock::duration::zero() : limbo_.front().reusable_at - now;
    if (merge_wait > Clock::duration::zero() &&
        (*retry_after == Clock::duration::zero() || merge_wait < *retry_after)) {
      *retry_after = merge_wait;
    }
  }
  const auto merge_ms = std::chrono::ceil<std::chrono::milliseconds>(merge_wait).count();
  return Status::OutOfSpace("no free block of " + std::to_string(uint64_t{size} * kv::kUnit) +
                            " bytes: the region's heap is full (" +
                            std::to_string(used_ * kv::kUnit) + " bytes in use, " +
                            std::to_string(limbo_units_ * kv::kUnit) +
                            " bytes waiting out the reuse grace period)" +
                            (merge_wait > Clock::duration::zero()
                                 ? "; freed blocks are merged in " + std::to_string(merge_ms) +
                                       " ms: a retry then may fit"
                                 : std::string()));
}

Allocator::Clock::duration Allocator::NextMergeLocked() const {
  return std::max<Clock::duration>(merge_interval_, 10 * last_merge_cost_);
}

Allocator::Clock::duration Allocator::MergeWaitLocked(Clock::time_point now) const {
  if (freed_since_merge_ == 0 || merges_ == 0) return Clock::duration::zero();
  const Clock::time_point at = last_merge_ + NextMergeLocked();
  return at > now ? at - now : Clock::duration::zero();
}

std::optional<Block> Allocator::TryAllocateLocked(uint32_t cls, uint32_t size) {
  if (!free_[cls].empty()) return TakeLocked(cls);
  if (bump_ + size <= heap_units_) {
    Block b{static_cast<uint32_t>(bump_), size};
    bump_ += size;
    used_ += size;
    return b;
  }
  // The carve run, then the smallest larger free block, which becomes the carve run: blocks
  // are cut from its start one after another (as from the bump pointer), so that splitting a
  // large block for many small items leaves at most one small rest, not one per item.
  if (carve_units_ < size) {
    uint32_t c = cls + 1;
    while (c < kClasses && free_[c].empty()) ++c;
    if (c == kClasses) return std::nullopt;
    if (carve_units_ > 0) ListRunLocked(carve_offset_, carve_units_);
    carve_offset_ = free_[c].back();
    free_[c].pop_back();
    carve_units_ = ClassUnits(c);
    listed_units_ -= carve_units_;
  }
  Block b{static_cast<uint32_t>(carve_offset_), size};
  carve_offset_ += size;
  carve_units_ -= size;
  used_ += size;
  return b;
}

void Allocator::ListRunLocked(uint64_t offset, uint64_t units) {
  const uint32_t largest = ClassUnits(kClasses - 1);
  while (units > 0) {
    uint32_t c = units >= largest ? kClasses - 1 : ClassOf(static_cast<uint32_t>(units));
    if (ClassUnits(c) > units) --c;  // the largest class that fits (classes 0..kExact-1 exact)
    const uint32_t n = ClassUnits(c);
    free_[c].push_back(static_cast<uint32_t>(offset));
    listed_units_ += n;
    offset += n;
    units -= n;
  }
}

bool Allocator::MergeLocked() {
  // Each pass sorts every listed block under the lock: it runs only when something was freed
  // since the last, and no sooner than ten times the last one's duration after it (and the
  // merge interval), so that merges take at most a tenth of the allocator's time however
  // often writes are refused.
  const Clock::time_point now = Clock::now();
  if (freed_since_merge_ == 0 || (merges_ > 0 && now - last_merge_ < NextMergeLocked())) {
    return false;
  }
  size_t count = carve_units_ > 0 ? 1 : 0;
  for (uint32_t c = 0; c < kClasses; ++c) count += free_[c].size();
  std::vector<std::pair<uint32_t, uint32_t>> blocks;  // offset, units
  try {
    blocks.reserve(count);
  } catch (const std::bad_alloc&) {
    return false;  // nothing changed: the allocation fails as without a merge
  }
  last_merge_ = now;
  if (carve_units_ > 0) blocks.emplace_back(carve_offset_, carve_units_);
  carve_units_ = 0;
  for (uint32_t c = 0; c < kClasses; ++c) {
    for (uint32_t off : free_[c]) blocks.emplace_back(off, ClassUnits(c));
    free_[c].clear();
  }
  std::sort(blocks.begin(), blocks.end());
  listed_units_ = 0;
  freed_since_merge_ = 0;
  ++merges_;
  for (size_t i = 0; i < blocks.size();) {
    const uint64_t start = blocks[i].first;
    uint64_t end = start + blocks[i].second;
    for (++i; i < blocks.size() && blocks[i].first == end; ++i) end += blocks[i].second;
    if (end == bump_) {
      bump_ = start;  // the last run: back to never carved
    } else {
      ListRunLocked(start, end - start);
    }
  }
  last_merge_cost_ = Clock::now() - now;
  return true;
}

bool Allocator::HasRoomNow(uint32_t units, uint64_t spare) {
  if (units == 0 || units > kv::kMaxItemUnits) return false;
  if (waiting_.load(std::memory_order_relaxed) > 0) return false;
  const uint32_t cls = ClassOf(units);
  MutexLock lock(&mu_);
  ReclaimLocked(Clock::now());
  const uint32_t size = ClassUnits(cls);
  uint64_t blocks = (heap_units_ - bump_) / size + carve_units_ / size + free_[cls].size();
  // A larger block is split into as many as it holds.
  for (uint32_t c = cls + 1; c < kClasses && blocks <= spare; ++c) {
    blocks += free_[c].size() * (ClassUnits(c) / size);
  }
  return blocks > spare;
}

Block Allocator::TakeLocked(uint32_t c) {
  uint32_t off = free_[c].back();
  free_[c].pop_back();
  uint32_t got = ClassUnits(c);
  listed_units_ -= got;
  used_ += got;
  return Block{off, got};
}

void Allocator::Retire(Block b) {
  MutexLock lock(&mu_);
  used_ -= b.units;
  limbo_units_ += b.units;
  limbo_.push_back({b, Clock::now() + grace_});
}

void Allocator::Release(Block b) {
  MutexLock lock(&mu_);
  used_ -= b.units;
  listed_units_ += b.units;
  freed_since_merge_ += b.units;
  free_[ClassOf(b.units)].push_back(b.offset_units);
}

AllocatorStats Allocator::stats() const {
  MutexLock lock(&mu_);
  return AllocatorStats{heap_units_, used_, limbo_units_,
                        listed_units_ + carve_units_ + (heap_units_ - bump_), merges_};
}

}  // namespace rdkv::server

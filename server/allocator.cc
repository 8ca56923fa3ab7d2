#include "server/allocator.h"

#include <bit>
#include <string>

#include "common/kv/layout.h"

namespace rdkv::server {

Allocator::Allocator(uint64_t heap_units, std::chrono::milliseconds grace)
    : heap_units_(heap_units), grace_(grace), free_(kClasses) {}

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
  if (!free_[cls].empty()) return TakeLocked(cls);
  if (bump_ + size <= heap_units_) {
    Block b{static_cast<uint32_t>(bump_), size};
    bump_ += size;
    used_ += size;
    return b;
  }
  // A somewhat larger block wastes at most ~50% and beats failing.
  for (uint32_t c = cls + 1; c < kClasses && c <= cls + 8; ++c) {
    if (!free_[c].empty()) return TakeLocked(c);
  }
  if (retry_after != nullptr) {
    // Measured from the reclaim's `now`: the front's time is after it (or it would have been
    // reclaimed), so a wait is never zero or negative while limbo holds blocks.
    *retry_after = limbo_.empty() ? Clock::duration::zero() : limbo_.front().reusable_at - now;
  }
  return Status::OutOfSpace("no free block of " + std::to_string(uint64_t{size} * kv::kUnit) +
                            " bytes: the region's heap is full (" +
                            std::to_string(used_ * kv::kUnit) + " bytes in use, " +
                            std::to_string(limbo_units_ * kv::kUnit) +
                            " bytes waiting out the reuse grace period)");
}

bool Allocator::HasRoomNow(uint32_t units, uint64_t spare) {
  if (units == 0 || units > kv::kMaxItemUnits) return false;
  if (waiting_.load(std::memory_order_relaxed) > 0) return false;
  const uint32_t cls = ClassOf(units);
  MutexLock lock(&mu_);
  ReclaimLocked(Clock::now());
  uint64_t blocks = (heap_units_ - bump_) / ClassUnits(cls);
  // The classes Allocate takes from: its own, then up to 8 larger ones.
  for (uint32_t c = cls; c < kClasses && c <= cls + 8 && blocks <= spare; ++c) {
    blocks += free_[c].size();
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
  free_[ClassOf(b.units)].push_back(b.offset_units);
}

AllocatorStats Allocator::stats() const {
  MutexLock lock(&mu_);
  return AllocatorStats{heap_units_, used_, limbo_units_, listed_units_ + (heap_units_ - bump_)};
}

}  // namespace rdkv::server

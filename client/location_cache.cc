#include "client/location_cache.h"

namespace rdkv::client {

LocationCache::LocationCache(size_t entries) : n_(entries) {
  if (n_ > 0) {
    slots_ = std::make_unique<std::atomic<uint64_t>[]>(n_);
    for (size_t i = 0; i < n_; ++i) slots_[i].store(0, std::memory_order_relaxed);
  }
}

size_t LocationCache::IndexOf(uint64_t key_hash) const {
  // The low bits of the hash (the index uses bits 20.. for the first bucket and 48.. for the
  // fingerprint); mixed and reduced to [0, n) without a division.
  uint64_t mixed = key_hash * 0x9e3779b97f4a7c15ull;
  return static_cast<size_t>((static_cast<unsigned __int128>(mixed) * n_) >> 64);
}

uint16_t LocationCache::TagOf(uint64_t key_hash) {
  uint16_t tag = static_cast<uint16_t>(key_hash >> 50);
  return tag == 0 ? 1 : tag;
}

uint64_t LocationCache::Pack(uint64_t key_hash, CachedLocation loc) {
  return (uint64_t{TagOf(key_hash)} << 50) | (uint64_t{loc.contended ? 1u : 0u} << 49) |
         (uint64_t{loc.choice & 1u} << 48) | (uint64_t{loc.units} << 32) | loc.offset_units;
}

std::optional<CachedLocation> LocationCache::Lookup(uint64_t key_hash) const {
  if (n_ == 0) return std::nullopt;
  uint64_t w = slots_[IndexOf(key_hash)].load(std::memory_order_relaxed);
  if (w == 0 || static_cast<uint16_t>(w >> 50) != TagOf(key_hash)) return std::nullopt;
  CachedLocation loc{static_cast<uint32_t>(w), static_cast<uint16_t>(w >> 32),
                     static_cast<uint8_t>((w >> 48) & 1), ((w >> 49) & 1) != 0};
  if (loc.units == 0) return std::nullopt;
  return loc;
}

void LocationCache::Store(uint64_t key_hash, CachedLocation loc) {
  if (n_ == 0 || loc.units == 0) return;
  slots_[IndexOf(key_hash)].store(Pack(key_hash, loc), std::memory_order_relaxed);
}

void LocationCache::Erase(uint64_t key_hash, std::optional<CachedLocation> loc) {
  if (n_ == 0) return;
  std::atomic<uint64_t>& slot = slots_[IndexOf(key_hash)];
  uint64_t w = slot.load(std::memory_order_relaxed);
  if (w == 0 || static_cast<uint16_t>(w >> 50) != TagOf(key_hash)) return;
  if (loc.has_value() && w != Pack(key_hash, *loc)) return;
  slot.compare_exchange_strong(w, 0, std::memory_order_relaxed);
}

void LocationCache::Clear() {
  for (size_t i = 0; i < n_; ++i) slots_[i].store(0, std::memory_order_relaxed);
}

}  // namespace rdkv::client

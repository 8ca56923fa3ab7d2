#include "client/location_cache.h"

namespace rdkv::client {

namespace {

// The way a Store replaces in a full set: a per-thread xorshift, so that two hot keys of one
// set do not keep evicting each other from the same way.
uint32_t NextVictim() {
  thread_local uint32_t x = 0x9e3779b9u ^ static_cast<uint32_t>(reinterpret_cast<uintptr_t>(&x));
  x ^= x << 13;
  x ^= x >> 17;
  x ^= x << 5;
  return x;
}

}  // namespace

LocationCache::LocationCache(size_t entries)
    : sets_n_(entries == 0 ? 0 : (entries + kWays - 1) / kWays) {
  if (sets_n_ > 0) {
    sets_ = std::make_unique<Set[]>(sets_n_);
    Clear();
  }
}

LocationCache::Set& LocationCache::SetOf(uint64_t key_hash) const {
  // The low bits of the hash (the index uses bits 20.. for the first bucket and 48.. for the
  // fingerprint, the tag 50..63); mixed and reduced to [0, sets) without a division.
  uint64_t mixed = key_hash * 0x9e3779b97f4a7c15ull;
  return sets_[static_cast<size_t>((static_cast<unsigned __int128>(mixed) * sets_n_) >> 64)];
}

uint16_t LocationCache::TagOf(uint64_t key_hash) {
  uint16_t tag = static_cast<uint16_t>(key_hash >> 50);
  return tag == 0 ? 1 : tag;
}

bool LocationCache::HasTag(uint64_t word, uint16_t tag) {
  return word != 0 && static_cast<uint16_t>(word >> 50) == tag;
}

uint64_t LocationCache::Pack(uint64_t key_hash, CachedLocation loc) {
  return (uint64_t{TagOf(key_hash)} << 50) | (uint64_t{loc.contended ? 1u : 0u} << 49) |
         (uint64_t{loc.choice & 1u} << 48) | (uint64_t{loc.units} << 32) | loc.offset_units;
}

std::optional<CachedLocation> LocationCache::Lookup(uint64_t key_hash) const {
  if (sets_n_ == 0) return std::nullopt;
  const Set& set = SetOf(key_hash);
  const uint16_t tag = TagOf(key_hash);
  for (const std::atomic<uint64_t>& way : set.ways) {
    const uint64_t w = way.load(std::memory_order_relaxed);
    if (!HasTag(w, tag)) continue;
    CachedLocation loc{static_cast<uint32_t>(w), static_cast<uint16_t>(w >> 32),
                       static_cast<uint8_t>((w >> 48) & 1), ((w >> 49) & 1) != 0};
    if (loc.units == 0) return std::nullopt;
    return loc;
  }
  return std::nullopt;
}

void LocationCache::Store(uint64_t key_hash, CachedLocation loc) {
  if (sets_n_ == 0 || loc.units == 0) return;
  Set& set = SetOf(key_hash);
  const uint16_t tag = TagOf(key_hash);
  const uint64_t packed = Pack(key_hash, loc);
  std::atomic<uint64_t>* empty = nullptr;
  for (std::atomic<uint64_t>& way : set.ways) {
    const uint64_t w = way.load(std::memory_order_relaxed);
    if (HasTag(w, tag)) {
      way.store(packed, std::memory_order_relaxed);  // the key's own way (or an alias's)
      return;
    }
    if (w == 0 && empty == nullptr) empty = &way;
  }
  // A free way, else one at random. Racing stores may take the same way (one entry is lost)
  // or put one key in two ways: both are hints, checked when read, and Erase clears both.
  (empty != nullptr ? *empty : set.ways[NextVictim() % kWays])
      .store(packed, std::memory_order_relaxed);
}

void LocationCache::Erase(uint64_t key_hash, std::optional<CachedLocation> loc) {
  if (sets_n_ == 0) return;
  Set& set = SetOf(key_hash);
  const uint16_t tag = TagOf(key_hash);
  for (std::atomic<uint64_t>& way : set.ways) {
    uint64_t w = way.load(std::memory_order_relaxed);
    if (!HasTag(w, tag)) continue;
    if (loc.has_value() && w != Pack(key_hash, *loc)) continue;
    way.compare_exchange_strong(w, 0, std::memory_order_relaxed);
  }
}

void LocationCache::Clear() {
  for (size_t s = 0; s < sets_n_; ++s) {
    for (std::atomic<uint64_t>& way : sets_[s].ways) way.store(0, std::memory_order_relaxed);
  }
}

}  // namespace rdkv::client

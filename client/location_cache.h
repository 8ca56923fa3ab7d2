// The client's location cache: key hash -> where the key's item was last found (offset and
// length in kv::kUnit units, and which of its two candidate index buckets pointed at it), so a
// repeated GET can take one READ instead of two round trips.
//
// A fixed-size direct-mapped array of atomic 64-bit words, allocated once: no locks, no
// allocation after construction, bounded memory (8 bytes per entry). Each word packs
//   bits 63..50 tag (14 bits of the key hash, never 0), 49 contended, 48 bucket choice,
//   47..32 units,
//   31..0 offset units
// so a lookup is one relaxed load. Two keys that share an entry evict each other; two keys
// with the same entry and tag alias, which is harmless: a cached location is only a hint and
// every item read through it is checked (key, checksum, state) before it is believed.
//
// Thread-safety: every method is safe from any thread.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>

namespace rdkv::client {

struct CachedLocation {
  uint32_t offset_units = 0;  // from the heap start
  uint16_t units = 0;         // item length
  uint8_t choice = 0;         // which candidate bucket (0 or 1) held the slot
  // The key's cached location went stale recently (another client rewrote it): its GETs READ
  // the buckets in the same batch as the cached item (GetEngine::IndexChunk), so a stale
  // location costs 2 round trips, not 3. Cleared when this client writes the key.
  bool contended = false;
};

class LocationCache {
 public:
  // entries == 0 disables the cache (every call is a no-op / miss).
  explicit LocationCache(size_t entries);

  size_t entries() const { return n_; }
  std::optional<CachedLocation> Lookup(uint64_t key_hash) const;
  void Store(uint64_t key_hash, CachedLocation loc);
  // Forgets the key if (and only if) its entry still points to `loc` (or to anything, when
  // loc is nullopt). Used when a cached location turned out stale.
  void Erase(uint64_t key_hash, std::optional<CachedLocation> loc = std::nullopt);
  // Forgets everything (a new server incarnation: every offset is void).
  void Clear();

 private:
  size_t IndexOf(uint64_t key_hash) const;
  static uint64_t Pack(uint64_t key_hash, CachedLocation loc);
  static uint16_t TagOf(uint64_t key_hash);

  size_t n_;
  std::unique_ptr<std::atomic<uint64_t>[]> slots_;
};

}  // namespace rdkv::client

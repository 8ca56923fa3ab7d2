// The client's location cache: key hash -> where the key's item was last found (offset and
// length in kv::kUnit units, and which of its two candidate index buckets pointed at it), so a
// repeated GET can take one READ instead of two round trips.
//
// A fixed-size set-associative array of atomic 64-bit words, allocated once: no locks, no
// allocation after construction, bounded memory (8 bytes per entry). A key's hash picks a set
// of kWays words (one 64-byte cache line); its entry may be in any of them. Each word packs
//   bits 63..50 tag (14 bits of the key hash, never 0), 49 contended, 48 bucket choice,
//   47..32 units,
//   31..0 offset units
// so a lookup is kWays relaxed loads of one line. A full set evicts a way at random. (The
// direct-mapped array this replaced kept about 86 % of 20,000 keys in 65,536 entries; YCSB C
// over 20,000 records took 1.255 round trips per GET with it and 1.192 with eight ways, docs/
// benchmarks.md.) Two keys of one set with the same tag alias, which is harmless: a cached
// location is only a hint and every item read through it is checked (key, checksum, state)
// before it is believed.
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
  // The key's cached location went stale since this client last wrote the key (another client
  // moved its item): its GETs READ the buckets in the same batch as the cached item
  // (GetEngine::IndexChunk), so a stale location costs 2 round trips, not 3. Cleared when this
  // client writes the key (or when the entry is evicted).
  bool contended = false;
};

class LocationCache {
 public:
  static constexpr size_t kWays = 8;

  // entries == 0 disables the cache (every call is a no-op / miss); else it is rounded up to
  // a multiple of kWays.
  explicit LocationCache(size_t entries);

  size_t entries() const { return sets_n_ * kWays; }
  std::optional<CachedLocation> Lookup(uint64_t key_hash) const;
  void Store(uint64_t key_hash, CachedLocation loc);
  // Forgets the key if (and only if) its entry still points to `loc` (or to anything, when
  // loc is nullopt). Used when a cached location turned out stale.
  void Erase(uint64_t key_hash, std::optional<CachedLocation> loc = std::nullopt);
  // Forgets everything (a new server incarnation: every offset is void).
  void Clear();

 private:
  struct alignas(64) Set {
    std::atomic<uint64_t> ways[kWays];
  };
  static_assert(sizeof(Set) == 64, "a set is one cache line");

  Set& SetOf(uint64_t key_hash) const;
  static uint64_t Pack(uint64_t key_hash, CachedLocation loc);
  static uint16_t TagOf(uint64_t key_hash);
  static bool HasTag(uint64_t word, uint16_t tag);

  size_t sets_n_;
  std::unique_ptr<Set[]> sets_;
};

}  // namespace rdkv::client

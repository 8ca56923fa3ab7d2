// The client's location cache: key hash -> where the key's item was last found (offset and
// length in 64-byte units), so a repeated GET can take one READ instead of two.
//
// A fixed-size direct-mapped array of atomic 64-bit words, allocated once: no locks, no
// allocation after construction, bounded memory (8 bytes per entry). Each word packs
//   bits 63..48 tag (16 bits of the key hash, never 0), 47..32 units, 31..0 offset units
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

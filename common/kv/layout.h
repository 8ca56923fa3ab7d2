// The registered region's layout, version 3: what a client may read one-sidedly.
//
// docs/design.md ("Region layout") is the prose version of this file; keep them together.
//
//   offset 0                 RegionHeader (one 4 KiB page; fields little-endian)
//   header.index_offset      bucket_count Buckets of 512 B (64 slots of 8 B). A key lives in
//                            one slot of one of its two candidate buckets (BucketsOf: two
//                            independent hashes); a GET READs both in one batch.
//   header.heap_offset       items, each starting on a 32-byte boundary (kUnit)
//
// Version 1 (before index v2) had 64-byte buckets and one 2-bucket window per key; version 2
// had this index with 64-byte units (a 16-byte key and 32-byte value took 128 B of heap, now
// 96 B). The versions are not compatible and each side refuses the other's region by its
// layout_version.
//
// Slot word (8 B, written by the server with one aligned 64-bit store; a key never moves
// between slots while it exists):
//   bits 63..48 fingerprint (16 bits of the key hash, never 0 in a used slot)
//   bits 47..32 item length in 32-byte units (the exact bytes one READ must fetch; at most
//               0xffff units = 2 MiB - 32 B, which holds the largest key and value)
//   bits 31..0  item offset from heap_offset in 32-byte units (heap up to 128 GiB)
//   A zero word is an empty slot.
//
// Item (once published, only its state+checksum pair changes, and a small item's value,
// lengths, version and checksum in an in-place update; docs/design.md "In-place updates"):
//   ItemHeader (32 B) | key bytes | value bytes | padding to 32 B
//   checksum = Checksum(state, version, key, value): a reader recomputes it and accepts an
//   item only when it matches, the key is the one asked for, and state == kLive. Retiring an
//   item rewrites state and checksum (two words); a torn read of the pair fails the check.
//
// Thread-safety: these are plain functions and PODs; concurrency rules are in docs/design.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

#include "common/kv/limits.h"

namespace rdkv::kv {

inline constexpr uint32_t kLayoutVersion = 3;
inline constexpr uint64_t kRegionMagic = 0x3147455256444b52ull;  // "RKDVREG1" little-endian
inline constexpr size_t kHeaderBytes = 4096;
inline constexpr size_t kSlotsPerBucket = 64;
inline constexpr size_t kBucketBytes = kSlotsPerBucket * 8;  // one READ
inline constexpr size_t kChoices = 2;                        // candidate buckets per key
inline constexpr size_t kCandidateSlots = kSlotsPerBucket * kChoices;
inline constexpr uint64_t kSecondHashSeed = 0x1d3c2b1a;
inline constexpr size_t kUnit = 32;                // item alignment and size unit
inline constexpr uint32_t kMaxItemUnits = 0xffff;  // 2 MiB - 32 B (the slot's 16 bits)

inline constexpr uint32_t kStateLive = 0x4556494c;     // "LIVE"
inline constexpr uint32_t kStateDead = 0x44414544;     // "DEAD"
inline constexpr uint32_t kStatePending = 0x444e4550;  // "PEND": written, not yet current

// The first page of the region. The static part is written once before the region is served
// and covered by header_checksum. The ownership part changes while serving (cluster map
// changes), each 8-byte word with one aligned store; clients re-read it under a lease
// (docs/design.md "Cluster").
struct RegionHeader {
  uint64_t magic;
  uint32_t layout_version;
  uint32_t header_bytes;
  uint64_t region_bytes;
  uint64_t index_offset;
  uint64_t bucket_count;  // buckets of kBucketBytes (at least 2)
  uint64_t heap_offset;
  uint64_t heap_bytes;
  uint64_t incarnation;  // random per server start: a new table, old cached locations are void
  uint64_t max_value_bytes;
  uint32_t shard_count;      // 1 for a standalone server
  uint32_t server_id;        // this server's id in the cluster map (0 standalone)
  uint64_t header_checksum;  // Checksum over the bytes before this field

  // --- ownership: one READ of kOwnershipBytes at offsetof(RegionHeader, map_epoch) ---
  uint64_t map_epoch;                      // cluster map epoch served (0 = standalone)
  uint64_t owned_shards[kMaxShards / 64];  // bit s of word s/64: this server serves shard s
};
inline constexpr size_t kOwnershipOffset = 88;
inline constexpr size_t kOwnershipBytes = 8 + kMaxShards / 8;
static_assert(offsetof(RegionHeader, map_epoch) == kOwnershipOffset);
inline bool OwnsShard(const uint64_t* owned_words, uint32_t shard) {
  return (owned_words[shard / 64] >> (shard % 64)) & 1;
}
static_assert(sizeof(RegionHeader) <= kHeaderBytes);

// In-place updates (docs/design.md "In-place updates") are made only for items of at most this
// many bytes: their rewrite takes tens of nanoseconds, far less than a READ's round trip.
inline constexpr uint64_t kInPlaceMaxItemBytes = 4096;

struct ItemHeader {
  uint32_t state;  // kLiveState / kDeadState
  uint32_t key_bytes;
  uint32_t value_bytes;
  uint32_t units;    // allocated size in kUnit units (server bookkeeping, checksummed)
  uint64_t version;  // the key's version; grows with every write of the key
  uint64_t checksum;
};
static_assert(sizeof(ItemHeader) == 32);
static_assert(kUnit % 8 == 0, "items stay 8-byte aligned (state/checksum are aligned stores)");
// The largest item (largest key and value) fits the slot's 16-bit length.
static_assert((sizeof(ItemHeader) + kMaxKeyBytes + kMaxValueBytes + kUnit - 1) / kUnit <=
              kMaxItemUnits);

inline size_t ItemBytes(size_t key_bytes, size_t value_bytes) {
  return sizeof(ItemHeader) + key_bytes + value_bytes;
}
inline uint32_t UnitsFor(size_t bytes) {
  return static_cast<uint32_t>((bytes + kUnit - 1) / kUnit);
}

// --- slot words ---
struct SlotFields {
  uint16_t fingerprint = 0;
  uint16_t units = 0;
  uint32_t offset_units = 0;
};
inline uint64_t PackSlot(SlotFields s) {
  return (uint64_t{s.fingerprint} << 48) | (uint64_t{s.units} << 32) | s.offset_units;
}
inline SlotFields UnpackSlot(uint64_t w) {
  return {static_cast<uint16_t>(w >> 48), static_cast<uint16_t>(w >> 32), static_cast<uint32_t>(w)};
}

// Where the item a slot points at lies in the region (offset from the region start), or
// nullopt when the slot is not a readable item of `h`'s heap (0 units, or past its end). A
// client checks every slot word it READ with this before it READs the item.
inline std::optional<uint64_t> SlotItemOffset(const RegionHeader& h, SlotFields s) {
  const uint64_t start = uint64_t{s.offset_units} * kUnit;
  const uint64_t len = uint64_t{s.units} * kUnit;
  if (s.units == 0 || start > h.heap_bytes || len > h.heap_bytes - start) return std::nullopt;
  return h.heap_offset + start;
}

// --- hashing ---
// The key's 64-bit hash (XXH3) decides its fingerprint, its first candidate bucket and (cluster)
// its shard; a second, independent hash (SecondHash) its other candidate bucket.
uint64_t KeyHash(std::string_view key);
uint64_t SecondHash(std::string_view key);
// The key's two candidate buckets, always different (bucket_count >= 2): [0] from `hash`
// (KeyHash), [1] from `hash2` (SecondHash), moved to the next bucket when they coincide.
struct Buckets {
  uint64_t b[kChoices];
};
inline Buckets BucketsOf(uint64_t hash, uint64_t hash2, uint64_t bucket_count) {
  uint64_t b1 = (hash >> 20) % bucket_count;
  uint64_t b2 = hash2 % bucket_count;
  if (b2 == b1) b2 = (b1 + 1) % bucket_count;
  return {{b1, b2}};
}
inline uint16_t FingerprintOf(uint64_t hash) {
  uint16_t fp = static_cast<uint16_t>(hash >> 48);
  return fp == 0 ? 1 : fp;
}

// The slots of one bucket image (kBucketBytes as READ, slot words in the host's byte order, as
// the region holds them) whose fingerprint is `fingerprint`, as a mask: bit s for slot s. No
// key's fingerprint is 0 (FingerprintOf), so a slot that matches one is a used slot. A GET's
// candidates are these slots of its two buckets.
static_assert(kSlotsPerBucket == 64, "one bit per slot in a uint64_t");
uint64_t MatchFingerprints(const uint8_t* bucket, uint16_t fingerprint);

// --- checksums ---
uint64_t Checksum(const void* data, size_t n);
// The item checksum: covers state, key/value sizes, units, version, key and value, as
// XXH3(sizes, units, version, key, value) XOR StateMix(state), so the server can change the
// state (PENDING -> LIVE -> DEAD) without rehashing the value: RestateChecksum.
uint64_t ItemChecksum(const ItemHeader& h, std::string_view key, std::string_view value);
uint64_t StateMix(uint32_t state);
inline uint64_t RestateChecksum(uint64_t sum, uint32_t from, uint32_t to) {
  return sum ^ StateMix(from) ^ StateMix(to);
}
uint64_t HeaderChecksum(const RegionHeader& h);

// Why a read item was rejected (for stats and tests).
// kDead: intact, retired (DEAD): it was the key's current value until a later write or delete.
// kPending: intact, written and not yet current (PENDING; or a state no server writes).
enum class ItemCheck : uint8_t {
  kOk,
  kTooShort,
  kBadLengths,
  kWrongKey,
  kBadChecksum,
  kDead,
  kPending
};

// Validates `bytes` (what a READ returned for a slot of `units` units) as a live item of
// `key`. On kOk and kDead, *value points into `bytes` and *version is the item's version;
// whether a kDead item may be returned is the reader's rule (docs/design.md "index path,
// found").
ItemCheck CheckItem(const uint8_t* bytes, size_t n, std::string_view key, std::string_view* value,
                    uint64_t* version);

// The default share of the region for the index: one slot per 56 bytes of heap, so that even
// the smallest items (two 32-byte units: header and a few bytes) fill the heap before the
// index refuses at its ~96% slot use
// (docs/operations.md "Sizing memory").
inline constexpr double kDefaultIndexFraction = 1.0 / 8;

// Region geometry for a region of `region_bytes`: how many buckets and where the heap starts.
struct Geometry {
  uint64_t bucket_count = 0;
  uint64_t index_offset = 0;
  uint64_t heap_offset = 0;
  uint64_t heap_bytes = 0;
};
// index_fraction: share of the region given to the index (default kDefaultIndexFraction).
// bucket_count is at least 2; a region too small for that gets bucket_count 0.
Geometry ComputeGeometry(uint64_t region_bytes, double index_fraction);

}  // namespace rdkv::kv

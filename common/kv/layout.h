// The registered region's layout, version 1: what a client may read one-sidedly.
//
// docs/design.md ("Region layout") is the prose version of this file; keep them together.
//
//   offset 0                 RegionHeader (one 4 KiB page; fields little-endian)
//   header.index_offset      bucket_count + 1 Buckets of 64 B (8 slots of 8 B). A key with
//                            bucket b lives in bucket b or b+1 (a 128-byte "window" read by
//                            one READ); the extra bucket at the end means windows never wrap.
//   header.heap_offset       items, each starting on a 64-byte boundary
//
// Slot word (8 B, written by the server with one aligned 64-bit store, never moved):
//   bits 63..48 fingerprint (16 bits of the key hash, never 0 in a used slot)
//   bits 47..32 item length in 64-byte units (the exact bytes one READ must fetch)
//   bits 31..0  item offset from heap_offset in 64-byte units (heap up to 256 GiB)
//   A zero word is an empty slot.
//
// Item (immutable once published, except for the state+checksum pair):
//   ItemHeader (32 B) | key bytes | value bytes | padding to 64 B
//   checksum = Checksum(state, version, key, value): a reader recomputes it and accepts an
//   item only when it matches, the key is the one asked for, and state == kLive. Retiring an
//   item rewrites state and checksum (two words); a torn read of the pair fails the check.
//
// Thread-safety: these are plain functions and PODs; concurrency rules are in docs/design.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "common/kv/limits.h"

namespace rdkv::kv {

inline constexpr uint32_t kLayoutVersion = 1;
inline constexpr uint64_t kRegionMagic = 0x3147455256444b52ull;  // "RKDVREG1" little-endian
inline constexpr size_t kHeaderBytes = 4096;
inline constexpr size_t kBucketBytes = 64;
inline constexpr size_t kSlotsPerBucket = 8;
inline constexpr size_t kWindowBuckets = 2;  // buckets a key may live in (one READ)
inline constexpr size_t kWindowBytes = kBucketBytes * kWindowBuckets;
inline constexpr size_t kUnit = 64;                // item alignment and size unit
inline constexpr uint32_t kMaxItemUnits = 0xffff;  // 4 MiB - 64 B

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
  uint64_t bucket_count;  // windows start at buckets [0, bucket_count); bucket_count+1 exist
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

struct ItemHeader {
  uint32_t state;  // kLiveState / kDeadState
  uint32_t key_bytes;
  uint32_t value_bytes;
  uint32_t units;    // allocated size in 64-byte units (server bookkeeping, checksummed)
  uint64_t version;  // the key's version; grows with every write of the key
  uint64_t checksum;
};
static_assert(sizeof(ItemHeader) == 32);

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

// --- hashing ---
// One 64-bit hash per key (XXH3) decides everything: bucket, fingerprint and (cluster) shard.
uint64_t KeyHash(std::string_view key);
inline uint64_t BucketOf(uint64_t hash, uint64_t bucket_count) {
  return (hash >> 20) % bucket_count;
}
inline uint16_t FingerprintOf(uint64_t hash) {
  uint16_t fp = static_cast<uint16_t>(hash >> 48);
  return fp == 0 ? 1 : fp;
}

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
// kDead: intact but not LIVE (retired, or written and not yet current).
enum class ItemCheck : uint8_t { kOk, kTooShort, kBadLengths, kWrongKey, kBadChecksum, kDead };

// Validates `bytes` (what a READ returned for a slot of `units` units) as a live item of
// `key`. On kOk, *value points into `bytes` and *version is the item's version.
ItemCheck CheckItem(const uint8_t* bytes, size_t n, std::string_view key, std::string_view* value,
                    uint64_t* version);

// Region geometry for a region of `region_bytes`: how many buckets and where the heap starts.
struct Geometry {
  uint64_t bucket_count = 0;
  uint64_t index_offset = 0;
  uint64_t heap_offset = 0;
  uint64_t heap_bytes = 0;
};
// index_fraction: share of the region given to the index (default 1/16).
Geometry ComputeGeometry(uint64_t region_bytes, double index_fraction);

}  // namespace rdkv::kv

// The registered hash table: formats the region and applies writes to it.
//
// The Store owns no memory: it works on a region that outlives it (the registered
// MemoryRegion). Clients read the same bytes one-sidedly at any moment, so every change follows
// the publication rules of docs/design.md ("Server"): items are complete before their slot is
// stored, slots change with one aligned 8-byte store, retired items are marked DEAD before the
// write that retired them returns, and their blocks wait out the grace period in limbo.
//
// Index: layout version 2 (docs/design.md "Region layout"): a key lives in one slot of one of
// its two candidate buckets and never moves while it exists; an insert takes the emptier one.
//
// Thread-safety: all methods are thread-safe. Writers of keys that share a candidate bucket
// (or its stripe) serialize on striped locks; others run in parallel.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/kv/layout.h"
#include "common/kv/limits.h"
#include "common/kv/wire.h"
#include "common/util/mutex.h"
#include "rdkv/status.h"
#include "server/allocator.h"

namespace rdkv::server {

struct StoreOptions {
  double index_fraction = kv::kDefaultIndexFraction;
  uint64_t max_value_bytes = kv::kDefaultMaxValueBytes;
  std::chrono::milliseconds grace{90};
  // Cluster: the map epoch, shard count and the shards this server owns at start
  // (empty: standalone, shard_count 1, shard 0 owned).
  uint64_t map_epoch = 0;
  uint32_t shard_count = 1;
  uint32_t server_id = 0;
  std::vector<uint32_t> owned_shards;
  // An update whose item needs as many units as the key's current one rewrites that item in
  // place (docs/design.md "In-place updates"); off: every write makes a new item.
  bool update_in_place = true;
};

// The cursor ScanShard returns when it has visited every slot.
inline constexpr uint64_t kScanComplete = ~uint64_t{0};

// One item as a shard scan sees it.
struct ScanItem {
  std::string_view key;
  std::string_view value;
  uint64_t version = 0;
};

struct StoreCounters {
  uint64_t items = 0;
  uint64_t item_bytes = 0;
  uint64_t in_place_updates = 0;  // writes that rewrote the key's item where it was
};

class Store {
 public:
  // Formats `region` (zeroes the index, writes the header). kInvalidArgument when the region
  // is too small for a header, an index and a heap.
  static Result<std::unique_ptr<Store>> Format(uint8_t* region, uint64_t region_bytes,
                                               const StoreOptions& options);

  // `where`, when not null, receives the new item's location on success (what a client
  // caches: kv::ItemLocation).
  // Upsert. Returns the new version.
  Result<uint64_t> Put(std::string_view key, std::string_view value,
                       kv::ItemLocation* where = nullptr);
  // Only if absent: kAlreadyExists (with *current_version set) otherwise.
  Result<uint64_t> Insert(std::string_view key, std::string_view value,
                          uint64_t* current_version = nullptr, kv::ItemLocation* where = nullptr);
  // Only if the current version equals `expected`: kVersionMismatch (with *current_version
  // set) otherwise; kNotFound when absent.
  Result<uint64_t> Cas(std::string_view key, uint64_t expected, std::string_view value,
                       uint64_t* current_version = nullptr, kv::ItemLocation* where = nullptr);
  // kNotFound when absent.
  Status Delete(std::string_view key);

  // --- replication (docs/design.md "Replication") ---
  // The key's current version (OK), or kNotFound. Callers that act on the answer hold the
  // key's service stripe, so no other writer of the key runs in between.
  Status Lookup(std::string_view key, uint64_t* version) const;
  // Hands out the next version (what a Put would give the key).
  uint64_t NextVersion() { return version_counter_.fetch_add(1, std::memory_order_relaxed) + 1; }
  // Stores `key` = `value` with exactly `version` (> 0) unless the key already has that
  // version or a newer one: then nothing changes and *applied is false, and *current (when
  // not null) is the key's version. Raises the version counter to at least `version`. Errors
  // as Put (kOutOfSpace, kInvalidArgument).
  // `where` as Put's, when applied.
  Status ApplyVersioned(std::string_view key, std::string_view value, uint64_t version,
                        bool* applied, uint64_t* current = nullptr,
                        kv::ItemLocation* where = nullptr);
  // Deletes `key` unless it is absent or its version is `version` or newer (*applied false;
  // *current, when not null, is then the key's version, 0 when absent). Raises the version
  // counter to at least `version`.
  Status DeleteVersioned(std::string_view key, uint64_t version, bool* applied,
                         uint64_t* current = nullptr);

  // Server-side lookup (tests, recovery checks). Not used by clients' GETs.
  Result<std::string> Get(std::string_view key, uint64_t* version = nullptr) const;

  // --- cluster ownership (the region header's ownership part) ---
  uint32_t shard_count() const { return header_->shard_count; }
  uint32_t ShardOfKey(std::string_view key) const;
  bool Owns(uint32_t shard) const;
  // One aligned store per word; readers re-read it under their lease (docs/design.md).
  void SetOwned(uint32_t shard, bool owned);
  void SetMapEpoch(uint64_t epoch);
  uint64_t map_epoch() const;

  // Visits the items of `shard` found at index slots [cursor, ...) in slot order; returns the
  // cursor to resume at, or kScanComplete when every slot was visited. `visit` returns false
  // to stop before the item it was given (the returned cursor is that item's slot, so the next
  // scan starts with it). The item's views are valid only during the call; `visit` runs under
  // a stripe lock and must not call back into the Store.
  uint64_t ScanShard(uint32_t shard, uint64_t cursor,
                     const std::function<bool(const ScanItem&)>& visit) const;

  // Recovery: stores an absent key with exactly `version` (> 0), leaving the version counter
  // alone; the caller raises it afterwards with EnsureVersionAbove. Keys of different index
  // windows restore in parallel. kAlreadyExists when the key is present, kInvalidArgument
  // for a version outside 1..kv::kMaxItemVersion or a bad key/value, kOutOfSpace when the heap or
  // both of the key's index buckets are full.
  Status Restore(std::string_view key, std::string_view value, uint64_t version);

  // Raises the version counter so the next write gets a version above `v` (recovery), at most
  // to kv::kMaxItemVersion: from there on writes get kOutOfSpace instead of a wrapped version.
  void EnsureVersionAbove(uint64_t v);
  // The last version handed out (every version this store gave is at most this). Refused
  // writes at the maximum move the counter past it; they hand nothing out, so it is clamped.
  uint64_t version_counter() const {
    return std::min(version_counter_.load(), kv::kMaxItemVersion);
  }

  const kv::RegionHeader& header() const { return *header_; }

  // While one exists, this thread's writes never wait for blocks in their grace period: a
  // heap full only of those refuses the write at once (kOutOfSpace). For a thread that must
  // not sleep (the transport's receiving thread), with HasRoomFor checked first.
  class NoWaitScope {
   public:
    NoWaitScope() : outer_(t_no_wait) { t_no_wait = true; }
    ~NoWaitScope() { t_no_wait = outer_; }  // nested scopes restore the outer one's
    NoWaitScope(const NoWaitScope&) = delete;
    NoWaitScope& operator=(const NoWaitScope&) = delete;

   private:
    const bool outer_;
  };
  // Whether the heap has plenty of room for an item of key and value of these sizes (many
  // blocks of the size classes it may take, and no writer waiting for blocks): then a write
  // of it does not meet a full heap.
  bool HasRoomFor(size_t key_bytes, size_t value_bytes);
  StoreCounters counters() const;
  AllocatorStats allocator_stats() const { return allocator_.stats(); }

 private:
  // kApply: upsert with exactly `expected` as the version, only over an older version.
  enum class Mode { kUpsert, kInsert, kCas, kRestore, kApply };
  Store(uint8_t* region, const kv::RegionHeader* header, const StoreOptions& options);
  // `expected`: the version to match (kCas) or to give the item (kRestore).
  Result<uint64_t> Write(Mode mode, std::string_view key, std::string_view value, uint64_t expected,
                         uint64_t* current_version, kv::ItemLocation* where = nullptr);
  // Whether `mode` may write over the key's current item (at version `have`): OK, or the
  // error the write returns. Caller holds the WindowLock.
  static Status CheckOverwrite(Mode mode, uint64_t have, uint64_t expected);
  // The version a write of `mode` gives its item; kOutOfSpace at the counter's maximum.
  Result<uint64_t> NewVersion(Mode mode, uint64_t expected);
  // The in-place update (docs/design.md "In-place updates") when the key exists in an item of
  // `units` units: true when it ran (*result is the write's outcome), false when the write
  // must make a new item.
  bool TryUpdateInPlace(Mode mode, std::string_view key, std::string_view value, uint32_t units,
                        uint64_t expected, uint64_t* current_version, kv::ItemLocation* where,
                        Result<uint64_t>* result);

  // Where a key may live: its hash, fingerprint and two candidate buckets.
  struct Place {
    uint64_t hash = 0;
    uint16_t fingerprint = 0;
    uint64_t bucket[kv::kChoices] = {};
    uint64_t* slots[kv::kChoices] = {};  // the buckets' first slots
  };
  Place PlaceOf(std::string_view key) const;
  // The write answer's location of an item at `offset_units` whose slot is `slot` (which of
  // the key's two buckets holds it).
  static kv::ItemLocation LocationOf(const Place& place, const uint64_t* slot,
                                     uint32_t offset_units, uint32_t units);
  class WindowLock;
  // Finds the slot holding `key` in its candidate buckets; nullptr when absent. Caller holds
  // the WindowLock.
  uint64_t* FindSlot(const Place& p, std::string_view key) const;
  // An empty slot of the emptier candidate bucket; nullptr when both are full. Caller holds
  // the WindowLock.
  uint64_t* FreeSlot(const Place& p) const;
  std::string IndexFullMessage() const;
  kv::ItemHeader* ItemAt(uint32_t offset_units) const;
  // Marks the item a slot word points at DEAD (state, then checksum) and returns its block.
  Block MarkDead(uint64_t slot_word);
  // Rewrites an item's state and its checksum (two aligned stores).
  void Restate(kv::ItemHeader* it, uint32_t to);

  uint8_t* const region_;
  const kv::RegionHeader* const header_;
  uint8_t* const heap_;
  const StoreOptions options_;
  mutable Allocator allocator_;
  static constexpr size_t kStripes = 4096;
  // Writers of a bucket hold its stripe (two buckets: WindowLock); they guard region memory.
  mutable std::array<Mutex, kStripes> stripes_;
  std::atomic<uint64_t> version_counter_{0};
  std::atomic<uint64_t> items_{0};
  std::atomic<uint64_t> item_bytes_{0};
  std::atomic<uint64_t> in_place_updates_{0};
  static thread_local bool t_no_wait;
};

}  // namespace rdkv::server

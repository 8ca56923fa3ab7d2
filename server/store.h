// The registered hash table: formats the region and applies writes to it.
//
// The Store owns no memory: it works on a region that outlives it (the registered
// MemoryRegion). Clients read the same bytes one-sidedly at any moment, so every change follows
// the publication rules of docs/design.md ("Server"): items are complete before their slot is
// stored, slots change with one aligned 8-byte store, retired items are marked DEAD before the
// write that retired them returns, and their blocks wait out the grace period in limbo.
//
// Thread-safety: all methods are thread-safe. Writers of keys in the same index window
// serialize on striped locks; others run in parallel.
#pragma once

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
#include "common/util/mutex.h"
#include "rdkv/status.h"
#include "server/allocator.h"

namespace rdkv::server {

struct StoreOptions {
  double index_fraction = 1.0 / 16;
  uint64_t max_value_bytes = kv::kDefaultMaxValueBytes;
  std::chrono::milliseconds grace{90};
  // Cluster: the map epoch, shard count and the shards this server owns at start
  // (empty: standalone, shard_count 1, shard 0 owned).
  uint64_t map_epoch = 0;
  uint32_t shard_count = 1;
  uint32_t server_id = 0;
  std::vector<uint32_t> owned_shards;
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
};

class Store {
 public:
  // Formats `region` (zeroes the index, writes the header). kInvalidArgument when the region
  // is too small for a header, an index and a heap.
  static Result<std::unique_ptr<Store>> Format(uint8_t* region, uint64_t region_bytes,
                                               const StoreOptions& options);

  // Upsert. Returns the new version.
  Result<uint64_t> Put(std::string_view key, std::string_view value);
  // Only if absent: kAlreadyExists (with *current_version set) otherwise.
  Result<uint64_t> Insert(std::string_view key, std::string_view value,
                          uint64_t* current_version = nullptr);
  // Only if the current version equals `expected`: kVersionMismatch (with *current_version
  // set) otherwise; kNotFound when absent.
  Result<uint64_t> Cas(std::string_view key, uint64_t expected, std::string_view value,
                       uint64_t* current_version = nullptr);
  // kNotFound when absent.
  Status Delete(std::string_view key);

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
  // for version 0 or a bad key/value, kOutOfSpace when the heap or the key's window is full.
  Status Restore(std::string_view key, std::string_view value, uint64_t version);

  // Raises the version counter so the next write gets a version above `v` (recovery).
  void EnsureVersionAbove(uint64_t v);
  // The last version handed out (every version this store gave is at most this).
  uint64_t version_counter() const { return version_counter_.load(); }

  const kv::RegionHeader& header() const { return *header_; }
  StoreCounters counters() const;
  AllocatorStats allocator_stats() const { return allocator_.stats(); }

 private:
  enum class Mode { kUpsert, kInsert, kCas, kRestore };
  Store(uint8_t* region, const kv::RegionHeader* header, const StoreOptions& options);
  // `expected`: the version to match (kCas) or to give the item (kRestore).
  Result<uint64_t> Write(Mode mode, std::string_view key, std::string_view value, uint64_t expected,
                         uint64_t* current_version);

  class WindowLock;
  // Finds the slot holding `key` in its window; nullptr when absent.
  uint64_t* FindSlot(uint64_t hash, std::string_view key) const;
  uint64_t* Window(uint64_t hash) const;
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
};

}  // namespace rdkv::server

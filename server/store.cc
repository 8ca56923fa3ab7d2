#include "server/store.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <optional>
#include <random>
#include <thread>

#include "common/util/reply_batch.h"

namespace rdkv::server {

using kv::ItemHeader;
using kv::kUnit;

thread_local bool Store::t_no_wait = false;

namespace {

// Stores the region's words with atomic_ref: concurrent READs (DMA, or the tcp transport's
// copy) see each aligned word either old or new.
void StoreWord(uint64_t* p, uint64_t v) {
  std::atomic_ref<uint64_t>(*p).store(v, std::memory_order_release);
}
void StoreWord32(uint32_t* p, uint32_t v) {
  std::atomic_ref<uint32_t>(*p).store(v, std::memory_order_release);
}
uint64_t LoadWord(uint64_t* p) {
  return std::atomic_ref<uint64_t>(*p).load(std::memory_order_acquire);
}

}  // namespace

Store::Place Store::PlaceOf(std::string_view key) const {
  Place p;
  p.hash = kv::KeyHash(key);
  p.fingerprint = kv::FingerprintOf(p.hash);
  kv::Buckets b = kv::BucketsOf(p.hash, kv::SecondHash(key), header_->bucket_count);
  for (size_t c = 0; c < kv::kChoices; ++c) {
    p.bucket[c] = b.b[c];
    p.slots[c] =
        reinterpret_cast<uint64_t*>(region_ + header_->index_offset + b.b[c] * kv::kBucketBytes);
  }
  return p;
}

// Holds the stripes of a key's two candidate buckets, the lower stripe first, each once. Which
// stripes is known only at run time, so the analysis cannot name them; they guard region
// memory, not members, and the scoped MutexLocks release them.
class Store::WindowLock {
 public:
  WindowLock(const Store& s, const Place& p) {
    size_t a = p.bucket[0] % kStripes, c = p.bucket[1] % kStripes;
    first_.emplace(&s.stripes_[std::min(a, c)]);
    if (a != c) second_.emplace(&s.stripes_[std::max(a, c)]);
  }
  ~WindowLock() {
    second_.reset();  // the reverse order of taking them
    first_.reset();
  }
  WindowLock(const WindowLock&) = delete;
  WindowLock& operator=(const WindowLock&) = delete;

 private:
  std::optional<MutexLock> first_;
  std::optional<MutexLock> second_;
};

Result<std::unique_ptr<Store>> Store::Format(uint8_t* region, uint64_t region_bytes,
                                             const StoreOptions& options) {
  kv::Geometry g = kv::ComputeGeometry(region_bytes, options.index_fraction);
  if (g.bucket_count == 0 || g.heap_bytes < 64 * kUnit) {
    return Status::InvalidArgument("a region of " + std::to_string(region_bytes) +
                                   " bytes is too small for a header, an index and a heap");
  }
  if (options.shard_count == 0 || options.shard_count > kv::kMaxShards) {
    return Status::InvalidArgument("shard count must be 1.." + std::to_string(kv::kMaxShards));
  }
  if (options.max_value_bytes > kv::kMaxValueBytes ||
      options.max_value_bytes < kv::kMinMaxValueBytes) {
    return Status::InvalidArgument("max value size must be " +
                                   std::to_string(kv::kMinMaxValueBytes) + ".." +
                                   std::to_string(kv::kMaxValueBytes) + " bytes");
  }
  std::memset(region + g.index_offset, 0, g.bucket_count * kv::kBucketBytes);
  auto* h = reinterpret_cast<kv::RegionHeader*>(region);
  std::memset(region, 0, kv::kHeaderBytes);
  h->magic = kv::kRegionMagic;
  h->layout_version = kv::kLayoutVersion;
  h->header_bytes = kv::kHeaderBytes;
  h->region_bytes = region_bytes;
  h->index_offset = g.index_offset;
  h->bucket_count = g.bucket_count;
  h->heap_offset = g.heap_offset;
  h->heap_bytes = g.heap_bytes;
  h->incarnation = std::random_device{}() | (uint64_t{std::random_device{}()} << 32);
  h->max_value_bytes = options.max_value_bytes;
  h->shard_count = options.shard_count;
  h->server_id = options.server_id;
  h->header_checksum = kv::HeaderChecksum(*h);
  h->map_epoch = options.map_epoch;
  if (options.owned_shards.empty()) {
    h->owned_shards[0] = 1;  // standalone: the one shard
  } else {
    for (uint32_t s : options.owned_shards) h->owned_shards[s / 64] |= uint64_t{1} << (s % 64);
  }
  return std::unique_ptr<Store>(new Store(region, h, options));
}

Store::Store(uint8_t* region, const kv::RegionHeader* header, const StoreOptions& options)
    : region_(region),
      header_(header),
      heap_(region + header->heap_offset),
      options_(options),
      allocator_(header->heap_bytes / kUnit, options.grace) {}

ItemHeader* Store::ItemAt(uint32_t offset_units) const {
  return reinterpret_cast<ItemHeader*>(heap_ + uint64_t{offset_units} * kUnit);
}

uint64_t* Store::FindSlot(const Place& p, std::string_view key) const {
  for (uint64_t* w : p.slots) {
    for (size_t i = 0; i < kv::kSlotsPerBucket; ++i) {
      uint64_t word = w[i];  // only writers of this bucket change it, and we hold its lock
      if (word == 0) continue;
      kv::SlotFields s = kv::UnpackSlot(word);
      if (s.fingerprint != p.fingerprint) continue;
      const ItemHeader* it = ItemAt(s.offset_units);
      if (it->key_bytes != key.size()) continue;
      if (std::memcmp(reinterpret_cast<const uint8_t*>(it) + sizeof(ItemHeader), key.data(),
                      key.size()) == 0) {
        return &w[i];
      }
    }
  }
  return nullptr;
}

uint64_t* Store::FreeSlot(const Place& p) const {
  // The candidate with more empty slots (the first on a tie), its lowest empty slot.
  uint64_t* first[kv::kChoices] = {};
  size_t empty[kv::kChoices] = {};
  for (size_t c = 0; c < kv::kChoices; ++c) {
    for (size_t i = 0; i < kv::kSlotsPerBucket; ++i) {
      if (p.slots[c][i] != 0) continue;
      if (empty[c]++ == 0) first[c] = &p.slots[c][i];
    }
  }
  return empty[1] > empty[0] ? first[1] : first[0];
}

void Store::Restate(ItemHeader* it, uint32_t to) {
  // State first, then the checksum that covers it: a READ between the two stores sees a
  // mismatch and retries; after both, a READ sees a consistent item in the new state.
  uint64_t sum = kv::RestateChecksum(it->checksum, it->state, to);
  StoreWord32(&it->state, to);
  StoreWord(&it->checksum, sum);
}

Block Store::MarkDead(uint64_t slot_word) {
  kv::SlotFields s = kv::UnpackSlot(slot_word);
  ItemHeader* it = ItemAt(s.offset_units);
  Restate(it, kv::kStateDead);
  items_.fetch_sub(1, std::memory_order_relaxed);
  item_bytes_.fetch_sub(kv::ItemBytes(it->key_bytes, it->value_bytes), std::memory_order_relaxed);
  return Block{s.offset_units, it->units};
}

Result<uint64_t> Store::Write(Mode mode, std::string_view key, std::string_view value,
                              uint64_t expected, uint64_t* current_version,
                              kv::ItemLocation* where) {
  RDKV_RETURN_IF_ERROR(kv::CheckKey(key));
  if (value.size() > options_.max_value_bytes) {
    return Status::InvalidArgument("value of " + std::to_string(value.size()) +
                                   " bytes is larger than the maximum of " +
                                   std::to_string(options_.max_value_bytes));
  }
  size_t bytes = kv::ItemBytes(key.size(), value.size());
  uint32_t units = kv::UnitsFor(bytes);
  if (options_.update_in_place && mode != Mode::kInsert && mode != Mode::kRestore) {
    Result<uint64_t> result = Status::Internal("no write");
    if (TryUpdateInPlace(mode, key, value, units, expected, current_version, where, &result)) {
      return result;
    }
  }

  // A new item. Allocate before locking. A heap full only because of limbo (writes retire
  // blocks faster than their grace period ends) is back pressure, not a full heap: wait for
  // blocks to leave it, again while other writers take the ones that came out first, for up
  // to four grace periods.
  Allocator::Clock::duration retry_after{};
  Result<Block> block = allocator_.Allocate(units, &retry_after);
  if (!block.ok() && !t_no_wait) {
    const auto give_up = Allocator::Clock::now() + 4 * options_.grace;
    Allocator::WaitScope waiting(allocator_);
    bool held_sent = false;
    while (!block.ok() && retry_after > Allocator::Clock::duration::zero() &&
           retry_after <= options_.grace + std::chrono::milliseconds(10) &&
           Allocator::Clock::now() + retry_after <= give_up) {
      if (!held_sent) {
        ReplyBatch::SendHeldNow();  // answers this thread holds must not wait for the sleep
        held_sent = true;
      }
      std::this_thread::sleep_for(retry_after);
      retry_after = {};
      block = allocator_.Allocate(units, &retry_after);
    }
  }
  if (!block.ok()) return block.status();
  Block b = *block;

  // Write the complete item into the (unpublished) block.
  ItemHeader* it = ItemAt(b.offset_units);
  uint8_t* body = reinterpret_cast<uint8_t*>(it) + sizeof(ItemHeader);
  ItemHeader h{};
  // PENDING until its slot is stored: a client whose cached location points at this block
  // (it may have held the same key before) must not see the new value before the index does.
  h.state = kv::kStatePending;
  h.key_bytes = static_cast<uint32_t>(key.size());
  h.value_bytes = static_cast<uint32_t>(value.size());
  h.units = b.units;

  const Place place = PlaceOf(key);
  WindowLock lock(*this, place);
  uint64_t* slot = FindSlot(place, key);
  if (slot != nullptr) {
    const ItemHeader* cur = ItemAt(kv::UnpackSlot(*slot).offset_units);
    if (current_version) *current_version = cur->version;
    if (Status over = CheckOverwrite(mode, cur->version, expected); !over.ok()) {
      allocator_.Release(b);
      return over;
    }
  } else {
    if (mode == Mode::kCas) {
      allocator_.Release(b);
      return Status::NotFound("key not found");
    }
    slot = FreeSlot(place);
    if (slot == nullptr) {
      allocator_.Release(b);
      return Status::OutOfSpace(IndexFullMessage());
    }
  }
  Result<uint64_t> version = NewVersion(mode, expected);
  if (!version.ok()) {
    allocator_.Release(b);
    return version.status();
  }
  h.version = *version;
  std::memcpy(body, key.data(), key.size());
  if (!value.empty()) std::memcpy(body + key.size(), value.data(), value.size());
  h.checksum = kv::ItemChecksum(h, key, value);
  std::memcpy(it, &h, sizeof(h));

  // The old item dies before the slot moves on: once any reader can see the new value through
  // the slot, no reader can accept the old one (not even through a cached location).
  uint64_t old = LoadWord(slot);
  Block old_block{};
  if (old != 0) old_block = MarkDead(old);
  // Publish: the item's bytes happen-before the slot store (release).
  StoreWord(slot, kv::PackSlot({place.fingerprint, static_cast<uint16_t>(units), b.offset_units}));
  items_.fetch_add(1, std::memory_order_relaxed);
  item_bytes_.fetch_add(bytes, std::memory_order_relaxed);
  // Now current: LIVE. Between the slot store and this, readers see PENDING and retry.
  Restate(it, kv::kStateLive);
  // The grace period starts once no slot points at the old block.
  if (old != 0) allocator_.Retire(old_block);
  if (where != nullptr) {
    *where = LocationOf(place, slot, b.offset_units, units);
  }
  return h.version;
}

bool Store::HasRoomFor(size_t key_bytes, size_t value_bytes) {
  // Far more blocks than the other receiving threads and the workers can take between this
  // check and the write's allocation.
  constexpr uint64_t kSpareBlocks = 64;
  const size_t bytes = kv::ItemBytes(key_bytes, value_bytes);
  if (bytes > size_t{kv::kMaxItemUnits} * kUnit) return false;
  return allocator_.HasRoomNow(kv::UnitsFor(bytes), kSpareBlocks);
}

kv::ItemLocation Store::LocationOf(const Place& place, const uint64_t* slot, uint32_t offset_units,
                                   uint32_t units) {
  const bool second = place.slots[1] != place.slots[0] && slot >= place.slots[1] &&
                      slot < place.slots[1] + kv::kSlotsPerBucket;
  return kv::ItemLocation{offset_units, static_cast<uint16_t>(units),
                          static_cast<uint8_t>(second ? 1 : 0)};
}

Status Store::CheckOverwrite(Mode mode, uint64_t have, uint64_t expected) {
  if (mode == Mode::kInsert || mode == Mode::kRestore) {
    return Status::AlreadyExists("key exists (version " + std::to_string(have) + ")");
  }
  if (mode == Mode::kApply && have >= expected) {
    return Status::AlreadyExists("the key has version " + std::to_string(have) +
                                 ", not older than " + std::to_string(expected));
  }
  if (mode == Mode::kCas && have != expected) {
    return Status::VersionMismatch("current version is " + std::to_string(have) + ", not " +
                                   std::to_string(expected));
  }
  return Status::Ok();
}

Result<uint64_t> Store::NewVersion(Mode mode, uint64_t expected) {
  const uint64_t v = mode == Mode::kRestore || mode == Mode::kApply
                         ? expected
                         : version_counter_.fetch_add(1, std::memory_order_relaxed) + 1;
  if (v > kv::kMaxItemVersion) {
    // Never wraps: the counter stays far below 2^64 (EnsureVersionAbove clamps, Restore refuses).
    return Status::OutOfSpace("the version counter reached its maximum " +
                              std::to_string(kv::kMaxItemVersion) +
                              ": this server cannot version more writes; reload its data into "
                              "a new cluster member");
  }
  return v;
}

bool Store::TryUpdateInPlace(Mode mode, std::string_view key, std::string_view value,
                             uint32_t units, uint64_t expected, uint64_t* current_version,
                             kv::ItemLocation* where, Result<uint64_t>* result) {
  const Place place = PlaceOf(key);
  WindowLock lock(*this, place);
  uint64_t* slot = FindSlot(place, key);
  if (slot == nullptr) return false;  // an insert: a new item and a free slot
  const kv::SlotFields s = kv::UnpackSlot(LoadWord(slot));
  ItemHeader* it = ItemAt(s.offset_units);
  if (current_version) *current_version = it->version;
  if (Status over = CheckOverwrite(mode, it->version, expected); !over.ok()) {
    *result = over;
    return true;
  }
  // The slot's length (what READs fetch, and what cached locations hold) must not change, and
  // the item must be small: a READ overlapping a rewrite is torn and retried, and a large
  // value rewritten back to back could tear every attempt (its copy takes longer than the gap
  // between writes), where a new item leaves readers an intact DEAD one to accept.
  if (s.units != units || uint64_t{units} * kUnit > kv::kInPlaceMaxItemBytes) return false;
  if (it->state != kv::kStateLive) return false;  // (always LIVE under the lock; never assume)
  Result<uint64_t> version = NewVersion(mode, expected);
  if (!version.ok()) {
    *result = version.status();
    return true;
  }
  // The new contents, LIVE, and their checksum; the item stays where it is (same length in
  // units, same key, so the slot word does not change; its block keeps its allocated units).
  ItemHeader h{};
  h.state = kv::kStateLive;
  h.key_bytes = it->key_bytes;
  h.value_bytes = static_cast<uint32_t>(value.size());
  h.units = it->units;
  h.version = *version;
  h.checksum = kv::ItemChecksum(h, key, value);
  const uint64_t old_bytes = kv::ItemBytes(it->key_bytes, it->value_bytes);
  // Value, then lengths and version, then the checksum last: a READ that overlaps any of it
  // fails the checksum (docs/design.md "In-place updates"); one after the checksum store
  // reads the new version whole.
  uint8_t* body = reinterpret_cast<uint8_t*>(it) + sizeof(ItemHeader);
  if (!value.empty()) std::memcpy(body + key.size(), value.data(), value.size());
  StoreWord32(&it->value_bytes, h.value_bytes);
  StoreWord(&it->version, h.version);
  StoreWord(&it->checksum, h.checksum);
  item_bytes_.fetch_add(kv::ItemBytes(key.size(), value.size()) - old_bytes,
                        std::memory_order_relaxed);
  in_place_updates_.fetch_add(1, std::memory_order_relaxed);
  if (where != nullptr) {
    *where = LocationOf(place, slot, s.offset_units, s.units);
  }
  *result = h.version;
  return true;
}

Result<uint64_t> Store::Put(std::string_view key, std::string_view value, kv::ItemLocation* where) {
  return Write(Mode::kUpsert, key, value, 0, nullptr, where);
}

Result<uint64_t> Store::Insert(std::string_view key, std::string_view value,
                               uint64_t* current_version, kv::ItemLocation* where) {
  return Write(Mode::kInsert, key, value, 0, current_version, where);
}

Result<uint64_t> Store::Cas(std::string_view key, uint64_t expected, std::string_view value,
                            uint64_t* current_version, kv::ItemLocation* where) {
  return Write(Mode::kCas, key, value, expected, current_version, where);
}

Status Store::Restore(std::string_view key, std::string_view value, uint64_t version) {
  RDKV_RETURN_IF_ERROR(kv::CheckItemVersion(version, "restored version"));
  Result<uint64_t> r = Write(Mode::kRestore, key, value, version, nullptr);
  return r.ok() ? Status::Ok() : r.status();
}

Status Store::Lookup(std::string_view key, uint64_t* version) const {
  RDKV_RETURN_IF_ERROR(kv::CheckKey(key));
  const Place place = PlaceOf(key);
  WindowLock lock(*this, place);
  uint64_t* slot = FindSlot(place, key);
  if (slot == nullptr) return Status::NotFound("key not found");
  *version = ItemAt(kv::UnpackSlot(*slot).offset_units)->version;
  return Status::Ok();
}

Status Store::ApplyVersioned(std::string_view key, std::string_view value, uint64_t version,
                             bool* applied, uint64_t* current, kv::ItemLocation* where) {
  *applied = false;
  if (version == 0) return Status::InvalidArgument("version 0 is not a stored version");
  EnsureVersionAbove(version);
  Result<uint64_t> r = Write(Mode::kApply, key, value, version, current, where);
  if (r.status().Is(StatusCode::kAlreadyExists)) return Status::Ok();  // as new or newer
  if (!r.ok()) return r.status();
  *applied = true;
  return Status::Ok();
}

Status Store::DeleteVersioned(std::string_view key, uint64_t version, bool* applied,
                              uint64_t* current) {
  *applied = false;
  if (current != nullptr) *current = 0;
  RDKV_RETURN_IF_ERROR(kv::CheckKey(key));
  EnsureVersionAbove(version);
  const Place place = PlaceOf(key);
  WindowLock lock(*this, place);
  uint64_t* slot = FindSlot(place, key);
  if (slot == nullptr) return Status::Ok();
  const uint64_t have = ItemAt(kv::UnpackSlot(*slot).offset_units)->version;
  if (have >= version) {
    if (current != nullptr) *current = have;
    return Status::Ok();
  }
  Block old_block = MarkDead(LoadWord(slot));
  StoreWord(slot, 0);
  allocator_.Retire(old_block);
  *applied = true;
  return Status::Ok();
}

Status Store::Delete(std::string_view key) {
  RDKV_RETURN_IF_ERROR(kv::CheckKey(key));
  const Place place = PlaceOf(key);
  WindowLock lock(*this, place);
  uint64_t* slot = FindSlot(place, key);
  if (slot == nullptr) return Status::NotFound("key not found");
  // Dead first, then unlinked (see Write), then the grace period.
  Block old_block = MarkDead(LoadWord(slot));
  StoreWord(slot, 0);
  allocator_.Retire(old_block);
  return Status::Ok();
}

Result<std::string> Store::Get(std::string_view key, uint64_t* version) const {
  const Place place = PlaceOf(key);
  WindowLock lock(*this, place);
  uint64_t* slot = FindSlot(place, key);
  if (slot == nullptr) return Status::NotFound("key not found");
  const ItemHeader* it = ItemAt(kv::UnpackSlot(*slot).offset_units);
  if (version) *version = it->version;
  const char* v = reinterpret_cast<const char*>(it) + sizeof(ItemHeader) + it->key_bytes;
  return std::string(v, it->value_bytes);
}

uint32_t Store::ShardOfKey(std::string_view key) const {
  return kv::ShardOf(kv::KeyHash(key), header_->shard_count);
}

bool Store::Owns(uint32_t shard) const {
  auto* h = const_cast<kv::RegionHeader*>(header_);
  uint64_t w =
      std::atomic_ref<uint64_t>(h->owned_shards[shard / 64]).load(std::memory_order_acquire);
  return (w >> (shard % 64)) & 1;
}

void Store::SetOwned(uint32_t shard, bool owned) {
  auto* h = const_cast<kv::RegionHeader*>(header_);
  std::atomic_ref<uint64_t> w(h->owned_shards[shard / 64]);
  uint64_t bit = uint64_t{1} << (shard % 64);
  if (owned) {
    w.fetch_or(bit, std::memory_order_acq_rel);
  } else {
    w.fetch_and(~bit, std::memory_order_acq_rel);
  }
}

void Store::SetMapEpoch(uint64_t epoch) {
  auto* h = const_cast<kv::RegionHeader*>(header_);
  StoreWord(&h->map_epoch, epoch);
}

uint64_t Store::map_epoch() const {
  auto* h = const_cast<kv::RegionHeader*>(header_);
  return LoadWord(&h->map_epoch);
}

uint64_t Store::ScanShard(uint32_t shard, uint64_t cursor,
                          const std::function<bool(const ScanItem&)>& visit) const {
  const uint64_t slots = header_->bucket_count * kv::kSlotsPerBucket;
  uint64_t* base = reinterpret_cast<uint64_t*>(region_ + header_->index_offset);
  while (cursor < slots) {
    uint64_t bucket = cursor / kv::kSlotsPerBucket;
    // Every writer that touches this bucket holds its stripe.
    MutexLock lock(&stripes_[bucket % kStripes]);
    for (; cursor < (bucket + 1) * kv::kSlotsPerBucket; ++cursor) {
      uint64_t word = base[cursor];
      if (word == 0) continue;
      const ItemHeader* it = ItemAt(kv::UnpackSlot(word).offset_units);
      const char* k = reinterpret_cast<const char*>(it) + sizeof(ItemHeader);
      std::string_view key(k, it->key_bytes);
      if (ShardOfKey(key) != shard) continue;
      if (!visit({key, std::string_view(k + it->key_bytes, it->value_bytes), it->version})) {
        return cursor;  // the next scan resumes with this item
      }
    }
  }
  return kScanComplete;
}

void Store::EnsureVersionAbove(uint64_t v) {
  v = std::min(v, kv::kMaxItemVersion);  // at the maximum, writes are refused (Write)
  uint64_t cur = version_counter_.load();
  while (cur < v && !version_counter_.compare_exchange_weak(cur, v)) {
  }
}

std::string Store::IndexFullMessage() const {
  const uint64_t slots = header_->bucket_count * kv::kSlotsPerBucket;
  const uint64_t used = items_.load(std::memory_order_relaxed);
  char pct[16];
  std::snprintf(pct, sizeof(pct), "%.1f", slots == 0 ? 0.0 : 100.0 * double(used) / double(slots));
  return "both of the key's index buckets (2 x " + std::to_string(kv::kSlotsPerBucket) +
         " slots) are full (" + std::to_string(used) + " of " + std::to_string(slots) +
         " index slots, " + pct +
         "%, in use): give the index a larger share of the region (--index_fraction) or more "
         "memory";
}

StoreCounters Store::counters() const {
  return {items_.load(std::memory_order_relaxed), item_bytes_.load(std::memory_order_relaxed),
          in_place_updates_.load(std::memory_order_relaxed)};
}

}  // namespace rdkv::server

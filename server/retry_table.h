// The answers of recently applied writes by request id, so that a retried write gets its first
// answer instead of applying twice (docs/design.md "Replication", exactly once).
//
// A write's request id is (client_id, request_seq), chosen by the client library. The primary
// records an id once the write is applied; its backups record it when they apply the forwarded
// write, so a retry that reaches a promoted backup is recognised too. Ids are kept for
// `retention` and at most `capacity` of them; the oldest go first. In memory only: a retry
// after every replica of a shard restarted is not recognised.
//
// Layout (docs/design.md "The retry table"): 64 stripes, each a ring of entries in the
// order they were recorded (the oldest is the next to go) and an open-addressing index (linear
// probing, 4-byte slots naming a ring position) of the power of two at or above twice the ring:
// 40 bytes of ring and 8 to 16 of index per id kept. A stripe's ring starts at kFirstRing
// entries and doubles when full (its index built again) up to its share of the capacity; then
// a record drops the oldest. Nothing is allocated per write once a stripe has grown.
//
// Thread-safety: all methods are thread-safe (striped locks).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "common/util/mutex.h"
#include "rdkv/status.h"

namespace rdkv::server {

class RetryTable {
 public:
  struct Answer {
    StatusCode code = StatusCode::kOk;
    uint64_t version = 0;
  };
  using Clock = std::chrono::steady_clock;

  static constexpr size_t kDefaultStripes = 64;
  static constexpr size_t kMaxStripes = size_t{1} << 15;  // a ScanShard cursor's stripe bits
  // `capacity`: ids kept at most, over all stripes (at least one per stripe); each stripe
  // keeps capacity / stripes and drops its own oldest (tests use one stripe: one FIFO).
  explicit RetryTable(size_t capacity = 1 << 20,
                      std::chrono::milliseconds retention = std::chrono::seconds(120),
                      size_t stripes = kDefaultStripes);
  ~RetryTable();
  RetryTable(const RetryTable&) = delete;
  RetryTable& operator=(const RetryTable&) = delete;

  // The recorded answer of (client_id, seq), if it is still kept. client_id 0: never.
  std::optional<Answer> Find(uint64_t client_id, uint64_t seq) const;
  // Records the answer of an applied write of a key in `shard` (client_id 0: ignored). A second
  // record of one id keeps the answer with the higher version (a backup sees a write again with
  // a newer version when its primary forwarded it again above a newer one, or repaired it so);
  // the id keeps its place in the order and its first shard.
  void Record(uint32_t shard, uint64_t client_id, uint64_t seq, Answer answer);

  // One id kept for a shard (ScanShard).
  struct Kept {
    uint64_t client_id = 0;
    uint64_t seq = 0;
    uint64_t version = 0;
  };
  // The end of a scan (ScanShard's answer when no id is left to visit).
  static constexpr uint64_t kScanEnd = UINT64_MAX;
  // Appends to *out up to `max` (>= 1) ids of `shard` whose answer is kOk and that are still kept,
  // from `cursor` (0 to start; then the previous call's answer) and returns the cursor to go
  // on from, kScanEnd at the end. Each call visits at most kMaxScanVisits entries (each
  // stripe's lock is held for its part only) and always advances the cursor. A cursor names a
  // stripe (bits 48..63) and an ordinal within the stripe's records (bits 0..47): entries
  // recorded or dropped between calls move no other entry's ordinal, so a whole scan returns
  // every id of the shard that was kept from its start to its end (and perhaps others).
  uint64_t ScanShard(uint32_t shard, uint64_t cursor, size_t max, std::vector<Kept>* out) const;
  static constexpr size_t kMaxScanVisits = 1 << 16;

  // Forgets every id of `shard` (Find and ScanShard no longer see them; a later Record of one
  // is a new answer, which keeps the forgotten entry's place in the order: under capacity
  // pressure it goes sooner than its time says). For a server that drops its copy of a shard:
  // an id it kept could be of a write that never took effect in the history a later copy
  // brings it. Forgotten entries count in size() until they are dropped. Returns how many.
  size_t ForgetShard(uint32_t shard);
  // The shard an entry ForgetShard took has (never a real shard: kv::kMaxShards is far below).
  static constexpr uint32_t kForgotten = UINT32_MAX;

  size_t size() const;
  uint64_t hits() const { return hits_.load(std::memory_order_relaxed); }

 private:
  struct Entry {
    uint64_t client_id;
    uint64_t seq;
    uint64_t version;
    int64_t at_ns;  // when it was recorded (steady clock)
    StatusCode code;
    uint32_t shard;  // in what would be padding; kForgotten: ForgetShard took it
  };
  static_assert(sizeof(Entry) == 40, "docs/design.md counts a 40-byte ring entry");
  static constexpr uint32_t kEmpty = 0;  // an index slot naming no entry (else position + 1)

  struct Stripe {
    mutable Mutex mu;
    Entry* ring GUARDED_BY(mu) = nullptr;      // `capacity` entries (malloc)
    uint32_t* index GUARDED_BY(mu) = nullptr;  // `mask` + 1 slots (calloc: all kEmpty)
    size_t capacity GUARDED_BY(mu) = 0;        // 0 until the first record
    size_t mask GUARDED_BY(mu) = 0;            // index slots - 1 (a power of two - 1)
    size_t head GUARDED_BY(mu) = 0;            // ring position of the oldest entry
    size_t count GUARDED_BY(mu) = 0;           // entries kept
    // Entries ever appended to the ring: the newest entry's ordinal + 1 (ScanShard's cursors).
    uint64_t recorded GUARDED_BY(mu) = 0;
  };

  static size_t HashOf(uint64_t client_id, uint64_t seq);
  Stripe& StripeOf(size_t hash) const { return stripes_[hash % stripe_count_]; }
  // The index slot naming (client_id, seq), or the empty slot where it would go.
  size_t SlotOf(const Stripe& s, size_t hash, uint64_t client_id, uint64_t seq) const
      REQUIRES(s.mu);
  // Drops the oldest entry: out of the index (backward-shift deletion), then off the ring.
  void DropOldest(Stripe& s) const REQUIRES(s.mu);
  void Expire(Stripe& s, int64_t now_ns) const REQUIRES(s.mu);
  // Doubles the stripe's ring (its first: kFirstRing), up to ring_size_, keeping every entry.
  void Grow(Stripe& s) const REQUIRES(s.mu);
  static constexpr size_t kFirstRing = 64;
  static int64_t NowNs();

  const size_t stripe_count_;
  const size_t ring_size_;  // entries per stripe at most
  const int64_t retention_ns_;
  const std::unique_ptr<Stripe[]> stripes_;
  mutable std::atomic<uint64_t> hits_{0};
};

}  // namespace rdkv::server

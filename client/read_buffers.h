// Registered destination memory for one-sided READs, pooled so that the GET fast path
// allocates nothing.
//
// A ReadScratch is what one thread needs for one GET or one MultiGet batch: a registered
// block holding `bucket_capacity` index bucket images (kv::kBucketBytes each; a key's index
// READ fills two) followed by `item_capacity` bytes for items, and `op_capacity` ReadOps. It is
// borrowed from the ScratchPool for the duration of one call (about one per concurrently calling
// thread) and given back after.
//
// Thread-safety: ScratchPool is thread-safe. A ReadScratch is used by one thread at a time.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/kv/layout.h"
#include "common/transport/transport.h"
#include "common/util/mutex.h"
#include "rdkv/client.h"
#include "rdkv/status.h"

namespace rdkv::client {

struct ReadScratch {
  std::unique_ptr<transport::MemoryRegion> region;
  uint8_t* buckets = nullptr;  // bucket_capacity * kv::kBucketBytes
  size_t bucket_capacity = 0;
  uint8_t* items = nullptr;  // item_capacity bytes, kv::kUnit aligned
  size_t item_capacity = 0;
  std::unique_ptr<transport::ReadOp[]> ops;
  size_t op_capacity = 0;
  std::vector<transport::ReadOp*> batch;  // reserved to op_capacity: pointers posted together
  std::vector<uint64_t> tags;             // reserved to op_capacity: what each op in batch is for

  uint32_t lkey() const { return region->lkey(); }
  // True when no op is still owned by the transport (after a timed-out wait some may be).
  bool Idle() const;
};

struct ScratchShape {
  size_t bucket_capacity = kv::kChoices;
  size_t item_capacity = 0;
  size_t op_capacity = 1;
};

// Candidate slots of one key: both of its index buckets.
inline constexpr size_t kMaxCandidates = kv::kCandidateSlots;
static_assert(kMaxCandidates <= 255, "candidate numbers travel in 8 bits (ReadTag, KeyJob)");

// READs one batch needs room for at least: a key's two bucket READs and an ownership READ.
inline constexpr size_t kMinBatchReads = kv::kChoices + 1;

// READs one GET batch posts at most: max_batch_reads, never above max_outstanding_reads, but
// at least kMinBatchReads (a key's bucket READs always go together; the client refuses a
// max_outstanding_reads below kMinBatchReads).
inline size_t BatchLimit(const ClientOptions& o) {
  return std::max<size_t>(kMinBatchReads, std::min(o.max_batch_reads, o.max_outstanding_reads));
}

// The scratch a GET batch of up to `batch_limit` READs needs from a server whose values are at
// most `max_value_bytes`: a window per READ, room for the largest item (and 64 KiB more), ops
// for a batch or for one key's candidates and its ownership READ.
ScratchShape ScratchShapeFor(size_t batch_limit, uint64_t max_value_bytes);

class ScratchPool {
 public:
  explicit ScratchPool(transport::Fabric* fabric) : fabric_(fabric) {}
  ~ScratchPool();
  ScratchPool(const ScratchPool&) = delete;
  ScratchPool& operator=(const ScratchPool&) = delete;

  // The shape new scratches get. Scratches of another shape are dropped when given back
  // (a reconnect to a server with larger items).
  void SetShape(const ScratchShape& shape);
  // Raises each capacity of the shape to at least `shape`'s (never lowers one), atomically per
  // capacity: links of several servers connecting at once leave the largest of their shapes.
  void GrowShape(const ScratchShape& shape);
  ScratchShape shape() const;

  // A free scratch of the current shape, or a newly registered one (control path: the first
  // call of each concurrently calling thread). kIoError / fabric errors when registration fails.
  // The calling thread's last released scratch comes back without a lock (one atomic exchange);
  // failing that, one from the shards or another thread's place; only then a new one.
  Result<std::unique_ptr<ReadScratch>> Acquire();
  // Gives a scratch back: to the calling thread's own place when that is empty, else to a
  // shard. Precondition: scratch->Idle().
  void Release(std::unique_ptr<ReadScratch> scratch);

  // Registers a one-off scratch of an explicit shape (slow path for unusually large items).
  Result<std::unique_ptr<ReadScratch>> AllocateUnpooled(const ScratchShape& shape);

 private:
  static constexpr size_t kShards = 8;
  struct alignas(64) Shard {
    Mutex mu;
    std::vector<std::unique_ptr<ReadScratch>> free GUARDED_BY(mu);
  };
  size_t MyShard() const;
  // One scratch per thread place, taken and given back by atomic exchange: the GET fast path
  // of a thread that calls again takes the scratch it gave back last, with no lock. Threads
  // beyond kThreadPlaces share places (an exchange that finds its place taken goes to a
  // shard). Owns what it points to.
  static constexpr size_t kThreadPlaces = 64;
  struct alignas(64) ThreadPlace {
    std::atomic<ReadScratch*> scratch{nullptr};
  };
  static size_t MyPlace();
  // What `place` held, taken out; null when it was empty or held an old shape (dropped).
  std::unique_ptr<ReadScratch> TakeFitting(ThreadPlace& place);

  // True when `s` is at least the current shape.
  bool Fits(const ReadScratch& s) const;

  transport::Fabric* fabric_;
  // The current shape, read on every Acquire and Release without a lock: a shape set while a
  // call runs may or may not be seen by it, as with a lock (the callers check the capacities
  // of what they get against what they need).
  std::atomic<size_t> bucket_capacity_{ScratchShape{}.bucket_capacity};
  std::atomic<size_t> item_capacity_{ScratchShape{}.item_capacity};
  std::atomic<size_t> op_capacity_{ScratchShape{}.op_capacity};
  Shard shards_[kShards];
  ThreadPlace places_[kThreadPlaces];
};

// Returns a scratch to its pool when it goes out of scope.
class ScratchLease {
 public:
  ScratchLease(ScratchPool* pool, std::unique_ptr<ReadScratch> s) : pool_(pool), s_(std::move(s)) {}
  ~ScratchLease() {
    if (s_ != nullptr && pool_ != nullptr) pool_->Release(std::move(s_));
  }
  ScratchLease(const ScratchLease&) = delete;
  ScratchLease& operator=(const ScratchLease&) = delete;
  ReadScratch* operator->() const { return s_.get(); }
  ReadScratch& operator*() const { return *s_; }
  ReadScratch* get() const { return s_.get(); }
  // Takes the scratch away from the lease (e.g. to quarantine it while READs are in flight).
  std::unique_ptr<ReadScratch> Take() { return std::move(s_); }

 private:
  ScratchPool* pool_;
  std::unique_ptr<ReadScratch> s_;
};

}  // namespace rdkv::client

#include "client/read_buffers.h"

#include <algorithm>
#include <functional>
#include <thread>

#include "common/kv/layout.h"

namespace rdkv::client {

namespace {
size_t RoundUp(size_t v, size_t to) { return (v + to - 1) / to * to; }
}  // namespace

ScratchShape ScratchShapeFor(size_t batch_limit, uint64_t max_value_bytes) {
  ScratchShape shape;
  // Bucket image offsets travel in 24 bits of a READ's tag.
  shape.bucket_capacity =
      std::min<size_t>(std::max<size_t>(batch_limit, kv::kChoices), (1u << 24) / kv::kBucketBytes);
  size_t max_item = kv::UnitsFor(kv::ItemBytes(kv::kMaxKeyBytes, max_value_bytes)) * kv::kUnit;
  shape.item_capacity = max_item + (64u << 10);
  shape.op_capacity = std::max<size_t>(batch_limit, kMaxCandidates + 1);
  return shape;
}

bool ReadScratch::Idle() const {
  for (size_t i = 0; i < op_capacity; ++i) {
    if (!ops[i].done()) return false;
  }
  return true;
}

void ScratchPool::SetShape(const ScratchShape& shape) {
  bucket_capacity_.store(shape.bucket_capacity, std::memory_order_relaxed);
  item_capacity_.store(shape.item_capacity, std::memory_order_relaxed);
  op_capacity_.store(shape.op_capacity, std::memory_order_relaxed);
}

namespace {
void RaiseTo(std::atomic<size_t>& a, size_t v) {
  size_t cur = a.load(std::memory_order_relaxed);
  while (cur < v && !a.compare_exchange_weak(cur, v, std::memory_order_relaxed)) {
  }
}
}  // namespace

void ScratchPool::GrowShape(const ScratchShape& shape) {
  RaiseTo(bucket_capacity_, shape.bucket_capacity);
  RaiseTo(item_capacity_, shape.item_capacity);
  RaiseTo(op_capacity_, shape.op_capacity);
}

ScratchShape ScratchPool::shape() const {
  ScratchShape s;
  s.bucket_capacity = bucket_capacity_.load(std::memory_order_relaxed);
  s.item_capacity = item_capacity_.load(std::memory_order_relaxed);
  s.op_capacity = op_capacity_.load(std::memory_order_relaxed);
  return s;
}

bool ScratchPool::Fits(const ReadScratch& s) const {
  return s.bucket_capacity >= bucket_capacity_.load(std::memory_order_relaxed) &&
         s.item_capacity >= item_capacity_.load(std::memory_order_relaxed) &&
         s.op_capacity >= op_capacity_.load(std::memory_order_relaxed);
}

size_t ScratchPool::MyShard() const {
  thread_local const size_t shard = std::hash<std::thread::id>{}(std::this_thread::get_id());
  return shard % kShards;
}

ScratchPool::~ScratchPool() {
  for (ThreadPlace& p : places_) delete p.scratch.exchange(nullptr, std::memory_order_acquire);
}

size_t ScratchPool::MyPlace() {
  static std::atomic<size_t> next{0};
  thread_local const size_t place = next.fetch_add(1, std::memory_order_relaxed) % kThreadPlaces;
  return place;
}

std::unique_ptr<ReadScratch> ScratchPool::TakeFitting(ThreadPlace& place) {
  std::unique_ptr<ReadScratch> s(place.scratch.exchange(nullptr, std::memory_order_acquire));
  if (s != nullptr && !Fits(*s)) s.reset();
  return s;
}

Result<std::unique_ptr<ReadScratch>> ScratchPool::Acquire() {
  // An old shape found anywhere is dropped (deregisters its memory) and the search goes on.
  if (std::unique_ptr<ReadScratch> s = TakeFitting(places_[MyPlace()])) return s;
  size_t first = MyShard();
  for (size_t i = 0; i < kShards; ++i) {
    Shard& sh = shards_[(first + i) % kShards];
    MutexLock l(&sh.mu);
    while (!sh.free.empty()) {
      std::unique_ptr<ReadScratch> s = std::move(sh.free.back());
      sh.free.pop_back();
      if (Fits(*s)) return s;
      // An old shape: drop it (deregisters its memory).
    }
  }
  // Another thread's place: a client whose calls move between threads (a thread pool) keeps
  // as many scratches as calls run at once, not one per thread that ever called.
  for (ThreadPlace& p : places_) {
    if (p.scratch.load(std::memory_order_relaxed) == nullptr) continue;
    if (std::unique_ptr<ReadScratch> s = TakeFitting(p)) return s;
  }
  return AllocateUnpooled(shape());
}

void ScratchPool::Release(std::unique_ptr<ReadScratch> s) {
  if (!Fits(*s)) return;  // stale shape
  ReadScratch* empty = nullptr;
  if (places_[MyPlace()].scratch.compare_exchange_strong(empty, s.get(), std::memory_order_release,
                                                         std::memory_order_relaxed)) {
    s.release();  // owned by the place now
    return;
  }
  Shard& sh = shards_[MyShard()];
  MutexLock l(&sh.mu);
  sh.free.push_back(std::move(s));
}

Result<std::unique_ptr<ReadScratch>> ScratchPool::AllocateUnpooled(const ScratchShape& shape) {
  auto s = std::make_unique<ReadScratch>();
  s->bucket_capacity = std::max<size_t>(shape.bucket_capacity, kv::kChoices);
  s->item_capacity = RoundUp(std::max<size_t>(shape.item_capacity, kv::kUnit), kv::kUnit);
  s->op_capacity = std::max<size_t>(shape.op_capacity, kMinBatchReads);
  size_t bucket_bytes = RoundUp(s->bucket_capacity * kv::kBucketBytes, kv::kUnit);
  RDKV_ASSIGN_OR_RETURN(s->region, fabric_->AllocateRegion(bucket_bytes + s->item_capacity,
                                                           transport::RegionAccess::kLocal));
  s->buckets = s->region->data();
  s->items = s->region->data() + bucket_bytes;
  s->ops = std::make_unique<transport::ReadOp[]>(s->op_capacity);
  for (size_t i = 0; i < s->op_capacity; ++i) {
    s->ops[i].status.store(transport::ReadStatus::kOk, std::memory_order_relaxed);  // idle
  }
  s->batch.reserve(s->op_capacity);
  s->tags.reserve(s->op_capacity);
  return s;
}

}  // namespace rdkv::client

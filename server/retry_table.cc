#include "server/retry_table.h"

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <new>

namespace rdkv::server {

namespace {
size_t IndexSlotsFor(size_t ring_size) { return std::bit_ceil(2 * ring_size); }
}  // namespace

RetryTable::RetryTable(size_t capacity, std::chrono::milliseconds retention, size_t stripes)
    : stripe_count_(std::clamp<size_t>(stripes, 1, kMaxStripes)),
      ring_size_(std::max<size_t>(1, capacity / stripe_count_)),
      retention_ns_(std::chrono::duration_cast<std::chrono::nanoseconds>(retention).count()),
      stripes_(new Stripe[stripe_count_]) {
  // The index names ring positions + 1 in 32 bits.
  if (ring_size_ >= (size_t{1} << 31)) throw std::bad_alloc();
}

RetryTable::~RetryTable() {
  for (size_t i = 0; i < stripe_count_; ++i) {
    Stripe& s = stripes_[i];
    MutexLock lock(&s.mu);
    std::free(s.ring);
    std::free(s.index);
  }
}

int64_t RetryTable::NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

size_t RetryTable::HashOf(uint64_t client_id, uint64_t seq) {
  // Both words mixed (a multiply-xorshift), so that one client's consecutive seqs spread over
  // the stripes and the index alike.
  uint64_t h = client_id * 0x9e3779b97f4a7c15ULL ^ seq;
  h ^= h >> 32;
  h *= 0xd6e8feb86659fd93ULL;
  h ^= h >> 32;
  return static_cast<size_t>(h);
}

size_t RetryTable::SlotOf(const Stripe& s, size_t hash, uint64_t client_id, uint64_t seq) const {
  // The stripe took hash % stripe_count_; the index uses what is above it.
  for (size_t slot = (hash / stripe_count_) & s.mask;; slot = (slot + 1) & s.mask) {
    const uint32_t v = s.index[slot];
    if (v == kEmpty) return slot;
    const Entry& e = s.ring[v - 1];
    if (e.client_id == client_id && e.seq == seq) return slot;
  }
}

void RetryTable::DropOldest(Stripe& s) const {
  const Entry& oldest = s.ring[s.head];
  size_t hole = SlotOf(s, HashOf(oldest.client_id, oldest.seq), oldest.client_id, oldest.seq);
  // Backward-shift deletion: entries after the hole in its probe run move back into it when
  // their home slot is not in (hole, slot] (cyclically), so that every lookup still finds them.
  for (size_t slot = (hole + 1) & s.mask; s.index[slot] != kEmpty; slot = (slot + 1) & s.mask) {
    const Entry& e = s.ring[s.index[slot] - 1];
    const size_t home = (HashOf(e.client_id, e.seq) / stripe_count_) & s.mask;
    const bool stays = hole < slot ? (home > hole && home <= slot) : (home > hole || home <= slot);
    if (stays) continue;
    s.index[hole] = s.index[slot];
    hole = slot;
  }
  s.index[hole] = kEmpty;
  s.head = (s.head + 1) % s.capacity;
  --s.count;
}

void RetryTable::Grow(Stripe& s) const {
  const size_t capacity =
      s.capacity == 0 ? std::min(ring_size_, kFirstRing) : std::min(ring_size_, 2 * s.capacity);
  const size_t slots = IndexSlotsFor(capacity);
  auto* ring = static_cast<Entry*>(std::malloc(capacity * sizeof(Entry)));
  auto* index = static_cast<uint32_t*>(std::calloc(slots, sizeof(uint32_t)));
  if (ring == nullptr || index == nullptr) {
    std::free(ring);
    std::free(index);
    throw std::bad_alloc();
  }
  // The entries keep their order, oldest at position 0; the index is built again.
  for (size_t i = 0; i < s.count; ++i) ring[i] = s.ring[(s.head + i) % s.capacity];
  std::free(s.ring);
  std::free(s.index);
  s.ring = ring;
  s.index = index;
  s.capacity = capacity;
  s.mask = slots - 1;
  s.head = 0;
  for (size_t i = 0; i < s.count; ++i) {
    const Entry& e = ring[i];
    s.index[SlotOf(s, HashOf(e.client_id, e.seq), e.client_id, e.seq)] =
        static_cast<uint32_t>(i + 1);
  }
}

void RetryTable::Expire(Stripe& s, int64_t now_ns) const {
  while (s.count > 0 && now_ns - s.ring[s.head].at_ns > retention_ns_) DropOldest(s);
}

std::optional<RetryTable::Answer> RetryTable::Find(uint64_t client_id, uint64_t seq) const {
  if (client_id == 0) return std::nullopt;
  const size_t hash = HashOf(client_id, seq);
  Stripe& s = StripeOf(hash);
  MutexLock lock(&s.mu);
  if (s.count == 0) return std::nullopt;
  const uint32_t v = s.index[SlotOf(s, hash, client_id, seq)];
  if (v == kEmpty) return std::nullopt;
  const Entry& e = s.ring[v - 1];
  if (e.shard == kForgotten || NowNs() - e.at_ns > retention_ns_) return std::nullopt;
  hits_.fetch_add(1, std::memory_order_relaxed);
  return Answer{e.code, e.version};
}

void RetryTable::Record(uint32_t shard, uint64_t client_id, uint64_t seq, Answer answer) {
  if (client_id == 0) return;
  const size_t hash = HashOf(client_id, seq);
  Stripe& s = StripeOf(hash);
  const int64_t now = NowNs();
  MutexLock lock(&s.mu);
  if (s.capacity == 0) Grow(s);
  Expire(s, now);
  if (const uint32_t at = s.index[SlotOf(s, hash, client_id, seq)]; at != kEmpty) {
    Entry& e = s.ring[at - 1];
    if (e.shard == kForgotten) {
      // Forgotten: this record is the id's first answer again (it keeps its place in the ring).
      e = Entry{client_id, seq, answer.version, now, answer.code, shard};
      return;
    }
    if (answer.version > e.version) {
      e.version = answer.version;
      e.code = answer.code;
    }
    return;
  }
  if (s.count == s.capacity) {
    if (s.capacity < ring_size_) {
      Grow(s);
    } else {
      DropOldest(s);
    }
  }
  const size_t pos = (s.head + s.count) % s.capacity;
  s.ring[pos] = Entry{client_id, seq, answer.version, now, answer.code, shard};
  // Looked up again: dropping the oldest may have moved the slot's run.
  s.index[SlotOf(s, hash, client_id, seq)] = static_cast<uint32_t>(pos + 1);
  ++s.count;
  ++s.recorded;
}

size_t RetryTable::ForgetShard(uint32_t shard) {
  size_t forgotten = 0;
  for (size_t i = 0; i < stripe_count_; ++i) {
    Stripe& s = stripes_[i];
    MutexLock lock(&s.mu);
    for (size_t k = 0; k < s.count; ++k) {
      Entry& e = s.ring[(s.head + k) % s.capacity];
      if (e.shard != shard) continue;
      e.shard = kForgotten;
      ++forgotten;
    }
  }
  return forgotten;
}

uint64_t RetryTable::ScanShard(uint32_t shard, uint64_t cursor, size_t max,
                               std::vector<Kept>* out) const {
  constexpr unsigned kOrdinalBits = 48;
  constexpr uint64_t kOrdinalMask = (uint64_t{1} << kOrdinalBits) - 1;
  static_assert(kMaxStripes < (uint64_t{1} << (64 - kOrdinalBits)), "a stripe fits its bits");
  const int64_t now = NowNs();
  size_t visits = 0, added = 0;
  for (uint64_t stripe = cursor >> kOrdinalBits; stripe < stripe_count_; ++stripe) {
    const uint64_t from = stripe == cursor >> kOrdinalBits ? cursor & kOrdinalMask : 0;
    Stripe& s = stripes_[stripe];
    MutexLock lock(&s.mu);
    // Ordinals recorded - count .. recorded - 1 are kept, oldest first from the head.
    const uint64_t first = s.recorded - s.count;
    for (uint64_t ordinal = std::max(from, first); ordinal < s.recorded; ++ordinal) {
      if (added == max || visits == kMaxScanVisits) {
        return (stripe << kOrdinalBits) | (ordinal & kOrdinalMask);
      }
      ++visits;
      const Entry& e = s.ring[(s.head + (ordinal - first)) % s.capacity];
      if (e.shard != shard || e.code != StatusCode::kOk || now - e.at_ns > retention_ns_) continue;
      out->push_back(Kept{e.client_id, e.seq, e.version});
      ++added;
    }
  }
  return kScanEnd;
}

size_t RetryTable::size() const {
  size_t n = 0;
  for (size_t i = 0; i < stripe_count_; ++i) {
    Stripe& s = stripes_[i];
    MutexLock lock(&s.mu);
    n += s.count;
  }
  return n;
}

}  // namespace rdkv::server

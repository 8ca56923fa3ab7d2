#include "server/replica_tombstones.h"

#include <algorithm>

namespace rdkv::server {

ReplicaTombstones::ReplicaTombstones(size_t capacity, Clock::duration retention, size_t stripes)
    : per_stripe_(std::max<size_t>(1, capacity / std::max<size_t>(1, stripes))),
      retention_(retention),
      stripes_(new Stripe[std::max<size_t>(1, stripes)]),
      stripe_count_(std::max<size_t>(1, stripes)) {}

ReplicaTombstones::Stripe& ReplicaTombstones::StripeOf(std::string_view key) const {
  return stripes_[StringHash{}(key) % stripe_count_];
}

void ReplicaTombstones::RememberDelete(std::string_view key, uint64_t version,
                                       Clock::time_point now) {
  Stripe& s = StripeOf(key);
  MutexLock lock(&s.mu);
  auto [it, inserted] = s.newest.try_emplace(std::string(key), version);
  if (!inserted) it->second = std::max(it->second, version);
  s.order.push_back({std::string(key), version, now});
  any_.store(true, std::memory_order_release);
  ForgetOld(s, now);
}

void ReplicaTombstones::ForgetOld(Stripe& s, Clock::time_point now) {
  while (!s.order.empty() &&
         (s.order.size() > per_stripe_ || now - s.order.front().at > retention_)) {
    const Entry& e = s.order.front();
    // A newer delete of the key later in the order keeps its entry.
    if (auto it = s.newest.find(e.key); it != s.newest.end() && it->second <= e.version) {
      s.newest.erase(it);
    }
    s.order.pop_front();
  }
}

uint64_t ReplicaTombstones::DeletedAtOrAbove(std::string_view key, uint64_t version) const {
  if (!any_.load(std::memory_order_acquire)) return 0;
  Stripe& s = StripeOf(key);
  MutexLock lock(&s.mu);
  auto it = s.newest.find(key);
  return it != s.newest.end() && it->second >= version ? it->second : 0;
}

size_t ReplicaTombstones::size() const {
  size_t n = 0;
  for (size_t i = 0; i < stripe_count_; ++i) {
    MutexLock lock(&stripes_[i].mu);
    n += stripes_[i].order.size();
  }
  return n;
}

}  // namespace rdkv::server

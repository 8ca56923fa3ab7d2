#include "server/retry_table.h"

namespace rdkv::server {

RetryTable::RetryTable(size_t capacity, std::chrono::milliseconds retention)
    : per_stripe_capacity_(std::max<size_t>(1, capacity / kStripes)), retention_(retention) {}

RetryTable::Stripe& RetryTable::StripeOf(uint64_t client_id, uint64_t seq) const {
  return stripes_[IdHash{}(Id{client_id, seq}) % kStripes];
}

void RetryTable::Expire(Stripe& s, Clock::time_point now) const {
  while (!s.order.empty() &&
         (s.order.size() > per_stripe_capacity_ || now - s.order.front().second > retention_)) {
    s.entries.erase(s.order.front().first);
    s.order.pop_front();
  }
}

std::optional<RetryTable::Answer> RetryTable::Find(uint64_t client_id, uint64_t seq) const {
  if (client_id == 0) return std::nullopt;
  Stripe& s = StripeOf(client_id, seq);
  MutexLock lock(&s.mu);
  auto it = s.entries.find(Id{client_id, seq});
  if (it == s.entries.end() || Clock::now() - it->second.at > retention_) return std::nullopt;
  hits_.fetch_add(1, std::memory_order_relaxed);
  return it->second.answer;
}

void RetryTable::Record(uint64_t client_id, uint64_t seq, Answer answer) {
  if (client_id == 0) return;
  Stripe& s = StripeOf(client_id, seq);
  const Clock::time_point now = Clock::now();
  MutexLock lock(&s.mu);
  if (s.entries.emplace(Id{client_id, seq}, Entry{answer, now}).second) {
    s.order.emplace_back(Id{client_id, seq}, now);
  }
  Expire(s, now);
}

size_t RetryTable::size() const {
  size_t n = 0;
  for (Stripe& s : stripes_) {
    MutexLock lock(&s.mu);
    n += s.entries.size();
  }
  return n;
}

}  // namespace rdkv::server

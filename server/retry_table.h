// The answers of recently applied writes by request id, so that a retried write gets its first
// answer instead of applying twice (docs/design.md "Replication", exactly once).
//
// A write's request id is (client_id, request_seq), chosen by the client library. The primary
// records an id once the write is applied; its backups record it when they apply the forwarded
// write, so a retry that reaches a promoted backup is recognised too. Ids are kept for
// `retention` and at most `capacity` of them; the oldest go first. In memory only: a retry
// after every replica of a shard restarted is not recognised.
//
// Thread-safety: all methods are thread-safe (striped locks).
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <optional>
#include <unordered_map>

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

  explicit RetryTable(size_t capacity = 1 << 20,
                      std::chrono::milliseconds retention = std::chrono::seconds(120));

  // The recorded answer of (client_id, seq), if it is still kept. client_id 0: never.
  std::optional<Answer> Find(uint64_t client_id, uint64_t seq) const;
  // Records the answer of an applied write (client_id 0: ignored). A second record of one id
  // keeps the first answer.
  void Record(uint64_t client_id, uint64_t seq, Answer answer);

  size_t size() const;
  uint64_t hits() const { return hits_.load(std::memory_order_relaxed); }

 private:
  struct Id {
    uint64_t client_id, seq;
    bool operator==(const Id&) const = default;
  };
  struct IdHash {
    size_t operator()(const Id& id) const {
      return static_cast<size_t>(id.client_id * 0x9e3779b97f4a7c15ULL ^ id.seq);
    }
  };
  struct Entry {
    Answer answer;
    Clock::time_point at;
  };
  static constexpr size_t kStripes = 64;
  struct Stripe {
    mutable Mutex mu;
    std::unordered_map<Id, Entry, IdHash> entries GUARDED_BY(mu);
    std::deque<std::pair<Id, Clock::time_point>> order GUARDED_BY(mu);  // oldest first
  };
  Stripe& StripeOf(uint64_t client_id, uint64_t seq) const;
  void Expire(Stripe& s, Clock::time_point now) const REQUIRES(s.mu);

  const size_t per_stripe_capacity_;
  const std::chrono::milliseconds retention_;
  mutable std::array<Stripe, kStripes> stripes_;
  mutable std::atomic<uint64_t> hits_{0};
};

}  // namespace rdkv::server

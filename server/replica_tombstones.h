// The deletes a server applied as a backup, so that a stale forwarded PUT (one the primary gave
// up on, applied late) cannot bring a deleted key back (docs/design.md "Replication", a stale
// REPLICATE after a delete).
//
// Each delete is remembered with its version for `retention` and at most `capacity` of them
// (the oldest go first). Service::ApplyReplica consults it only for an in-sync replica and only
// when the key is absent, the one case a version check cannot decide.
//
// Thread-safety: all methods are thread-safe (striped locks; a key is in one stripe).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>

#include "common/util/mutex.h"

namespace rdkv::server {

class ReplicaTombstones {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr size_t kDefaultCapacity = 1 << 16;
  static constexpr std::chrono::seconds kDefaultRetention{60};
  static constexpr size_t kDefaultStripes = 16;

  // `capacity`: deletes kept at most over all stripes (each keeps capacity / stripes, at least
  // one); tests use one stripe.
  explicit ReplicaTombstones(size_t capacity = kDefaultCapacity,
                             Clock::duration retention = kDefaultRetention,
                             size_t stripes = kDefaultStripes);
  ReplicaTombstones(const ReplicaTombstones&) = delete;
  ReplicaTombstones& operator=(const ReplicaTombstones&) = delete;

  // Remembers that `key` was deleted at `version`; forgets what is older than the retention at
  // `now`, and the oldest of the key's stripe beyond its capacity.
  void RememberDelete(std::string_view key, uint64_t version, Clock::time_point now = Clock::now());
  // The newest remembered delete version of `key` when it is at or above `version`, else 0.
  // No lock while nothing was ever remembered.
  uint64_t DeletedAtOrAbove(std::string_view key, uint64_t version) const;
  // Deletes remembered now (over all stripes).
  size_t size() const;

 private:
  struct Entry {
    std::string key;
    uint64_t version;
    Clock::time_point at;
  };
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  struct Stripe {
    mutable Mutex mu;
    std::deque<Entry> order GUARDED_BY(mu);  // oldest first
    // key -> the newest delete version remembered
    std::unordered_map<std::string, uint64_t, StringHash, std::equal_to<>> newest GUARDED_BY(mu);
  };
  Stripe& StripeOf(std::string_view key) const;
  void ForgetOld(Stripe& s, Clock::time_point now) REQUIRES(s.mu);

  const size_t per_stripe_;
  const Clock::duration retention_;
  std::unique_ptr<Stripe[]> stripes_;
  const size_t stripe_count_;
  std::atomic<bool> any_{false};  // set by the first RememberDelete, never cleared
};

}  // namespace rdkv::server

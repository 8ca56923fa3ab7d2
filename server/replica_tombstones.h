// The deletes a server applied as a backup, so that a stale forwarded PUT (one the primary gave
// up on, applied late) cannot bring a deleted key back (docs/design.md "Replication", a stale
// REPLICATE after a delete).
//
// Rule: a forwarded PUT of `key` at version v may apply only if v is above every delete of
// `key` this server applied as a backup. The deletes are remembered for `retention` and at
// most `capacity` of them; forgetting one raises a floor (per stripe and shard) to its version,
// and a PUT not above the floor is refused as well. So the rule holds with no timing
// assumption; forgetting only makes it refuse more (a live write that old goes again with a
// newer version).
//
// Thread-safety: all methods are thread-safe (striped locks; a key is in one stripe).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

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

  // Remembers that `key` (of `shard`) was deleted at `version`; forgets what is older than the
  // retention at `now`, and the oldest of the key's stripe beyond its capacity.
  void RememberDelete(uint32_t shard, std::string_view key, uint64_t version,
                      Clock::time_point now = Clock::now());
  // 0 when a forwarded PUT of `key` (of `shard`) at `version` may apply; otherwise the version
  // it is not above: the newest remembered delete of the key, or the floor of what was
  // forgotten. Never allocates; no lock while nothing was ever remembered.
  uint64_t RefusingVersion(uint32_t shard, std::string_view key, uint64_t version) const;
  // Deletes remembered now (over all stripes).
  size_t size() const;

 private:
  struct Entry {
    uint32_t shard;
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
    // shard -> the newest version forgotten
    std::unordered_map<uint32_t, uint64_t> floor GUARDED_BY(mu);
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

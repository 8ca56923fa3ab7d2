// LeaseKeeper: an etcd lease kept alive on its own thread, and a conservative deadline until
// which the holder may act as the lease's owner (a server fences itself at valid_until()).
//
// Why valid_until() is never later than etcd's own expiry of the lease (durations only, no
// synchronized clocks): let t_send be the local steady_clock time at which a keepalive (or the
// grant) was sent, and TTL the TTL etcd answered with. etcd handled that request after it
// was sent, at some instant r >= t_send, and set the lease to expire TTL after r: at r + TTL on
// etcd's clock, which is, measured as a duration, no earlier than t_send + TTL on ours. So
// valid_until = t_send + TTL of the newest confirmed keepalive is at or before the real expiry,
// whatever the network delay (a slow reply only makes the deadline more conservative). Only the
// two clocks' rates must agree (steady_clock drift is parts per million; keep TTL >> drift *
// TTL). A renewal whose reply never arrives is not counted, so a lost reply also errs on the
// safe side. etcd may only extend a lease beyond that (a new leader renews every lease with its
// full TTL), never shorten it, except by an explicit revoke.
//
// Lost: the callback runs once, on the keeper's thread, when etcd says the lease is unknown
// (expired or revoked) or when valid_until() passes without a confirmed renewal (etcd
// unreachable for longer than TTL minus the last round trip). The keeper then stops renewing.
//
// Thread-safety: all methods may be called from any thread. The callback must not destroy the
// keeper. The destructor stops the thread and, if `revoke_on_close` and the lease was not lost,
// revokes the lease (one request, bounded by the request timeout).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <thread>

#include "common/etcd/etcd_client.h"
#include "common/util/mutex.h"
#include "rdkv/status.h"

namespace rdkv::etcd {

struct LeaseKeeperOptions {
  int64_t ttl_seconds = 10;
  // Keepalive period; zero = TTL / 3. Each keepalive is bounded by min(request_timeout, this).
  std::chrono::milliseconds interval{0};
  bool revoke_on_close = true;
};

class LeaseKeeper {
 public:
  using Clock = std::chrono::steady_clock;
  // Called once with why the lease was lost (kNotFound: etcd expired it; kUnavailable /
  // kTimedOut: no renewal confirmed in time).
  using LostCallback = std::function<void(const Status&)>;

  // Grants the lease (errors as EtcdClient::LeaseGrant; kInvalidArgument on bad options) and
  // starts keeping it alive. The keeper owns its own EtcdClient over `etcd`.
  static Result<std::unique_ptr<LeaseKeeper>> Start(EtcdOptions etcd, LeaseKeeperOptions options,
                                                    LostCallback on_lost);
  ~LeaseKeeper();
  LeaseKeeper(const LeaseKeeper&) = delete;
  LeaseKeeper& operator=(const LeaseKeeper&) = delete;

  int64_t lease_id() const { return lease_.id; }
  int64_t ttl_seconds() const { return lease_.ttl_seconds; }
  // The conservative deadline (header comment): act as the owner only while now < this.
  Clock::time_point valid_until();
  bool lost() const { return lost_.load(std::memory_order_acquire); }
  // Number of keepalives etcd confirmed.
  int64_t renewals() const { return renewals_.load(std::memory_order_relaxed); }

 private:
  LeaseKeeper(std::unique_ptr<EtcdClient> client, Lease lease, Clock::time_point valid_until,
              LeaseKeeperOptions options, std::chrono::milliseconds interval, LostCallback on_lost);
  void Run();
  void Lose(const Status& why);

  const std::unique_ptr<EtcdClient> client_;
  const Lease lease_;
  const LeaseKeeperOptions options_;
  const std::chrono::milliseconds interval_;
  const LostCallback on_lost_;
  std::atomic<bool> lost_{false};
  std::atomic<int64_t> renewals_{0};
  Mutex mu_;
  Clock::time_point valid_until_ GUARDED_BY(mu_);
  bool stop_ GUARDED_BY(mu_) = false;
  CondVar cv_;
  std::thread thread_;
};

}  // namespace rdkv::etcd

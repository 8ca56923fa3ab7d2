// LeaseKeeper: grant, the keepalive loop, the validity deadline and the lost callback.
#include "common/etcd/lease_keeper.h"
#include "common/util/thread_name.h"

#include <algorithm>

namespace rdkv::etcd {

Result<std::unique_ptr<LeaseKeeper>> LeaseKeeper::Start(EtcdOptions etcd,
                                                        LeaseKeeperOptions options,
                                                        LostCallback on_lost) {
  if (options.ttl_seconds <= 0) {
    return Status::InvalidArgument("etcd lease keeper: ttl_seconds must be positive");
  }
  if (options.interval.count() < 0) {
    return Status::InvalidArgument("etcd lease keeper: interval must not be negative");
  }
  std::chrono::milliseconds interval =
      options.interval.count() > 0 ? options.interval
                                   : std::chrono::milliseconds(options.ttl_seconds * 1000 / 3);
  // A keepalive that takes longer than the period is as good as lost: bound it so the loop
  // notices a passed deadline on time.
  etcd.request_timeout = std::min(etcd.request_timeout, interval);
  RDKV_ASSIGN_OR_RETURN(std::unique_ptr<EtcdClient> client, EtcdClient::Create(std::move(etcd)));
  const Clock::time_point sent = Clock::now();
  RDKV_ASSIGN_OR_RETURN(Lease lease, client->LeaseGrant(options.ttl_seconds));
  // Never past the TTL asked for: conservative, and an absurd TTL in a reply cannot overflow
  // the clock arithmetic.
  const Clock::time_point valid_until =
      sent + std::chrono::seconds(std::min(lease.ttl_seconds, options.ttl_seconds));
  std::unique_ptr<LeaseKeeper> k(new LeaseKeeper(std::move(client), lease, valid_until, options,
                                                 interval, std::move(on_lost)));
  k->thread_ = std::thread([p = k.get()] {
    rdkv::util::NameThisThread("rdkv-etcd-lease");
    p->Run();
  });
  return k;
}

LeaseKeeper::LeaseKeeper(std::unique_ptr<EtcdClient> client, Lease lease,
                         Clock::time_point valid_until, LeaseKeeperOptions options,
                         std::chrono::milliseconds interval, LostCallback on_lost)
    : client_(std::move(client)),
      lease_(lease),
      options_(options),
      interval_(interval),
      on_lost_(std::move(on_lost)),
      valid_until_(valid_until) {}

LeaseKeeper::~LeaseKeeper() {
  {
    MutexLock l(&mu_);
    stop_ = true;
    cv_.SignalAll();
  }
  if (thread_.joinable()) thread_.join();
  if (options_.revoke_on_close && !lost()) client_->LeaseRevoke(lease_.id).IgnoreError();
}

LeaseKeeper::Clock::time_point LeaseKeeper::valid_until() {
  MutexLock l(&mu_);
  return valid_until_;
}

void LeaseKeeper::Lose(const Status& why) {
  lost_.store(true, std::memory_order_release);
  if (on_lost_) on_lost_(why);
}

void LeaseKeeper::Run() {
  Clock::time_point next = Clock::now() + interval_;
  Status last_error = Status::Ok();
  while (true) {
    Clock::time_point deadline;
    {
      MutexLock l(&mu_);
      // Wake for the next keepalive, or at the deadline to report the loss on time.
      while (!stop_ && Clock::now() < std::min(next, valid_until_)) {
        cv_.WaitUntil(&mu_, std::min(next, valid_until_));
      }
      if (stop_) return;
      deadline = valid_until_;
    }
    const Clock::time_point sent = Clock::now();
    if (sent >= deadline) {
      Lose(Status::Unavailable(
          "etcd lease " + std::to_string(lease_.id) +
          ": no renewal confirmed before its conservative deadline (TTL " +
          std::to_string(lease_.ttl_seconds) + " s)" +
          (last_error.ok() ? std::string() : "; last keepalive error: " + last_error.ToString())));
      return;
    }
    Result<int64_t> ttl = client_->LeaseKeepAlive(lease_.id);
    if (ttl.ok()) {
      last_error = Status::Ok();
      renewals_.fetch_add(1, std::memory_order_relaxed);
      MutexLock l(&mu_);
      valid_until_ =
          std::max(valid_until_, sent + std::chrono::seconds(std::min(*ttl, options_.ttl_seconds)));
      next = sent + interval_;
    } else if (ttl.status().Is(StatusCode::kNotFound)) {
      Lose(ttl.status());
      return;
    } else {
      // etcd unreachable or slow: try again soon, until the deadline passes.
      last_error = ttl.status();
      next = Clock::now() + std::max(interval_ / 4, std::chrono::milliseconds(20));
    }
  }
}

}  // namespace rdkv::etcd

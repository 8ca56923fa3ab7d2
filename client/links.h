// The client's links: one per server it talks to, each with its connections (Sessions, one per
// thread slot, each replaced after a failure, with back-off), its location cache and its name
// for messages.
//
// Ownership: Links owns every Link; a Link lives as long as its Links (pointers to it stay
// valid). Links does not own the fabric, the scratch pool or the counters: they must outlive
// it (ClientImpl declares them first).
// Thread-safety: every method is safe from any thread.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "client/counters.h"
#include "client/location_cache.h"
#include "client/read_buffers.h"
#include "client/session.h"
#include "common/transport/transport.h"
#include "common/util/mutex.h"
#include "rdkv/client.h"

namespace rdkv::client {

// One server: its connections (ClientOptions::connections_per_server, each opened on first use
// and replaced after a failure), its location cache, and when it was last found unreachable.
struct Link {
  struct Slot {
    std::shared_ptr<Session> session;
    bool connected_once = false;
    bool connecting = false;  // a thread is opening it, outside the lock (others wait on opened)
    std::chrono::steady_clock::time_point failed_at{};  // its last failed open, if any
  };
  // What SessionOf's fast path reads without mu: a slot's session, copied under a spin lock
  // of its own (a reference count's increment), in its own cache line.
  struct alignas(64) Published {
    SpinLock mu;
    std::shared_ptr<Session> session GUARDED_BY(mu);
  };
  Link(uint32_t server_id, ServerAddress a, size_t cache_entries, size_t connections)
      : id(server_id),
        address(std::move(a)),
        cache(cache_entries),
        slot_count(std::max<size_t>(connections, 1)),
        published(new Published[slot_count]),
        slots(slot_count) {}
  const uint32_t id;
  const ServerAddress address;
  LocationCache cache;  // offsets in this server's region (lock-free)
  const size_t slot_count;
  // published[i] is slots[i].session, set with mu held whenever that changes.
  const std::unique_ptr<Published[]> published;
  Mutex mu;
  // A thread uses slot ThreadSlot() % slots.size(): its own connection when there are as many
  // connections as threads, so threads do not queue behind each other on one socket or QP.
  std::vector<Slot> slots GUARDED_BY(mu);
  // Sets slots[index].session and its published copy. The old session is returned, to be let
  // go of outside mu (its last holder closes its connection).
  std::shared_ptr<Session> SetSession(size_t index, std::shared_ptr<Session> s) REQUIRES(mu) {
    {
      SpinLockHold h(&published[index].mu);
      published[index].session = s;
    }
    std::swap(slots[index].session, s);
    return s;
  }
  CondVar opened;  // a slot's open finished (with mu)
  uint64_t incarnation GUARDED_BY(mu) = 0;
  bool down GUARDED_BY(mu) = false;  // the last connection attempt failed
  std::chrono::steady_clock::time_point last_try GUARDED_BY(mu);
  Status last_error GUARDED_BY(mu);
};

class Links {
 public:
  // `seed` is the server Connect was given (id 0 until a map names it).
  Links(const ClientOptions& options, ServerAddress seed, transport::Fabric* fabric,
        ScratchPool* pool, Counters* counters);
  // Closes every connection (before the pool and the fabric go).
  ~Links();

  // In a cluster, names carry server ids and an unreachable server is retried at most every
  // 500 ms. Set by the Router when it installs its first map.
  void set_cluster(bool cluster) { cluster_.store(cluster, std::memory_order_release); }
  bool cluster() const { return cluster_.load(std::memory_order_acquire); }

  Link& seed() const { return *seed_; }
  // The link of server `id` at `address` ("host:port"), created on first use.
  Link* LinkFor(uint32_t id, const std::string& address) EXCLUDES(mu_);

  // The live session of `link` for the calling thread's slot, (re)connecting it when it is
  // broken or not open yet (outside the link's lock: the other slots keep serving). While the
  // slot is being opened by another thread, or its last open failed less than 500 ms ago,
  // another usable slot's session is returned; only with no usable slot does an open's failure
  // reach the caller. In a cluster a server that could not be reached is tried again at most
  // every 500 ms; meanwhile its calls fail fast with the last error. Errors name the server (Name):
  // kUnavailable for anything about reaching it; the server's own refusals (kPermissionDenied,
  // kProtocolError, kInvalidArgument, kNotSupported) keep their code.
  Result<std::shared_ptr<Session>> SessionOf(Link& link) EXCLUDES(link.mu);

  // "server 10.0.0.1:7400", or in a cluster "server 2 (10.0.0.1:7400)": the one name of a
  // server in the client's messages.
  std::string Name(const Link& link) const;

  // The largest value the last connected server accepts (its region header).
  uint64_t max_value_bytes() const { return max_value_bytes_.load(std::memory_order_relaxed); }

 private:
  const ClientOptions& options_;
  transport::Fabric* const fabric_;
  ScratchPool* const pool_;
  Counters* const counters_;
  std::atomic<bool> cluster_{false};
  std::atomic<uint64_t> max_value_bytes_{0};
  Mutex mu_;
  std::map<std::string, std::unique_ptr<Link>> links_ GUARDED_BY(mu_);  // "id@address"
  std::unique_ptr<Link> seed_;
};

}  // namespace rdkv::client

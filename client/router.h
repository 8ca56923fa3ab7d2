// Routing: the cluster map this client routes by, the link of each shard's owner, refreshing
// the map from any server, and the one loop that re-routes work a server redirected
// (kWrongOwner) until op_timeout. Standalone (the seed serves no map) everything goes to the
// seed.
//
// Ownership: borrows the links and the caller (they outlive it). Routing
// snapshots are shared_ptrs: a caller keeps the one it took for as long as it needs it.
// Thread-safety: every method is safe from any thread, except Init, which runs once before
// the client is shared.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "client/call.h"
#include "client/links.h"
#include "common/cluster/cluster_map.h"
#include "common/util/mutex.h"
#include "rdkv/client.h"

namespace rdkv::client {

// A cluster map with the link of each shard's owner, built once per map.
struct Routing {
  std::shared_ptr<const cluster::ClusterMap> map;
  std::vector<Link*> owners;  // per shard
};

class Router {
 public:
  Router(Links* links, Caller* caller) : links_(links), caller_(caller) {}

  // Asks the seed for its cluster map: none (an empty body, or a server older than
  // clusters) is a standalone server. kProtocolError for a map that does not parse; the
  // seed's errors otherwise.
  Status Init();
  // Whether the client routes by a map (the seed served one at Init; a test may Install one).
  bool cluster() const { return cluster_.load(std::memory_order_acquire); }

  // The current routing and map; nullptr when standalone.
  std::shared_ptr<const Routing> routing() const EXCLUDES(mu_);
  std::shared_ptr<const cluster::ClusterMap> map() const EXCLUDES(mu_);
  // The epoch of the map this client routes by (0 standalone).
  uint64_t epoch() const EXCLUDES(mu_);

  // Routes by `map` from now on when its epoch is newer than the current one's (the first map
  // makes the client a cluster client).
  void Install(cluster::ClusterMap map) EXCLUDES(mu_);

  // Fetches the map from `from` (the server that redirected; may be null), else the seed,
  // else any server of the map, and keeps it when its epoch is newer. OK when some server
  // answered; otherwise the last error.
  Status Refresh(Link* from) EXCLUDES(mu_);

  // Runs `round(const Routing&)` with the current routing until it returns nullptr. A round
  // returns the link that redirected work it wants to retry (it decides, by op_timeout,
  // whether to retry); the map is then refreshed from that server and the next round runs
  // after a short back-off (0.5 ms doubling to 20 ms: the new owner may still be installing
  // the map). Cluster only. Used by GETs and writes alike.
  template <typename Round>
  void RunRouted(Round&& round) {
    RunRouted(nullptr, std::forward<Round>(round));
  }
  // The same, after work already redirected by `redirected` (null: none): the map is refreshed
  // from it before the first round, as after a round that returned it.
  template <typename Round>
  void RunRouted(Link* redirected, Round&& round) {
    int n = 0;
    if (redirected != nullptr) AfterRedirect(redirected, n++);
    for (;; ++n) {
      std::shared_ptr<const Routing> rt = routing();
      redirected = round(*rt);
      if (redirected == nullptr) return;
      AfterRedirect(redirected, n);
    }
  }

 private:
  // Refreshes the map from `redirected` (logging a failure) and backs off for round `n`.
  void AfterRedirect(Link* redirected, int n);
  void InstallLocked(cluster::ClusterMap map) REQUIRES(mu_);

  Links* const links_;
  Caller* const caller_;
  std::atomic<bool> cluster_{false};  // set by the first Install
  mutable Mutex mu_;
  std::shared_ptr<const Routing> routing_ GUARDED_BY(mu_);
};

}  // namespace rdkv::client

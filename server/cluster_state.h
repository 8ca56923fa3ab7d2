// This server's view of the cluster: the map it serves and which shards it owns.
//
// Ownership lives in two places kept in step: the map (for writes and redirects) and the
// region header's ownership words (for clients' one-sided GETs, read under a lease). A map
// change clears lost shards' bits first, then waits one lease before it is acknowledged, so no
// client can still return a GET from this server for a shard after the move is acknowledged
// (docs/design.md "Cluster").
//
// Thread-safety: all methods are thread-safe. Writes hold WriteGuard() across their ownership
// check and apply, so Install() never races with a write to a shard it is taking away.
#pragma once

#include <chrono>
#include <memory>
#include <shared_mutex>
#include <string>
#include <string_view>

#include "common/cluster/cluster_map.h"
#include "rdkv/status.h"
#include "server/store.h"

namespace rdkv::server {

class ClusterState {
 public:
  // `map` must contain `server_id` and have the store's shard count. `saved_map_path`: where
  // Install() keeps the newest map (server/saved_map.h); empty: nowhere (durability=none
  // without a data dir), and a restart falls back to the --cluster_map file.
  static Result<std::unique_ptr<ClusterState>> Create(Store* store, cluster::ClusterMap map,
                                                      uint32_t server_id,
                                                      std::chrono::milliseconds lease,
                                                      std::string saved_map_path = {});

  // Shared: many writes at once. Waits while an install is taking the lock exclusively (a
  // turnstile: glibc's shared mutex prefers readers, and a steady stream of writes would
  // otherwise hold an install off for as long as it lasts).
  std::shared_lock<std::shared_mutex> WriteGuard() const {
    { std::lock_guard turnstile(turnstile_); }
    return std::shared_lock(mu_);
  }
  // OK when this server owns the key's shard; else kWrongOwner naming the owner and the epoch
  // (and *epoch set). Call under WriteGuard().
  Status CheckOwner(std::string_view key, uint64_t* epoch) const;

  std::shared_ptr<const cluster::ClusterMap> map() const;
  // Adopts a newer map: kInvalidArgument when its epoch is not higher, its shard count differs
  // or it lacks this server. Saves it durably first (when a saved-map path was given; kIoError,
  // with nothing changed, when that fails), then changes ownership. Blocks for one lease when
  // shards are lost.
  Status Install(cluster::ClusterMap map);
  uint32_t server_id() const { return server_id_; }

 private:
  // mu_ exclusively, through the turnstile: writes arriving meanwhile wait behind it.
  std::unique_lock<std::shared_mutex> LockExclusive() {
    std::lock_guard turnstile(turnstile_);
    return std::unique_lock(mu_);
  }
  ClusterState(Store* store, std::shared_ptr<const cluster::ClusterMap> map, uint32_t id,
               std::chrono::milliseconds lease, std::string saved_map_path)
      : store_(store),
        map_(std::move(map)),
        server_id_(id),
        lease_(lease),
        saved_map_path_(std::move(saved_map_path)) {}

  Store* store_;
  mutable std::shared_mutex mu_;  // exclusive while ownership changes
  mutable std::mutex turnstile_;  // held by an install while it waits for mu_ exclusively
  std::mutex install_mu_;         // one Install at a time
  std::shared_ptr<const cluster::ClusterMap> map_;
  const uint32_t server_id_;
  const std::chrono::milliseconds lease_;
  const std::string saved_map_path_;  // empty: maps are not saved
};

}  // namespace rdkv::server

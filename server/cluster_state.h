// This server's view of the cluster: the map it serves and which shards it owns.
//
// Ownership lives in two places kept in step: the map (for writes and redirects) and the
// region header's ownership words (for clients' one-sided GETs, read under a lease). A map
// change clears lost shards' bits first, then waits one lease before it is acknowledged, so no
// client can still return a GET from this server for a shard after the move is acknowledged
// (docs/design.md "Cluster").
//
// Thread-safety: all methods are thread-safe. Writes hold an OwnerGuard across their ownership
// check and apply, so Install() never races with a write to a shard it is taking away.
//
// Lock order: install_mu_, then turnstile_, then mu_ (an Install holds install_mu_ throughout
// and takes the turnstile and mu_ inside it; a write takes the turnstile and lets it go before
// it takes mu_).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <string_view>

#include "common/cluster/cluster_map.h"
#include "common/util/mutex.h"
#include "common/util/thread_annotations.h"
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

  // A write's hold on the ownership lock (mu_ shared) for its scope, the analysis knowing it:
  //
  //   ClusterState::OwnerGuard owner_guard(cluster_);  // nothing held when cluster_ is null
  //   Status own = cluster_->CheckOwner(key, &epoch);   // (only when cluster_ is not null)
  //
  // Many writes hold it at once. It waits while an install is taking the lock exclusively (a
  // turnstile: glibc's shared mutex prefers readers, and a steady stream of writes would
  // otherwise hold an install off for as long as it lasts).
  class SCOPED_CAPABILITY OwnerGuard {
   public:
    // `state` null (a standalone server): holds nothing.
    explicit OwnerGuard(const ClusterState* state) ACQUIRE_SHARED(state->mu_)
        : mu_(state ? &state->mu_ : nullptr) {
      if (mu_ == nullptr) return;
      { MutexLock turnstile(&state->turnstile_); }
      mu_->ReaderLock();
    }
    ~OwnerGuard() RELEASE() {
      if (mu_ != nullptr) mu_->ReaderUnlock();
    }
    OwnerGuard(const OwnerGuard&) = delete;
    OwnerGuard& operator=(const OwnerGuard&) = delete;

   private:
    SharedMutex* const mu_;
  };

  // OK when this server owns the key's shard; else kWrongOwner naming the owner and the epoch
  // (and *epoch set). Call holding an OwnerGuard.
  Status CheckOwner(std::string_view key, uint64_t* epoch) const REQUIRES_SHARED(mu_);

  std::shared_ptr<const cluster::ClusterMap> map() const EXCLUDES(mu_);
  // Adopts a newer map: kInvalidArgument when its epoch is not higher, its shard count differs
  // or it lacks this server. Saves it durably first (when a saved-map path was given; kIoError,
  // with nothing changed, when that fails), then changes ownership. Blocks for one lease when
  // shards are lost.
  Status Install(cluster::ClusterMap map) EXCLUDES(install_mu_, turnstile_, mu_);
  uint32_t server_id() const { return server_id_; }

 private:
  // mu_ exclusively for its scope, through the turnstile: writes arriving meanwhile wait
  // behind it.
  class SCOPED_CAPABILITY ExclusiveLock {
   public:
    explicit ExclusiveLock(ClusterState* state) ACQUIRE(state->mu_) : mu_(&state->mu_) {
      MutexLock turnstile(&state->turnstile_);
      mu_->Lock();
    }
    ~ExclusiveLock() RELEASE() { mu_->Unlock(); }
    ExclusiveLock(const ExclusiveLock&) = delete;
    ExclusiveLock& operator=(const ExclusiveLock&) = delete;

   private:
    SharedMutex* const mu_;
  };

  ClusterState(Store* store, std::shared_ptr<const cluster::ClusterMap> map, uint32_t id,
               std::chrono::milliseconds lease, std::string saved_map_path)
      : store_(store),
        map_(std::move(map)),
        server_id_(id),
        lease_(lease),
        saved_map_path_(std::move(saved_map_path)) {}

  Store* store_;
  // Lock order: install_mu_, turnstile_, mu_ (ACQUIRED_BEFORE: the tsa preset checks it).
  Mutex install_mu_ ACQUIRED_BEFORE(turnstile_);  // one Install at a time
  // Held by an install while it waits for mu_ exclusively; writes pass through it.
  mutable Mutex turnstile_ ACQUIRED_BEFORE(mu_);
  mutable SharedMutex mu_;  // exclusive while ownership changes
  std::shared_ptr<const cluster::ClusterMap> map_ GUARDED_BY(mu_);
  const uint32_t server_id_;
  const std::chrono::milliseconds lease_;
  const std::string saved_map_path_;  // empty: maps are not saved
};

}  // namespace rdkv::server

#include "server/cluster_state.h"

#include <glog/logging.h>

#include <algorithm>
#include <set>
#include <thread>

#include "server/saved_map.h"

namespace rdkv::server {

namespace {
Status Validate(const Store& store, const cluster::ClusterMap& map, uint32_t id) {
  if (map.FindServer(id) == nullptr) {
    return Status::InvalidArgument("server id " + std::to_string(id) +
                                   " is not in the cluster map (epoch " +
                                   std::to_string(map.epoch) + ")");
  }
  if (map.shards != store.shard_count()) {
    return Status::InvalidArgument("the cluster map has " + std::to_string(map.shards) +
                                   " shards, this server was started with " +
                                   std::to_string(store.shard_count()) +
                                   "; the shard count is fixed for a cluster's life");
  }
  return Status::Ok();
}

// Replicated maps: versions carry the epoch (docs/design.md "Replication").
void RaiseVersionFloor(Store* store, const cluster::ClusterMap& map) {
  if (map.MaxReplicas() > 1 || std::any_of(map.joining.begin(), map.joining.end(),
                                           [](const auto& j) { return !j.empty(); })) {
    store->EnsureVersionAbove(cluster::EpochVersionFloor(map.epoch));
  }
}
}  // namespace

Result<std::unique_ptr<ClusterState>> ClusterState::Create(Store* store, cluster::ClusterMap map,
                                                           uint32_t server_id,
                                                           std::chrono::milliseconds lease,
                                                           std::string saved_map_path) {
  RDKV_RETURN_IF_ERROR(Validate(*store, map, server_id));
  map.NormalizeReplicas();
  for (uint32_t s = 0; s < map.shards; ++s) store->SetOwned(s, map.OwnerOf(s) == server_id);
  store->SetMapEpoch(map.epoch);
  RaiseVersionFloor(store, map);
  return std::unique_ptr<ClusterState>(
      new ClusterState(store, std::make_shared<const cluster::ClusterMap>(std::move(map)),
                       server_id, lease, std::move(saved_map_path)));
}

Status ClusterState::CheckOwner(std::string_view key, uint64_t* epoch) const {
  uint32_t shard = store_->ShardOfKey(key);
  if (store_->Owns(shard)) return Status::Ok();
  if (fenced_.load(std::memory_order_acquire)) {
    MutexLock lock(&fence_mu_);
    return Status::Unavailable("server " + std::to_string(server_id_) +
                               " is fenced and serves no shard: " + fence_reason_);
  }
  // The caller holds mu_ shared (an OwnerGuard): map_ is read without locking mu_ again.
  std::shared_ptr<const cluster::ClusterMap> m = map_;
  *epoch = m->epoch;
  uint32_t owner = m->OwnerOf(shard);
  if (owner == server_id_) {
    // The map gives it to this server, which is still waiting for the previous primary to
    // release it (the control plane's gain rule): a moment.
    return Status::Unavailable("server " + std::to_string(server_id_) + " is taking over shard " +
                               std::to_string(shard) + " (map epoch " + std::to_string(m->epoch) +
                               ") and waits for its previous primary to release it; retry");
  }
  const cluster::ServerEntry* e = m->FindServer(owner);
  return Status::WrongOwner("shard " + std::to_string(shard) + " belongs to server " +
                            std::to_string(owner) + " (" + (e ? e->address : "?") +
                            ") in map epoch " + std::to_string(m->epoch) + ", not to server " +
                            std::to_string(server_id_));
}

Status ClusterState::CheckReplica(uint32_t shard, uint64_t epoch, uint32_t sender,
                                  bool* joining) const {
  std::shared_ptr<const cluster::ClusterMap> snapshot = map();
  const cluster::ClusterMap& m = *snapshot;
  *joining = shard < m.shards && m.IsJoining(shard, server_id_);
  if (shard < m.shards && m.OwnerOf(shard) == sender &&
      (m.IsBackup(shard, server_id_) || m.IsJoining(shard, server_id_))) {
    // A joining replica takes nothing of an earlier join of its own (removed and added again
    // since): a forward or a copy's item read before it was emptied could bring back a key
    // deleted meanwhile, which the new copy (it only adds) would not remove.
    if (const uint64_t joined_at = m.JoinedAt(shard, server_id_); epoch < joined_at) {
      return Status::WrongOwner("forwarded write for shard " + std::to_string(shard) +
                                " of map epoch " + std::to_string(epoch) + " refused: server " +
                                std::to_string(server_id_) + " joined the shard again at epoch " +
                                std::to_string(joined_at) +
                                " and takes nothing of an earlier join");
    }
    return Status::Ok();
  }
  if (epoch > m.epoch) {
    return Status::Busy("forwarded write of map epoch " + std::to_string(epoch) + ": server " +
                        std::to_string(server_id_) + " is still at epoch " +
                        std::to_string(m.epoch) + "; retry once it has installed the new map");
  }
  return Status::WrongOwner("forwarded write for shard " + std::to_string(shard) + " from server " +
                            std::to_string(sender) + " (map epoch " + std::to_string(epoch) +
                            ") refused: in server " + std::to_string(server_id_) + "'s map epoch " +
                            std::to_string(m.epoch) +
                            " the sender is not the shard's primary or this server not its "
                            "backup");
}

std::shared_ptr<const cluster::ClusterMap> ClusterState::map() const {
  MutexLock lock(&snapshot_mu_);
  return map_snapshot_;
}

Status ClusterState::Install(cluster::ClusterMap next) {
  MutexLock install(&install_mu_);
  RDKV_RETURN_IF_ERROR(Validate(*store_, next, server_id_));
  next.NormalizeReplicas();
  RDKV_RETURN_IF_ERROR(cluster::ValidateReplicas(next));
  std::shared_ptr<const cluster::ClusterMap> cur = map();
  if (next.epoch <= cur->epoch) {
    return Status::InvalidArgument("cluster map epoch " + std::to_string(next.epoch) +
                                   " is not newer than this server's " +
                                   std::to_string(cur->epoch));
  }
  // The primaries this server takes shards from.
  std::set<uint32_t> previous_primaries;
  for (uint32_t s = 0; s < next.shards; ++s) {
    if (next.OwnerOf(s) == server_id_ && cur->OwnerOf(s) != server_id_) {
      previous_primaries.insert(cur->OwnerOf(s));
    }
  }
  // Durable before anything changes: a restart must never come back with an older map than
  // one this server acknowledged (it would claim shards whose data has moved away).
  if (!saved_map_path_.empty()) {
    Status saved = SaveClusterMap(next, saved_map_path_);
    if (!saved.ok()) {
      LOG(ERROR) << "cluster map epoch " << next.epoch << " refused: cannot save it to "
                 << saved_map_path_ << ": " << saved.ToString();
      return Status::IoError("cannot save cluster map epoch " + std::to_string(next.epoch) +
                             " to " + saved_map_path_ + " (nothing changed): " + saved.message());
    }
  } else {
    LOG(WARNING) << "cluster map epoch " << next.epoch
                 << " is not saved (no data dir): a restart of server " << server_id_
                 << " goes back to its --cluster_map file";
  }
  uint32_t lost = 0, gained = 0;
  bool released_any = false;  // a shard the old map gave this server and the new one does not
  {
    // Lost shards first, under the exclusive lock: no write to them is in flight afterwards.
    ExclusiveLock lock(this);
    for (uint32_t s = 0; s < next.shards; ++s) {
      bool had = store_->Owns(s), has = next.OwnerOf(s) == server_id_;
      if (!has && cur->OwnerOf(s) == server_id_) released_any = true;
      if (had && !has) {
        MutexLock fence(&fence_mu_);
        store_->SetOwned(s, false);
        last_clear_ = std::chrono::steady_clock::now();
        ++lost;
      }
    }
    if (map_hook_) map_hook_(*cur, next);
    map_ = std::make_shared<const cluster::ClusterMap>(next);
    {
      MutexLock snapshot(&snapshot_mu_);
      map_snapshot_ = map_;
    }
    // Before any gained shard takes a write under the new epoch.
    RaiseVersionFloor(store_, next);
  }
  // A client that saw a lost shard's bit set before it was cleared may use that for one lease:
  // from the last clear, which a fence may have done a moment ago.
  if (released_any) {
    std::chrono::steady_clock::time_point cleared;
    {
      MutexLock fence(&fence_mu_);
      cleared = last_clear_;
    }
    std::this_thread::sleep_until(cleared + lease_);
  }
  if (released_hook_) released_hook_(next.epoch);
  // Gains wait until their previous primaries have released them (the control plane's rule;
  // without one, the installer's order guarantees it: docs/design.md "Moving a shard").
  if (gain_gate_) {
    for (uint32_t old_primary : previous_primaries) {
      Status gate = gain_gate_(old_primary, next.epoch);
      if (!gate.ok()) {
        LOG(ERROR) << "cluster map epoch " << next.epoch << ": server " << server_id_
                   << " does not take the shards of server " << old_primary
                   << " yet: " << gate.ToString();
        return Status(gate.code(), "map epoch " + std::to_string(next.epoch) +
                                       " installed, but its shards from server " +
                                       std::to_string(old_primary) +
                                       " are not served yet: " + gate.message());
      }
    }
  }
  if (resync_hook_) {
    std::vector<uint32_t> promoted;
    for (uint32_t s = 0; s < next.shards; ++s) {
      if (next.OwnerOf(s) == server_id_ && cur->OwnerOf(s) != server_id_ &&
          cur->IsBackup(s, server_id_)) {
        promoted.push_back(s);
      }
    }
    if (!promoted.empty()) resync_hook_(next, promoted);
  }
  {
    // Gained shards under the exclusive lock too: an IMPORT (allowed only into a shard this
    // server does not own) is either done before it or refused after it.
    ExclusiveLock lock(this);
    MutexLock fence(&fence_mu_);
    for (uint32_t s = 0; s < next.shards; ++s) {
      if (next.OwnerOf(s) == server_id_ && !store_->Owns(s) && !fenced_.load()) {
        store_->SetOwned(s, true);
        ++gained;
      }
    }
  }
  store_->SetMapEpoch(next.epoch);
  LOG(INFO) << "cluster map epoch " << cur->epoch << " -> " << next.epoch << ": server "
            << server_id_ << " lost " << lost << " and gained " << gained << " shard(s)";
  return Status::Ok();
}

void ClusterState::NoteWritePause(std::chrono::steady_clock::time_point start,
                                  std::chrono::steady_clock::time_point drained,
                                  std::chrono::steady_clock::time_point end) {
  const auto paused = std::chrono::duration_cast<std::chrono::nanoseconds>(end - start);
  write_pause_ns_.fetch_add(paused.count(), std::memory_order_relaxed);
  write_pauses_.fetch_add(1, std::memory_order_relaxed);
  if (paused >= kLoggedWritePause) {
    LOG(INFO) << "server " << server_id_
              << ": taking the ownership lock (a map change or an unfence) held off writes of "
                 "every shard for "
              << std::chrono::duration_cast<std::chrono::microseconds>(paused).count() << " us ("
              << std::chrono::duration_cast<std::chrono::microseconds>(drained - start).count()
              << " us of it waiting for writes in flight)";
  }
}

ClusterState::WriteHold ClusterState::HoldForWrite() const {
  MutexLock lock(&holds_mu_);
  ++holds_;
  return WriteHold(this);
}

void ClusterState::WriteHold::Release() {
  if (state_ == nullptr) return;
  {
    MutexLock lock(&state_->holds_mu_);
    if (--state_->holds_ == 0) state_->holds_cv_.SignalAll();
  }
  state_ = nullptr;
}

uint64_t ClusterState::write_holds() const {
  MutexLock lock(&holds_mu_);
  return holds_;
}

void ClusterState::WaitForWriteHolds() const {
  MutexLock lock(&holds_mu_);
  while (holds_ > 0) holds_cv_.Wait(&holds_mu_);
}

void ClusterState::Fence(const std::string& why) {
  // At once, without waiting for writes in flight: the bits must be clear one ownership lease
  // before the etcd lease can expire. A write that passed its ownership check before is either
  // on every in-sync backup when it is acknowledged, or fails (docs/design.md "Control plane").
  // fence_mu_ orders this with an install's gains: no bit is set after the fence.
  uint32_t cleared = 0;
  {
    MutexLock lock(&fence_mu_);
    fence_reason_ = why;
    if (!fenced_.exchange(true, std::memory_order_acq_rel)) {
      fences_.fetch_add(1, std::memory_order_relaxed);
    }
    for (uint32_t s = 0; s < store_->shard_count(); ++s) {
      if (store_->Owns(s)) {
        store_->SetOwned(s, false);
        ++cleared;
      }
    }
    if (cleared > 0) last_clear_ = std::chrono::steady_clock::now();
  }
  LOG(WARNING) << "server " << server_id_ << " fenced itself (" << cleared
               << " shard(s) no longer served): " << why;
}

void ClusterState::Unfence() {
  MutexLock install(&install_mu_);
  uint32_t set = 0;
  {
    ExclusiveLock lock(this);
    MutexLock fence(&fence_mu_);
    if (!fenced_.load()) return;
    fenced_.store(false, std::memory_order_release);
    for (uint32_t s = 0; s < map_->shards; ++s) {
      if (map_->OwnerOf(s) == server_id_ && !store_->Owns(s)) {
        store_->SetOwned(s, true);
        ++set;
      }
    }
  }
  LOG(INFO) << "server " << server_id_ << " unfenced: serves its " << set << " shard(s) again";
}

}  // namespace rdkv::server

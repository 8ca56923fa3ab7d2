#include "server/cluster_state.h"

#include <glog/logging.h>

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
}  // namespace

Result<std::unique_ptr<ClusterState>> ClusterState::Create(Store* store, cluster::ClusterMap map,
                                                           uint32_t server_id,
                                                           std::chrono::milliseconds lease,
                                                           std::string saved_map_path) {
  RDKV_RETURN_IF_ERROR(Validate(*store, map, server_id));
  for (uint32_t s = 0; s < map.shards; ++s) store->SetOwned(s, map.OwnerOf(s) == server_id);
  store->SetMapEpoch(map.epoch);
  return std::unique_ptr<ClusterState>(
      new ClusterState(store, std::make_shared<const cluster::ClusterMap>(std::move(map)),
                       server_id, lease, std::move(saved_map_path)));
}

Status ClusterState::CheckOwner(std::string_view key, uint64_t* epoch) const {
  uint32_t shard = store_->ShardOfKey(key);
  if (store_->Owns(shard)) return Status::Ok();
  // The caller holds mu_ shared (an OwnerGuard): map_ is read without locking mu_ again.
  std::shared_ptr<const cluster::ClusterMap> m = map_;
  *epoch = m->epoch;
  uint32_t owner = m->OwnerOf(shard);
  const cluster::ServerEntry* e = m->FindServer(owner);
  return Status::WrongOwner("shard " + std::to_string(shard) + " belongs to server " +
                            std::to_string(owner) + " (" + (e ? e->address : "?") +
                            ") in map epoch " + std::to_string(m->epoch) + ", not to server " +
                            std::to_string(server_id_));
}

std::shared_ptr<const cluster::ClusterMap> ClusterState::map() const {
  mu_.ReaderLock();
  std::shared_ptr<const cluster::ClusterMap> m = map_;
  mu_.ReaderUnlock();
  return m;
}

Status ClusterState::Install(cluster::ClusterMap next) {
  MutexLock install(&install_mu_);
  RDKV_RETURN_IF_ERROR(Validate(*store_, next, server_id_));
  std::shared_ptr<const cluster::ClusterMap> cur = map();
  if (next.epoch <= cur->epoch) {
    return Status::InvalidArgument("cluster map epoch " + std::to_string(next.epoch) +
                                   " is not newer than this server's " +
                                   std::to_string(cur->epoch));
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
  {
    // Lost shards first, under the exclusive lock: no write to them is in flight afterwards.
    ExclusiveLock lock(this);
    for (uint32_t s = 0; s < next.shards; ++s) {
      bool had = store_->Owns(s), has = next.OwnerOf(s) == server_id_;
      if (had && !has) {
        store_->SetOwned(s, false);
        ++lost;
      }
    }
    map_ = std::make_shared<const cluster::ClusterMap>(next);
  }
  // A client that saw a lost shard's bit set before it was cleared may use that for one lease.
  if (lost > 0) std::this_thread::sleep_for(lease_);
  {
    // Gained shards under the exclusive lock too: an IMPORT (allowed only into a shard this
    // server does not own) is either done before it or refused after it.
    ExclusiveLock lock(this);
    for (uint32_t s = 0; s < next.shards; ++s) {
      if (next.OwnerOf(s) == server_id_ && !store_->Owns(s)) {
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

}  // namespace rdkv::server

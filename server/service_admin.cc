// The Service's admin requests and the map fetch: SNAPSHOT, CLUSTER_MAP, INSTALL_MAP,
// SHARD_SCAN, DROP_SHARD, SHARD_IDS, RECORD_IDS (IMPORT is a write: service_write.cc). Each decodes
// its message with common/kv/admin_wire.h; none is on the datapath.
#include <algorithm>

#include "common/kv/admin_wire.h"
#include "server/service.h"

namespace rdkv::server {

// A shard scan's cursor passes through the wire unchanged.
static_assert(kScanComplete == kv::kScanDone, "the store's end of scan is the wire's");

namespace {
// The keys a DROP_SHARD collects per scan before deleting them (a bound on its memory).
constexpr size_t kDropBatchKeyBytes = size_t{1} << 20;
}  // namespace

Status Service::RequireCluster(std::string_view what) const {
  if (cluster_ != nullptr) return Status::Ok();
  return Status::NotSupported(std::string(what) +
                              ": this server is standalone: start it with --cluster_map and "
                              "--server_id to take part in a cluster");
}

Status Service::CheckShardInRange(uint32_t shard) const {
  if (shard < store_->shard_count()) return Status::Ok();
  return Status::InvalidArgument("shard " + std::to_string(shard) +
                                 " does not exist: this server's map has shards 0.." +
                                 std::to_string(store_->shard_count() - 1));
}

bool Service::HandleSnapshot(const kv::Request& r, Exchange ex) {
  counters_.snapshots.fetch_add(1, std::memory_order_relaxed);
  Result<kv::SnapshotRequest> m = kv::DecodeSnapshot(r);
  if (!m.ok()) return AnswerNow(ex, m.status());
  if (persister_ == nullptr) {
    return AnswerNow(ex, Status::NotSupported("this server runs with durability=none: it has "
                                              "nothing on disk to snapshot"));
  }
  // A checkpoint flushes RocksDB's memtables: done on the snapshot thread.
  persister_->Snapshot(std::string(m->name), [answer = AnswerLater(ex)](Result<std::string> path) {
    answer(path.status(), 0, path.ok() ? *path : std::string());
  });
  return false;
}

bool Service::HandleMapFetch(const kv::Request& r, Exchange ex) {
  Result<kv::MapFetchRequest> m = kv::DecodeMapFetch(r);
  if (!m.ok()) return AnswerNow(ex, m.status());
  if (cluster_ == nullptr) return AnswerNow(ex, Status::Ok());  // standalone: no map, epoch 0
  std::shared_ptr<const cluster::ClusterMap> map = cluster_->map();
  return AnswerNow(ex, Status::Ok(), map->epoch, map->ToJson());
}

bool Service::HandleMapInstall(const kv::Request& r, Exchange ex) {
  Result<kv::MapInstallRequest> m = kv::DecodeMapInstall(r);
  if (!m.ok()) return AnswerNow(ex, m.status());
  if (Status s = RequireCluster("install_map"); !s.ok()) return AnswerNow(ex, s);
  Result<cluster::ClusterMap> next = cluster::ParseClusterMap(m->map_json);
  if (!next.ok()) return AnswerNow(ex, next.status());
  // A joining backup becomes in sync here only if this primary vouches for it: it forwarded
  // it every write since the pair started joining, none failed, and a whole copy was read
  // from here since (Replicator::MayBecomeInSync).
  if (replicator_ != nullptr) {
    std::shared_ptr<const cluster::ClusterMap> cur = cluster_->map();
    const uint32_t me = cluster_->server_id();
    for (uint32_t s = 0; s < next->shards && s < cur->shards; ++s) {
      if (cur->OwnerOf(s) != me) continue;
      for (uint32_t id : s < next->backups.size() ? next->backups[s] : std::vector<uint32_t>{}) {
        if (!cur->IsJoining(s, id)) continue;
        if (Status may = replicator_->MayBecomeInSync(s, id, cur->JoinedAt(s, id)); !may.ok()) {
          return AnswerNow(
              ex, Status::Unavailable("server " + std::to_string(id) +
                                      " cannot become an in-sync replica of shard " +
                                      std::to_string(s) + ": " + may.message() +
                                      "; add it again (it leaves joining and is copied again from "
                                      "empty)"));
        }
      }
    }
  }
  // A joining replica made in sync vouches for its own copy too, when asked (check-only: the
  // caller asks every new replica after the primaries, before anything changes; a real
  // install must not be refused by one replica after others took it).
  if (m->check_only && replicator_ != nullptr) {
    std::shared_ptr<const cluster::ClusterMap> cur = cluster_->map();
    const uint32_t me = cluster_->server_id();
    for (uint32_t s = 0; s < next->shards; ++s) {
      if (!next->IsBackup(s, me) || (s < cur->shards && cur->IsBackup(s, me))) continue;
      const uint64_t joined_at = s < cur->shards ? cur->JoinedAt(s, me) : 0;
      if (Status own = replicator_->MayClaimOwnCopy(s, joined_at); !own.ok()) {
        return AnswerNow(ex, Status::Unavailable("server " + std::to_string(me) +
                                                 " cannot become an in-sync replica of shard " +
                                                 std::to_string(s) + ": " + own.message() +
                                                 "; add it again (it leaves joining and is "
                                                 "copied again from empty)"));
      }
    }
  }
  // Only the checks: the caller asks every primary, then every new replica, before it changes
  // anything.
  if (m->check_only) return AnswerNow(ex, Status::Ok(), cluster_->map()->epoch);
  // An etcd cluster's map changes in etcd first (a transaction on the map's revision); the
  // other servers get it from their watch, and this one installs it now.
  if (control_ != nullptr) {
    if (Status s = control_->CommitMap(*next); !s.ok()) return AnswerNow(ex, s);
  }
  const uint64_t epoch = next->epoch;
  // Answered after the leases of the shards this server loses (ClusterState::Install).
  Status installed = cluster_->Install(std::move(next).value());
  if (!installed.ok()) {
    // The watch may have installed it a moment before: that is the same map.
    if (control_ == nullptr || cluster_->map()->epoch < epoch) return AnswerNow(ex, installed);
  }
  if (control_ != nullptr) control_->Installed(epoch);
  counters_.map_changes.fetch_add(1, std::memory_order_relaxed);
  return AnswerNow(ex, Status::Ok(), cluster_->map()->epoch);
}

bool Service::HandleShardScan(const kv::Request& r, Exchange ex) {
  Result<kv::ShardScanRequest> m = kv::DecodeShardScan(r);
  if (!m.ok()) return AnswerNow(ex, m.status());
  if (Status s = RequireCluster("shard_scan"); !s.ok()) return AnswerNow(ex, s);
  if (Status s = CheckShardInRange(m->shard); !s.ok()) return AnswerNow(ex, s);
  // A copy into a joining backup: from the shard's first slot to its end, it is what the
  // in-sync check asks for (Replicator::CopyScanStarts). A scan that names no backup (a shard
  // move's) is no such copy.
  const bool copy = m->copy_for != kv::kScanForNoReplica && replicator_ != nullptr;
  const uint64_t joined_at = copy ? cluster_->map()->JoinedAt(m->shard, m->copy_for) : 0;
  if (copy && m->cursor == 0) {
    if (Status may = replicator_->CopyScanStarts(m->shard, m->copy_for, joined_at); !may.ok()) {
      return AnswerNow(ex, may);
    }
  }
  kv::ScanAnswerBuilder answer(limits_.max_value_bytes);
  uint64_t items = 0;
  const uint64_t next = store_->ScanShard(m->shard, m->cursor, [&](const ScanItem& item) {
    if (!answer.Add(kv::ScanEntry{item.key, item.value, item.version})) return false;
    ++items;
    return true;
  });
  counters_.scan_items.fetch_add(items, std::memory_order_relaxed);
  if (copy && next == kScanComplete) replicator_->CopyScanEnded(m->shard, m->copy_for, joined_at);
  {
    const uint64_t slots = uint64_t{store_->header().bucket_count} * kv::kSlotsPerBucket;
    const double at = next == kScanComplete || slots == 0
                          ? 1.0
                          : static_cast<double>(std::min(next, slots)) / static_cast<double>(slots);
    MutexLock lock(&copies_mu_);
    scan_progress_[m->shard] = at;
  }
  return AnswerNow(ex, Status::Ok(), next, answer.body());
}

bool Service::HandleShardIds(const kv::Request& r, Exchange ex) {
  Result<kv::ShardIdsRequest> m = kv::DecodeShardIds(r);
  if (!m.ok()) return AnswerNow(ex, m.status());
  if (Status s = RequireCluster("shard_ids"); !s.ok()) return AnswerNow(ex, s);
  if (Status s = CheckShardInRange(m->shard); !s.ok()) return AnswerNow(ex, s);
  // No role check: a move's source no longer owns the shard, and a replica's ids are its
  // primary's (docs/design.md "Ids travel with copies").
  std::vector<RetryTable::Kept> kept;
  const size_t page = kv::MaxIdsPerShardIdsAnswer(limits_.max_value_bytes);
  kept.reserve(page);
  const uint64_t next = retry_table_.ScanShard(m->shard, m->cursor, page, &kept);
  std::vector<kv::AnsweredWrite> ids;
  ids.reserve(kept.size());
  for (const RetryTable::Kept& k : kept) ids.push_back({k.version, k.client_id, k.seq});
  counters_.shard_ids_sent.fetch_add(ids.size(), std::memory_order_relaxed);
  static_assert(RetryTable::kScanEnd == kv::kScanDone, "one end-of-scan cursor on the wire");
  return AnswerNow(ex, Status::Ok(), next, kv::EncodeAnsweredWrites(ids));
}

bool Service::HandleRecordIds(const kv::Request& r, Exchange ex) {
  Result<kv::RecordIdsRequest> m = kv::DecodeRecordIds(r);
  if (!m.ok()) return AnswerNow(ex, m.status());
  if (Status s = RequireCluster("record_ids"); !s.ok()) return AnswerNow(ex, s);
  if (Status s = CheckShardInRange(m->shard); !s.ok()) return AnswerNow(ex, s);
  // Part of a copy: a new copy's start (DROP_SHARD with a floor) waits until this one is quiet.
  NoteCopy(m->shard, /*begin=*/false).IgnoreError();
  // Under the ownership guard: an install that gives this server the shard waits for it.
  ClusterState::OwnerGuard owner_guard(cluster_);
  if (store_->Owns(m->shard)) {
    // IMPORT's rule: an owner has answered writes of the shard itself, and its answers are
    // what its retries must get.
    return AnswerNow(
        ex, Status::InvalidArgument("RECORD_IDS refused: this server owns shard " +
                                    std::to_string(m->shard) +
                                    " (a copy's ids go in before the new owner takes the shard)"));
  }
  static_assert(kv::kMaxShards < RetryTable::kForgotten, "no shard is the forgotten mark");
  const std::vector<kv::AnsweredWrite> ids = kv::DecodeAnsweredWrites(m->ids);
  for (const kv::AnsweredWrite& w : ids) {
    retry_table_.Record(m->shard, w.client_id, w.request_seq, {StatusCode::kOk, w.version});
  }
  counters_.copied_ids_recorded.fetch_add(ids.size(), std::memory_order_relaxed);
  return AnswerNow(ex, Status::Ok(), ids.size());
}

bool Service::HandleDropShard(const kv::Request& r, Exchange ex) {
  Result<kv::DropShardRequest> m = kv::DecodeDropShard(r);
  if (!m.ok()) return AnswerNow(ex, m.status());
  if (Status s = RequireCluster("drop_shard"); !s.ok()) return AnswerNow(ex, s);
  if (Status s = CheckShardInRange(m->shard); !s.ok()) return AnswerNow(ex, s);
  uint64_t dropped = 0;
  Status s = DropShard(m->shard, m->version_floor, &dropped);
  return AnswerNow(ex, s, s.ok() ? dropped : 0);
}

Status Service::DropShard(uint32_t shard, uint64_t version_floor, uint64_t* dropped) {
  // The shard has moved away (or is about to be copied in); its stale items go, on disk too.
  // Admitted first (backpressure, a failing disk), then under the ownership guard for the
  // whole drop: an install that gives this server the shard waits for it.
  if (persister_ != nullptr) RDKV_RETURN_IF_ERROR(persister_->Admit());
  ClusterState::OwnerGuard owner_guard(cluster_);
  if (std::shared_ptr<const cluster::ClusterMap> m = cluster_->map_held();
      m->IsBackup(shard, cluster_->server_id()) || m->IsJoining(shard, cluster_->server_id())) {
    return Status::InvalidArgument("shard " + std::to_string(shard) +
                                   " has a replica on this server; remove the replica first");
  }
  if (store_->Owns(shard)) {
    return Status::InvalidArgument("shard " + std::to_string(shard) +
                                   " is still owned by this server; move it first");
  }
  WaitForReplicaApplies();
  // A join of the shard given up (the replica removed) leaves its deletes behind; a copy that
  // follows starts with none of them.
  if (version_floor > 0) {
    // The start of a copy into this server: refused while another copy of the shard is active
    // (before anything is forgotten or dropped: the active copy's deletes and ids stay).
    RDKV_RETURN_IF_ERROR(NoteCopy(shard, /*begin=*/true));
  }
  ForgetDeletes(shard);
  // And the request ids of its writes: one kept here could be of a write that never took effect
  // where the shard is served (a forward applied here, then lost with its primary), and a copy
  // back into this server must not bring it along ("Ids travel with copies").
  retry_table_.ForgetShard(shard);
  if (version_floor > 0) {
    // A version floor from the shard's old owner: keys of the shard deleted there left no item
    // to carry their versions, and must not get them again here (CAS would be fooled).
    store_->EnsureVersionAbove(version_floor);
    if (persister_ != nullptr) persister_->EnqueueMaxVersion(store_->version_counter(), nullptr);
  }
  uint64_t cursor = 0;
  std::vector<std::string> keys;
  do {
    // Collect a batch of keys (the scan holds the store's stripes), then delete them.
    keys.clear();
    size_t key_bytes = 0;
    cursor = store_->ScanShard(shard, cursor, [&](const ScanItem& item) {
      if (!keys.empty() && key_bytes + item.key.size() > kDropBatchKeyBytes) return false;
      keys.emplace_back(item.key);
      key_bytes += item.key.size();
      return true;
    });
    for (const std::string& key : keys) {
      StripeTurn key_lock = TakeStripe(key);
      if (!store_->Delete(key).ok()) continue;
      ++*dropped;
      if (persister_ != nullptr) persister_->EnqueueDelete(key, nullptr);
    }
  } while (cursor != kScanComplete);
  // Answered once the floor and the deletes are durable: the copy that follows may be empty,
  // and nothing else would make them so before the shard is served here.
  if (persister_ != nullptr && (*dropped > 0 || version_floor > 0)) {
    Status flushed = persister_->Flush();
    if (!flushed.ok()) {
      return Status(flushed.code(), "dropped " + std::to_string(*dropped) + " item(s) of shard " +
                                        std::to_string(shard) +
                                        " but could not make that durable: " + flushed.message());
    }
  }
  // The first step of a copy into this server: a join that begins after it may be vouched for
  // by this process (Replicator::MayClaimOwnCopy).
  if (replicator_ != nullptr) replicator_->NoteDropped(shard);
  return Status::Ok();
}

void Service::WaitForReplicaApplies() {
  // A forwarded write checks its role and is applied under its key's replica stripe: one that
  // passed the check under an older map (this server still a replica of the shard) holds its
  // stripe until it is applied, and one that takes a stripe after this loop checks against the
  // map the caller has seen or a newer one.
  for (Mutex& stripe : replica_stripes_) {
    MutexLock wait(&stripe);
  }
}

Status Service::NoteCopy(uint32_t shard, bool begin) {
  const auto now = std::chrono::steady_clock::now();
  MutexLock lock(&copies_mu_);
  auto it = copy_seen_.find(shard);
  if (begin && it != copy_seen_.end() && now - it->second < kCopyQuiet) {
    auto ago = std::chrono::duration_cast<std::chrono::milliseconds>(now - it->second);
    return Status::Busy("a copy of shard " + std::to_string(shard) +
                        " into this server was active " + std::to_string(ago.count()) +
                        " ms ago (another move of it running?); a copy is refused until " +
                        std::to_string(kCopyQuiet.count()) + " ms after the last one's requests");
  }
  copy_seen_[shard] = now;
  return Status::Ok();
}

std::map<uint32_t, double> Service::ScanProgress() const {
  MutexLock lock(&copies_mu_);
  return scan_progress_;
}

}  // namespace rdkv::server

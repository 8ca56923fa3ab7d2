#include "server/control_plane.h"
#include "common/util/thread_name.h"

#include <glog/logging.h>

#include <random>

namespace rdkv::server {

using Clock = std::chrono::steady_clock;

namespace {

uint64_t RandomIncarnation() {
  std::random_device rd;
  uint64_t v = 0;
  while (v == 0) v = (uint64_t{rd()} << 32) ^ rd();
  return v;
}

ControlPlaneOptions WithIncarnation(ControlPlaneOptions o) {
  if (o.incarnation == 0) o.incarnation = RandomIncarnation();
  return o;
}

}  // namespace

ControlPlane::ControlPlane(ControlPlaneOptions options, ClusterState* cluster,
                           std::unique_ptr<etcd::EtcdClient> client)
    : options_(WithIncarnation(std::move(options))),
      cluster_(cluster),
      client_(std::move(client)) {}

std::string ControlPlane::RegistrationJson(const std::string& address, uint64_t released,
                                           uint64_t installed) const {
  return cluster::RegistrationJson({.address = address,
                                    .released = released,
                                    .epoch = installed,
                                    .incarnation = options_.incarnation,
                                    .durable = options_.durable});
}

bool ControlPlane::Admitted(const cluster::ClusterMap& map) const {
  if (!map.coordinated) return true;
  const cluster::ServerEntry* me = map.FindServer(options_.server_id);
  return me != nullptr && me->incarnation == options_.incarnation;
}

void ControlPlane::CheckAdmission() {
  if (!awaiting_admission_.load(std::memory_order_acquire)) return;
  std::shared_ptr<const cluster::ClusterMap> map = cluster_->map();
  if (!Admitted(*map)) return;
  awaiting_admission_.store(false, std::memory_order_release);
  const bool have_lease = LeaseHeld();
  LOG(INFO) << "control plane: map epoch " << map->epoch << " admits this server (incarnation "
            << options_.incarnation << ")" << (have_lease ? "; serving" : "");
  // Without a lease the fence thread unfences once it has registered again.
  if (!have_lease) return;
  cluster_->Unfence();
  // The fence thread may have fenced and dropped the lease between the check and the
  // Unfence (which can wait for an install): then it must stay fenced.
  if (!LeaseHeld()) {
    cluster_->Fence(
        "its etcd lease could not be renewed in time (etcd unreachable or this "
        "server cut off); it registers again once etcd answers");
  }
}

bool ControlPlane::LeaseHeld() const {
  MutexLock lock(&reg_mu_);
  if (lease_ == nullptr || lease_->lost()) return false;
  return Clock::now() < lease_->valid_until() - options_.ownership_lease - options_.fence_margin;
}

Result<std::unique_ptr<ControlPlane>> ControlPlane::Start(ControlPlaneOptions options,
                                                          ClusterState* cluster,
                                                          int64_t map_revision) {
  RDKV_ASSIGN_OR_RETURN(std::unique_ptr<etcd::EtcdClient> client,
                        etcd::EtcdClient::Create(options.etcd));
  std::unique_ptr<ControlPlane> cp(
      new ControlPlane(std::move(options), cluster, std::move(client)));
  const uint64_t epoch = cluster->map()->epoch;
  {
    MutexLock lock(&cp->reg_mu_);
    cp->released_ = epoch;
    cp->installed_ = epoch;
  }
  RDKV_RETURN_IF_ERROR(cp->Register());
  {
    std::shared_ptr<const cluster::ClusterMap> map = cluster->map();
    if (!cp->Admitted(*map)) {
      const cluster::ServerEntry* me = map->FindServer(cp->options_.server_id);
      cp->awaiting_admission_.store(true, std::memory_order_release);
      cluster->Fence("this server (incarnation " + std::to_string(cp->options_.incarnation) +
                     ") waits for the failover coordinator to admit it after a restart");
      LOG(WARNING) << "control plane: the map (epoch " << map->epoch
                   << ") is managed by the failover coordinator and admits incarnation "
                   << (me != nullptr ? me->incarnation : 0) << " of server "
                   << cp->options_.server_id << ", not this process's " << cp->options_.incarnation
                   << ": serving nothing until a map admits it (a restart may have lost data; "
                      "the coordinator decides which roles this server keeps)";
    }
  }
  ControlPlane* self = cp.get();
  cluster->set_control_hooks(
      [self](uint32_t old_primary, uint64_t e) { return self->WaitReleased(old_primary, e); },
      [self](uint64_t e) {
        uint64_t installed = 0;
        {
          MutexLock lock(&self->reg_mu_);
          installed = self->installed_;
        }
        self->PublishEpochs(e, installed);
      });
  RDKV_RETURN_IF_ERROR(cp->StartWatch(map_revision + 1));
  cp->apply_thread_ = std::thread([self] {
    rdkv::util::NameThisThread("rdkv-map-apply");
    self->ApplyLoop();
  });
  cp->fence_thread_ = std::thread([self] {
    rdkv::util::NameThisThread("rdkv-fence");
    self->FenceLoop();
  });
  cp->publish_thread_ = std::thread([self] {
    rdkv::util::NameThisThread("rdkv-etcd-publish");
    self->PublishLoop();
  });
  LOG(INFO) << "control plane: server " << cp->options_.server_id << " registered in etcd ("
            << cp->client_->current_endpoint() << ") for cluster '" << cp->options_.cluster_name
            << "', lease TTL " << cp->options_.lease_ttl_seconds << " s; watching "
            << MapKey(cp->options_.cluster_name) << " from revision " << map_revision + 1;
  return cp;
}

ControlPlane::~ControlPlane() { Stop(); }

void ControlPlane::Stop() {
  if (stopping_.exchange(true)) return;
  {
    MutexLock lock(&apply_mu_);
    apply_stop_ = true;
  }
  apply_cv_.SignalAll();
  if (apply_thread_.joinable()) apply_thread_.join();
  if (fence_thread_.joinable()) fence_thread_.join();
  if (publish_thread_.joinable()) publish_thread_.join();
  watch_.reset();
  // Leaving: stop serving, let every client's ownership lease run out, then drop the
  // registration (a server waiting to take our shards may then do so at once).
  cluster_->Fence("the server is stopping");
  std::this_thread::sleep_for(options_.ownership_lease);
  std::shared_ptr<etcd::LeaseKeeper> lease;
  {
    MutexLock lock(&reg_mu_);
    lease = std::move(lease_);
  }
  if (lease != nullptr) client_->LeaseRevoke(lease->lease_id()).IgnoreError();
}

Status ControlPlane::Register() {
  std::shared_ptr<const cluster::ClusterMap> map = cluster_->map();
  const cluster::ServerEntry* me = map->FindServer(options_.server_id);
  if (me == nullptr) {
    return Status::InvalidArgument("server " + std::to_string(options_.server_id) +
                                   " is not in the cluster map");
  }
  etcd::LeaseKeeperOptions lo;
  lo.ttl_seconds = options_.lease_ttl_seconds;
  // Never revoked when dropped after a fence: it must expire at etcd by itself, at least one
  // ownership lease after the bits were cleared (docs/design.md "Control plane").
  lo.revoke_on_close = false;
  RDKV_ASSIGN_OR_RETURN(std::unique_ptr<etcd::LeaseKeeper> lease,
                        etcd::LeaseKeeper::Start(options_.etcd, lo, [](const Status&) {}));
  MutexLock publishing(&publish_mu_);
  uint64_t released = 0, installed = 0;
  {
    MutexLock lock(&reg_mu_);
    released = released_;
    installed = installed_;
  }
  // reg_mu_ is not held across the etcd calls (the fence check must never wait for one).
  // Written only over the lease it replaces, read just before: a write of an older
  // registration of this process that etcd applies late fails its own comparison, so it
  // cannot bind the key to a lease nobody renews (the key would vanish while this server
  // serves, and the coordinator fail it over).
  const std::string key = ServerKey(options_.cluster_name, options_.server_id);
  const std::string json = RegistrationJson(me->address, released, installed);
  for (int attempt = 1;; ++attempt) {
    RDKV_ASSIGN_OR_RETURN(etcd::GetResult cur, client_->Get(key));
    RDKV_ASSIGN_OR_RETURN(etcd::PutIfResult put, client_->PutIfLease(key, json, lease->lease_id(),
                                                                     cur.kv ? cur.kv->lease : 0));
    if (put.succeeded) break;
    if (attempt == 3) {
      return Status::Busy("the registration " + key +
                          " kept changing while this server registered (is another process "
                          "running with --server_id=" +
                          std::to_string(options_.server_id) + "?)");
    }
  }
  MutexLock lock(&reg_mu_);
  lease_ = std::move(lease);
  publish_pending_.store(false, std::memory_order_release);  // this put carried the epochs
  return Status::Ok();
}

void ControlPlane::RaiseEpochs(uint64_t released, uint64_t installed) {
  MutexLock lock(&reg_mu_);
  released_ = std::max(released_, released);
  installed_ = std::max(installed_, installed);
}

void ControlPlane::PublishEpochs(uint64_t released, uint64_t installed) {
  // Raised first, so that a call that waits below for another's write still gets its epochs
  // written by whichever write comes next.
  RaiseEpochs(released, installed);
  MutexLock publishing(&publish_mu_);
  std::shared_ptr<etcd::LeaseKeeper> lease;
  {
    MutexLock lock(&reg_mu_);
    released = released_;
    installed = installed_;
    lease = lease_;
  }
  if (lease == nullptr || lease->lost()) return;  // published when registering again
  std::shared_ptr<const cluster::ClusterMap> map = cluster_->map();
  const cluster::ServerEntry* me = map->FindServer(options_.server_id);
  // Only over this server's own lease (see Register): a late write of it cannot land on a
  // registration made since under a new lease.
  Result<etcd::PutIfResult> put = client_->PutIfLease(
      ServerKey(options_.cluster_name, options_.server_id),
      RegistrationJson(me != nullptr ? me->address : std::string(), released, installed),
      lease->lease_id(), lease->lease_id());
  const bool published = put.ok() && put->succeeded;
  // A failed publication is retried by PublishLoop: another server may be waiting for it.
  publish_pending_.store(!published, std::memory_order_release);
  if (!put.ok()) {
    LOG_EVERY_N(WARNING, 20) << "control plane: cannot publish released/installed epochs "
                             << released << "/" << installed
                             << " in etcd (retrying): " << put.status().ToString();
  } else if (!put->succeeded) {
    // Gone (the lease expired at etcd, or was revoked: the fence follows) or under another
    // lease (another process with this server id).
    LOG_EVERY_N(ERROR, 20) << "control plane: the registration of server " << options_.server_id
                           << " is "
                           << (put->current ? "under lease " + std::to_string(put->current->lease)
                                            : std::string("gone"))
                           << ", not under this process's lease " << lease->lease_id()
                           << "; epochs " << released << "/" << installed
                           << " not published (retrying)";
  }
}

Status ControlPlane::CommitMap(const cluster::ClusterMap& next_in) {
  MutexLock lock(&commit_mu_);
  cluster::ClusterMap next = next_in;
  next.NormalizeReplicas();
  Result<EtcdMap> cur = LoadMap(*client_, options_.cluster_name);
  if (!cur.ok()) {
    return Status(cur.status().code(),
                  "map epoch " + std::to_string(next.epoch) +
                      " not installed: map changes wait for etcd: " + cur.status().message());
  }
  // Another writer (the coordinator, another admin command) got there first: kBusy, like a lost
  // transaction below, so that the change is made again from the newest map
  // (client::AgainWhileTheMapMoves).
  if (cur->map.epoch > next.epoch) {
    return Status::Busy("etcd already holds map epoch " + std::to_string(cur->map.epoch) +
                        ", newer than " + std::to_string(next.epoch) +
                        " (another writer changed the map); start again from the newest map");
  }
  if (cur->map.epoch == next.epoch) {
    if (cur->map.ToJson() == next.ToJson()) return Status::Ok();  // committed by another server
    return Status::Busy("etcd holds a different map of epoch " + std::to_string(next.epoch) +
                        " (another writer changed the map); start again from the newest map");
  }
  Result<etcd::PutIfResult> put =
      client_->PutIf(MapKey(options_.cluster_name), next.ToJson(), cur->mod_revision);
  if (!put.ok()) {
    return Status(put.status().code(), "map epoch " + std::to_string(next.epoch) +
                                           " not committed to etcd (map changes wait for etcd): " +
                                           put.status().message());
  }
  if (!put->succeeded) {
    return Status::Busy("the cluster map in etcd changed while epoch " +
                        std::to_string(next.epoch) +
                        " was being committed (another writer); start again from the newest map");
  }
  LOG(INFO) << "control plane: committed map epoch " << next.epoch << " to etcd (revision "
            << put->revision << ")";
  return Status::Ok();
}

Status ControlPlane::WaitReleased(uint32_t old_primary, uint64_t epoch) {
  // Every other server, not only `old_primary`: a server whose watch skipped an epoch does not
  // know every primary the shard had in between (docs/design.md "Control plane").
  Clock::time_point next_log = Clock::now() + std::chrono::seconds(2);
  while (!stopping_) {
    Result<etcd::RangeResult> got = client_->GetPrefix(ServersPrefix(options_.cluster_name));
    std::string behind;
    if (got.ok()) {
      behind = cluster::NotReleased(got->kvs, ServerKey(options_.cluster_name, options_.server_id),
                                    epoch);
      // A server with no registration has let its lease expire: it has fenced itself.
      if (behind.empty()) return Status::Ok();
    }
    if (Clock::now() >= next_log) {
      LOG(WARNING) << "control plane: map epoch " << epoch << ": taking over the shards of server "
                   << old_primary << " waits until every server has released them: "
                   << (got.ok() ? "not yet " + behind : "etcd: " + got.status().ToString());
      next_log = Clock::now() + std::chrono::seconds(5);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return Status::Unavailable("the server is stopping");
}

Status ControlPlane::StartWatch(int64_t from_revision) {
  etcd::WatchOptions wo;
  wo.key = MapKey(options_.cluster_name);
  wo.start_revision = from_revision;
  RDKV_ASSIGN_OR_RETURN(
      watch_, etcd::Watch::Start(options_.etcd, wo,
                                 [this](const Result<etcd::WatchEvent>& e) { OnMapEvent(e); }));
  return Status::Ok();
}

void ControlPlane::OnMapEvent(const Result<etcd::WatchEvent>& e) {
  MutexLock lock(&apply_mu_);
  if (!e.ok()) {
    LOG(WARNING) << "control plane: the map watch ended (" << e.status().ToString()
                 << "); reading the map again";
    rewatch_ = true;
  } else if (e->type == etcd::WatchEvent::Type::kDelete) {
    LOG(ERROR) << "control plane: the cluster map was deleted from etcd; keeping map epoch "
               << cluster_->map()->epoch;
    return;
  } else {
    pending_map_ = e->kv.value;
  }
  apply_cv_.SignalAll();
}

void ControlPlane::ApplyLoop() {
  for (;;) {
    std::string json;
    bool rewatch = false;
    {
      MutexLock lock(&apply_mu_);
      while (!apply_stop_ && pending_map_.empty() && !rewatch_) apply_cv_.Wait(&apply_mu_);
      if (apply_stop_) return;
      json.swap(pending_map_);
      rewatch = rewatch_;
      rewatch_ = false;
    }
    if (rewatch) {
      watch_.reset();
      Result<EtcdMap> m = LoadMap(*client_, options_.cluster_name);
      if (!m.ok()) {
        LOG(WARNING) << "control plane: reading the map: " << m.status().ToString();
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        MutexLock lock(&apply_mu_);
        rewatch_ = true;
        continue;
      }
      json = m->map.ToJson();
      Status w = StartWatch(m->revision + 1);
      if (!w.ok()) LOG(ERROR) << "control plane: watch: " << w.ToString();
    }
    if (json.empty()) continue;
    Result<cluster::ClusterMap> next = cluster::ParseClusterMap(json);
    if (!next.ok()) {
      LOG(ERROR) << "control plane: the map in etcd does not parse: " << next.status().ToString();
      continue;
    }
    const uint64_t epoch = next->epoch;
    if (epoch <= cluster_->map()->epoch) continue;  // installed already (INSTALL_MAP)
    Status s = cluster_->Install(std::move(next).value());
    if (!s.ok()) {
      if (epoch > cluster_->map()->epoch) {
        LOG(ERROR) << "control plane: installing map epoch " << epoch << ": " << s.ToString();
      }
      continue;
    }
    PublishEpochs(epoch, epoch);
    CheckAdmission();
  }
}

bool ControlPlane::ResumeAfterFence() {
  Result<EtcdMap> m = LoadMap(*client_, options_.cluster_name);
  if (!m.ok()) {
    if (Clock::now() >= next_resume_log_) {
      LOG(WARNING) << "control plane: still fenced: reading the map from etcd: "
                   << m.status().ToString();
      next_resume_log_ = Clock::now() + std::chrono::seconds(5);
    }
    return false;
  }
  if (m->map.epoch > cluster_->map()->epoch) {
    Status s = cluster_->Install(m->map);
    if (!s.ok() && cluster_->map()->epoch < m->map.epoch) {
      // Serving the old map's shards again could serve a shard promoted elsewhere.
      if (Clock::now() >= next_resume_log_) {
        LOG(WARNING) << "control plane: still fenced: installing map epoch " << m->map.epoch
                     << " failed: " << s.ToString();
        next_resume_log_ = Clock::now() + std::chrono::seconds(5);
      }
      return false;
    }
  }
  // The install may have waited (its gain gate) past the new lease's own deadline: then
  // stay fenced; the fence check fences and the loop registers again.
  if (!LeaseHeld()) return false;
  if (!awaiting_admission_.load(std::memory_order_acquire)) cluster_->Unfence();
  // The epochs go out on the publisher thread: this one holds a lease again and must not
  // wait for etcd.
  RequestPublish(cluster_->map()->epoch, cluster_->map()->epoch);
  CheckAdmission();
  return true;
}

void ControlPlane::FenceLoop() {
  Clock::time_point next_attempt{};
  Clock::time_point next_admission_log = Clock::now() + std::chrono::seconds(5);
  // Fenced by this loop and registered again, but not yet back on the map: the new lease is
  // held, so the pass below that checks it must also go on resuming, or the server would stay
  // fenced for good after one failed map read.
  bool resuming = false;
  while (!stopping_) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    std::shared_ptr<etcd::LeaseKeeper> lease;
    {
      MutexLock lock(&reg_mu_);
      lease = lease_;
    }
    if (lease != nullptr) {
      const Clock::time_point fence_at =
          lease->valid_until() - options_.ownership_lease - options_.fence_margin;
      if (lease->lost() || Clock::now() >= fence_at) {
        cluster_->Fence(
            "its etcd lease could not be renewed in time (etcd unreachable or this "
            "server cut off); it registers again once etcd answers");
        MutexLock lock(&reg_mu_);
        lease_.reset();  // not revoked: it expires at etcd by itself
        continue;
      }
      if (resuming) {
        if (Clock::now() < next_attempt) continue;
        next_attempt = Clock::now() + std::chrono::milliseconds(500);
        resuming = !ResumeAfterFence();
        continue;
      }
      if (awaiting_admission_.load(std::memory_order_acquire)) {
        CheckAdmission();
        if (awaiting_admission_.load(std::memory_order_acquire) &&
            Clock::now() >= next_admission_log) {
          LOG(WARNING) << "control plane: still waiting for the failover coordinator to admit "
                          "incarnation "
                       << options_.incarnation << " (map epoch " << cluster_->map()->epoch
                       << "); is a kvcoord running for cluster '" << options_.cluster_name << "'?";
          next_admission_log = Clock::now() + std::chrono::seconds(10);
        }
      }
      continue;
    }
    // Fenced without a lease: register again (a new lease), read the map, then serve what it
    // says (once admitted).
    if (Clock::now() < next_attempt) continue;
    next_attempt = Clock::now() + std::chrono::milliseconds(500);
    Status r = Register();
    if (!r.ok()) continue;
    resuming = !ResumeAfterFence();
  }
}

void ControlPlane::RequestPublish(uint64_t released, uint64_t installed) {
  RaiseEpochs(released, installed);
  publish_pending_.store(true, std::memory_order_release);
}

void ControlPlane::PublishLoop() {
  while (!stopping_) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (!publish_pending_.load(std::memory_order_acquire)) continue;
    PublishEpochs(0, 0);
    // Failing: not again at once (etcd down, or the key is not ours).
    if (publish_pending_.load(std::memory_order_acquire)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
}

}  // namespace rdkv::server

// A kvserver's side of the control plane in etcd (docs/design.md "Control plane"): the cluster
// map lives at /rdkv/<cluster>/map, each server registers at /rdkv/<cluster>/servers/<id>
// under an etcd lease it keeps alive, and every server watches the map and installs each new
// epoch.
//
//   * Map: LoadMap reads it at start. A map change is an etcd transaction that compares the
//     map key's revision (CommitMap: INSTALL_MAP on a server of an etcd cluster commits there
//     first), so two writers can never both change it; the watch then brings it to every
//     server (an applier thread installs epochs in order).
//   * Registration: {"address", "released", "epoch", "incarnation", "durable"}: `released` is the
//   newest epoch whose lost
//     shards this server has let go (bits clear, one lease waited), `epoch` the newest it has
//     installed completely. A server that gains a shard from another primary waits until that
//     primary's `released` reaches the new epoch or its registration is gone (GainGate).
//   * Fencing: the server stops serving (ClusterState::Fence) once its etcd lease might have
//     expired within one ownership lease: at LeaseKeeper::valid_until() - ownership_lease -
//     margin. It then tries to register again with a new lease, reads the map, installs it if
//     newer and serves again (Unfence).
//   * Admission (docs/design.md "Failover"): each process registers a fresh random
//     `incarnation`. In a map the failover coordinator manages (`coordinated`), a server whose
//     map entry holds another incarnation (it restarted) starts fenced and serves nothing until
//     a map admits its incarnation: the coordinator first takes away whatever the restart may
//     have lost (without `durable` data: every in-sync role).
//
// Thread-safety: all public methods are thread-safe. Ownership: borrows the ClusterState (it
// must outlive the ControlPlane).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "common/cluster/cluster_map.h"
#include "common/cluster/etcd_map.h"
#include "common/etcd/etcd_client.h"
#include "common/etcd/lease_keeper.h"
#include "common/etcd/watch.h"
#include "common/util/mutex.h"
#include "rdkv/status.h"
#include "server/cluster_state.h"

namespace rdkv::server {

struct ControlPlaneOptions {
  etcd::EtcdOptions etcd;
  std::string cluster_name = "rdkv";  // keys under /rdkv/<cluster_name>/
  uint32_t server_id = 0;
  int64_t lease_ttl_seconds = 2;
  std::chrono::milliseconds ownership_lease{100};
  // Fencing starts this much before the conservative end of the etcd lease, on top of one
  // ownership lease (scheduling slack).
  std::chrono::milliseconds fence_margin{100};
  // This process's incarnation (0: a random one is drawn) and whether its data survives a
  // restart with every acknowledged write (durability=sync).
  uint64_t incarnation = 0;
  bool durable = false;
};

using cluster::EtcdMap;
using cluster::ImportMap;
using cluster::LoadMap;
using cluster::MapKey;
using cluster::ServerKey;
using cluster::ServersPrefix;

class ControlPlane {
 public:
  // Registers this server (a new lease), sets the ClusterState's hooks and starts the watch
  // from `map_revision` + 1 (the revision the starting map was read at).
  static Result<std::unique_ptr<ControlPlane>> Start(ControlPlaneOptions options,
                                                     ClusterState* cluster, int64_t map_revision);
  ~ControlPlane();  // Stop()
  // Stops the threads, fences the server (bits clear), waits one ownership lease and revokes
  // the lease (the registration goes). Idempotent; call before the listener stops, so a
  // worker blocked in an install (the gain gate) is released.
  void Stop();
  ControlPlane(const ControlPlane&) = delete;
  ControlPlane& operator=(const ControlPlane&) = delete;

  // INSTALL_MAP of an etcd cluster: makes `next` the map in etcd unless it is there already.
  // kBusy when another writer changed the map first (etcd holds a newer epoch, a different
  // map of this epoch, or the transaction lost): start again from the newest map; kUnavailable /
  // kTimedOut while etcd cannot be reached ("map changes wait for etcd").
  Status CommitMap(const cluster::ClusterMap& next) EXCLUDES(commit_mu_);

  // The gate of ClusterState::Install (see the header comment).
  Status WaitReleased(uint32_t old_primary, uint64_t epoch);
  // After an install by INSTALL_MAP: publishes `epoch` as released and installed.
  void Installed(uint64_t epoch) { PublishEpochs(epoch, epoch); }

  uint64_t incarnation() const { return options_.incarnation; }
  // True while this server waits for the coordinator to admit its incarnation (fenced).
  bool awaiting_admission() const { return awaiting_admission_.load(std::memory_order_acquire); }

 private:
  ControlPlane(ControlPlaneOptions options, ClusterState* cluster,
               std::unique_ptr<etcd::EtcdClient> client);
  Status Register() EXCLUDES(publish_mu_, reg_mu_);
  void PublishEpochs(uint64_t released, uint64_t installed) EXCLUDES(publish_mu_, reg_mu_);
  // Retries a publication that failed (publish_pending_), on a thread of its own: the fence
  // thread never waits for etcd while it holds a lease.
  void PublishLoop() EXCLUDES(publish_mu_, reg_mu_);
  // The epochs to publish become at least these (never lowered).
  void RaiseEpochs(uint64_t released, uint64_t installed) EXCLUDES(reg_mu_);
  // Raises the epochs to publish and leaves the write to PublishLoop (no etcd call here).
  void RequestPublish(uint64_t released, uint64_t installed) EXCLUDES(reg_mu_);
  // True while the lease is held, not lost and its fence deadline has not passed.
  bool LeaseHeld() const EXCLUDES(reg_mu_);
  void OnMapEvent(const Result<etcd::WatchEvent>& e) EXCLUDES(apply_mu_);
  void ApplyLoop() EXCLUDES(apply_mu_);
  void FenceLoop() EXCLUDES(reg_mu_);
  // After a fence and a new registration: reads the map, installs it if newer and unfences
  // (unless awaiting admission). False when any step failed: the caller tries again while it
  // holds the new lease (the server stays fenced meanwhile, and says why).
  bool ResumeAfterFence() EXCLUDES(reg_mu_);
  Status StartWatch(int64_t from_revision);
  bool Admitted(const cluster::ClusterMap& map) const;
  // This server's registration value (the one format both Register and PublishEpochs write;
  // coordinator/plan.h ParseRegistration reads it).
  std::string RegistrationJson(const std::string& address, uint64_t released,
                               uint64_t installed) const;
  // Ends the wait for admission once the current map admits this incarnation.
  void CheckAdmission();

  const ControlPlaneOptions options_;
  ClusterState* const cluster_;
  const std::unique_ptr<etcd::EtcdClient> client_;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> awaiting_admission_{false};
  std::chrono::steady_clock::time_point
      next_resume_log_{};  // fence thread: ResumeAfterFence's warnings, 1 per 5 s

  // One registration write at a time (Register, PublishEpochs): a slow write of older epochs
  // or of a dropped lease cannot land after a newer one from this process. Held across the
  // etcd call; the fence thread takes it only while it holds no lease (fenced).
  Mutex publish_mu_ ACQUIRED_BEFORE(reg_mu_);
  mutable Mutex reg_mu_;
  // Copied out under reg_mu_; no lock is held across an etcd call.
  std::shared_ptr<etcd::LeaseKeeper> lease_ GUARDED_BY(reg_mu_);
  std::atomic<bool> publish_pending_{false};
  uint64_t released_ GUARDED_BY(reg_mu_) = 0;
  uint64_t installed_ GUARDED_BY(reg_mu_) = 0;

  Mutex commit_mu_;  // one CommitMap at a time on this server

  Mutex apply_mu_;
  CondVar apply_cv_;
  std::string pending_map_ GUARDED_BY(apply_mu_);  // the newest map JSON not yet installed
  bool apply_stop_ GUARDED_BY(apply_mu_) = false;
  bool rewatch_ GUARDED_BY(apply_mu_) = false;  // the watch ended (compaction): start again

  std::unique_ptr<etcd::Watch> watch_;  // touched by Start, the apply thread and ~ControlPlane
  std::thread apply_thread_;
  std::thread fence_thread_;
  std::thread publish_thread_;
};

}  // namespace rdkv::server

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
// Lock order: install_mu_, then turnstile_, then mu_, then snapshot_mu_ (an Install holds
// install_mu_ throughout and takes the turnstile and mu_ inside it; a write takes the turnstile
// and lets it go before it takes mu_; snapshot_mu_ guards only a pointer copy).
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
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

  // OwnerGuard's non-blocking form, for a write on the transport's receiving thread (which must
  // never wait): held() is false when the lock could not be taken at once (an install holds or
  // waits for it); then the caller must leave at once and touch nothing the lock guards. (For
  // the analysis the lock is held in both cases, which holds only on the held() path: keep the
  // other path to an immediate return.)
  class SCOPED_CAPABILITY OwnerTryGuard {
   public:
    explicit OwnerTryGuard(const ClusterState* state)
        ACQUIRE_SHARED(state->mu_) NO_THREAD_SAFETY_ANALYSIS : mu_(state ? &state->mu_ : nullptr) {
      if (mu_ == nullptr) {
        held_ = true;
        return;
      }
      // Through the turnstile first, as OwnerGuard: the shared lock alone would still be
      // granted while an install waits for it (glibc prefers readers).
      if (!state->turnstile_.TryLock()) return;
      state->turnstile_.Unlock();
      held_ = locked_ = mu_->ReaderTryLock();
    }
    ~OwnerTryGuard() RELEASE() NO_THREAD_SAFETY_ANALYSIS {
      if (locked_) mu_->ReaderUnlock();
    }
    OwnerTryGuard(const OwnerTryGuard&) = delete;
    OwnerTryGuard& operator=(const OwnerTryGuard&) = delete;
    bool held() const { return held_; }

   private:
    SharedMutex* const mu_;
    bool held_ = false;
    bool locked_ = false;
  };
  // For a function called under an OwnerGuard (or a held OwnerTryGuard).
  void AssertOwnerHeld() const ASSERT_SHARED_CAPABILITY(mu_) {}

  // A write's hold on ownership that outlives the guard it was taken under and may be given
  // back on another thread: an asynchronous replicated write keeps it from its ownership check
  // until its backups have answered and it is applied (docs/design.md "No thread waits for the
  // backups"). Whatever takes the ownership lock exclusively (an install, Unfence) waits, once
  // it holds the lock, until every hold is given back, as it waits for OwnerGuards. Movable;
  // gives the hold back when destroyed or on Release(). Empty when standalone.
  class WriteHold {
   public:
    WriteHold() = default;
    WriteHold(WriteHold&& o) noexcept : state_(o.state_) { o.state_ = nullptr; }
    WriteHold& operator=(WriteHold&& o) noexcept {
      if (this != &o) {
        Release();
        state_ = o.state_;
        o.state_ = nullptr;
      }
      return *this;
    }
    WriteHold(const WriteHold&) = delete;
    WriteHold& operator=(const WriteHold&) = delete;
    ~WriteHold() { Release(); }
    void Release();

   private:
    friend class ClusterState;
    explicit WriteHold(const ClusterState* state) : state_(state) {}
    const ClusterState* state_ = nullptr;
  };
  // Takes a hold; call under an OwnerGuard (or a held OwnerTryGuard), after the ownership check.
  WriteHold HoldForWrite() const REQUIRES_SHARED(mu_) EXCLUDES(holds_mu_);
  // Holds given out and not given back (tests).
  uint64_t write_holds() const EXCLUDES(holds_mu_);

  // OK when this server owns the key's shard; else kWrongOwner naming the owner and the epoch
  // (and *epoch set). Call holding an OwnerGuard.
  Status CheckOwner(std::string_view key, uint64_t* epoch) const REQUIRES_SHARED(mu_);

  // The map, for a caller that holds an OwnerGuard (a write reading the shard's replicas).
  std::shared_ptr<const cluster::ClusterMap> map_held() const REQUIRES_SHARED(mu_) { return map_; }
  // A backup's check of a forwarded write (REPLICATE) for `shard` from server `sender` under
  // the sender's map `epoch` (docs/design.md "Replication"): OK when, in this server's map,
  // `sender` is the shard's primary and this server an in-sync or joining backup of it, at any
  // epoch (a map change for another shard must not stall this one). Otherwise kBusy when
  // `epoch` is newer than this server's (it has not installed that map yet: the primary
  // retries), else kWrongOwner (the sender is no longer the primary: fenced). Reads the map
  // without waiting for an install in progress (a primary's install may be waiting for writes
  // that wait for this answer).
  // *joining: whether this server is still joining the shard in the map the check used.
  Status CheckReplica(uint32_t shard, uint64_t epoch, uint32_t sender, bool* joining) const
      EXCLUDES(snapshot_mu_);

  // The current map. Never waits for an install in progress.
  std::shared_ptr<const cluster::ClusterMap> map() const EXCLUDES(snapshot_mu_);
  // Adopts a newer map: kInvalidArgument when its epoch is not higher, its shard count differs
  // or it lacks this server. Saves it durably first (when a saved-map path was given; kIoError,
  // with nothing changed, when that fails), then changes ownership. Blocks for one lease when
  // shards are lost.
  Status Install(cluster::ClusterMap map) EXCLUDES(install_mu_, turnstile_, mu_);
  uint32_t server_id() const { return server_id_; }

  // --- the control plane's hooks (server/control_plane.h; docs/design.md "Control plane") ---
  // Called by Install before this server takes shards whose primary in the current map is
  // another server: returns once `old_primary` can no longer serve them under `epoch` (it has
  // released them, or it is gone). An error stops the install before anything changes.
  using GainGate = std::function<Status(uint32_t old_primary, uint64_t epoch)>;
  // Called by Install once the shards this server loses are released (bits clear, one lease
  // waited): before it waits on the gate for the shards it gains.
  using ReleasedHook = std::function<void(uint64_t epoch)>;
  // Set before the first Install; not thread-safe with Install.
  void set_control_hooks(GainGate gate, ReleasedHook released) {
    gain_gate_ = std::move(gate);
    released_hook_ = std::move(released);
  }
  // Called by Install after the gate and before this server sets the bits of the shards it
  // takes over as a promoted backup (previous primary another server), with the new map: the
  // Service resends the writes it recently applied as a backup of them to the new backups
  // (docs/design.md "Replication", promotion). Set before the first Install.
  using ResyncHook =
      std::function<void(const cluster::ClusterMap& next, const std::vector<uint32_t>& shards)>;
  void set_resync_hook(ResyncHook hook) { resync_hook_ = std::move(hook); }
  // Called by Install with each new map under the exclusive ownership lock, just before it
  // becomes the current one: no write runs under the older map any more, none under this one
  // yet (the Replicator starts its joining pairs' records here), with the map it replaces
  // (the one the server started with, the first time). Not called for the map the server
  // starts with. Set before the first Install.
  using MapHook =
      std::function<void(const cluster::ClusterMap& previous, const cluster::ClusterMap& next)>;
  void set_map_hook(MapHook hook) { map_hook_ = std::move(hook); }
  // Self-fencing: clears every ownership bit at once (without waiting for writes in flight) and
  // refuses writes (kUnavailable naming `why`) until Unfence. Installs meanwhile change the map
  // but set no bit. Idempotent.
  void Fence(const std::string& why) EXCLUDES(fence_mu_);
  // Sets the bits of the shards the current map gives this server again.
  void Unfence() EXCLUDES(install_mu_, turnstile_, mu_);
  bool fenced() const { return fenced_.load(std::memory_order_acquire); }
  // Time this server's writes (of every shard) spent held off by installs and Unfence taking
  // the ownership lock exclusively, and how many takings (an install takes it twice: lost
  // shards, then gained ones) (for /metrics).
  uint64_t write_pause_ns() const { return write_pause_ns_.load(std::memory_order_relaxed); }
  uint64_t write_pauses() const { return write_pauses_.load(std::memory_order_relaxed); }
  // Times this server fenced itself (a Fence while not fenced), for /metrics.
  uint64_t fences() const { return fences_.load(std::memory_order_relaxed); }

 private:
  // mu_ exclusively for its scope, through the turnstile: writes arriving meanwhile wait
  // behind it.
  // Writes of every shard wait from its first line to its release: how long is counted
  // (write_pause_ns(), and a log line past kLoggedWritePause).
  class SCOPED_CAPABILITY ExclusiveLock {
   public:
    explicit ExclusiveLock(ClusterState* state) ACQUIRE(state->mu_)
        : state_(state), start_(std::chrono::steady_clock::now()) {
      MutexLock turnstile(&state->turnstile_);
      state->mu_.Lock();
      state->mu_.AssertHeld();
      state->WaitForWriteHolds();  // no new one can be taken now: they need mu_ shared
      drained_ = std::chrono::steady_clock::now();
    }
    ~ExclusiveLock() RELEASE() {
      state_->mu_.Unlock();
      state_->NoteWritePause(start_, drained_, std::chrono::steady_clock::now());
    }
    ExclusiveLock(const ExclusiveLock&) = delete;
    ExclusiveLock& operator=(const ExclusiveLock&) = delete;

   private:
    ClusterState* const state_;
    const std::chrono::steady_clock::time_point start_;
    std::chrono::steady_clock::time_point drained_;
  };
  static constexpr std::chrono::milliseconds kLoggedWritePause{5};
  void NoteWritePause(std::chrono::steady_clock::time_point start,
                      std::chrono::steady_clock::time_point drained,
                      std::chrono::steady_clock::time_point end);

  ClusterState(Store* store, std::shared_ptr<const cluster::ClusterMap> map, uint32_t id,
               std::chrono::milliseconds lease, std::string saved_map_path)
      : store_(store),
        map_(map),
        map_snapshot_(std::move(map)),
        server_id_(id),
        lease_(lease),
        saved_map_path_(std::move(saved_map_path)) {}

  Store* store_;
  // Lock order: install_mu_, turnstile_, mu_ (ACQUIRED_BEFORE: the tsa preset checks it).
  Mutex install_mu_ ACQUIRED_BEFORE(turnstile_);  // one Install at a time
  // Held by an install while it waits for mu_ exclusively; writes pass through it.
  mutable Mutex turnstile_ ACQUIRED_BEFORE(mu_);
  mutable SharedMutex mu_ ACQUIRED_BEFORE(snapshot_mu_, fence_mu_,
                                          holds_mu_);  // exclusive while ownership changes
  std::shared_ptr<const cluster::ClusterMap> map_ GUARDED_BY(mu_);
  // The same map, for readers that must not queue behind an install (CheckReplica).
  mutable Mutex snapshot_mu_;
  std::shared_ptr<const cluster::ClusterMap> map_snapshot_ GUARDED_BY(snapshot_mu_);
  const uint32_t server_id_;
  const std::chrono::milliseconds lease_;
  const std::string saved_map_path_;  // empty: maps are not saved
  GainGate gain_gate_;
  ResyncHook resync_hook_;
  MapHook map_hook_;
  ReleasedHook released_hook_;
  std::atomic<bool> fenced_{false};
  std::atomic<uint64_t> fences_{0};
  std::atomic<uint64_t> write_pause_ns_{0};
  std::atomic<uint64_t> write_pauses_{0};
  // Orders Fence with the bits an install or Unfence sets (after mu_ in the lock order).
  mutable Mutex fence_mu_;
  std::string fence_reason_ GUARDED_BY(fence_mu_);
  // WriteHolds given out (after mu_ in the lock order: taken under it, shared or exclusive).
  mutable Mutex holds_mu_;
  mutable CondVar holds_cv_;
  mutable uint64_t holds_ GUARDED_BY(holds_mu_) = 0;
  void WaitForWriteHolds() const REQUIRES(mu_) EXCLUDES(holds_mu_);
  // When an ownership bit was last cleared (an install's loss or a fence).
  std::chrono::steady_clock::time_point last_clear_ GUARDED_BY(fence_mu_){};
};

}  // namespace rdkv::server

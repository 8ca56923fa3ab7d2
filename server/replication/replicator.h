// The primary's side of replication: forwards a write (REPLICATE) to the backups of its shard,
// in parallel, and says whether every in-sync backup applied it (docs/design.md "Replication").
//
// One connection per backup server, opened on first use with the cluster's credentials and
// re-opened after a failure no more often than every `reconnect_interval` (meanwhile forwards
// to it fail fast with kUnavailable). A forward to a backup whose map is behind the primary's
// (it answers kBusy "epoch behind") is retried until `forward_timeout`.
//
// Batching and pipelining: each backup has a queue, one sender thread and up to
// `batches_in_flight` REPLICATE batches in flight. Forward puts the write on the queue of every
// backup; for each backup with room it takes the batch itself (whatever is queued, its own
// write included) and starts it (Connection::StartCall), so that a write goes to all its
// backups at once from its own thread. It waits for the first backup's answer and hands the
// other started batches to their backups' senders (a stalled backup never holds another's
// places in flight). A backup with no room keeps the write queued: when one of its batches is
// answered, its sender takes what is queued (up to a batch's size per batch, while there is
// room), starts those batches and finishes them in order. Under load a round trip is shared by
// every write of a batch, and several batches overlap (docs/design.md "Batching").
//
// The writer pool (Submit): the primary runs its replicated writes there, not on the
// transport's worker threads, so that a worker is always free to take a REPLICATE: two servers
// that back each other never wait for each other's workers.
//
// Ownership: borrows the fabric (it must outlive the Replicator).
// Thread-safety: every method may run on many threads at once.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "common/cluster/cluster_map.h"
#include "common/kv/admin_wire.h"
#include "common/transport/transport.h"
#include "common/util/mutex.h"
#include "rdkv/status.h"

namespace rdkv::server::replication {

struct ReplicatorOptions {
  // The credential presented to the backups: REPLICATE is an admin op, so the servers' admin
  // secret with role kAdmin; without one, the data secret (a loopback peer then gets admin).
  std::string auth_token;
  transport::SessionRole role = transport::SessionRole::kAdmin;
  transport::TlsOptions tls;  // client side: TLS to the backups when tls.ca_file is set
  std::chrono::milliseconds connect_timeout{1000};
  std::chrono::milliseconds forward_timeout{2000};
  std::chrono::milliseconds reconnect_interval{200};
  size_t max_message_size = 0;  // the servers' message limit
  // tcp: how long a sender polls for its backup's answer before sleeping (the server's
  // --busy_poll_us, so that 0 turns all of the server's polling off).
  std::chrono::microseconds busy_poll{50};
  int sender_threads = 16;  // the writer pool (Submit): replicated writes in flight at once
  // REPLICATE batches in flight to one backup at once (1: each waits for the previous). A batch
  // starts while another is in flight only when at least `pipeline_min_writes` writes are
  // queued for that backup: fewer wait and go together in the next batch, since a round trip
  // costs both servers CPU per batch, not per write (docs/design.md "Batching").
  int batches_in_flight = 4;
  size_t pipeline_min_writes = 8;
  // A write waits for its first backup's answer and then collects its other backups' answers
  // itself; if the first takes longer than this, the other batches go to their backups'
  // senders, so that a slow backup does not hold the others' places in flight.
  std::chrono::microseconds hand_off_after{2000};
  // The largest batch body; also kept within the backups' --max_value_size
  // (set_max_value_bytes): a write larger than a batch goes alone as a plain REPLICATE.
  size_t max_batch_bytes = 64 * 1024;
};

struct ReplicatorStats {
  uint64_t forwards = 0;         // REPLICATE requests answered OK
  uint64_t forward_errors = 0;   // to in-sync backups (the write failed)
  uint64_t joining_errors = 0;   // to joining backups (the write went on)
  uint64_t epoch_retries = 0;    // a backup's map was behind; retried
  uint64_t version_retries = 0;  // a backup had a newer version of the key; retried above it
  uint64_t batches = 0;          // REPLICATE requests sent (a batch or a single write)
  uint64_t batched_writes = 0;   // writes they carried
  uint64_t sender_batches = 0;   // batches a backup's sender took from its queue (their
                                 // writes waited for a place in flight); writers took the rest
  uint64_t async_forwards = 0;   // ForwardAsync calls (writes no thread waited for)
};

class Replicator {
 public:
  Replicator(transport::Fabric* fabric, ReplicatorOptions options);
  ~Replicator();  // runs the queued jobs, then joins the writer pool and the senders
  Replicator(const Replicator&) = delete;
  Replicator& operator=(const Replicator&) = delete;

  // The backups' value limit (the servers of a cluster share --max_value_size): batch bodies
  // stay within it. Call before the first Forward.
  void set_max_value_bytes(size_t bytes) { max_batch_bytes_ = std::min(max_batch_bytes_, bytes); }

  // Runs `job` on the writer pool, in submission order as threads free up.
  void Submit(std::function<void()> job) EXCLUDES(jobs_mu_);

  // Forwards `m` to every backup of `shard` in `map` (in sync and joining) and waits for their
  // answers. OK when every in-sync backup applied it. Errors: kUnavailable naming the first
  // in-sync backup that failed and why (the write must not be acknowledged; its outcome is
  // unknown: some backups may have applied it). A joining backup's failure is only counted.
  // A backup that holds a newer version of the key answers kVersionMismatch: then *newer is
  // the highest such version (0 otherwise) and the status is kVersionMismatch; the caller
  // forwards again with a version above it.
  Status Forward(const cluster::ClusterMap& map, uint32_t shard, const kv::ReplicateRequest& m,
                 uint64_t* newer);
  // Forward's result, for a write that no thread waits for: (status, newer) as Forward returns
  // them. Runs exactly once, on the thread that settles the write's last backup answer (a
  // backup's sender, or a thread running a synchronous Forward that took the batch) or on the
  // caller's before ForwardAsync returns (no backups in `map`, every backup's sender gone, or a
  // replaced backup's batch finished there). It must not wait for anything a backup's answer
  // needs (it may run on a sender); it may call ForwardAsync again (with may_start false).
  using ForwardDone = std::function<void(const Status& result, uint64_t newer)>;
  // Forward without waiting (docs/design.md "No thread waits for the backups"): queues `m` for
  // every backup, starts on this thread the batches that may start on an open connection
  // (never connects here), hands every batch to its backup's sender, and returns. `m` (and
  // what it points at) must stay alive and unchanged until `done` runs.
  // `may_start` false (a caller that must not wait even briefly: the transport's receiving
  // thread): no batch is started here, every one goes to its backup's sender.
  void ForwardAsync(const cluster::ClusterMap& map, uint32_t shard, const kv::ReplicateRequest& m,
                    ForwardDone done, bool may_start = true);
  // ForwardAsync for several writes of one key in version order (docs/design.md "A hot key's
  // writes go together"): queued for each backup one after another, and never split across
  // batches, so that every backup applies them in this order. (*dones)[j] is chain[j]'s
  // completion (moved from); each runs exactly once, as ForwardAsync's does, in no set order.
  void ForwardChainAsync(const cluster::ClusterMap& map, uint32_t shard,
                         std::span<const kv::ReplicateRequest* const> chain,
                         std::vector<ForwardDone>* dones, bool may_start = true);
  // The largest batch body a chain must fit in.
  size_t max_batch_bytes() const { return max_batch_bytes_; }

  ReplicatorStats stats() const;
  // True on a backup's sender thread (it holds no lock of its caller's while it completes
  // writes).
  static bool OnSenderThread();

  // The credential for connections opened from now on (the servers' secrets were rotated:
  // kvserver's SIGHUP). Open connections stay until the backup revokes them.
  void SetCredential(std::string auth_token, transport::SessionRole role) EXCLUDES(cred_mu_);

  // --- Catch-up copies this primary vouches for (docs/design.md "Re-replication") ---
  // A joining pair is (shard, backup id, the epoch at which it started joining). It may become
  // in sync only when this primary process forwarded it every write since that epoch (it
  // installed that very map as the shard's primary), none of those forwards failed, and a
  // copy read the whole shard from here for it since. A pair removed and added again joins at
  // a later epoch: a new pair, with nothing of the old one's record.
  //
  // Called by ClusterState::Install with every new map before any write runs under it
  // (`previous`: the map it replaces, the one the process started with included; `me`: this
  // server's id): starts the record of each pair that starts joining in `next` under this
  // server, and of each join of this server's own that `previous` did not have, and forgets
  // the ones that are not joining any more.
  void NoteMap(const cluster::ClusterMap& previous, const cluster::ClusterMap& next, uint32_t me)
      EXCLUDES(joining_mu_);
  // A copy's SHARD_SCAN for joining backup `id` of `shard`, which started joining at
  // `joined_at` in this server's map (0: not joining there, or not said): kUnavailable, saying
  // why, when this primary cannot vouch for a copy into it; else the copy is noted.
  Status CopyScanStarts(uint32_t shard, uint32_t id, uint64_t joined_at) EXCLUDES(joining_mu_);
  // That copy's scan reached the shard's end.
  void CopyScanEnded(uint32_t shard, uint32_t id, uint64_t joined_at) EXCLUDES(joining_mu_);
  // OK when the pair may become in sync (see above); else kUnavailable saying why (the word
  // "missed" when a forward to it failed). Waits first for the forwards sent to it before the
  // call to be answered (at most the forward timeout and kSettleSlack).
  Status MayBecomeInSync(uint32_t shard, uint32_t id, uint64_t joined_at) const
      EXCLUDES(joining_mu_);
  // This server process emptied `shard` (DROP_SHARD): the first step of every copy into it.
  void NoteDropped(uint32_t shard) EXCLUDES(joining_mu_);
  // The joining replica's side: OK when this server process emptied the shard and then saw
  // its join of `shard` at `joined_at` begin (it installed a map with that join over one
  // without it: it has not restarted since), else
  // kUnavailable saying why. A restarted replica may lack the copy's last items (answered
  // before they were durable; all of them with durability none) while no forward to it failed,
  // so only the process that took the whole copy may become in sync by it.
  Status MayClaimOwnCopy(uint32_t shard, uint64_t joined_at) const EXCLUDES(joining_mu_);
  // Forwards to the pair that failed since it started joining.
  uint64_t JoiningFailures(uint32_t shard, uint32_t id, uint64_t joined_at) const
      EXCLUDES(joining_mu_);
  // Each backup this primary has talked to: connected now, seconds since its last failed
  // forward (negative: never), and its lag: writes queued for it or in a batch it has not
  // answered yet (`pending`), and how long the oldest of them has waited (`oldest_pending_s`,
  // 0 when none; at most about forward_timeout, when the write fails). For STATS and /metrics.
  struct PeerState {
    uint32_t id = 0;
    bool connected = false;
    double last_failure_s_ago = -1;
    uint64_t pending = 0;
    double oldest_pending_s = 0;
  };
  std::vector<PeerState> Peers() const EXCLUDES(peers_mu_);

 private:
  struct Peer;
  struct Item;
  struct Batch;
  struct Forwarding;
  using TakenBatches = std::vector<std::pair<std::shared_ptr<Peer>, std::unique_ptr<Batch>>>;
  // A Forward's state for `m`: its backups in `map` (in sync, then joining) and an entry for
  // each, not queued yet.
  std::unique_ptr<Forwarding> Prepare(const cluster::ClusterMap& map, uint32_t shard,
                                      const kv::ReplicateRequest& m);
  // Puts the entries of `chain` (one Forwarding, or a chain's in its order, glued) on their
  // backups' queues; returns the batches this thread took (one per
  // backup with room in flight; none unless `may_take`), not started. An entry whose backup's
  // sender has exited (replaced in the map) gets a failed result and goes to *orphaned, not
  // counted done yet (the caller does).
  TakenBatches Enqueue(std::span<Forwarding* const> chain, bool may_take,
                       std::vector<Item*>* orphaned);
  // Gives `batch` to its backup's sender to finish (started or not). False, with `batch`
  // untouched, when that sender has exited (the backup was replaced; a stopping sender still
  // finishes what it is handed).
  bool HandOver(std::shared_ptr<Peer>& peer, std::unique_ptr<Batch>& batch);
  // Every entry of `f` has its result: the Forward's status (and *newer), counting each.
  Status Settle(Forwarding& f, uint64_t* newer) EXCLUDES(joining_mu_);
  // An asynchronous Forwarding is settled: frees it and runs its completion.
  void Complete(std::unique_ptr<Forwarding> f);
  // A connection to `peer` (opened when there is none); kUnavailable while it failed less than
  // reconnect_interval ago, or when it cannot be opened.
  Result<std::shared_ptr<transport::Connection>> ConnectionTo(Peer* peer);
  // One round of `batch`: sends its first entries still to send (as many as fit in one
  // REPLICATE) without waiting. False when nothing went out: the entries past their deadline, or
  // all of them when the backup cannot be reached, have their results.
  // `open`: a connection to use (ForwardAsync's, taken without waiting); null: ConnectionTo.
  bool StartRound(Peer* peer, Batch* batch, std::shared_ptr<transport::Connection> open = nullptr);
  // Waits for the round in flight and settles its entries; those answered kBusy (the backup's
  // map is behind) and those that did not fit go back on the batch's list to send.
  void FinishRound(Peer* peer, Batch* batch);
  // Waits for the answer to the round in flight until `until`: true when it is there (or
  // nothing is in flight), so FinishRound will not wait.
  static bool WaitRound(Batch* batch, std::chrono::steady_clock::time_point until);
  // Runs rounds (the one in flight first) until every entry of `batch` has its result, then
  // hands each result to its Forward and frees the batch's place in flight.
  void RunBatch(Peer* peer, Batch* batch);
  // Peer `id` at `address`, its sender started; a peer whose address changed is replaced (its
  // sender drains its queue and stops).
  std::shared_ptr<Peer> PeerFor(uint32_t id, const std::string& address) EXCLUDES(peers_mu_);
  void SenderLoop(std::shared_ptr<Peer> peer);
  void WriterLoop() EXCLUDES(jobs_mu_);

  transport::Fabric* const fabric_;
  const ReplicatorOptions options_;

  size_t max_batch_bytes_;

  mutable Mutex cred_mu_;
  std::string auth_token_ GUARDED_BY(cred_mu_);
  transport::SessionRole role_ GUARDED_BY(cred_mu_);

  mutable Mutex peers_mu_;
  std::map<uint32_t, std::shared_ptr<Peer>> peers_ GUARDED_BY(peers_mu_);
  std::vector<std::shared_ptr<Peer>> retired_ GUARDED_BY(peers_mu_);  // replaced; joined at exit

  Mutex jobs_mu_;
  CondVar jobs_cv_;
  std::deque<std::function<void()>> jobs_ GUARDED_BY(jobs_mu_);
  bool stopping_ GUARDED_BY(jobs_mu_) = false;
  std::vector<std::thread> writers_;

  // What this primary knows of one joining pair since it started joining.
  struct JoiningRecord {
    bool from_join = false;     // this process installed the map that started the join
    bool scan_started = false;  // a copy's scan for it began at the shard's first slot
    bool copied = false;        // and one reached the shard's end
    uint64_t missed = 0;        // forwards to it that failed
    uint64_t sent = 0;          // forwards to it prepared
    uint64_t settled = 0;       // and answered (or failed)
  };
  // How much longer than the forward timeout an in-sync check waits for forwards in flight.
  static constexpr std::chrono::milliseconds kSettleSlack{500};
  using JoiningPair = std::tuple<uint32_t, uint32_t, uint64_t>;  // shard, backup id, joined at
  mutable Mutex joining_mu_;
  std::map<JoiningPair, JoiningRecord> joining_ GUARDED_BY(joining_mu_);
  // The joins of this server as a replica that this process saw begin (shard, joined at);
  // forgotten when the map no longer has it joining since then.
  std::set<std::pair<uint32_t, uint64_t>> own_joins_ GUARDED_BY(joining_mu_);
  // Shards this process emptied and has not seen a join of since (NoteDropped).
  std::set<uint32_t> dropped_ GUARDED_BY(joining_mu_);

  std::atomic<uint64_t> forwards_{0}, forward_errors_{0}, joining_errors_{0}, epoch_retries_{0},
      version_retries_{0}, batches_{0}, batched_writes_{0}, sender_batches_{0}, async_forwards_{0};
};

}  // namespace rdkv::server::replication

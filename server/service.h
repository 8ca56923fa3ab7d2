// The request handler: decodes a two-sided request, applies it to the Store, hands writes to
// the persister (when the server persists), encodes the response. Bad input gets an error
// response; it never takes the server down.
//
// A request goes through steps of one job each:
//   Decode    (service.cc)        frame and limits; kProtocolError / kInvalidArgument
//   Dispatch  (service.cc)        one switch over the ops, every op by name, no default: an op
//                                 with no handler is answered kNotSupported, never applied
//   writes    (service_write.cc)  Admit (backpressure; refused while the disk fails), the
//                                 ownership check, count, the repair of an earlier failed
//                                 write of the key, the retry check (request ids), replicate
//                                 to the backups (replicated shards, on the replicator's
//                                 writer pool), apply to the store, enqueue for RocksDB,
//                                 answer now or once durable; REPLICATE (single or batch), a
//                                 backup's side
//   queries   (service.cc)        STATS, PING, CLUSTER_MAP
//   admin     (service_admin.cc)  SNAPSHOT, INSTALL_MAP, SHARD_SCAN, DROP_SHARD, SHARD_IDS,
//                                 RECORD_IDS (IMPORT is a write whose ownership check and
//                                 apply are its own)
//
// Writers of one key hold a key-stripe lock across apply + enqueue, so RocksDB receives each
// key's writes in version order. In sync mode the reply is deferred until the write's group is
// in the WAL and synced (docs/persistence.md).
//
// Thread-safety: Handle() runs on many worker threads at once.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/kv/admin_wire.h"
#include "common/kv/wire.h"
#include "common/transport/transport.h"
#include "common/util/mutex.h"
#include "server/cluster_state.h"
#include "server/control_plane.h"
#include "server/persistence/persister.h"
#include "server/replica_tombstones.h"
#include "server/replication/replicator.h"
#include "server/request_metrics.h"
#include "server/retry_table.h"
#include "server/store.h"

namespace rdkv::server {

struct OpCounters {
  std::atomic<uint64_t> puts{0}, inserts{0}, deletes{0}, cas{0}, stats{0}, pings{0};
  std::atomic<uint64_t> snapshots{0};
  std::atomic<uint64_t> wrong_owner{0}, map_changes{0}, imports{0};
  std::atomic<uint64_t> errors{0}, protocol_errors{0}, out_of_space{0}, io_errors{0};
  // Of `errors`: the answers that are a request's normal negative result (NotFound,
  // VersionMismatch, AlreadyExists), not a failure of the server or of the request.
  std::atomic<uint64_t> outcomes{0};
  // Replication: writes this primary forwarded, forwarded writes this backup applied, retried
  // writes answered from the retry table.
  std::atomic<uint64_t> replicated_writes{0}, replicas_applied{0}, retries_answered{0};
  // Repair of failed replicated writes (docs/design.md "Replication", repair): writes that
  // failed after a forward and were kept for repair, the ones repaired (every in-sync replica
  // has them, this primary too), the ones superseded by a newer primary's write (dropped),
  // and repair attempts that failed again.
  std::atomic<uint64_t> repairs_noted{0}, repairs_done{0}, repairs_dropped{0}, repair_failures{0};
  // REPLICATE batches this backup applied.
  std::atomic<uint64_t> replicate_batches{0};
  // Replicated writes refused because the writer pool's queue was full (Service::OffloadWrite).
  std::atomic<uint64_t> pool_refused{0};
  // Forwarded PUTs this backup refused as not above a delete it applied (a stale REPLICATE).
  std::atomic<uint64_t> stale_forwards_refused{0};
  // Request ids sent to backups as answers and taken by all of them (a promoted primary's
  // resend, the repair pass), and answers REPLICATEs this backup took (docs/design.md "Exactly
  // once").
  std::atomic<uint64_t> answers_sent{0}, answers_received{0};
  // Catch-up: REPLICATE writes taken (answered OK) for a shard this server is joining (the
  // copy's items and the writes forwarded meanwhile); items this server sent in SHARD_SCAN
  // answers (the source side of catch-up copies and shard moves).
  std::atomic<uint64_t> catchup_applied{0}, scan_items{0};
  // Request ids this server sent in SHARD_IDS answers, and ids it recorded from RECORD_IDS (a
  // copy's ids, docs/design.md "Ids travel with copies").
  std::atomic<uint64_t> shard_ids_sent{0}, copied_ids_recorded{0};
  // Writes run on the transport's receiving thread (no handoff to a worker).
  std::atomic<uint64_t> writes_on_receiving_thread{0};
  // REPLICATE requests (single or batch) applied on the transport's receiving thread.
  std::atomic<uint64_t> replicates_on_receiving_thread{0};
  // Replicated writes parked behind their key's stripe; groups of them started together, and
  // the writes those groups forwarded (docs/design.md "A hot key's writes go together").
  std::atomic<uint64_t> writes_parked{0}, write_groups{0}, grouped_writes{0};
};

class Service {
 public:
  // `persister` may be null (durability=none); it must outlive the Service's last Handle.
  Service(Store* store, kv::WireLimits limits, persistence::Persister* persister = nullptr)
      : store_(store), limits_(limits), persister_(persister) {}
  // Waits for the writes running on the replicator's writer pool and stops the repair pass.
  ~Service();
  Service(const Service&) = delete;
  Service& operator=(const Service&) = delete;

  // Handles one request. Returns true when `*response` (overwritten) holds the answer, to be
  // sent now. Returns false when the answer is deferred (a sync-mode write waiting for its
  // WAL sync, a snapshot): the Service has then taken `*reply` and answers through it, once,
  // from another thread. Appends nothing to logs on the fast path; a malformed request is
  // logged (rate-limited) and answered with kProtocolError.
  // Admin ops (kv::IsAdmin) are refused kPermissionDenied unless reply->session->role() is
  // transport::SessionRole::kAdmin (docs/security.md).
  bool Handle(std::span<const uint8_t> request, std::vector<uint8_t>* response,
              transport::ReplyHandle* reply);
  // The write path on the transport's receiving thread (ListenOptions::inline_handler; docs/
  // design.md "Writes on the receiving thread"): runs a PUT, INSERT, CAS or DELETE of a value of
  // at most 4 KiB when it cannot wait for anything (no persister, a shard without backups, no
  // repair pending, its locks free right now, ample heap) and returns true with the answer in
  // *response; false (nothing done, nothing counted) leaves the request to a worker (Handle).
  // Never blocks.
  // Also a REPLICATE (single or batch) of an admin session (`role`), applied here when every
  // entry's replica stripe is free and the heap has room (a backup's side waits for no other
  // server; docs/design.md "A backup").
  // And a replicated write (async_replicated_writes, no persister): started here and answered
  // later through *reply (taken), or refused into *response.
  bool TryWriteOnReceivingThread(std::span<const uint8_t> request, std::vector<uint8_t>* response,
                                 transport::ReplyHandle* reply = nullptr);
  // Blocking form (tests, benchmarks): waits for a deferred answer. In-process callers are
  // trusted (kAdmin) unless they pass the role of the session they stand for.
  void Handle(std::span<const uint8_t> request, std::vector<uint8_t>* response,
              transport::SessionRole role = transport::SessionRole::kAdmin);
  // Blocking, for a request that is already decoded: what Handle does after decoding. Tests
  // use it for requests no decoder lets through (an op number with no handler).
  void HandleDecoded(const kv::Request& request, std::vector<uint8_t>* response);

  // Whether Dispatch has a handler for `op`; false for a number that is no op. Every op of
  // kv::kOpTable has one (tests check it).
  static bool HasHandler(kv::Op op);

  // Cluster mode: ownership checks on writes, map requests, shard moves. Null = standalone.
  // Set before the first Handle; `cluster` must outlive the Service.
  void set_cluster(ClusterState* cluster) { cluster_ = cluster; }
  // Replication: forwards the writes of replicated shards to their backups. Null: writes of a
  // replicated shard fail kInternal. Set once, after set_cluster and before the first Handle;
  // must outlive the Service. Starts the repair pass (a thread) when `replicator` is not null.
  // A replicated shard's write waits for no thread (async_replicated_writes, the default:
  // docs/design.md "No thread waits for the backups"); one that must wait (a repair pending,
  // its stripe or the ownership lock busy, or async writes off) waits for its backups on the
  // transport worker that took it only while another worker stays free, otherwise on the
  // replicator's writer pool.
  void set_replicator(replication::Replicator* replicator);
  // False: every replicated write waits for its backups on a thread (the earlier path, kept
  // for comparison). Set before the first Handle.
  void set_async_replicated_writes(bool on) { async_replicated_writes_ = on; }
  // The transport's worker threads, all started with the listener: the share of them a
  // replicated write may use is known from the first request (else workers are counted as
  // they take their first request, and a write waits on the writer pool until two are seen).
  // Set before the first Handle.
  void set_transport_workers(int n) { transport_workers_ = n; }
  // Waits until no write is in flight on the writer pool or waiting for its backups, then stops
  // the repair pass (the server calls it once it stops listening, before its persister goes;
  // ~Service too). No write may arrive after it.
  void WaitForWrites() EXCLUDES(offload_mu_, repair_mu_);
  // Writes kept for repair now (failed after a forward; docs/design.md "Replication").
  size_t repairs_pending() const { return repairs_pending_.load(std::memory_order_relaxed); }
  size_t repair_bytes_pending() const {
    return repair_bytes_pending_.load(std::memory_order_relaxed);
  }
  // Request ids whose answers the retry table keeps now.
  size_t retry_ids_kept() const { return retry_table_.size(); }
  // Keys whose deletes a joining replica remembers (all shards).
  size_t catchup_tombstones() const EXCLUDES(tombstones_mu_);
  // How far the latest SHARD_SCAN of each shard scanned since the start got through the index
  // (0..1; 1: the scan finished): a copy's progress on its source, by shard.
  std::map<uint32_t, double> ScanProgress() const EXCLUDES(copies_mu_);
  // At most this many keys (and max_repair_bytes of keys and values, kDefaultMaxRepairBytes
  // unless set) await repair: beyond either a replicated write is refused (kUnavailable) before
  // it is forwarded. Writes already in flight that fail are still kept, so the bytes can pass
  // the limit by what was in flight (bounded by the asynchronous writes' own limit).
  static constexpr size_t kMaxRepairKeys = 1 << 16;
  static constexpr size_t kDefaultMaxRepairBytes = 64 << 20;
  void set_max_repair_bytes(size_t bytes) { max_repair_bytes_ = bytes; }
  // Replicated writes that wait for the writer pool (their stripe busy, repairs pending, or more
  // than the asynchronous path's limits in flight): at most this many, and kMaxPoolBytes of
  // their keys and values; beyond either a write is refused at once (kUnavailable, nothing
  // applied: the client library retries it), instead of queueing without bound. A shard move's
  // IMPORT is exempt (its mover bounds its own copies and does not retry them).
  static constexpr size_t kDefaultMaxPoolWrites = 4096;
  static constexpr size_t kMaxPoolBytes = 64 << 20;
  void set_max_pool_writes(size_t writes) { max_pool_writes_ = writes; }
  // Tests only: called on a worker with a forwarded write's key after its role check passed,
  // before it is applied, under the key's replica stripe (the hook may block). Set before
  // the server serves; a set hook keeps REPLICATE off the receiving thread.
  void set_before_replica_apply(std::function<Status(const kv::ReplicateRequest&)> hook) {
    before_replica_apply_ = std::move(hook);
  }
  // How often the repair pass retries the writes that await repair.
  static constexpr std::chrono::milliseconds kRepairInterval{100};
  // etcd clusters: INSTALL_MAP commits the map to etcd first. Null: no etcd.
  void set_control_plane(ControlPlane* control) { control_ = control; }
  // A promoted backup's resync (ClusterState's resync hook): forwards the current state of
  // every key of `shards` it applied as a backup in the last kResyncWindow to the backups of
  // `next`, so that they hold whatever it may serve (a write it applied whose forward failed
  // elsewhere); a backup that holds a newer version keeps it. Failures are logged and kept for
  // repair (served); the shard is served anyway.
  void ResyncPromoted(const cluster::ClusterMap& next, const std::vector<uint32_t>& shards)
      EXCLUDES(recent_mu_);
  static constexpr std::chrono::seconds kResyncWindow{60};
  static constexpr size_t kResyncMaxKeys = 1 << 18;
  // A resend's forwards in flight at once (states and answers), and their keys' and values'
  // bytes (beyond them only while nothing else is in flight: one large value still goes).
  static constexpr size_t kResyncInFlight = 4096;
  static constexpr size_t kResyncBytesInFlight = 16 << 20;

  const OpCounters& counters() const { return counters_; }
  // Every answered request by op and result, with its latency (the Prometheus exporter's).
  RequestMetricsSnapshot request_metrics() const { return request_metrics_.Snapshot(); }
  // The stats body: JSON with items, bytes, free space, ops by type, errors.
  std::string StatsJson() const;

  // A copy into this server (a DROP_SHARD with a version floor, then IMPORTs) counts as active
  // until this long after its last request: another copy of the same shard is refused
  // (kBusy) meanwhile, so two movers cannot interleave their drops and imports.
  static constexpr std::chrono::milliseconds kCopyQuiet{3000};

 private:
  // Sends an answer later, from any thread, exactly once.
  using Deliver = std::function<void(std::span<const uint8_t> response)>;
  // Where one request's answer goes: into *response now, or through the Deliver that defer()
  // makes (taking the transport's reply handle) later. Handlers return the Exchange's result:
  // true when answered now, false when deferred. `op` (0 until decoded) and `received` are
  // what the answer is recorded under in request_metrics_.
  struct Exchange {
    std::vector<uint8_t>* response;
    const std::function<Deliver()>* defer;
    uint8_t op = 0;
    std::chrono::steady_clock::time_point received = std::chrono::steady_clock::now();
    // Of the requesting session. The least privilege unless said: a path that forgets to set
    // it can never reach an admin op.
    transport::SessionRole role = transport::SessionRole::kData;
    bool on_worker = false;  // on a transport worker thread (Handle with a ReplyHandle)
  };

  bool HandleImpl(std::span<const uint8_t> request, std::vector<uint8_t>* response,
                  const std::function<Deliver()>& defer, transport::SessionRole role,
                  bool on_worker = false);
  // The decoded request's handler.
  bool Dispatch(const kv::Request& r, Exchange ex);

  // Encodes the answer into ex.response, counting an error; returns true.
  bool AnswerNow(Exchange ex, const Status& status, uint64_t version = 0,
                 std::string_view body = {});
  // A Deliver that encodes (counting an error) and sends a deferred answer.
  std::function<void(const Status&, uint64_t, std::string_view)> AnswerLater(Exchange ex);
  void CountError(const Status& s);
  // Records one answer (any result) in request_metrics_.
  void RecordAnswer(uint8_t op, std::chrono::steady_clock::time_point received, StatusCode result);
  void CountWrite(kv::Op op);

  // --- writes (service_write.cc): PUT, INSERT, CAS, DELETE, IMPORT ---
  // A replicated shard's write runs here while another transport worker stays free, else on
  // the writer pool (OffloadWrite); others run here.
  bool HandleWrite(const kv::Request& r, Exchange ex);
  bool HandleWriteNow(const kv::Request& r, Exchange ex);
  // The ownership step of a write (the caller holds an OwnerGuard): an answer (true: answered)
  // when this server must refuse it (not the owner; an IMPORT into an owned shard), else none.
  std::optional<bool> CheckWriteOwner(const kv::Request& r, Exchange ex);
  // A write's steps under its locks (OwnerGuard and the key's stripe): the retry check, the
  // apply (replicated when `map` is given: the shard's map), the retry record, and the answer
  // now or once durable.
  bool WriteUnderLocks(const kv::Request& r, Exchange ex, const cluster::ClusterMap* map,
                       uint32_t shard);
  // Step 1 of every write under its locks: the first answer of a retried request id (answered
  // now), or nullopt for a new write.
  std::optional<bool> AnswerRetry(const kv::Request& r, Exchange ex);
  // After a successful apply at `version`: records the request id, then answers now or once
  // durable (Persist).
  bool AnswerApplied(const kv::Request& r, Exchange ex, uint64_t version,
                     const std::optional<kv::ItemLocation>& where);
  // A write refused for good (its precondition, or no room: IsDefiniteRefusal) under its
  // locks: records the refusal as the request id's answer, as AnswerApplied records a success,
  // so that an earlier attempt of the id still on its way here cannot apply after this answer.
  void RecordRefusal(const kv::Request& r, const Status& refusal, uint64_t version);
  static bool IsDefiniteRefusal(StatusCode code);
  // Copies the request and runs HandleWriteNow on the replicator's writer pool; returns false
  // (the answer comes from there).
  bool OffloadWrite(const kv::Request& r, Exchange ex) EXCLUDES(offload_mu_);
  static bool IsReplicated(const cluster::ClusterMap& map, uint32_t shard);
  // A request with its own copy of its key and value (the transport's bytes live only during
  // its handler call). Not copyable or movable: `request` points into the strings.
  struct OwnedRequest {
    explicit OwnedRequest(const kv::Request& r) : key(r.key), value(r.value), request(r) {
      request.key = key;
      request.value = value;
    }
    OwnedRequest(const OwnedRequest&) = delete;
    OwnedRequest& operator=(const OwnedRequest&) = delete;
    size_t bytes() const { return key.size() + value.size(); }
    std::string key, value;
    kv::Request request;
  };
  // The asynchronous replicated write (docs/design.md "No thread waits for the backups"): its
  // own copy of the request, the map it started under, its holds and its answer's way out.
  // Also a write parked behind its key's stripe, and a write of a group (below).
  struct ReplicatedWrite {
    explicit ReplicatedWrite(const kv::Request& r) : owned(r) {}
    OwnedRequest owned;      // the request's bytes live only during the handler call
    kv::ReplicateRequest m;  // points into `owned` too; its version is the attempt's
    std::shared_ptr<const cluster::ClusterMap> map;  // the map the write started under
    uint32_t shard = 0;
    int attempt = 0;
    uint8_t op = 0;
    std::chrono::steady_clock::time_point received;
    transport::SessionRole role = transport::SessionRole::kData;
    Deliver deliver;
    bool start_here = true;  // ForwardAsync's may_start: false on the transport's receiving thread
    // Held from the ownership check until the write is applied and enqueued for persistence.
    ClusterState::WriteHold owner;
    TransferableHold stripe;
    size_t stripe_index = 0;  // of key_stripes_
    // In a group: forwarded (then `forwarded_result`, `newer` are its backups' answer), or
    // refused at the start (`refusal`, `refusal_version`: its answer, given in order).
    bool forwarded = false;
    Status forwarded_result;
    uint64_t newer = 0;
    Status refusal;
    uint64_t refusal_version = 0;
  };
  // Steps 1 to 4 on this thread, without waiting for anything but the persister's admission:
  // answers now (refused, retried, failed precondition), hands the write to the writer pool
  // (a repair pending, its stripe or the ownership lock taken), or forwards it and returns
  // false (answered by OnForwarded).
  // `on_receiving_thread`: the transport's receiving thread (no persister): no batch is
  // started there (ForwardAsync's may_start), every one goes to its backup's sender.
  // Returns nullopt only on the receiving thread, where what would wait is declined instead.
  std::optional<bool> StartReplicatedWrite(const kv::Request& r, Exchange ex,
                                           bool on_receiving_thread = false) EXCLUDES(offload_mu_);
  // Takes a version and forwards `w` (ForwardAsync); OnForwarded continues it.
  void ForwardReplicatedWrite(std::unique_ptr<ReplicatedWrite> w);
  // Steps 4 (again, above a newer version) to 6 once every backup answered; on any thread.
  void OnForwarded(std::unique_ptr<ReplicatedWrite> w, const Status& forwarded, uint64_t newer)
      EXCLUDES(offload_mu_);
  // Steps 2 and the limits of a replicated write: OK when it may be forwarded, else its
  // answer (*version: the current version for kAlreadyExists / kVersionMismatch).
  Status CheckReplicatedWrite(const kv::Request& r, uint32_t shard, uint64_t* version);

  // --- A hot key's writes go together (docs/design.md; service_write_group.cc) ---
  struct WriteGroup;
  // A key stripe's hold. Every holder of a key stripe keeps it in one, and hands the stripe on
  // (HandOnStripe) to the writes parked behind it when it lets go: at the end of its scope,
  // or, after Take() moved the hold to an asynchronous write or a group, at their completion.
  // So a write may park behind any holder, and behind a thread waiting in Take.
  class StripeTurn {
   public:
    StripeTurn() = default;
    StripeTurn(Service* service, size_t index, TransferableHold hold)
        : service_(service), index_(index), hold_(std::move(hold)) {}
    StripeTurn(StripeTurn&& o) noexcept = default;
    StripeTurn& operator=(StripeTurn&& o) noexcept {
      if (this != &o) {
        if (hold_) service_->HandOnStripe(index_, std::move(hold_));
        service_ = o.service_;
        index_ = o.index_;
        hold_ = std::move(o.hold_);
      }
      return *this;
    }
    StripeTurn(const StripeTurn&) = delete;
    StripeTurn& operator=(const StripeTurn&) = delete;
    ~StripeTurn() {
      if (hold_) service_->HandOnStripe(index_, std::move(hold_));
    }
    explicit operator bool() const { return static_cast<bool>(hold_); }
    // The hold, for a holder that hands the stripe on itself.
    TransferableHold Take() { return std::move(hold_); }

   private:
    Service* service_ = nullptr;
    size_t index_ = 0;
    TransferableHold hold_;
  };
  enum class StripeTake { kTaken, kParked, kBusy };
  static size_t StripeIndex(std::string_view key);
  // Stripe `stripe` (of r.key) into *turn when it is free now and no group waits for it
  // (kTaken). Else, when `may_park`, parks the write behind its holder, answered later
  // through ex.defer (kParked; counted in the writer pool's bounds). kBusy: neither (not
  // `may_park`, or the pool's bounds are full); nothing was done (the caller takes the
  // waiting path).
  StripeTake TakeStripeOrPark(const kv::Request& r, Exchange ex, size_t stripe, bool may_park,
                              StripeTurn* turn) EXCLUDES(offload_mu_);
  // The stripe of `key`, waiting for it / only if free now (empty otherwise).
  StripeTurn TakeStripe(std::string_view key);
  StripeTurn TryTakeStripe(std::string_view key);
  // An asynchronous holder of `stripe` is done: the writes parked behind it get it as one
  // group (started on the writer pool), or it is released (and any parked writes go the
  // waiting way when a thread waits for the stripe).
  void HandOnStripe(size_t stripe, TransferableHold hold) EXCLUDES(offload_mu_);
  // Releases `stripe` and sends `first`, then every write still parked behind it, the
  // waiting way (the writer pool, which waits for the stripe).
  void ReleaseToWaiting(size_t stripe, TransferableHold hold,
                        std::vector<std::unique_ptr<ReplicatedWrite>> first) EXCLUDES(offload_mu_);
  // Parked writes run by the writer pool the waiting way (HandleWriteNow), in this order.
  void RunParkedWaiting(std::vector<std::unique_ptr<ReplicatedWrite>> parked) EXCLUDES(offload_mu_);
  // Steps 0 to 4 for a group (holding `hold` and an ownership guard; `admitted`: the
  // persister's admission for it), on the sender that handed the stripe on or a writer-pool
  // thread (`may_start`: ForwardAsync's); FinishWriteGroup runs steps 5 and 6 for all of it
  // on the thread that settles its last answer.
  void StartWriteGroup(size_t stripe, TransferableHold hold,
                       std::vector<std::unique_ptr<ReplicatedWrite>> parked, const Status& admitted,
                       bool may_start) EXCLUDES(offload_mu_);
  // A group on a writer-pool thread, the stripe released meanwhile: admission, ownership
  // guard, then the stripe if free (else the waiting way), then StartWriteGroup.
  void StartWriteGroupOnPool(size_t stripe, std::vector<std::unique_ptr<ReplicatedWrite>> parked)
      EXCLUDES(offload_mu_);
  void FinishWriteGroup(const std::shared_ptr<WriteGroup>& g) EXCLUDES(offload_mu_);
  // A write enters the writer pool's queue (and offloaded_): false, with nothing counted,
  // when the queue is full (*waiting, *waiting_bytes: what it holds).
  bool EnterPoolQueue(const kv::Request& r, size_t* waiting, size_t* waiting_bytes)
      EXCLUDES(offload_mu_);
  // A parked or grouped write leaves the writer pool's bounds (started or answered).
  void LeavePoolQueue(size_t bytes) EXCLUDES(offload_mu_);
  // `n` writes handed off (offloaded_) are finished.
  void FinishOffloaded(size_t n = 1) EXCLUDES(offload_mu_);
  // The forward request for `r` under map epoch `epoch` (version not set).
  kv::ReplicateRequest ReplicateRequestFor(const kv::Request& r, uint64_t epoch) const;
  // A forward that failed (`forwarded`, with a backup's newer version or 0) on attempt
  // `attempt`: nullopt when the write goes again (the version counter is above `newer` now),
  // else its error (the write is kept for repair).
  std::optional<Status> ForwardFailed(const kv::ReplicateRequest& m, uint32_t shard,
                                      const Status& forwarded, uint64_t newer, int attempt);
  // Step 5: applies the forwarded write `m` here (one-sided GETs see it from now on).
  Status PublishReplicated(const kv::ReplicateRequest& m, uint32_t shard,
                           std::optional<kv::ItemLocation>* where);
  // Applies a write to the store; *version is the new version, or the current one for
  // kVersionMismatch / kAlreadyExists; *where the new item's location when one was stored
  // (left alone otherwise). kInternal for an op that is no write.
  Status ApplyToStore(const kv::Request& r, uint64_t* version,
                      std::optional<kv::ItemLocation>* where);
  // A replicated shard's write on its primary: precondition, version, every in-sync backup,
  // then the store (docs/design.md "Replication"). The caller holds the key's stripe and an
  // OwnerGuard.
  Status ApplyReplicated(const kv::Request& r, const cluster::ClusterMap& map, uint32_t shard,
                         uint64_t* version, std::optional<kv::ItemLocation>* where);
  // A backup's side: applies a forwarded write (or a batch of them) after CheckReplica.
  bool HandleReplicate(const kv::Request& r, Exchange ex);
  bool HandleReplicateBatch(const kv::Request& r, Exchange ex);
  // TryWriteOnReceivingThread's REPLICATE: answers into *response and returns true, or
  // returns false having changed nothing (a worker takes it).
  bool TryReplicateOnReceivingThread(const kv::Request& r, std::vector<uint8_t>* response);
  // Mutex::TryLock for a set of stripes taken in a loop (outside the analysis).
  static bool TryLockStripe(Mutex* mu);
  // One forwarded write on a backup whose role CheckReplica confirmed; the caller holds the
  // key's replica stripe. Returns its answer: OK (*version: its version), kVersionMismatch
  // (*version: the newer version held here) or the store's error; *changed when the store
  // changed (the caller persists it, then records the request id with RecordReplicaApplied).
  Status ApplyReplica(const kv::ReplicateRequest& m, uint32_t shard, bool joining,
                      uint64_t* version, bool* changed);
  // For a forwarded PUT on an in-sync replica: the version of a delete of its key applied here
  // at or above its version while the key is absent (a stale forward: refused), else 0.
  uint64_t StaleAfterDelete(const kv::ReplicateRequest& m) const;
  // Hands an applied forward that changed the store to the persister (`done` as for
  // EnqueuePut), then records its request id.
  void PersistReplica(const kv::ReplicateRequest& m, persistence::Persister::Completion done);
  // Records an applied forward's request id (a retry after a promotion gets its answer); called
  // after the write was handed to the persister.
  void RecordReplicaApplied(const kv::ReplicateRequest& m);

  // --- repair of failed replicated writes (service_write.cc) ---
  // A forwarded write whose outcome is unknown (some backups may have applied it): kept so
  // that every in-sync replica ends up with it (RepairKey).
  struct PendingRepair {
    uint32_t shard = 0;
    uint64_t map_epoch = 0;  // when it failed
    std::string value;
    uint64_t version = 0;
    bool is_delete = false;
    uint64_t client_id = 0, request_seq = 0;
    // Earlier failed writes of the key that this one superseded (a group's chain: docs/design.md
    // "A hot key's writes go together"): their request ids and versions, recorded as applied
    // when this one is repaired (it took effect after them), so that their retries are not
    // applied again.
    std::vector<kv::AnsweredWrite> superseded;  // sent to the backups as answers before it
    // This primary serves it already (a promotion's resend that failed): a backup that holds
    // a newer version keeps it, and the entry is dropped (writing the served value again
    // above it would be a write no client made).
    bool served = false;
  };
  // Keeps `m` (of `shard`) for repair, replacing an older entry of its key. `answered`: earlier
  // writes of the key that `m` supersedes, whose ids the repair sends after it (a promoted
  // primary's resend that failed).
  void NoteFailedWrite(const kv::ReplicateRequest& m, uint32_t shard, bool served = false,
                       const std::vector<kv::AnsweredWrite>& answered = {}) EXCLUDES(repair_mu_);
  // Sends `answered` (earlier writes of `key`, superseded by the state its backups hold) to
  // every backup of `shard` in `map` as answers REPLICATEs (docs/design.md "Exactly once"), one
  // per request id, in pieces of at most kv::kMaxAnsweredWrites that fit a batch. The caller
  // holds the key's stripe. Errors: the first failed forward's.
  Status ForwardAnswers(const cluster::ClusterMap& map, uint32_t shard, std::string_view key,
                        std::vector<kv::AnsweredWrite> answered);
  // `answered` cut into the pieces of ForwardAnswers, and one piece's answers REPLICATE: its
  // value packed into `*packed` (the message views `key` and `*packed`).
  std::vector<std::vector<kv::AnsweredWrite>> AnswerPieces(
      std::string_view key, const std::vector<kv::AnsweredWrite>& answered) const;
  kv::ReplicateRequest AnswersMessage(const cluster::ClusterMap& map, std::string_view key,
                                      const std::vector<kv::AnsweredWrite>& piece,
                                      std::string* packed) const;
  // Brings `key`'s pending write (if any) to every replica of `shard` in `map`: forwards it
  // again with its version (or, when a backup holds a newer version under the same epoch,
  // above it), then applies it here, records its request id and forgets it. A write
  // superseded by another primary's newer version (the epoch changed) is dropped, and so is a
  // served one that meets any newer version. Errors:
  // kUnavailable while a backup still fails (the entry stays). The caller holds the key's
  // stripe and an OwnerGuard, and this server is the shard's primary.
  Status RepairKey(std::string_view key, const cluster::ClusterMap& map, uint32_t shard)
      EXCLUDES(repair_mu_);
  void ForgetRepair(std::string_view key) EXCLUDES(repair_mu_);
  // The repair pass: every kRepairInterval while writes await repair, RepairKey on each.
  void RepairLoop() EXCLUDES(repair_mu_);
  // A joining backup's deletes of `shard` (key -> version), so that a copied item older than
  // a delete does not bring the key back; forgotten once the shard is in sync here, and when
  // the shard is dropped here (a join given up, or the first step of another copy).
  void RememberDelete(uint32_t shard, std::string_view key, uint64_t version)
      EXCLUDES(tombstones_mu_);
  bool DeletedSince(uint32_t shard, std::string_view key, uint64_t version)
      EXCLUDES(tombstones_mu_);
  void ForgetDeletes(uint32_t shard) EXCLUDES(tombstones_mu_);
  // Hands an applied write to the persister and answers now, or once it is durable (sync
  // mode, IMPORT). The answer's body is the item's location, when known. The caller holds the
  // key's stripe.
  bool Persist(const kv::Request& r, uint64_t version, const std::optional<kv::ItemLocation>& where,
               Exchange ex);
  // A successful write's answer body: its item location (kv::EncodeItemLocation), or empty.
  static std::string WriteAnswerBody(const std::optional<kv::ItemLocation>& where);

  // --- queries and admin (service.cc, service_admin.cc) ---
  bool HandleStats(const kv::Request& r, Exchange ex);
  bool HandlePing(const kv::Request& r, Exchange ex);
  bool HandleMapFetch(const kv::Request& r, Exchange ex);
  bool HandleSnapshot(const kv::Request& r, Exchange ex);
  bool HandleMapInstall(const kv::Request& r, Exchange ex);
  bool HandleShardScan(const kv::Request& r, Exchange ex);
  bool HandleDropShard(const kv::Request& r, Exchange ex);
  bool HandleShardIds(const kv::Request& r, Exchange ex);
  bool HandleRecordIds(const kv::Request& r, Exchange ex);
  // The drop itself: deletes (and persists the deletes of) every item of `shard`; *dropped
  // counts them.
  Status DropShard(uint32_t shard, uint64_t version_floor, uint64_t* dropped);
  // Returns once every forwarded write that passed its role check before the call has been
  // applied (docs/design.md "Replication": a drop after a replica's removal). Takes each
  // replica stripe once; the caller holds none.
  void WaitForReplicaApplies();
  // kInvalidArgument for a shard this server's map does not have.
  Status CheckShardInRange(uint32_t shard) const;
  // kNotSupported when standalone.
  Status RequireCluster(std::string_view what) const;

  // Notes copy activity on `shard` now; with `begin`, first refuses (kBusy) while another
  // copy of it is active.
  Status NoteCopy(uint32_t shard, bool begin) EXCLUDES(copies_mu_);

  Store* store_;
  kv::WireLimits limits_;
  persistence::Persister* persister_;
  ClusterState* cluster_ = nullptr;
  replication::Replicator* replicator_ = nullptr;
  ControlPlane* control_ = nullptr;
  RetryTable retry_table_;
  OpCounters counters_;
  RequestMetrics request_metrics_;
  // More stripes than writes in flight by far: an asynchronous write holds its stripe for a
  // round trip to its backups, and a write that finds its stripe taken waits on a thread.
  static constexpr size_t kKeyStripes = 4096;
  // The most entries of a REPLICATE batch applied on the receiving thread (holding a replica
  // stripe per entry at once); larger batches go to a worker. Also below the 64 locks one
  // thread may hold under ThreadSanitizer's deadlock detector.
  static constexpr size_t kMaxEntriesOnReceivingThread = 32;
  // Serialize writers of one key across the store and the persister; guard no member.
  std::array<TransferableLock, kKeyStripes> key_stripes_;
  // The same for forwarded writes applied as a backup (HandleReplicate): apart from
  // key_stripes_, so that no server waits for another while holding a stripe the other needs.
  std::array<Mutex, kKeyStripes> replica_stripes_;
  // Writes parked behind a key stripe (TakeStripeOrPark). A stripe has an entry while writes
  // are parked behind it or a group started on the writer pool waits for it (`group_pending`:
  // the stripe may be free meanwhile, and new writes park instead of taking it). Parking, the
  // queue and every release of the stripe change together under the shard's lock, and every
  // holder hands the stripe on (StripeTurn), so no parked write is left without a holder, a
  // thread waiting in Take or a pending group that will see it.
  struct StripeQueue {
    bool group_pending = false;
    std::deque<std::unique_ptr<ReplicatedWrite>> parked;
  };
  struct ParkShard {
    Mutex mu;
    std::unordered_map<size_t, StripeQueue> stripes GUARDED_BY(mu);
  };
  static constexpr size_t kParkShards = 64;
  std::array<ParkShard, kParkShards> park_;
  // A group's most writes; its keys' and values' bytes stay within half a REPLICATE batch.
  static constexpr size_t kMaxGroupWrites = 64;
  static_assert(kMaxGroupWrites <= kv::kMaxReplicateBatchEntries / 2);

  // Keys applied as a backup (HandleReplicate), by shard, with when, the version (a delete's
  // version for a key deleted) and the request id of the write that made it (0/0: none; an
  // answers REPLICATE's ids are remembered too), oldest first; at most kResyncMaxKeys,
  // kResyncWindow old.
  struct RecentApply {
    uint32_t shard;
    std::string key;
    uint64_t version;
    uint64_t client_id, request_seq;
    std::chrono::steady_clock::time_point at;
  };
  void RememberApplied(uint32_t shard, std::string_view key, uint64_t version, uint64_t client_id,
                       uint64_t request_seq) EXCLUDES(recent_mu_);
  Mutex recent_mu_;
  std::deque<RecentApply> recent_ GUARDED_BY(recent_mu_);

  // Deletes applied as a backup (in sync or joining): on an in-sync replica, a forwarded PUT of
  // an absent key not above one is stale.
  ReplicaTombstones replica_deletes_;

  mutable Mutex tombstones_mu_;
  std::map<uint32_t, std::unordered_map<std::string, uint64_t>> tombstones_
      GUARDED_BY(tombstones_mu_);
  std::atomic<bool> has_tombstones_{false};

  Mutex repair_mu_;
  CondVar repair_cv_;
  std::unordered_map<std::string, PendingRepair> repairs_ GUARDED_BY(repair_mu_);
  bool repair_stop_ GUARDED_BY(repair_mu_) = false;
  std::atomic<size_t> repairs_pending_{0};  // repairs_.size(), read without the lock
  // Their keys' and values' bytes: changed under repair_mu_, read without it.
  std::atomic<size_t> repair_bytes_pending_{0};
  size_t max_repair_bytes_ = kDefaultMaxRepairBytes;
  std::thread repair_thread_;

  // Transport worker threads seen (Handle with a ReplyHandle), and how many of them run a
  // replicated write now: at most workers_seen_ - 1, so one is always free for REPLICATE; the
  // rest go to the writer pool.
  std::atomic<int> workers_seen_{0};
  int transport_workers_ = 0;  // set_transport_workers; 0: count them as they are seen
  std::atomic<int> inline_writes_{0};

  bool async_replicated_writes_ = true;
  // Asynchronous writes in flight and their keys' and values' bytes: beyond either limit a
  // replicated write takes the waiting path (bounded by the writer pool's threads).
  static constexpr size_t kMaxAsyncWrites = 1024;
  static constexpr size_t kMaxAsyncBytes = 64 << 20;
  std::atomic<size_t> async_writes_{0}, async_bytes_{0};

  // Writes handed to the writer pool or waiting for their backups without a thread, not
  // finished yet (~Service and WaitForWrites wait for them).
  Mutex offload_mu_;
  CondVar offload_cv_;
  size_t offloaded_ GUARDED_BY(offload_mu_) = 0;
  // Of those, the writes queued for or running on the writer pool, and their keys' and values'
  // bytes: bounded (max_pool_writes_, kMaxPoolBytes), beyond which a write is refused.
  size_t pool_writes_ GUARDED_BY(offload_mu_) = 0;
  size_t pool_bytes_ GUARDED_BY(offload_mu_) = 0;
  size_t max_pool_writes_ = kDefaultMaxPoolWrites;
  std::function<Status(const kv::ReplicateRequest&)> before_replica_apply_;  // tests only

  mutable Mutex copies_mu_;
  // When each shard last saw a copy into this server.
  std::map<uint32_t, std::chrono::steady_clock::time_point> copy_seen_ GUARDED_BY(copies_mu_);
  // ScanProgress: the position of each shard's latest scan (fraction of the index).
  std::map<uint32_t, double> scan_progress_ GUARDED_BY(copies_mu_);
};

}  // namespace rdkv::server

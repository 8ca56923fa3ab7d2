// Internal classes of the verbs transport. Control path (device, PD, MRs, rdma_cm, threads,
// teardown) lives in verbs_control.cc; datapath (post, poll, send, receive, reply) in
// verbs_datapath.cc. docs/transport-verbs.md explains the design.
#pragma once

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/transport/auth.h"
#include "common/transport/transport.h"
#include "common/transport/verbs/verbs_fabric.h"
#include "common/transport/verbs/verbs_objects.h"
#include "common/transport/verbs/verbs_wire.h"
#include "common/util/mutex.h"
#include "common/util/thread_annotations.h"

namespace rdkv::transport::verbs {

using Clock = std::chrono::steady_clock;

// ---- Events from the device and from rdma_cm ---------------------------------------------------

// Receives the async events (ibv_get_async_event) of one verbs object (QP, CQ or SRQ). Called on
// a fabric thread with the registry lock held: set flags, never block, never unregister.
class AsyncEventSink {
 public:
  virtual void OnAsyncEvent(ibv_event_type type) = 0;

 protected:
  ~AsyncEventSink() = default;
};
// Process-wide registry, keyed by the ibv_qp*/ibv_cq*/ibv_srq*: several Fabrics of one process
// share librdmacm's ibv_context (and so its async event queue), so any of their threads may read
// an event of another's object. Unregister before destroying the object.
void RegisterAsyncSink(const void* object, AsyncEventSink* sink);
void UnregisterAsyncSink(const void* object);
// Reads every pending async event of ctx (its fd is non-blocking), dispatches and acks each.
void DrainAsyncEvents(ibv_context* ctx);

// Receives the rdma_cm events of one connected client id (after it migrated to the fabric's
// channel). Same rules as AsyncEventSink.
class CmEventSink {
 public:
  virtual void OnCmEvent(rdma_cm_event_type type, int status) = 0;

 protected:
  ~CmEventSink() = default;
};

// ---- Work request ids
// ---------------------------------------------------------------------------- READs use the ReadOp
// pointer itself (8-byte aligned, low bits 0); everything else carries a kind in the low 3 bits and
// a buffer index above them.
enum WrKind : uint64_t { kWrRead = 0, kWrSend = 1, kWrRecv = 2, kWrWrite = 3, kWrBind = 4 };
static_assert(alignof(ReadOp) >= 8, "ReadOp pointers must leave the low 3 bits of wr_id free");
inline uint64_t MakeWrId(WrKind kind, uint32_t index) { return (uint64_t{index} << 3) | kind; }
inline WrKind WrKindOf(uint64_t wr_id) { return static_cast<WrKind>(wr_id & 7); }
inline uint32_t WrIndexOf(uint64_t wr_id) { return static_cast<uint32_t>(wr_id >> 3); }

ReadStatus ReadStatusFromWc(ibv_wc_status status);

// ---- The two-sided send side of one queue pair
// ----------------------------------------------------- Owns the credit accounting and the send
// buffers of one direction. Send() never waits: what lacks a credit, a send buffer or a send-queue
// slot is queued (copied) and goes out from Flush(), which the poller calls when credits arrive or
// sends complete. Fragments of one message are sent contiguously and messages in Send() order;
// credit-only fragments may go between them. One credit is kept back for credit-only fragments, so
// two peers can never both sit at zero credits with credits owed (see docs/transport-verbs.md).
class MsgChannel {
 public:
  struct Setup {
    ibv_qp* qp = nullptr;
    const ChunkPool* send_pool = nullptr;  // its chunks are the send slots
    uint32_t peer_credits = 0;             // receives the peer posted for us
    uint32_t granted_credits = 0;          // receives we posted for the peer
    // Messages waiting for credits or send slots beyond this many bytes close the channel
    // (Send reports it fatal): a peer that takes no answers cannot grow our memory. 0: no cap.
    size_t max_waiting_bytes = 0;
    // Test hooks (VerbsHandshakeTap): `flood` sends whenever a send slot is free, ignoring the
    // peer's credits, and returns none of ours (a client that ignores flow control);
    // `withhold_credits` keeps to the peer's credits but returns none of ours (a client that
    // takes no answers).
    bool flood = false;
    bool withhold_credits = false;
  };
  void Init(const Setup& setup);

  // kConnectionLost once closed. *fatal is set when ibv_post_send failed (the owner must then
  // mark the connection dead; the channel is already closed).
  Status Send(MsgType type, uint64_t id, std::span<const uint8_t> payload, bool* fatal);
  // Poller side. Each returns false when a post failed (fatal, channel closed).
  bool OnCredits(uint32_t credits);
  bool OnSendCompleted(uint32_t slot);
  bool OnReceivesReposted(uint32_t count);
  // A credit-only message (a keep-alive; it also returns what is owed) when a credit beyond the
  // reserve and a send slot are free; otherwise nothing (the next call tries again). False when
  // the post failed (fatal, channel closed).
  bool SendKeepAlive();
  // No more posts; drops queued messages. Idempotent.
  void Close();
  uint32_t sends_in_flight() const { return in_flight_.load(std::memory_order_acquire); }
  // Receiving side (one thread at a time per channel): counts one fragment received from the
  // peer. False when the peer has now sent more fragments than it was ever granted credits
  // (the receives we posted for it): a peer that ignores flow control, which would take
  // receive buffers shared with other connections.
  bool CountReceive() {
    return ++received_total_ <= granted_total_.load(std::memory_order_acquire);
  }
  // Since when (steady clock, ns) messages have waited for credits or send slots without the
  // queue emptying; 0 while nothing waits.
  int64_t waiting_since_ns() const { return waiting_since_ns_.load(std::memory_order_acquire); }

 private:
  struct Pending {
    MsgType type;
    uint64_t id;
    uint32_t total;
    uint32_t base;  // message offset of rest[0]
    uint32_t next;  // message offset of the next fragment to send
    std::vector<uint8_t> rest;
  };
  bool CanSendData() const REQUIRES(mu_) {
    return !free_slots_.empty() && (credits_ >= 2 || flood_);
  }
  bool FlushLocked() REQUIRES(mu_);
  // Closes the channel and drops what waits (Close, a failed post, the waiting-bytes cap).
  void CloseLocked() REQUIRES(mu_);
  bool PostLocked(MsgType type, uint64_t id, uint32_t total, uint32_t offset, const uint8_t* data,
                  uint32_t length) REQUIRES(mu_);

  Mutex mu_;
  ibv_qp* qp_ GUARDED_BY(mu_) = nullptr;
  const ChunkPool* pool_ GUARDED_BY(mu_) = nullptr;
  std::vector<uint32_t> free_slots_ GUARDED_BY(mu_);
  int64_t credits_ GUARDED_BY(mu_) = 0;
  uint32_t owed_ GUARDED_BY(mu_) = 0;
  uint32_t credit_threshold_ GUARDED_BY(mu_) = 2;
  bool closed_ GUARDED_BY(mu_) = true;
  std::deque<Pending> pending_ GUARDED_BY(mu_);
  size_t waiting_bytes_ GUARDED_BY(mu_) = 0;  // pending_'s unsent bytes
  size_t max_waiting_bytes_ GUARDED_BY(mu_) = 0;
  bool flood_ GUARDED_BY(mu_) = false;
  bool withhold_ GUARDED_BY(mu_) = false;  // flood or withhold_credits: no credit returned
  std::atomic<uint32_t> in_flight_{0};
  // Credits granted to the peer in all: the receives first posted, then every credit returned
  // in a fragment we posted. Raised before the post that carries them goes out.
  std::atomic<uint64_t> granted_total_{0};
  uint64_t received_total_ = 0;  // CountReceive's (the receiving thread's)
  std::atomic<int64_t> waiting_since_ns_{0};
};

class VerbsFabric;

// ---- Client connection
// ---------------------------------------------------------------------------
class ClientConnection final : public VerbsConnection, public CmEventSink, public AsyncEventSink {
 public:
  ClientConnection(VerbsFabric* fabric, const ConnectOptions& options,
                   VerbsHandshakeTap* tap = nullptr);
  ~ClientConnection() override;
  Status Establish();  // control path: rdma_cm resolve, QP, buffers, connect, handshake

  const std::vector<RegionDescriptor>& regions() const override { return regions_; }
  Status PostReads(std::span<ReadOp* const> ops) override;
  size_t PollReads() override;
  Status ReadAndWait(std::span<ReadOp* const> ops, Clock::time_point deadline) override;
  Status WaitReads(std::span<ReadOp* const> ops, Clock::time_point deadline) override;
  Status Call(std::span<const uint8_t> request, std::vector<uint8_t>* response,
              std::chrono::milliseconds timeout) override;
  Status StartCall(std::span<const uint8_t> request, std::vector<uint8_t>* response,
                   std::chrono::milliseconds timeout, PendingCall* call) override;
  Status FinishCall(PendingCall* call) override;
  bool WaitCall(PendingCall* call, Clock::time_point until) override;
  bool alive() const override { return alive_.load(std::memory_order_acquire); }
  std::string peer() const override { return "verbs " + peer_; }

  Result<int> PostWriteForTest(std::span<const uint8_t> local, uint32_t lkey, uint64_t remote_addr,
                               uint32_t rkey, std::chrono::milliseconds timeout) override;
  void SetLocalReadCheckForTest(bool enabled) override {
    local_read_check_.store(enabled, std::memory_order_relaxed);
  }
  bool per_connection_windows() const override { return windows_; }

  void OnCmEvent(rdma_cm_event_type type, int status) override;
  void OnAsyncEvent(ibv_event_type type) override;

 private:
  // Call slot states, in the low 3 bits of CallSlot::word; the call's sequence number above.
  enum SlotState : uint64_t { kFree = 0, kWaiting = 1, kFilling = 2, kDone = 3, kAbandoned = 4 };
  struct CallSlot {
    std::atomic<uint64_t> word{kFree};
    // Written by the poller while the slot is kFilling, read by the owner after kDone.
    std::vector<uint8_t> buf;
    uint32_t total = 0;
    uint32_t received = 0;
    StatusCode code = StatusCode::kOk;
  };

  // Records why (a static string) and marks the connection dead: channel closed, QP to error
  // (rdma_disconnect), waiters woken. Idempotent; any thread.
  void Kill(const char* why);
  void MarkDead() { Kill("connection lost"); }
  Status LostStatus() const;
  // Polls one batch. Returns completions seen; adds READ completions to *reads.
  size_t PollCq(size_t* reads) REQUIRES(poll_mu_);
  // Blocks on the completion channel until an event or `until`.
  size_t BlockOnCq(Clock::time_point until, size_t* reads) REQUIRES(poll_mu_);
  // How long a waiting poller polls before it blocks on the completion channel: twice the recent
  // average wait, within [kClientSpinMin, kClientSpinMax].
  Clock::duration SpinBudget() const REQUIRES(poll_mu_);
  void NoteWait(Clock::duration waited) REQUIRES(poll_mu_);
  // One step of progress for a waiting thread: polls (spin, then block) if no one else is
  // polling, otherwise sleeps until the poller reports progress. Bounded by `deadline`.
  void Progress(Clock::time_point deadline) EXCLUDES(poll_mu_, wait_mu_);
  void WakeWaiters() EXCLUDES(wait_mu_);
  void HandleReceive(uint32_t index, uint32_t byte_len);
  // WELCOME / AUTH_REFUSED, on the poller (under poll_mu_) during Establish.
  void HandleHandshakeMessage(const FragmentHeader& h, const uint8_t* payload);
  // The second half of Establish: the proof on the QP, then WELCOME or AUTH_REFUSED.
  Status FinishHandshake(Clock::time_point deadline, const std::string& where);
  void DeliverResponse(const FragmentHeader& h, const uint8_t* payload);
  void ProtocolError(const char* why) { Kill(why); }
  bool InRegions(const ReadOp& op) const;
  // Posts the ops of a reserved batch in one chain; `filter`: skip those outside every region.
  Status PostReadBatch(std::span<ReadOp* const> ops, bool filter) EXCLUDES(post_mu_);
  // Fills `wrs`/`sges` (room for ops.size()) with the batch's READs, chained, and posts them
  // with one ibv_post_send. False after a failed post (FailPost done; the caller kills).
  bool PostChain(std::span<ReadOp* const> ops, bool filter, ibv_send_wr* wrs, ibv_sge* sges);
  // After a failed ibv_post_send of the n WRs at `wrs`: gives back the unposted ones'
  // reservations and ends them (kConnectionLost); the posted ones flush. The caller then kills
  // the connection, with no lock held.
  void FailPost(ibv_send_wr* wrs, size_t n, ibv_send_wr* bad);
  // Ends READs that were never posted: done, kConnectionLost.
  static void EndUnposted(std::span<ReadOp* const> ops);
  // Batches of at most this many READs are posted from the stack, without post_mu_.
  static constexpr size_t kStackReads = 8;
  // A keep-alive when nothing was sent for keepalive_ (the server's idle timeout does not see
  // READs); called after READs are posted.
  void MaybeKeepAlive();
  void FreeSlot(uint32_t index, uint64_t seq) EXCLUDES(slots_mu_);
  void AbandonSlot(uint32_t index, uint64_t seq) EXCLUDES(slots_mu_);
  Result<uint32_t> AcquireSlot(Clock::time_point deadline, uint64_t* seq) EXCLUDES(slots_mu_);

  VerbsFabric* const fabric_;
  const ConnectOptions options_;
  VerbsHandshakeTap* const tap_;  // tests only; usually null
  std::string peer_;
  // Set by the poller from the WELCOME during Establish (published by hs_state_), then fixed.
  std::vector<RegionDescriptor> regions_;
  bool windows_ = false;
  int64_t keepalive_ns_ = 0;              // from the WELCOME; 0: none needed
  std::atomic<int64_t> last_sent_ns_{0};  // CoarseNanos: the last message we sent
  // Handshake on the QP: 0 waiting, 1 WELCOME received, 2 AUTH_REFUSED received or malformed.
  enum HandshakeState : int { kHsWaiting = 0, kHsWelcome = 1, kHsRefused = 2 };
  std::atomic<int> hs_state_{kHsWaiting};
  Status hs_refusal_;  // written by the poller before hs_state_ turns kHsRefused
  uint32_t max_request_ = 0;
  uint32_t max_read_length_ = 0;

  // Verbs objects, torn down in ~ClientConnection in this order: QP, CQ, completion channel,
  // MRs (pools), cm id, setup event channel.
  EventChannel setup_channel_;
  CmId id_;
  ChunkPool recv_pool_;
  ChunkPool send_pool_;
  CompletionChannel comp_channel_;
  CompletionQueue cq_;
  CmQueuePair qp_;
  bool registered_ = false;

  MsgChannel chan_;
  std::atomic<bool> alive_{false};
  std::atomic<bool> disconnected_{false};
  std::atomic<bool> local_read_check_{true};
  std::atomic<const char*> death_reason_{nullptr};

  // READs.
  std::atomic<uint32_t> reads_in_flight_{0};
  // Lock order: poll_mu_, then slots_mu_ or chan_'s lock (the poller frees call slots and
  // sends credits); post_mu_, wait_mu_ and write_mu_ are taken with no other lock held.
  Mutex post_mu_;  // serializes ibv_post_send of READ batches (and the test's WRITE)
  std::vector<ibv_send_wr> wrs_ GUARDED_BY(post_mu_);
  std::vector<ibv_sge> sges_ GUARDED_BY(post_mu_);

  // Progress: one poller at a time (try-lock); others sleep on wait_cv_ until it reports.
  Mutex poll_mu_ ACQUIRED_BEFORE(slots_mu_);
  std::vector<ibv_recv_wr> recv_wrs_ GUARDED_BY(poll_mu_);
  std::vector<ibv_sge> recv_sges_ GUARDED_BY(poll_mu_);
  std::vector<uint32_t> reposts_ GUARDED_BY(poll_mu_);
  // How long the poller's recent waits for a completion took (an average over about the last
  // eight), and so how long the next one spins before it blocks (SpinBudget).
  Clock::duration wait_avg_ GUARDED_BY(poll_mu_){};
  Mutex wait_mu_;  // guards nothing: orders a waiter's epoch check against WakeWaiters
  CondVar wait_cv_;
  std::atomic<uint64_t> epoch_{0};
  std::atomic<uint32_t> waiters_{0};

  // Calls.
  std::unique_ptr<CallSlot[]> slots_;
  uint32_t slot_count_ = 0;
  Mutex slots_mu_;
  std::vector<uint32_t> free_slot_list_ GUARDED_BY(slots_mu_);
  std::atomic<uint64_t> next_seq_{1};

  // PostWriteForTest.
  Mutex write_mu_;  // one PostWriteForTest at a time; guards nothing else
  std::atomic<int> write_status_{-1};
};

// ---- Server
// -----------------------------------------------------------------------------------------
class VerbsListener;

class ServerSessionImpl final : public ServerSession, public AsyncEventSink {
 public:
  ServerSessionImpl(uint64_t id, std::string peer, uint32_t peer_max_message)
      : id_(id), peer_(std::move(peer)), peer_max_message_(peer_max_message) {}
  // Where the handshake of this session stands. Requests are served only in kReady.
  enum class AuthState : uint8_t { kAwaitProof = 0, kReady = 1, kRefused = 2 };
  AuthState auth_state() const { return auth_state_.load(std::memory_order_acquire); }
  Status Reply(uint64_t request_id, std::span<const uint8_t> response) override;
  std::string peer() const override { return "verbs " + peer_; }
  uint64_t id() const override { return id_; }
  SessionRole role() const override { return role_; }
  void OnAsyncEvent(ibv_event_type type) override;

  // Marks the session dead: closes the channel and disconnects (QP to error). Idempotent.
  void MarkDead();
  bool dead() const { return dead_.load(std::memory_order_acquire); }

 private:
  friend class VerbsListener;
  const uint64_t id_;
  const std::string peer_;
  const uint32_t peer_max_message_;
  SessionRole role_ = SessionRole::kData;  // set by the cm thread before the session is published
  SessionRole proven_secret_ = SessionRole::kData;  // whose secret keyed its proof (revocation)

  // Handshake (docs/security.md "The handshake (verbs)"). Set by the cm thread before the
  // session is published, then read-only: the client proof we expect, the regions the WELCOME
  // carries (with this session's window rkeys) and when the handshake started.
  auth::Mac expected_proof_{};
  std::vector<RegionDescriptor> welcome_regions_;
  Clock::time_point created_{};
  std::atomic<AuthState> auth_state_{AuthState::kAwaitProof};
  std::atomic<bool> close_after_send_{false};  // refused: disconnect once AUTH_REFUSED went out

  // Serializes rdma_disconnect/rdma_notify with the teardown of cm_id_/qp_ (it guards no
  // field: the cm thread sets them up before the session is published, and alone resets them).
  Mutex cm_mu_;
  CmId cm_id_;
  ChunkPool send_pool_;
  // One type-2 window per advertised region, bound to qp_ once the client's proof checks out;
  // deallocated (invalidated) in Teardown before qp_ is destroyed. Empty without windows.
  std::vector<MemoryWindow> windows_;
  std::vector<ibv_mr*> window_mrs_;  // the MR each window is bound onto (owned by the regions)
  CmQueuePair qp_;
  uint32_t qp_num_ = 0;
  uint32_t group_ = 0;  // the listener's receive group of its QP (set before it is published)
  MsgChannel chan_;
  std::atomic<bool> dead_{false};
  std::atomic<bool> last_wqe_reached_{false};
  std::atomic<bool> cut_for_waiting_{false};  // Reply: its waiting answers passed the byte cap

  // Reassembly of a multi-fragment request; touched only by the one polling worker.
  bool rx_active_ = false;
  uint64_t rx_id_ = 0;
  uint32_t rx_received_ = 0;
  std::vector<uint8_t> rx_;

  // Teardown bookkeeping, cm thread only.
  bool dying_ = false;
  Clock::time_point dead_since_{};
  uint64_t dead_epoch_ = 0;
  // When rdma_cm reported the connection established (the client can send its proof only
  // from then on); unset until then. The proof deadline counts from here.
  std::optional<Clock::time_point> established_;
  // The peer's address without its port (per-source handshake limit); set before publishing.
  std::string source_;
  uint64_t secrets_epoch_ = 0;  // the listener's secrets epoch its key came from (cm thread)
  // Idle timeout: messages received (workers count, relaxed), and what the cm thread saw of
  // that count last and when it last changed.
  std::atomic<uint64_t> received_{0};
  uint64_t received_seen_ = 0;
  Clock::time_point last_active_{};
};

class VerbsListener final : public Listener, public AsyncEventSink {
 public:
  VerbsListener(VerbsFabric* fabric, ListenOptions options);
  ~VerbsListener() override;
  Status Start();

  uint16_t port() const override { return port_; }
  ListenerStats stats() const override;
  void PauseWorkers(bool paused) override;
  Result<uint64_t> RotateSecrets(const std::string& auth_token,
                                 const std::string& admin_token) override;
  void OnAsyncEvent(ibv_event_type type) override;

 private:
  struct Ready {
    std::shared_ptr<ServerSessionImpl> session;
    uint64_t id = 0;
    const uint8_t* data = nullptr;
    uint32_t length = 0;
    int64_t srq_index = -1;  // -1: the payload is in `owned` (reassembled)
    std::vector<uint8_t> owned;
  };
  static constexpr int kWorkerBatch = 16;
  // A worker's receive reposts (each completion or handler gives back at most one buffer).
  struct Scratch {
    ibv_recv_wr wrs[kWorkerBatch];
    ibv_sge sges[kWorkerBatch];
    std::shared_ptr<ServerSessionImpl> credit_to[kWorkerBatch];  // null: no credit (dropped)
    int n = 0;
    uint32_t group = 0;  // the group whose SRQ the queued buffers go back to
  };
  // A receive group: the CQ of its sessions' sends and receives, and the SRQ their receives
  // take buffers from. A CQ must hold every completion its sessions can have outstanding (an
  // overrun kills every QP on it), and a device's CQ has at most max_cqe entries (rxe: 32767),
  // so one CQ holds at most about max_cqe / 49 sessions; a listener allowed more spreads them
  // over several groups, each sized for its share (docs/transport-verbs.md "Queue sizes").
  // One completion channel serves every group's CQ; the one polling worker polls them in turn.
  struct RecvGroup {
    CompletionQueue cq;
    SharedReceiveQueue srq;
    uint32_t blocks = 0;    // cm thread: SRQ buffer blocks posted to this group
    uint32_t sessions = 0;  // cm thread: live sessions whose QP uses this group
    // Polls that found this group's CQ empty (ReapSessions: a dead session's completions are
    // all taken once its group's CQ has been found empty twice since it died).
    std::atomic<uint64_t> empty_epoch{0};
  };
  // At most this many groups (with rxe's CQs, about 42,000 connections).
  static constexpr uint32_t kMaxRecvGroups = 64;

  // Control path (cm thread).
  void CmThreadMain();
  void HandleConnectRequest(rdma_cm_id* raw_id, const rdma_conn_param& param,
                            std::span<const uint8_t> private_data);
  void Reject(CmId id, RejectReason reason, const std::string& text);
  // One more block of receive buffers for group `g`'s SRQ (cm thread).
  Status GrowSrq(uint32_t g);
  void ReapSessions();
  // Whether an unproven session has run out of time (cm thread).
  bool HandshakeOverdue(const ServerSessionImpl& s, Clock::time_point now) const;
  // How long a connection may take to become established before it is cut.
  static constexpr std::chrono::seconds kEstablishDeadline{30};
  void Teardown(std::shared_ptr<ServerSessionImpl> s);

  // Datapath (workers).
  void WorkerMain();
  size_t PollForRequests(Ready* ready, Scratch* scratch);
  void WaitForCq(int timeout_ms);
  void ProcessCompletion(const ibv_wc& wc, Ready* ready, size_t* nready, Scratch* scratch);
  std::shared_ptr<ServerSessionImpl> FindSession(uint32_t qp_num);
  uint8_t* SrqChunk(uint32_t index, uint32_t* lkey) const;
  // The group whose SRQ holds receive buffer `index` (a block's group never changes).
  uint32_t GroupOfChunk(uint32_t index) const {
    return srq_block_group_[index / kServerRecvCredits];
  }
  // One ibv_poll_cq of the next group's CQ in turn that has completions: their number (negative:
  // that CQ is broken), or 0 when every group's CQ was empty.
  int PollGroups(ibv_wc* wc);
  // Arms every group's CQ for an event on the completion channel; false when one failed.
  bool ArmGroups();
  void QueueRepost(Scratch* scratch, uint32_t index, std::shared_ptr<ServerSessionImpl> credit_to);
  void FlushReposts(Scratch* scratch);
  void SessionProtocolError(ServerSessionImpl* s);
  // The client's first message (AUTH_PROOF) on a session in kAwaitProof; worker thread.
  void HandleAuthProof(const std::shared_ptr<ServerSessionImpl>& s, const FragmentHeader& h,
                       const uint8_t* payload);
  // Proof checked: QP may serve READs, windows bound, WELCOME sent. False when that failed.
  bool AdmitSession(ServerSessionImpl* s);

  VerbsFabric* const fabric_;
  ListenOptions options_;
  auth::ServerSecrets secrets_;
  // Per-connection type-2 memory windows (docs/security.md): the MR behind each advertised
  // region, in options_.regions order. Empty when the device has no type-2 windows.
  bool use_windows_ = false;
  std::vector<ibv_mr*> region_mrs_;
  uint16_t port_ = 0;

  // Verbs objects, torn down in ~VerbsListener: session QPs and ids, listen id, SRQ, SRQ
  // buffers, CQ, completion channel, event channel.
  EventChannel channel_;
  CmId listen_id_;
  CompletionChannel comp_channel_;
  std::unique_ptr<RecvGroup[]> groups_;
  uint32_t group_count_ = 0;
  uint32_t sessions_per_group_ = 0;  // each group's CQ and SRQ are sized for this many sessions
  // Receive buffer blocks of every group (group_count_ x sessions_per_group_ slots); a group
  // gets one more when its live sessions reach its blocks. srq_block_group_[b]: block b's
  // group, written before srq_blocks_used_ counts the block.
  std::unique_ptr<ChunkPool[]> srq_blocks_;
  std::unique_ptr<uint32_t[]> srq_block_group_;
  std::atomic<uint32_t> srq_blocks_used_{0};

  // Sessions: by QP number for the workers, by cm id for the cm thread.
  // Lock order: sessions_mu_, then a session's cm_mu_ (OnAsyncEvent marks sessions dead).
  SharedMutex sessions_mu_;
  std::unordered_map<uint32_t, std::shared_ptr<ServerSessionImpl>> by_qpn_ GUARDED_BY(sessions_mu_);
  std::unordered_map<rdma_cm_id*, std::shared_ptr<ServerSessionImpl>> by_id_;  // cm thread
  uint32_t live_sessions_ = 0;                                                 // cm thread
  std::atomic<uint32_t> open_sessions_{0};  // live_sessions_ for stats(), from any thread
  std::atomic<uint64_t> handshakes_evicted_{0}, handshakes_timed_out_{0}, idle_closed_{0};
  std::atomic<uint64_t> slow_readers_cut_{0};  // answers waited output_stall_timeout for credits
  uint64_t idle_unlogged_ = 0;                 // cm thread: closed since the last log
  Clock::time_point last_idle_log_{};          // cm thread
  uint64_t next_session_id_ = 1;

  // Workers: one polls (and blocks on the completion channel) at a time; the others wait for
  // their turn on work_cv_ or run handlers.
  std::vector<std::thread> workers_;
  Mutex state_mu_;
  CondVar work_cv_;
  bool poller_active_ GUARDED_BY(state_mu_) = false;
  bool paused_ GUARDED_BY(state_mu_) = false;
  bool stop_ GUARDED_BY(state_mu_) = false;
  std::atomic<bool> paused_flag_{false};
  std::atomic<bool> stop_flag_{false};
  EventFd worker_wake_;
  // The group the active poller polls next (PollGroups; only the one poller touches it).
  uint32_t next_poll_group_ = 0;
  // The recent average idle gap (nanoseconds) from an empty CQ to the next request; only
  // the one active poller reads and writes it (PollForRequests), hence relaxed.
  std::atomic<int64_t> idle_gap_avg_ns_{0};
  std::atomic<bool> srq_post_failed_{false};  // reported by the cm thread

  std::thread cm_thread_;
  EventFd cm_wake_;
  std::atomic<bool> cm_stop_{false};

  // RotateSecrets hands the new secrets to the cm thread (which alone uses secrets_ and the
  // sessions' roles) and waits until it has revoked the sessions they concern.
  struct Rotation {
    uint64_t epoch = 0;  // asked for; the cm thread has applied up to rotated_epoch
    std::string data, admin;
    uint64_t revoked = 0;  // by the latest applied rotation
  };
  Mutex rotate_mu_;
  CondVar rotate_cv_;
  Rotation rotation_ GUARDED_BY(rotate_mu_);
  uint64_t rotated_epoch_ GUARDED_BY(rotate_mu_) = 0;
  uint64_t secrets_epoch_ = 0;  // cm thread: the epoch of secrets_
  void ApplyRotation();         // cm thread

  std::atomic<uint64_t> accepted_{0}, refused_{0}, requests_{0}, protocol_errors_{0};
  // Proofs refused by the workers, logged (throttled) by the cm thread: no logging on workers.
  std::atomic<uint64_t> proofs_refused_{0};
  uint64_t proofs_refused_logged_ = 0;      // cm thread
  uint64_t timed_out_unlogged_ = 0;         // cm thread
  Clock::time_point last_refusal_log_{};    // cm thread
  std::atomic<uint32_t> authenticated_{0};  // sessions in kReady, for stats()
  std::atomic<bool> srq_alarm_logged_{false};
};

// ---- Fabric
// -------------------------------------------------------------------------------------------
class VerbsFabric final : public Fabric {
 public:
  static Result<std::unique_ptr<VerbsFabric>> Open(const FabricOptions& options);
  ~VerbsFabric() override;

  TransportKind kind() const override { return TransportKind::kVerbs; }
  std::string Describe() const override;
  Result<std::unique_ptr<MemoryRegion>> AllocateRegion(size_t size, RegionAccess access) override;
  Result<std::unique_ptr<Listener>> Listen(ListenOptions options) override;
  Result<std::unique_ptr<Connection>> Connect(const ConnectOptions& options) override;
  Status CheckListenPort(const std::string& what, const std::string& host, uint16_t port) override;

  ibv_context* context() const { return ctx_; }
  ibv_pd* pd() const { return pd_.get(); }
  const ibv_device_attr& device_attr() const { return device_attr_; }
  const ibv_port_attr& port_attr() const { return port_attr_; }
  const std::string& device_name() const { return device_name_; }
  rdma_event_channel* cm_channel() const { return cm_channel_.get(); }
  // True when the device supports type-2 memory windows (IBV_DEVICE_MEM_WINDOW_TYPE_2B):
  // server regions are then registered without remote access, for windows only.
  bool memory_windows() const { return memory_windows_; }
  // The registration of a region this fabric allocated that covers r (same rkey, r inside it),
  // or null. Regions unregister themselves when destroyed.
  ibv_mr* FindRegistration(const RegionDescriptor& r);
  void AddRegistration(ibv_mr* mr);
  void RemoveRegistration(ibv_mr* mr);
  void RegisterCmSink(rdma_cm_id* id, CmEventSink* sink);
  void UnregisterCmSink(rdma_cm_id* id);

 private:
  VerbsFabric() = default;
  void ThreadMain();

  DeviceList devices_;
  ibv_context* ctx_ = nullptr;  // owned by librdmacm, kept alive by devices_
  uint8_t port_num_ = 0;
  std::string device_name_;
  ibv_device_attr device_attr_{};
  ibv_port_attr port_attr_{};
  bool huge_pages_ = true;
  bool memory_windows_ = false;
  ProtectionDomain pd_;
  Mutex regions_mu_;
  std::vector<ibv_mr*> registrations_ GUARDED_BY(regions_mu_);
  EventChannel cm_channel_;  // established client ids, migrated here
  EventFd wake_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  Mutex sinks_mu_;
  std::unordered_map<rdma_cm_id*, CmEventSink*> sinks_ GUARDED_BY(sinks_mu_);
};

}  // namespace rdkv::transport::verbs

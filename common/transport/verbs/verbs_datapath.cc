// Datapath of the verbs transport: READ posting and polling, two-sided send/receive with
// credits, client progress, server workers, Reply, and the handshake's messages on the QP (once
// per connection: the proof check, the window binds, WELCOME). No logging here and no
// per-operation heap allocation, except: the handshake messages, a message that must wait for
// credits or send buffers is copied into a queue, a multi-fragment request is reassembled into a
// vector, and Call's response vector grows to the largest response seen. Errors carry short
// messages (error paths only).
#include <poll.h>
#include <time.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "common/transport/auth.h"
#include "common/transport/verbs/verbs_internal.h"
#include "common/util/thread_name.h"

namespace rdkv::transport::verbs {

namespace {

constexpr int kPollBatch = 32;
// How long the polling server worker keeps polling an empty CQ before it blocks on the
// completion channel: twice the recent average idle gap when that is within kServerSpinMax
// (the next request is likely to come while it spins: no wake-up on the request's path), else
// kServerSpinMin (requests come too seldom for spinning to catch them: an idle server uses no
// CPU beyond that). A fixed count of 128 polls was a few microseconds under Soft-RoCE in an
// emulated VM, so a client sending its next request a round trip later always found the worker
// asleep.
constexpr auto kServerSpinMin = std::chrono::microseconds(20);
constexpr auto kServerSpinMax = std::chrono::microseconds(300);
static_assert(kServerSpinMin <= kServerSpinMax);
// How long a waiting client thread keeps polling before it blocks on the completion channel:
// twice its recent waits, at least kClientSpinMin (far longer than a READ round trip on real
// NICs, ~2 us) and at most kClientSpinMax. A completion that arrives after the spin costs a
// completion-channel wake-up (a system call and a scheduler round trip: under Soft-RoCE in an
// emulated VM, where a READ takes 40-60 us, a fixed 50 us spin made most GETs block).
constexpr auto kClientSpinMin = std::chrono::microseconds(50);
constexpr auto kClientSpinMax = std::chrono::microseconds(300);
static_assert(kClientSpinMin <= kClientSpinMax);
constexpr auto kMaxBlock = std::chrono::milliseconds(10);  // longest single sleep of a waiter

// A running average over about the last eight durations, each counted up to kMaxBlock: the
// recent waits of a client poller and the recent idle gaps of a server poller.
Clock::duration AverageIn(Clock::duration average, Clock::duration sample) {
  return average + (std::min<Clock::duration>(sample, kMaxBlock) - average) / 8;
}

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

int MillisUntil(Clock::time_point until, int cap_ms) {
  auto left = until - Clock::now();
  if (left <= Clock::duration::zero()) return 0;
  auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
  return static_cast<int>(std::clamp<int64_t>(ms, 1, cap_ms));
}

}  // namespace

ReadStatus ReadStatusFromWc(ibv_wc_status status) {
  switch (status) {
    case IBV_WC_SUCCESS:
      return ReadStatus::kOk;
    case IBV_WC_REM_ACCESS_ERR:
    case IBV_WC_REM_INV_REQ_ERR:
    case IBV_WC_REM_OP_ERR:
      return ReadStatus::kRemoteAccessError;
    case IBV_WC_WR_FLUSH_ERR:
    case IBV_WC_RETRY_EXC_ERR:
    case IBV_WC_RNR_RETRY_EXC_ERR:
    case IBV_WC_REM_ABORT_ERR:
    case IBV_WC_RESP_TIMEOUT_ERR:
    case IBV_WC_FATAL_ERR:
      return ReadStatus::kConnectionLost;
    default:
      return ReadStatus::kLocalError;  // LOC_PROT_ERR, LOC_LEN_ERR, LOC_QP_OP_ERR, ...
  }
}

// =================================================================================================
// MsgChannel
// =================================================================================================

void MsgChannel::Init(const Setup& s) {
  MutexLock lk(&mu_);
  qp_ = s.qp;
  pool_ = s.send_pool;
  free_slots_.clear();
  free_slots_.reserve(pool_->chunks());
  for (uint32_t i = pool_->chunks(); i-- > 0;) free_slots_.push_back(i);
  credits_ = s.peer_credits;
  owed_ = 0;
  granted_total_.store(s.granted_credits, std::memory_order_release);
  pending_.clear();
  waiting_bytes_ = 0;
  max_waiting_bytes_ = s.max_waiting_bytes;
  flood_ = s.flood;
  withhold_ = s.flood || s.withhold_credits;
  received_total_ = 0;
  waiting_since_ns_.store(0, std::memory_order_release);
  credit_threshold_ = std::max<uint32_t>(2, s.granted_credits / 4);
  closed_ = false;
}

bool MsgChannel::PostLocked(MsgType type, uint64_t id, uint32_t total, uint32_t offset,
                            const uint8_t* data, uint32_t length) {
  const uint32_t slot = free_slots_.back();
  free_slots_.pop_back();
  uint8_t* buf = pool_->chunk(slot);
  FragmentHeader h;
  h.type = type;
  h.credits = withhold_ ? 0 : owed_;
  h.id = id;
  h.total = total;
  h.offset = offset;
  h.length = length;
  EncodeFragmentHeader(h, buf);
  if (length > 0) std::memcpy(buf + kFragmentHeaderSize, data, length);
  ibv_sge sge;
  sge.addr = reinterpret_cast<uintptr_t>(buf);
  sge.length = static_cast<uint32_t>(kFragmentHeaderSize + length);
  sge.lkey = pool_->lkey();
  ibv_send_wr wr{};
  wr.wr_id = MakeWrId(kWrSend, slot);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED;
  // The peer may use these credits once the fragment arrives: count them granted first.
  granted_total_.fetch_add(h.credits, std::memory_order_acq_rel);
  ibv_send_wr* bad = nullptr;
  if (ibv_post_send(qp_, &wr, &bad) != 0) {  // positive errno; the QP is unusable
    free_slots_.push_back(slot);
    CloseLocked();
    return false;
  }
  if (!withhold_) owed_ = 0;
  --credits_;
  in_flight_.fetch_add(1, std::memory_order_acq_rel);
  return true;
}

namespace {
int64_t SteadyNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}
}  // namespace

bool MsgChannel::FlushLocked() {
  const bool waited = !pending_.empty();
  bool progressed = false;
  while (!pending_.empty() && CanSendData()) {
    progressed = true;
    Pending& p = pending_.front();
    const uint32_t len =
        static_cast<uint32_t>(std::min<size_t>(kMaxFragmentPayload, p.total - p.next));
    if (!PostLocked(p.type, p.id, p.total, p.next, p.rest.data() + (p.next - p.base), len)) {
      return false;
    }
    p.next += len;
    waiting_bytes_ -= len;
    if (p.next >= p.total) pending_.pop_front();
  }
  // The stall clock measures time without progress: it restarts whenever a waiting fragment
  // went out (a client that takes its answers slowly but steadily is not cut off).
  if (pending_.empty()) {
    waiting_since_ns_.store(0, std::memory_order_release);
  } else if (waited && progressed) {
    waiting_since_ns_.store(SteadyNanos(), std::memory_order_release);
  }
  // Credits owed and nothing carried them: a credit-only fragment (may use the reserve credit).
  if (owed_ >= credit_threshold_ && credits_ >= 1 && !free_slots_.empty() && !withhold_) {
    if (!PostLocked(MsgType::kCredit, 0, 0, 0, nullptr, 0)) return false;
  }
  return true;
}

Status MsgChannel::Send(MsgType type, uint64_t id, std::span<const uint8_t> payload, bool* fatal) {
  *fatal = false;
  MutexLock lk(&mu_);
  if (closed_) return Status::ConnectionLost("connection closed");
  const uint32_t total = static_cast<uint32_t>(payload.size());
  uint32_t offset = 0;
  if (pending_.empty()) {
    while (CanSendData()) {
      const uint32_t len =
          static_cast<uint32_t>(std::min<size_t>(kMaxFragmentPayload, total - offset));
      if (!PostLocked(type, id, total, offset, payload.data() + offset, len)) {
        *fatal = true;
        return Status::ConnectionLost("ibv_post_send failed");
      }
      offset += len;
      if (offset >= total) return Status::Ok();
    }
  }
  // No credit, send buffer or queue space now: keep the rest until Flush().
  Pending p;
  p.type = type;
  p.id = id;
  p.total = total;
  p.base = offset;
  p.next = offset;
  if (max_waiting_bytes_ > 0 && waiting_bytes_ + (total - offset) > max_waiting_bytes_) {
    // The peer takes no answers (no credits come back) while they pile up: cut it off.
    CloseLocked();
    *fatal = true;
    return Status::Busy("the peer took no answers: " + std::to_string(max_waiting_bytes_) +
                        " bytes wait for credits");
  }
  p.rest.assign(payload.begin() + offset, payload.end());
  waiting_bytes_ += total - offset;
  if (pending_.empty()) waiting_since_ns_.store(SteadyNanos(), std::memory_order_release);
  pending_.push_back(std::move(p));
  return Status::Ok();
}

bool MsgChannel::OnCredits(uint32_t credits) {
  MutexLock lk(&mu_);
  credits_ += credits;
  return closed_ || FlushLocked();
}

bool MsgChannel::OnSendCompleted(uint32_t slot) {
  MutexLock lk(&mu_);
  if (pool_ == nullptr || slot >= pool_->chunks()) return false;
  free_slots_.push_back(slot);
  in_flight_.fetch_sub(1, std::memory_order_acq_rel);
  return closed_ || FlushLocked();
}

bool MsgChannel::OnReceivesReposted(uint32_t count) {
  MutexLock lk(&mu_);
  owed_ += count;
  return closed_ || FlushLocked();
}

bool MsgChannel::SendKeepAlive() {
  MutexLock lk(&mu_);
  if (closed_ || !pending_.empty() || credits_ < 2 || free_slots_.empty()) return true;
  return PostLocked(MsgType::kCredit, 0, 0, 0, nullptr, 0);
}

void MsgChannel::Close() {
  MutexLock lk(&mu_);
  CloseLocked();
}

void MsgChannel::CloseLocked() {
  closed_ = true;
  pending_.clear();
  waiting_bytes_ = 0;
  waiting_since_ns_.store(0, std::memory_order_release);
}

// =================================================================================================
// ClientConnection: READs
// =================================================================================================

bool ClientConnection::InRegions(const ReadOp& op) const {
  for (const RegionDescriptor& r : regions_) {
    if (op.rkey != r.rkey || op.remote_addr < r.addr) continue;
    const uint64_t off = op.remote_addr - r.addr;
    if (off <= r.length && op.length <= r.length - off) return true;
  }
  return false;
}

Status ClientConnection::LostStatus() const {
  const char* why = death_reason_.load(std::memory_order_acquire);
  return Status::ConnectionLost(peer_ + ": " + (why != nullptr ? why : "connection lost"));
}

// A kConnectionLost answer leaves every op of the batch either done (kConnectionLost) or posted
// (it completes through the CQ, as a flush): the caller waits for done() on each before it
// reuses their buffers (ReadAndWait does).
Status ClientConnection::PostReads(std::span<ReadOp* const> ops) {
  if (ops.empty()) return Status::Ok();
  if (ops.size() > options_.max_outstanding_reads) {
    return Status::InvalidArgument("batch exceeds max_outstanding_reads");
  }
  const bool check = local_read_check_.load(std::memory_order_relaxed);
  uint32_t to_post = 0;
  for (const ReadOp* op : ops) {
    if (op->length == 0) return Status::InvalidArgument("zero-length READ");
    if (op->length > max_read_length_) return Status::InvalidArgument("READ too long");
    if (!check || InRegions(*op)) ++to_post;
  }
  if (!alive()) {
    EndUnposted(ops);
    return LostStatus();
  }
  // Reserve send-queue slots for the whole batch, or none (kBusy).
  uint32_t cur = reads_in_flight_.load(std::memory_order_relaxed);
  do {
    if (cur + to_post > options_.max_outstanding_reads) return Status::Busy("reads in flight");
  } while (!reads_in_flight_.compare_exchange_weak(cur, cur + to_post, std::memory_order_acq_rel,
                                                   std::memory_order_relaxed));
  // Every op inside a region (the usual case): none is looked at again.
  const bool filter = to_post < ops.size();
  const Status posted = to_post > 0 ? PostReadBatch(ops, filter) : Status::Ok();
  if (posted.ok() && keepalive_ns_ > 0) MaybeKeepAlive();
  if (filter) {
    // Left out of the chain, outside every advertised region: what the NIC would refuse (and a
    // NIC refusal would also kill the queue pair), refused here without sending it; after a
    // failed post, lost like the chain's unposted READs (PostReadBatch ended those).
    const ReadStatus left_out =
        posted.ok() ? ReadStatus::kRemoteAccessError : ReadStatus::kConnectionLost;
    for (ReadOp* op : ops) {
      if (!InRegions(*op)) op->status.store(left_out, std::memory_order_release);
    }
  }
  return posted;
}

namespace {
// The one definition of a READ work request: the op's own buffer, lkey, remote address and
// rkey, its pointer as the wr_id (PollCq finds it from there), always signalled.
void FillReadWr(const ReadOp& op, ibv_send_wr* wr, ibv_sge* sge) {
  *wr = ibv_send_wr{};  // every field a provider may read (imm_data, the unions) is zero
  sge->addr = reinterpret_cast<uintptr_t>(op.local);
  sge->length = op.length;
  sge->lkey = op.lkey;
  wr->wr_id = reinterpret_cast<uint64_t>(&op);
  wr->sg_list = sge;
  wr->num_sge = 1;
  wr->opcode = IBV_WR_RDMA_READ;
  wr->send_flags = IBV_SEND_SIGNALED;
  wr->wr.rdma.remote_addr = op.remote_addr;
  wr->wr.rdma.rkey = op.rkey;
}
}  // namespace

Status ClientConnection::PostReadBatch(std::span<ReadOp* const> ops, bool filter) {
  // A small batch (every GET's) is built on the stack and posted without a lock: ibv_post_send
  // is thread-safe (the provider serializes its send queue), so threads sharing this QP do not
  // queue behind each other here. Larger batches use the connection's preallocated chain.
  bool posted;
  if (ops.size() <= kStackReads) {
    ibv_send_wr wrs[kStackReads];
    ibv_sge sges[kStackReads];
    posted = PostChain(ops, filter, wrs, sges);
  } else {
    MutexLock lk(&post_mu_);
    posted = PostChain(ops, filter, wrs_.data(), sges_.data());
  }
  if (posted) return Status::Ok();
  Kill("ibv_post_send of READs failed");  // with no lock held (the lock order in the header)
  return LostStatus();
}

bool ClientConnection::PostChain(std::span<ReadOp* const> ops, bool filter, ibv_send_wr* wrs,
                                 ibv_sge* sges) {
  size_t n = 0;
  for (ReadOp* op : ops) {
    if (filter && !InRegions(*op)) continue;
    FillReadWr(*op, &wrs[n], &sges[n]);
    if (n > 0) wrs[n - 1].next = &wrs[n];
    ++n;
  }
  ibv_send_wr* bad = nullptr;
  if (ibv_post_send(qp_.get(), wrs, &bad) == 0) return true;  // one doorbell for the chain
  FailPost(wrs, n, bad);
  return false;
}

void ClientConnection::FailPost(ibv_send_wr* wrs, size_t n, ibv_send_wr* bad) {
  // Positive errno. WRs before `bad` were posted (they will flush); the rest were not.
  const size_t posted = bad != nullptr ? static_cast<size_t>(bad - wrs) : 0;
  reads_in_flight_.fetch_sub(static_cast<uint32_t>(n - posted), std::memory_order_acq_rel);
  for (size_t i = posted; i < n; ++i) {
    reinterpret_cast<ReadOp*>(wrs[i].wr_id)
        ->status.store(ReadStatus::kConnectionLost, std::memory_order_release);
  }
}

void ClientConnection::EndUnposted(std::span<ReadOp* const> ops) {
  for (ReadOp* op : ops) op->status.store(ReadStatus::kConnectionLost, std::memory_order_release);
}

namespace {
// The keep-alive's clock: monotonic at the kernel tick's resolution (milliseconds, against a
// keep-alive period of seconds), read from the vDSO without touching the clock device. Every
// PostReads reads it; CLOCK_MONOTONIC costs a system call and a device read where the clock
// source is an HPET (an emulated machine's, about 1 us) and CLOCK_MONOTONIC_COARSE does not.
int64_t CoarseNanos() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}
}  // namespace

void ClientConnection::MaybeKeepAlive() {
  const int64_t now = CoarseNanos();
  int64_t last = last_sent_ns_.load(std::memory_order_relaxed);
  if (now - last < keepalive_ns_) return;
  // One thread sends it; the others see the new time.
  if (!last_sent_ns_.compare_exchange_strong(last, now, std::memory_order_relaxed)) return;
  if (!chan_.SendKeepAlive()) Kill("ibv_post_send of a keep-alive failed");
}

size_t ClientConnection::PollReads() {
  if (!poll_mu_.TryLock()) return 0;  // another thread is polling; it will set our statuses
  size_t reads = 0;
  size_t seen = 0;
  for (int i = 0; i < 4; ++i) {
    size_t n = PollCq(&reads);
    seen += n;
    if (n < static_cast<size_t>(kPollBatch)) break;
  }
  poll_mu_.Unlock();
  if (seen > 0) WakeWaiters();
  return reads;
}

Status ClientConnection::WaitReads(std::span<ReadOp* const> ops, Clock::time_point deadline) {
  size_t first_pending = 0;
  while (true) {
    while (first_pending < ops.size() && ops[first_pending]->done()) ++first_pending;
    if (first_pending == ops.size()) return Status::Ok();
    if (Clock::now() >= deadline) return Status::TimedOut("READs not done by the deadline");
    Progress(deadline);
  }
}

Status ClientConnection::ReadAndWait(std::span<ReadOp* const> ops, Clock::time_point deadline) {
  for (const ReadOp* op : ops) {
    if (op->length == 0) return Status::InvalidArgument("zero-length READ");
    if (op->length > max_read_length_) return Status::InvalidArgument("READ too long");
  }
  const size_t batch = options_.max_outstanding_reads;
  size_t next = 0;           // first op not posted yet
  size_t first_pending = 0;  // first op not known done
  bool progressed = false;
  while (true) {
    while (next < ops.size()) {
      size_t n = std::min(batch, ops.size() - next);
      Status s = PostReads(ops.subspan(next, n));
      if (s.ok()) {
        next += n;
        continue;
      }
      if (s.code() == StatusCode::kBusy) break;
      // Broken connection. PostReads ended this batch's unposted READs; its posted ones
      // flush and are waited for below (their buffers are the NIC's until then). The batches
      // never offered end now.
      if (s.code() != StatusCode::kConnectionLost) n = 0;
      EndUnposted(ops.subspan(next + n));
      next = ops.size();
    }
    while (first_pending < next && ops[first_pending]->done()) ++first_pending;
    if (first_pending == ops.size()) return Status::Ok();
    // The deadline is read after a Progress, not before the first: the caller has just made it
    // from the clock, and Progress bounds its own wait by it.
    if (progressed && Clock::now() >= deadline) {
      // Never posted (the queue stayed full): end them so that callers waiting on done() stop.
      for (size_t i = next; i < ops.size(); ++i) {
        ops[i]->status.store(ReadStatus::kLocalError, std::memory_order_release);
      }
      return Status::TimedOut("READs not done by the deadline");
    }
    Progress(deadline);
    progressed = true;
  }
}

// =================================================================================================
// ClientConnection: progress
// =================================================================================================

size_t ClientConnection::PollCq(size_t* reads) {
  ibv_wc wc[kPollBatch];
  const int n = ibv_poll_cq(cq_.get(), kPollBatch, wc);
  if (n < 0) {  // negative on failure (the only ibv_* call with that convention)
    Kill("ibv_poll_cq failed");
    return 0;
  }
  uint32_t nrepost = 0;
  for (int i = 0; i < n; ++i) {
    const ibv_wc& c = wc[i];
    switch (WrKindOf(c.wr_id)) {
      case kWrRead: {
        auto* op = reinterpret_cast<ReadOp*>(c.wr_id);
        reads_in_flight_.fetch_sub(1, std::memory_order_acq_rel);  // before the op is seen done
        op->status.store(ReadStatusFromWc(c.status), std::memory_order_release);
        ++*reads;
        if (c.status != IBV_WC_SUCCESS) Kill(ibv_wc_status_str(c.status));
        break;
      }
      case kWrSend:
        if (!chan_.OnSendCompleted(WrIndexOf(c.wr_id))) Kill("ibv_post_send failed");
        if (c.status != IBV_WC_SUCCESS) Kill(ibv_wc_status_str(c.status));
        break;
      case kWrRecv:
        if (c.status != IBV_WC_SUCCESS) {
          Kill(ibv_wc_status_str(c.status));
          break;
        }
        HandleReceive(WrIndexOf(c.wr_id), c.byte_len);
        reposts_[nrepost++] = WrIndexOf(c.wr_id);
        break;
      case kWrWrite:
        write_status_.store(static_cast<int>(c.status), std::memory_order_release);
        if (c.status != IBV_WC_SUCCESS) Kill(ibv_wc_status_str(c.status));
        break;
      default:
        Kill("completion with an unknown work request id");
        break;
    }
  }
  if (nrepost > 0 && alive()) {
    for (uint32_t i = 0; i < nrepost; ++i) {
      const uint32_t idx = reposts_[i];
      recv_sges_[i].addr = reinterpret_cast<uintptr_t>(recv_pool_.chunk(idx));
      recv_wrs_[i].wr_id = MakeWrId(kWrRecv, idx);
      recv_wrs_[i].next = i + 1 < nrepost ? &recv_wrs_[i + 1] : nullptr;
    }
    ibv_recv_wr* bad = nullptr;
    if (ibv_post_recv(qp_.get(), recv_wrs_.data(), &bad) != 0) {
      Kill("ibv_post_recv failed");
    } else if (!chan_.OnReceivesReposted(nrepost)) {
      Kill("ibv_post_send failed");
    }
  }
  return static_cast<size_t>(n);
}

size_t ClientConnection::BlockOnCq(Clock::time_point until, size_t* reads) {
  if (ibv_req_notify_cq(cq_.get(), 0) != 0) {  // positive errno
    Kill("ibv_req_notify_cq failed");
    return 0;
  }
  // Completions that arrived before the CQ was armed raise no event: look once more.
  size_t n = PollCq(reads);
  if (n > 0) return n;
  const int ms = MillisUntil(until, static_cast<int>(kMaxBlock.count()));
  if (ms == 0) return 0;
  pollfd pfd{comp_channel_.fd(), POLLIN, 0};
  if (poll(&pfd, 1, ms) > 0) {
    ibv_cq* ev_cq = nullptr;
    void* ev_ctx = nullptr;
    while (ibv_get_cq_event(comp_channel_.get(), &ev_cq, &ev_ctx) == 0) {
      ibv_ack_cq_events(ev_cq, 1);  // every event taken is acked (ibv_destroy_cq waits for it)
    }
  }
  return PollCq(reads);
}

void ClientConnection::WakeWaiters() {
  epoch_.fetch_add(1);
  if (waiters_.load() > 0) {
    MutexLock lk(&wait_mu_);
    wait_cv_.SignalAll();
  }
}

Clock::duration ClientConnection::SpinBudget() const {
  return std::clamp<Clock::duration>(2 * wait_avg_, kClientSpinMin, kClientSpinMax);
}

void ClientConnection::NoteWait(Clock::duration waited) {
  wait_avg_ = AverageIn(wait_avg_, waited);  // SpinBudget keeps its bounds whatever it holds
}

void ClientConnection::Progress(Clock::time_point deadline) {
  const uint64_t seen_epoch = epoch_.load();
  if (poll_mu_.TryLock()) {
    size_t reads = 0;
    size_t n = PollCq(&reads);
    if (n == 0) {
      const Clock::time_point start = Clock::now();
      const Clock::time_point spin_until = start + SpinBudget();
      // Back to back, as perftest polls: a pause between polls is as much added to the
      // completion's latency (about 40 ns on recent x86, 250 ns under an emulator, which
      // leaves its translated code for it). One pause per 16 polls, with the clock read,
      // still yields to a hyperthread sibling.
      for (int spin = 1; n == 0; ++spin) {
        n = PollCq(&reads);
        if ((spin & 15) == 0) {
          if (Clock::now() >= spin_until) break;
          CpuRelax();
        }
      }
      if (n == 0) n = BlockOnCq(std::min(deadline, Clock::now() + kMaxBlock), &reads);
      if (n > 0) NoteWait(Clock::now() - start);  // a wait that ended in nothing says nothing
    }
    poll_mu_.Unlock();
    WakeWaiters();  // others re-check their state, and one of them may take over polling
    return;
  }
  waiters_.fetch_add(1);
  {
    const Clock::time_point until = std::min(deadline, Clock::now() + kMaxBlock);
    MutexLock lk(&wait_mu_);
    while (epoch_.load() == seen_epoch && wait_cv_.WaitUntil(&wait_mu_, until)) {
    }
  }
  waiters_.fetch_sub(1);
}

// =================================================================================================
// ClientConnection: two-sided calls
// =================================================================================================

void ClientConnection::HandleReceive(uint32_t index, uint32_t byte_len) {
  if (index >= recv_pool_.chunks()) return ProtocolError("receive completion for no buffer");
  const uint8_t* buf = recv_pool_.chunk(index);
  FragmentHeader h;
  const char* why = nullptr;
  if (!DecodeFragmentHeader(buf, byte_len, options_.max_message_size, &h, &why)) {
    return ProtocolError(why);
  }
  if (h.credits > 0 && !chan_.OnCredits(h.credits)) Kill("ibv_post_send failed");
  if (h.type == MsgType::kCredit) return;
  if (hs_state_.load(std::memory_order_acquire) != kHsWelcome) {
    return HandleHandshakeMessage(h, buf + kFragmentHeaderSize);
  }
  switch (h.type) {
    case MsgType::kResponse:
    case MsgType::kErrorResponse:
      return DeliverResponse(h, buf + kFragmentHeaderSize);
    default:
      return ProtocolError("unexpected message type from the server");
  }
}

void ClientConnection::HandleHandshakeMessage(const FragmentHeader& h, const uint8_t* payload) {
  // Only during Establish, which waits for this: allocation and strings are fine here.
  if (hs_state_.load(std::memory_order_acquire) != kHsWaiting) return;
  if (h.offset != 0 || h.length != h.total) {
    hs_refusal_ = Status::ProtocolError("verbs " + peer_ + ": fragmented handshake message");
  } else if (h.type == MsgType::kWelcome) {
    WelcomeData w;
    Status st = DecodeWelcome({payload, h.length}, &w);
    if (st.ok()) {
      regions_ = std::move(w.regions);
      windows_ = (w.flags & kAcceptFlagMemoryWindows) != 0;
      keepalive_ns_ = int64_t{w.keepalive_s} * 1'000'000'000;
      last_sent_ns_.store(CoarseNanos(), std::memory_order_relaxed);
      hs_state_.store(kHsWelcome, std::memory_order_release);
      return;
    }
    hs_refusal_ = Status::ProtocolError("verbs " + peer_ + ": " + st.message());
  } else if (h.type == MsgType::kAuthRefused) {
    hs_refusal_ = DecodeAuthRefused({payload, h.length}, peer_);
  } else {
    hs_refusal_ =
        Status::ProtocolError("verbs " + peer_ + ": the server answered before the handshake");
  }
  hs_state_.store(kHsRefused, std::memory_order_release);
  Kill("handshake refused");
}

void ClientConnection::DeliverResponse(const FragmentHeader& h, const uint8_t* payload) {
  const uint32_t index = static_cast<uint32_t>(h.id & 0xFFFF);
  const uint64_t seq = h.id >> 16;
  if (index >= slot_count_) return ProtocolError("response for an unknown call slot");
  CallSlot& slot = slots_[index];
  uint64_t w = slot.word.load(std::memory_order_acquire);
  if ((w >> 3) != seq) return;  // a response to a call that timed out long ago: dropped
  uint64_t state = w & 7;
  if (state == kWaiting) {
    if (h.offset != 0) return ProtocolError("response does not start at offset 0");
    if (!slot.word.compare_exchange_strong(w, (seq << 3) | kFilling, std::memory_order_acq_rel)) {
      return;  // the caller gave up just now (slot is free again): dropped
    }
    slot.total = h.total;
    slot.received = 0;
    slot.code = StatusCode::kOk;
    if (h.type == MsgType::kErrorResponse) {
      if (h.length != h.total || h.total == 0 || payload[0] == 0 ||
          payload[0] > static_cast<uint8_t>(StatusCode::kProtocolError)) {
        return ProtocolError("malformed error response");
      }
      slot.code = static_cast<StatusCode>(payload[0]);
      slot.buf.assign(payload + 1, payload + h.length);
      slot.received = h.total;
    } else {
      slot.buf.resize(h.total);
    }
    state = kFilling;
  } else if (state == kFilling || state == kAbandoned) {
    if (h.type != MsgType::kResponse || h.offset != slot.received || h.total != slot.total) {
      return ProtocolError("response fragments out of order");
    }
  } else {
    return;  // duplicate for a finished call: dropped
  }
  if (h.type == MsgType::kResponse) {
    // Abandoned: the caller no longer reads buf, but the slot stays ours until the last byte.
    if (state == kFilling && h.length > 0)
      std::memcpy(slot.buf.data() + h.offset, payload, h.length);
    slot.received += h.length;
  }
  if (slot.received == slot.total) {
    uint64_t expect = (seq << 3) | kFilling;
    if (!slot.word.compare_exchange_strong(expect, (seq << 3) | kDone, std::memory_order_acq_rel)) {
      FreeSlot(index, seq);  // abandoned mid-way: the poller releases it
    }
  }
}

void ClientConnection::FreeSlot(uint32_t index, uint64_t seq) {
  slots_[index].word.store((seq << 3) | kFree, std::memory_order_release);
  MutexLock lk(&slots_mu_);
  free_slot_list_.push_back(index);
}

void ClientConnection::AbandonSlot(uint32_t index, uint64_t seq) {
  CallSlot& slot = slots_[index];
  uint64_t w = (seq << 3) | kWaiting;
  if (slot.word.compare_exchange_strong(w, (seq << 3) | kFree, std::memory_order_acq_rel)) {
    MutexLock lk(&slots_mu_);
    free_slot_list_.push_back(index);
    return;
  }
  w = (seq << 3) | kFilling;
  if (slot.word.compare_exchange_strong(w, (seq << 3) | kAbandoned, std::memory_order_acq_rel)) {
    return;  // the poller frees it once the last fragment is in
  }
  FreeSlot(index, seq);  // kDone: the response came after all; dropped
}

Result<uint32_t> ClientConnection::AcquireSlot(Clock::time_point deadline, uint64_t* seq) {
  while (true) {
    {
      MutexLock lk(&slots_mu_);
      if (!free_slot_list_.empty()) {
        const uint32_t index = free_slot_list_.back();
        free_slot_list_.pop_back();
        *seq = next_seq_.fetch_add(1, std::memory_order_relaxed);
        slots_[index].word.store((*seq << 3) | kWaiting, std::memory_order_release);
        return index;
      }
    }
    if (!alive()) return LostStatus();
    if (Clock::now() >= deadline) return Status::Busy("call slots busy");
    Progress(deadline);
  }
}

Status ClientConnection::Call(std::span<const uint8_t> request, std::vector<uint8_t>* response,
                              std::chrono::milliseconds timeout) {
  PendingCall call;
  RDKV_RETURN_IF_ERROR(StartCall(request, response, timeout, &call));
  return FinishCall(&call);
}

Status ClientConnection::StartCall(std::span<const uint8_t> request, std::vector<uint8_t>* response,
                                   std::chrono::milliseconds timeout, PendingCall* call) {
  const Clock::time_point deadline = Clock::now() + timeout;
  if (request.size() > max_request_) {
    return Status::InvalidArgument("request exceeds max_message_size");
  }
  if (!alive()) return LostStatus();
  uint64_t seq = 0;
  RDKV_ASSIGN_OR_RETURN(const uint32_t index, AcquireSlot(deadline, &seq));
  bool fatal = false;
  Status sent = chan_.Send(MsgType::kRequest, (seq << 16) | index, request, &fatal);
  if (fatal) Kill("ibv_post_send failed");
  if (!sent.ok()) {
    AbandonSlot(index, seq);
    return LostStatus();
  }
  if (keepalive_ns_ > 0) last_sent_ns_.store(CoarseNanos(), std::memory_order_relaxed);
  call->MarkStarted(response, deadline, timeout, index, seq, nullptr);
  return Status::Ok();
}

bool ClientConnection::WaitCall(PendingCall* call, Clock::time_point until) {
  const Clock::time_point end = std::min(until, call->deadline);
  const CallSlot& slot = slots_[call->slot];
  while (true) {
    if ((slot.word.load(std::memory_order_acquire) & 7) == kDone) return true;
    if (!alive()) return true;  // FinishCall reports the loss at once
    if (Clock::now() >= end) return false;
    Progress(end);
  }
}

Status ClientConnection::FinishCall(PendingCall* call) {
  call->started = false;
  const uint32_t index = call->slot;
  const uint64_t seq = call->sequence;
  CallSlot& slot = slots_[index];
  bool late_poll_done = false;
  while (true) {
    if ((slot.word.load(std::memory_order_acquire) & 7) == kDone) {
      call->response->swap(slot.buf);  // no copy; the slot keeps the caller's old buffer
      const StatusCode code = slot.code;
      FreeSlot(index, seq);
      if (code != StatusCode::kOk) {
        std::string text(call->response->begin(), call->response->end());
        call->response->clear();
        return Status(code, "server: " + text);
      }
      return Status::Ok();
    }
    if (!alive()) {
      AbandonSlot(index, seq);
      return LostStatus();
    }
    if (Clock::now() >= call->deadline) {
      // A FinishCall that starts late (the caller waited on other calls first) looks at the
      // completion queue once before it gives up: the answer may be there, unread.
      if (!late_poll_done && poll_mu_.TryLock()) {
        size_t reads = 0;
        PollCq(&reads);
        poll_mu_.Unlock();
        WakeWaiters();
        late_poll_done = true;
        continue;
      }
      AbandonSlot(index, seq);
      return Status::TimedOut("no response within the timeout");
    }
    Progress(call->deadline);
  }
}

Result<int> ClientConnection::PostWriteForTest(std::span<const uint8_t> local, uint32_t lkey,
                                               uint64_t remote_addr, uint32_t rkey,
                                               std::chrono::milliseconds timeout) {
  if (!alive()) return LostStatus();
  MutexLock one_at_a_time(&write_mu_);
  write_status_.store(-1, std::memory_order_relaxed);
  ibv_sge sge;
  sge.addr = reinterpret_cast<uintptr_t>(local.data());
  sge.length = static_cast<uint32_t>(local.size());
  sge.lkey = lkey;
  ibv_send_wr wr{};
  wr.wr_id = MakeWrId(kWrWrite, 0);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = remote_addr;
  wr.wr.rdma.rkey = rkey;
  ibv_send_wr* bad = nullptr;
  int rc;
  {
    MutexLock lk(&post_mu_);
    rc = ibv_post_send(qp_.get(), &wr, &bad);  // one send-queue slot is reserved for this
  }
  if (rc != 0) return CallError("ibv_post_send (RDMA WRITE)", rc);
  const Clock::time_point deadline = Clock::now() + timeout;
  while (true) {
    const int st = write_status_.load(std::memory_order_acquire);
    if (st >= 0) return st;
    if (Clock::now() >= deadline) return Status::TimedOut("no completion for the RDMA WRITE");
    Progress(deadline);
  }
}

// =================================================================================================
// Server: Reply and the workers
// =================================================================================================

Status ServerSessionImpl::Reply(uint64_t request_id, std::span<const uint8_t> response) {
  bool fatal = false;
  if (response.size() > peer_max_message_) {
    // Tell the caller's Call at once instead of letting it time out.
    static constexpr char kText[] = "response exceeds the client's max_message_size";
    uint8_t err[sizeof(kText)];
    err[0] = static_cast<uint8_t>(StatusCode::kInvalidArgument);
    std::memcpy(err + 1, kText, sizeof(kText) - 1);
    chan_
        .Send(MsgType::kErrorResponse, request_id, std::span<const uint8_t>(err, sizeof(err)),
              &fatal)
        .IgnoreError();
    if (fatal) MarkDead();
    return Status::InvalidArgument("response exceeds the client's max_message_size");
  }
  Status s = chan_.Send(MsgType::kResponse, request_id, response, &fatal);
  if (fatal) {
    // kBusy: its answers passed the byte limit (ReapSessions counts and logs the cut).
    if (s.Is(StatusCode::kBusy)) cut_for_waiting_.store(true, std::memory_order_release);
    MarkDead();
  }
  return s;
}

std::shared_ptr<ServerSessionImpl> VerbsListener::FindSession(uint32_t qp_num) {
  ReaderMutexLock lk(&sessions_mu_);
  auto it = by_qpn_.find(qp_num);
  return it == by_qpn_.end() ? nullptr : it->second;
}

uint8_t* VerbsListener::SrqChunk(uint32_t index, uint32_t* lkey) const {
  const uint32_t block = index / kServerRecvCredits;
  if (block >= srq_blocks_used_.load(std::memory_order_acquire)) return nullptr;
  if (lkey != nullptr) *lkey = srq_blocks_[block].lkey();
  return srq_blocks_[block].chunk(index % kServerRecvCredits);
}

void VerbsListener::QueueRepost(Scratch* scratch, uint32_t index,
                                std::shared_ptr<ServerSessionImpl> credit_to) {
  uint32_t lkey = 0;
  uint8_t* chunk = SrqChunk(index, &lkey);
  if (chunk == nullptr) return;
  const uint32_t group = GroupOfChunk(index);
  // One chain goes to one SRQ: a buffer of another group flushes what is queued first.
  if (scratch->n == kWorkerBatch || (scratch->n > 0 && scratch->group != group)) {
    FlushReposts(scratch);
  }
  scratch->group = group;
  const int i = scratch->n++;
  scratch->sges[i].addr = reinterpret_cast<uintptr_t>(chunk);
  scratch->sges[i].length = kChunkSize;
  scratch->sges[i].lkey = lkey;
  scratch->wrs[i].wr_id = MakeWrId(kWrRecv, index);
  scratch->wrs[i].sg_list = &scratch->sges[i];
  scratch->wrs[i].num_sge = 1;
  scratch->wrs[i].next = nullptr;
  scratch->credit_to[i] = std::move(credit_to);
}

void VerbsListener::FlushReposts(Scratch* scratch) {
  const int n = scratch->n;
  if (n == 0) return;
  for (int i = 0; i + 1 < n; ++i) scratch->wrs[i].next = &scratch->wrs[i + 1];
  ibv_recv_wr* bad = nullptr;
  if (ibv_post_srq_recv(groups_[scratch->group].srq.get(), scratch->wrs, &bad) != 0) {
    srq_post_failed_.store(true, std::memory_order_release);  // the cm thread reports it
  } else {
    // Buffers are back in the SRQ: now (not before) the credits may return to their senders.
    for (int i = 0; i < n;) {
      ServerSessionImpl* s = scratch->credit_to[i].get();
      int j = i + 1;
      while (j < n && scratch->credit_to[j].get() == s) ++j;
      if (s != nullptr && !s->chan_.OnReceivesReposted(static_cast<uint32_t>(j - i))) {
        s->MarkDead();
      }
      i = j;
    }
  }
  for (int i = 0; i < n; ++i) scratch->credit_to[i].reset();
  scratch->n = 0;
}

void VerbsListener::SessionProtocolError(ServerSessionImpl* s) {
  protocol_errors_.fetch_add(1, std::memory_order_relaxed);
  s->MarkDead();
}

void VerbsListener::ProcessCompletion(const ibv_wc& wc, Ready* ready, size_t* nready,
                                      Scratch* scratch) {
  const WrKind kind = WrKindOf(wc.wr_id);
  const uint32_t index = WrIndexOf(wc.wr_id);
  if (kind == kWrSend) {
    std::shared_ptr<ServerSessionImpl> s = FindSession(wc.qp_num);
    if (s == nullptr) return;  // torn down; its send buffers went with it
    if (!s->chan_.OnSendCompleted(index) || wc.status != IBV_WC_SUCCESS ||
        s->close_after_send_.load(std::memory_order_acquire)) {
      s->MarkDead();  // (a refused handshake: AUTH_REFUSED went out, now the disconnect)
    }
    return;
  }
  if (kind == kWrBind) {
    if (wc.status == IBV_WC_SUCCESS) return;
    std::shared_ptr<ServerSessionImpl> s = FindSession(wc.qp_num);
    if (s != nullptr) SessionProtocolError(s.get());  // no window: the client could read nothing
    return;
  }
  if (kind != kWrRecv) return;
  std::shared_ptr<ServerSessionImpl> s = FindSession(wc.qp_num);
  if (wc.status != IBV_WC_SUCCESS) {
    // An SRQ receive that ended in error is no longer posted: give it back to the SRQ.
    QueueRepost(scratch, index, nullptr);
    if (s != nullptr && wc.status != IBV_WC_WR_FLUSH_ERR) s->MarkDead();
    return;
  }
  if (s == nullptr || s->dead()) {
    QueueRepost(scratch, index, nullptr);
    return;
  }
  uint8_t* buf = SrqChunk(index, nullptr);
  if (buf == nullptr) return SessionProtocolError(s.get());
  FragmentHeader h;
  const char* why = nullptr;
  if (!DecodeFragmentHeader(buf, wc.byte_len, options_.max_message_size, &h, &why)) {
    SessionProtocolError(s.get());
    return QueueRepost(scratch, index, nullptr);
  }
  if (!s->chan_.CountReceive()) {  // sent beyond its credits: it ignores flow control
    SessionProtocolError(s.get());
    return QueueRepost(scratch, index, nullptr);
  }
  if (h.credits > 0 && !s->chan_.OnCredits(h.credits)) s->MarkDead();
  s->received_.fetch_add(1, std::memory_order_relaxed);  // activity, for the idle timeout
  if (h.type == MsgType::kCredit) return QueueRepost(scratch, index, std::move(s));
  if (s->auth_state() != ServerSessionImpl::AuthState::kReady) {
    // Before the proof checked out, the only message is AUTH_PROOF: nothing else is served.
    HandleAuthProof(s, h, buf + kFragmentHeaderSize);
    return QueueRepost(scratch, index, std::move(s));
  }
  if (h.type != MsgType::kRequest) {
    SessionProtocolError(s.get());
    return QueueRepost(scratch, index, nullptr);
  }
  if (!s->rx_active_ && h.offset == 0 && h.length == h.total) {
    // Whole request in one buffer: the handler reads it in place; reposted after the handler.
    Ready& r = ready[(*nready)++];
    r.session = std::move(s);
    r.id = h.id;
    r.data = buf + kFragmentHeaderSize;
    r.length = h.length;
    r.srq_index = index;
    return;
  }
  // A fragment of a longer request: copy it out and give the buffer back at once.
  if (h.offset == 0) {
    if (s->rx_active_) {
      SessionProtocolError(s.get());
      return QueueRepost(scratch, index, nullptr);
    }
    s->rx_active_ = true;
    s->rx_id_ = h.id;
    s->rx_received_ = 0;
    s->rx_.resize(h.total);
  } else if (!s->rx_active_ || h.id != s->rx_id_ || h.offset != s->rx_received_ ||
             h.total != s->rx_.size()) {
    SessionProtocolError(s.get());
    return QueueRepost(scratch, index, nullptr);
  }
  std::memcpy(s->rx_.data() + h.offset, buf + kFragmentHeaderSize, h.length);
  s->rx_received_ += h.length;
  if (s->rx_received_ == h.total) {
    Ready& r = ready[(*nready)++];
    r.owned = std::move(s->rx_);
    s->rx_ = std::vector<uint8_t>();
    s->rx_active_ = false;
    r.session = s;
    r.id = h.id;
    r.data = r.owned.data();
    r.length = h.total;
    r.srq_index = -1;
  }
  QueueRepost(scratch, index, std::move(s));
}

void VerbsListener::HandleAuthProof(const std::shared_ptr<ServerSessionImpl>& s,
                                    const FragmentHeader& h, const uint8_t* payload) {
  using AuthState = ServerSessionImpl::AuthState;
  if (s->auth_state() != AuthState::kAwaitProof || h.type != MsgType::kAuthProof || h.offset != 0 ||
      h.length != h.total) {
    return SessionProtocolError(s.get());
  }
  Result<auth::AuthProof> proof = auth::DecodeAuthProof({payload, h.length});
  if (!proof.ok()) return SessionProtocolError(s.get());
  if (!auth::ProofsEqual(proof->client_proof, s->expected_proof_)) {
    // Wrong secret, or a replayed/forged proof (it is bound to this connection's fresh server
    // nonce). Tell the client why, then disconnect once that went out (ProcessCompletion).
    s->auth_state_.store(AuthState::kRefused, std::memory_order_release);
    refused_.fetch_add(1, std::memory_order_relaxed);
    proofs_refused_.fetch_add(1, std::memory_order_relaxed);
    static constexpr char kReason[] =
        "authentication failed: wrong secret for the requested role (the client's "
        "--auth_token_file / --admin_token_file must hold the server's secret)";
    const std::vector<uint8_t> msg = EncodeAuthRefused(StatusCode::kPermissionDenied, kReason);
    s->close_after_send_.store(true, std::memory_order_release);
    bool fatal = false;
    if (!s->chan_.Send(MsgType::kAuthRefused, 0, msg, &fatal).ok() || fatal) s->MarkDead();
    return;
  }
  if (!AdmitSession(s.get())) s->MarkDead();
}

bool VerbsListener::AdmitSession(ServerSessionImpl* s) {
  bool windows = false;
  {
    MutexLock lk(&s->cm_mu_);
    ibv_qp* qp = s->qp_.get();
    if (qp == nullptr || s->dead()) return false;
    // The QP may serve READs from now on (through the windows bound next, or the regions'
    // own rkeys without windows).
    ibv_qp_attr qa{};
    qa.qp_access_flags = IBV_ACCESS_REMOTE_READ;
    if (ibv_modify_qp(qp, &qa, IBV_QP_ACCESS_FLAGS) != 0) return false;
    // Bind each window onto its region, for this QP only: posted ahead of the WELCOME on the
    // same send queue, so a bind is done before the client can learn its rkey.
    const size_t n = s->windows_.size();
    windows = n > 0;
    if (n > 0) {
      ibv_send_wr wrs[kMaxRegions];
      for (size_t i = 0; i < n; ++i) {
        const RegionDescriptor& r = s->welcome_regions_[i];
        ibv_send_wr& wr = wrs[i];
        wr = ibv_send_wr{};
        wr.wr_id = MakeWrId(kWrBind, static_cast<uint32_t>(i));
        wr.opcode = IBV_WR_BIND_MW;
        wr.send_flags = IBV_SEND_SIGNALED;
        wr.next = i + 1 < n ? &wrs[i + 1] : nullptr;
        wr.bind_mw.mw = s->windows_[i].get();
        wr.bind_mw.rkey = r.rkey;
        wr.bind_mw.bind_info.mr = s->window_mrs_[i];
        wr.bind_mw.bind_info.addr = r.addr;
        wr.bind_mw.bind_info.length = r.length;
        wr.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_READ;
      }
      ibv_send_wr* bad = nullptr;
      if (ibv_post_send(qp, wrs, &bad) != 0) return false;
    }
    // Under cm_mu_, so that Teardown (which resets qp_ under it) sees kReady or a null qp_.
    s->auth_state_.store(ServerSessionImpl::AuthState::kReady, std::memory_order_release);
    authenticated_.fetch_add(1, std::memory_order_relaxed);
  }
  WelcomeData w;
  w.flags = windows ? kAcceptFlagMemoryWindows : 0;
  w.keepalive_s = KeepAliveSeconds(options_.idle_timeout);
  w.regions = s->welcome_regions_;
  const std::vector<uint8_t> msg = EncodeWelcome(w);
  accepted_.fetch_add(1, std::memory_order_relaxed);
  bool fatal = false;
  return s->chan_.Send(MsgType::kWelcome, 0, msg, &fatal).ok() && !fatal;
}

void VerbsListener::WaitForCq(int timeout_ms) {
  pollfd pfd[2] = {{comp_channel_.fd(), POLLIN, 0}, {worker_wake_.fd(), POLLIN, 0}};
  if (poll(pfd, 2, timeout_ms) <= 0) return;
  if (pfd[0].revents != 0) {
    ibv_cq* ev_cq = nullptr;
    void* ev_ctx = nullptr;
    while (ibv_get_cq_event(comp_channel_.get(), &ev_cq, &ev_ctx) == 0) ibv_ack_cq_events(ev_cq, 1);
  }
  if (pfd[1].revents != 0) worker_wake_.Drain();
}

int VerbsListener::PollGroups(ibv_wc* wc) {
  // Round robin from the group after the last one polled: a busy group cannot keep the
  // poller from the others. With one group (most listeners) this is one ibv_poll_cq.
  for (uint32_t k = 0; k < group_count_; ++k) {
    RecvGroup& g = groups_[next_poll_group_];
    next_poll_group_ = next_poll_group_ + 1 == group_count_ ? 0 : next_poll_group_ + 1;
    const int n = ibv_poll_cq(g.cq.get(), kWorkerBatch, wc);
    if (n != 0) return n;
    g.empty_epoch.fetch_add(1, std::memory_order_acq_rel);
  }
  return 0;
}

bool VerbsListener::ArmGroups() {
  for (uint32_t g = 0; g < group_count_; ++g) {
    if (ibv_req_notify_cq(groups_[g].cq.get(), 0) != 0) return false;
  }
  return true;
}

size_t VerbsListener::PollForRequests(Ready* ready, Scratch* scratch) {
  int idle = 0;                  // empty polls since the CQ was last found non-empty
  Clock::time_point idle_since;  // when that was
  Clock::duration budget{};      // this idle gap's spin
  while (true) {
    if (stop_flag_.load(std::memory_order_acquire) ||
        paused_flag_.load(std::memory_order_acquire)) {
      return 0;
    }
    ibv_wc wc[kWorkerBatch];
    int n = PollGroups(wc);
    if (n == 0) {
      if (idle++ == 0) {
        idle_since = Clock::now();
        const auto twice =
            2 * std::chrono::nanoseconds(idle_gap_avg_ns_.load(std::memory_order_relaxed));
        budget = twice <= kServerSpinMax ? std::max<Clock::duration>(twice, kServerSpinMin)
                                         : Clock::duration(kServerSpinMin);
      }
      if ((idle & 15) != 0 || Clock::now() - idle_since < budget) {
        CpuRelax();
        continue;
      }
      if (!ArmGroups()) {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
        idle = 1;
        continue;
      }
      n = PollGroups(wc);  // what came before the CQs were armed
      if (n == 0) {
        WaitForCq(100);
        idle = 1;  // still idle since idle_since: the gap goes on (and the count stays small)
        continue;
      }
    }
    if (n < 0) {  // the CQ is broken; nothing sensible to do but not spin
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      continue;
    }
    // A gap ends with the next request (a receive), not with the completion of a reply's
    // SEND: those follow each reply within a round trip and would halve the average.
    bool request = false;
    for (int i = 0; i < n; ++i) request = request || WrKindOf(wc[i].wr_id) == kWrRecv;
    if (idle > 0 && request) {
      const Clock::duration avg = std::chrono::duration_cast<Clock::duration>(
          std::chrono::nanoseconds(idle_gap_avg_ns_.load(std::memory_order_relaxed)));
      idle_gap_avg_ns_.store(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                 AverageIn(avg, Clock::now() - idle_since))
                                 .count(),
                             std::memory_order_relaxed);
    }
    if (request) idle = 0;  // else the gap since idle_since goes on
    size_t nready = 0;
    for (int i = 0; i < n; ++i) ProcessCompletion(wc[i], ready, &nready, scratch);
    FlushReposts(scratch);
    if (nready > 0) return nready;
  }
}

void VerbsListener::WorkerMain() {
  rdkv::util::NameThisThread("rdkv-worker");
  Ready ready[kWorkerBatch];
  Scratch scratch;
  while (true) {
    {
      MutexLock lk(&state_mu_);
      while (!(stop_ || (!paused_ && !poller_active_))) work_cv_.Wait(&state_mu_);
      if (stop_) break;
      poller_active_ = true;
    }
    const size_t n = PollForRequests(ready, &scratch);
    {
      MutexLock lk(&state_mu_);
      poller_active_ = false;
    }
    work_cv_.SignalAll();  // the next worker takes over polling while we run handlers
    if (n == 0) continue;
    {
      // Paused: requests already taken wait here, unhandled.
      MutexLock lk(&state_mu_);
      while (!(stop_ || !paused_)) work_cv_.Wait(&state_mu_);
    }
    for (size_t i = 0; i < n; ++i) {
      Ready& r = ready[i];
      if (!stop_flag_.load(std::memory_order_acquire)) {
        requests_.fetch_add(1, std::memory_order_relaxed);
        options_.handler(std::span<const uint8_t>(r.data, r.length), ReplyHandle{r.session, r.id});
      }
      if (r.srq_index >= 0) {
        QueueRepost(&scratch, static_cast<uint32_t>(r.srq_index), std::move(r.session));
      }
      r.session.reset();
      r.owned = std::vector<uint8_t>();
    }
    FlushReposts(&scratch);
  }
}

}  // namespace rdkv::transport::verbs

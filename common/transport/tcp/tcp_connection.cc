#include "common/transport/tcp/tcp_connection.h"

#include <glog/logging.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "common/transport/tcp/byte_buffer.h"
#include "common/transport/tcp/frame.h"
#include "common/transport/tcp/socket_util.h"
#include "common/transport/tcp/tls.h"
#include "common/util/mutex.h"
#include "common/util/thread_annotations.h"
#include "common/util/units.h"

namespace rdkv::transport::tcp {

namespace {

constexpr size_t kRecvChunk = 256 << 10;
constexpr uint32_t kMaxOutstandingReadsLimit = 1u << 20;
constexpr uint32_t kMaxOutstandingCallsLimit = 1u << 16;
// A READ request the peer leaves unread this long (its socket buffer full) fails the connection.
constexpr std::chrono::seconds kSendStallLimit{5};
// Under TLS, a Call whose head and payload together are at most this many bytes (one TLS
// record's plaintext) is sent as one record.
constexpr size_t kTlsJoinLimit = 16 << 10;
// The reader blocks in recv() for a bounded time (SO_RCVTIMEO of kRecvSlice), so it sees its
// deadline without a poll() before every recv(). The kernel rounds that timeout up to its tick
// (a 2 ms one blocked 8-12 ms on a HZ=250 VM), so slices are used only while the deadline is
// more than kSliceMargin away; the last stretch is polled, which is accurate to a millisecond.
constexpr std::chrono::milliseconds kRecvSlice{2};
constexpr std::chrono::milliseconds kSliceMargin{50};
// A sender that finds no room in the socket looks at least this often whether answers wait to
// be read (nobody else reading them would leave the server unable to take more requests).
constexpr std::chrono::milliseconds kSendReadInterval{1};
// alive() looks at the socket at most this often when nobody is reading it.
constexpr std::chrono::milliseconds kProbeInterval{1};

// Wire ids of READs and Calls: (generation << 32) | slot. The reader accepts a
// completion only for a busy slot whose generation matches, so a stale, duplicated or forged id
// can never reach a ReadOp or a caller that is not waiting for it (nothing that comes off the
// wire is ever dereferenced).
uint64_t MakeWireId(uint32_t slot, uint32_t generation) {
  return (uint64_t{generation} << 32) | slot;
}
uint32_t WireSlot(uint64_t id) { return static_cast<uint32_t>(id); }
uint32_t WireGeneration(uint64_t id) { return static_cast<uint32_t>(id >> 32); }

enum class PostCode { kOk, kBusy, kConnectionLost };

class TcpConnection final : public Connection {
 public:
  TcpConnection(int fd, std::unique_ptr<TlsStream> tls, std::string peer,
                const ConnectOptions& options, const Welcome& welcome,
                std::shared_ptr<RegionRegistry> registry)
      : fd_(fd),
        tls_(std::move(tls)),
        peer_(std::move(peer)),
        registry_(std::move(registry)),
        regions_(welcome.regions),
        receive_limit_(options.max_message_size),
        busy_poll_(options.busy_poll),
        send_limit_(std::min<size_t>(options.max_message_size, welcome.max_message_size)),
        num_read_slots_(options.max_outstanding_reads),
        read_slots_(options.max_outstanding_reads),
        call_slots_(new CallSlot[options.max_outstanding_calls]),
        num_call_slots_(options.max_outstanding_calls),
        in_(kRecvChunk) {
    free_reads_.reserve(read_slots_.size());
    for (size_t i = read_slots_.size(); i > 0; --i)
      free_reads_.push_back(static_cast<uint32_t>(i - 1));
    free_calls_.reserve(num_call_slots_);
    for (uint32_t i = num_call_slots_; i > 0; --i) free_calls_.push_back(i - 1);
    send_buf_.Reserve(size_t{64} * kReadRequestFrameSize);
    timeval slice{0,
                  static_cast<suseconds_t>(
                      std::chrono::duration_cast<std::chrono::microseconds>(kRecvSlice).count())};
    slices_ = setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &slice, sizeof slice) == 0;
  }

  ~TcpConnection() override {
    // Nobody waits on a connection being destroyed, so nobody is reading it.
    closing_.store(true, std::memory_order_release);
    Fail("the connection was closed locally");
    {
      MutexLock lock(&tls_mu_);
      tls_.reset();  // before the socket it uses is closed
    }
    close(fd_);
  }

  const std::vector<RegionDescriptor>& regions() const override { return regions_; }
  // Logically const: when nobody is reading the socket (and at most every kProbeInterval) it
  // reads what the socket already holds, so a peer that closed is seen without a waiting caller.
  bool alive() const override {
    if (!alive_.load(std::memory_order_acquire)) return false;
    const int64_t now = Clock::now().time_since_epoch().count();
    int64_t next = next_probe_.load(std::memory_order_relaxed);
    if (now >= next &&
        next_probe_.compare_exchange_strong(next, now + Clock::duration(kProbeInterval).count(),
                                            std::memory_order_relaxed)) {
      const_cast<TcpConnection*>(this)->ReadIfIdle();
    }
    return alive_.load(std::memory_order_acquire);
  }
  std::string peer() const override { return peer_; }

  Status PostReads(std::span<ReadOp* const> ops) override {
    if (ops.empty()) return Status::Ok();
    RDKV_RETURN_IF_ERROR(ValidateReads(ops, /*whole_batch=*/true));
    size_t posted = 0;
    switch (Post(ops, /*partial=*/false, &posted)) {
      case PostCode::kOk:
        return Status::Ok();
      case PostCode::kBusy:
        return Status(StatusCode::kBusy, "read slots full");  // no alloc (SSO)
      case PostCode::kConnectionLost:
        break;
    }
    return Status::ConnectionLost(peer_ + ": connection lost");
  }

  // Every completion is counted exactly once, by whichever PollReads call runs first after it;
  // with several polling threads, each one sees only its share (the sum is exact).
  size_t PollReads() override {
    ReadIfIdle();
    uint64_t reported = reads_reported_.load(std::memory_order_relaxed);
    uint64_t total;
    do {
      total = reads_completed_.load(std::memory_order_acquire);
      if (total <= reported) return 0;
    } while (!reads_reported_.compare_exchange_weak(reported, total, std::memory_order_relaxed));
    return static_cast<size_t>(total - reported);
  }

  Status ReadAndWait(std::span<ReadOp* const> ops, Clock::time_point deadline) override {
    if (ops.empty()) return Status::Ok();
    RDKV_RETURN_IF_ERROR(ValidateReads(ops, /*whole_batch=*/false));
    size_t posted = 0;
    while (posted < ops.size()) {
      const ProgressSince progress{this, reads_completed_.load(std::memory_order_acquire)};
      size_t n = 0;
      PostCode code = Post(ops.subspan(posted), /*partial=*/true, &n);
      if (code == PostCode::kOk) {
        posted += n;
        continue;
      }
      if (code == PostCode::kConnectionLost) {
        for (size_t i = posted; i < ops.size(); ++i) {
          ops[i]->status.store(ReadStatus::kConnectionLost, std::memory_order_release);
        }
        posted = ops.size();
        break;
      }
      if (!Await(&Progressed, &progress, deadline)) {
        // Every slot stayed busy until the deadline: complete the ops that never left this
        // machine with kLocalError, so every op is either done or owned by the transport.
        for (size_t i = posted; i < ops.size(); ++i) {
          ops[i]->status.store(ReadStatus::kLocalError, std::memory_order_release);
        }
        return Status::TimedOut(peer_ + ": no free READ slot before the deadline");
      }
    }
    return WaitReads(ops, deadline);
  }

  Status WaitReads(std::span<ReadOp* const> ops, Clock::time_point deadline) override {
    for (ReadOp* op : ops) {
      if (!Await(&OpDone, op, deadline)) {
        return Status::TimedOut(peer_ + ": READs not complete by the deadline");
      }
    }
    return Status::Ok();
  }

  Status Call(std::span<const uint8_t> request, std::vector<uint8_t>* response,
              std::chrono::milliseconds timeout) override {
    PendingCall call;
    RDKV_RETURN_IF_ERROR(StartCall(request, response, timeout, &call));
    return FinishCall(&call);
  }

  Status StartCall(std::span<const uint8_t> request, std::vector<uint8_t>* response,
                   std::chrono::milliseconds timeout, PendingCall* call) override {
    if (request.size() > send_limit_) {
      return Status::InvalidArgument("request of " + std::to_string(request.size()) +
                                     " bytes exceeds the message limit of " +
                                     std::to_string(send_limit_));
    }
    Clock::time_point deadline = Clock::now() + timeout;
    uint32_t slot_index;
    uint32_t generation;
    const std::atomic<bool>* finished;  // set when the slot is no longer kWaiting
    {
      MutexLock lock(&calls_mu_);
      while (!calls_dead_ && free_calls_.empty()) {
        if (!call_free_cv_.WaitUntil(&calls_mu_, deadline) && !calls_dead_ && free_calls_.empty()) {
          return Status::Busy(peer_ +
                              ": max_outstanding_calls requests in flight for the whole "
                              "timeout; the request was not sent");
        }
      }
      if (calls_dead_) return Status::ConnectionLost(peer_ + ": " + dead_reason_);
      slot_index = free_calls_.back();
      free_calls_.pop_back();
      CallSlot& slot = call_slots_[slot_index];
      generation = ++slot.generation;
      slot.state = CallSlot::kWaiting;
      slot.response = response;
      slot.finished.store(false, std::memory_order_relaxed);
      finished = &slot.finished;
    }

    uint8_t head[kCallHeadSize];
    EncodeCallHead(FrameType::kCallRequest, MakeWireId(slot_index, generation),
                   static_cast<uint32_t>(request.size()), std::span<uint8_t, kCallHeadSize>(head));
    iovec iov[2] = {{head, kCallHeadSize}, {const_cast<uint8_t*>(request.data()), request.size()}};
    Status send;
    size_t sent_bytes = 0;
    bool stream_broken = false;
    {
      MutexLock lock(&send_mu_);
      send = SendBefore(iov, request.empty() ? 1 : 2, deadline, &sent_bytes);
      // Under TLS a write that did not finish may have left part of a record in the TLS
      // layer (even with nothing counted as sent): the stream is unusable either way.
      if (!send.ok() && (tls_ != nullptr || !(send.Is(StatusCode::kTimedOut) && sent_bytes == 0))) {
        // Part of a frame may be on the wire: the stream is unusable. Failed before send_mu_
        // is released, so no other frame can follow the partial one. Completes our slot too.
        Fail("send: " + send.message());
        stream_broken = true;
      }
    }
    if (!send.ok()) {
      if (!stream_broken) {
        // Nothing of it went out: the stream is intact and the request was not sent.
        MutexLock lock(&calls_mu_);
        ReleaseCallSlotLocked(slot_index);
        return Status::TimedOut(peer_ + ": the peer read nothing within " +
                                std::to_string(timeout.count()) + " ms; the request was not sent");
      }
      if (send.Is(StatusCode::kTimedOut)) {
        MutexLock lock(&calls_mu_);
        ReleaseCallSlotLocked(slot_index);
        return Status::TimedOut(peer_ + ": the request could not be sent within " +
                                std::to_string(timeout.count()) +
                                " ms (the peer stopped reading); the connection is closed");
      }
      // Otherwise Fail completed the slot: FinishCall reports the lost connection.
    }
    call->MarkStarted(response, deadline, timeout, slot_index, 0, finished);
    return Status::Ok();
  }

  bool WaitCall(PendingCall* call, Clock::time_point until) override {
    const auto* finished = static_cast<const std::atomic<bool>*>(call->token);
    if (finished->load(std::memory_order_acquire)) return true;
    Await(&FlagSet, call->token, std::min(until, call->deadline));
    return finished->load(std::memory_order_acquire);
  }

  Status FinishCall(PendingCall* call) override {
    call->started = false;
    Await(&FlagSet, call->token, call->deadline);
    const uint32_t slot_index = call->slot;
    MutexLock lock(&calls_mu_);
    CallSlot& slot = call_slots_[slot_index];
    bool timed_out = slot.state == CallSlot::kWaiting;
    StatusCode code = slot.code;
    std::string error = std::move(slot.error);
    ReleaseCallSlotLocked(slot_index);
    if (timed_out) {
      return Status::TimedOut(peer_ + ": no response within " +
                              std::to_string(call->timeout.count()) +
                              " ms (the request may have been applied)");
    }
    if (code == StatusCode::kOk) return Status::Ok();
    if (code != StatusCode::kConnectionLost)
      return Status(code, peer_ + ": " + error);  // CALL_ERROR
    return Status::ConnectionLost(peer_ + ": " + dead_reason_);
  }

 private:
  // Frees a call slot; a response arriving for it from now on is dropped.
  void ReleaseCallSlotLocked(uint32_t index) REQUIRES(calls_mu_) {
    CallSlot& slot = call_slots_[index];
    ++slot.generation;
    slot.state = CallSlot::kFree;
    slot.response = nullptr;
    slot.error.clear();
    free_calls_.push_back(index);
    call_free_cv_.Signal();
  }

  struct ReadSlot {
    ReadOp* op = nullptr;
    uint32_t generation = 0;
    bool busy = false;
  };
  // Under calls_mu_ (the slots are reached through call_slots_, which is GUARDED_BY it).
  struct CallSlot {
    enum State { kFree, kWaiting, kDone };
    uint32_t generation = 0;
    State state = kFree;
    StatusCode code = StatusCode::kOk;
    std::string error;  // the server's reason with a CALL_ERROR
    std::vector<uint8_t>* response = nullptr;
    // True once state left kWaiting (set under calls_mu_, read without it by Await).
    std::atomic<bool> finished{false};
  };

  Status ValidateReads(std::span<ReadOp* const> ops, bool whole_batch) const {
    if (whole_batch && ops.size() > num_read_slots_) {
      return Status::InvalidArgument("a batch of " + std::to_string(ops.size()) +
                                     " READs exceeds max_outstanding_reads " +
                                     std::to_string(num_read_slots_));
    }
    for (ReadOp* op : ops) {
      if (op == nullptr) return Status::InvalidArgument("null ReadOp");
      if (op->length == 0 || op->length > send_limit_) {
        return Status::InvalidArgument("READ of " + std::to_string(op->length) +
                                       " bytes: must be 1.." + std::to_string(send_limit_));
      }
    }
    return Status::Ok();
  }

  // Takes slots for ops (all of them, or with `partial` as many as are free, at least one),
  // writes their READ_REQUEST frames with one send. Datapath: no allocation.
  PostCode Post(std::span<ReadOp* const> ops, bool partial, size_t* posted)
      EXCLUDES(send_mu_, reads_mu_) {
    MutexLock send_lock(&send_mu_);
    size_t n = ops.size();
    {
      MutexLock lock(&reads_mu_);
      if (reads_dead_) return PostCode::kConnectionLost;
      if (free_reads_.size() < n) {
        if (!partial || free_reads_.empty()) return PostCode::kBusy;
        n = free_reads_.size();
      }
      send_buf_.Clear();
      std::span<uint8_t> w = send_buf_.PrepareWrite(n * kReadRequestFrameSize);
      for (size_t i = 0; i < n; ++i) {
        uint32_t index = free_reads_.back();
        free_reads_.pop_back();
        ReadSlot& slot = read_slots_[index];
        slot.op = ops[i];
        slot.busy = true;
        ++slot.generation;
        ReadOp* op = ops[i];
        op->status.store(ReadStatus::kPending, std::memory_order_relaxed);
        EncodeReadRequest(
            {MakeWireId(index, slot.generation), op->remote_addr, op->rkey, op->length},
            w.subspan(i * kReadRequestFrameSize).first<kReadRequestFrameSize>());
      }
      send_buf_.Commit(n * kReadRequestFrameSize);
    }
    std::span<const uint8_t> bytes = send_buf_.readable();
    iovec iov{const_cast<uint8_t*>(bytes.data()), bytes.size()};
    size_t sent_bytes = 0;
    Status send = SendBefore(&iov, 1, Clock::now() + kSendStallLimit, &sent_bytes);
    if (!send.ok()) {
      Fail("send: " + send.message());  // completes the ops just taken, too
      return PostCode::kConnectionLost;
    }
    *posted = n;
    return PostCode::kOk;
  }

  // ---- Who reads the socket (docs/transport-tcp.md "Client: the waiting caller reads") ----
  // No thread of its own: a caller that waits (WaitReads, ReadAndWait, Call) becomes the reader
  // when nobody is, and completes whatever arrives, for itself and for others. The others sleep
  // on their own condition variable until their operation is done (the reader wakes exactly
  // them) or the reader leaves and hands the socket to one of them. An answer therefore reaches
  // its caller with no thread switch when that caller is the reader, and with one when not.

  // What a caller waits for: ready(arg) turns true (and never back) once the transport has
  // finished the operation. Read with acquire, without locks.
  using ReadyFn = bool (*)(const void*);
  static bool OpDone(const void* op) { return static_cast<const ReadOp*>(op)->done(); }
  static bool FlagSet(const void* flag) {
    return static_cast<const std::atomic<bool>*>(flag)->load(std::memory_order_acquire);
  }
  struct ProgressSince {
    const TcpConnection* conn;
    uint64_t seen;
  };
  static bool Progressed(const void* p) {
    const auto* q = static_cast<const ProgressSince*>(p);
    return q->conn->reads_completed_.load(std::memory_order_acquire) != q->seen ||
           !q->conn->alive_.load(std::memory_order_acquire);
  }

  // A sleeping caller, linked into waiters_ (on its own stack) while it sleeps.
  struct Waiter {
    Waiter(ReadyFn r, const void* a) : ready(r), arg(a) {}
    const ReadyFn ready;
    const void* const arg;
    CondVar cv;
    bool woken = false;  // under progress_mu_: ready, or asked to take over the socket
    Waiter* prev = nullptr;
    Waiter* next = nullptr;
  };

  // Waits until ready(arg) or the deadline; returns ready(arg). Reads the socket itself when
  // nobody else does.
  bool Await(ReadyFn ready, const void* arg, Clock::time_point deadline)
      EXCLUDES(progress_mu_, reads_mu_, calls_mu_) {
    if (ready(arg)) return true;
    Waiter self(ready, arg);
    const Clock::time_point spin_until = std::min(deadline, Clock::now() + busy_poll_);
    for (;;) {
      // While another thread reads, poll for our answer for up to busy_poll before sleeping:
      // a condition-variable wake-up of an idle CPU costs more than a loopback round trip.
      while (reading_now_.load(std::memory_order_relaxed) && !ready(arg) &&
             Clock::now() < spin_until) {
        sched_yield();
      }
      {
        MutexLock lock(&progress_mu_);
        if (ready(arg)) {
          HandOverLocked();  // we may have been woken to take over; pass that on
          return true;
        }
        if (!reading_) {
          SetReadingLocked(true);
        } else {
          self.woken = false;
          Link(&self);
          bool in_time = true;
          while (!self.woken && in_time) in_time = self.cv.WaitUntil(&progress_mu_, deadline);
          Unlink(&self);
          if (self.woken) continue;  // done, or the socket is ours to read: look again
          HandOverLocked();
          return ready(arg);  // the deadline passed
        }
      }
      // The reader until our operation is done or the deadline passes.
      for (;;) {
        const size_t completed = ReadPass(deadline, spin_until, /*block=*/true);
        if (ready(arg) || Clock::now() >= deadline || !alive_.load(std::memory_order_acquire)) {
          break;  // (a failed connection has completed everything: ready(arg) holds)
        }
        if (completed > 0) {
          MutexLock lock(&progress_mu_);
          WakeReadyLocked();
        }
      }
      StopReading();
      return ready(arg);
    }
  }

  // Reads what the socket already holds, unless another thread is reading it (that one will).
  void ReadIfIdle() EXCLUDES(progress_mu_, reads_mu_, calls_mu_) {
    {
      MutexLock lock(&progress_mu_);
      if (reading_) return;
      SetReadingLocked(true);
    }
    ReadPass(Clock::now(), Clock::time_point{}, /*block=*/false);
    StopReading();
  }

  void StopReading() EXCLUDES(progress_mu_) {
    MutexLock lock(&progress_mu_);
    SetReadingLocked(false);
    WakeReadyLocked();
    HandOverLocked();
  }

  void SetReadingLocked(bool reading) REQUIRES(progress_mu_) {
    reading_ = reading;
    reading_now_.store(reading, std::memory_order_relaxed);
  }

  // Wakes every sleeper whose operation is done.
  void WakeReadyLocked() REQUIRES(progress_mu_) {
    for (Waiter* w = waiters_; w != nullptr; w = w->next) {
      if (!w->woken && w->ready(w->arg)) {
        w->woken = true;
        w->cv.Signal();
      }
    }
  }

  // With nobody reading, wakes one sleeper to take the socket over (one already woken will
  // look anyway). Every path that leaves reading_ false with sleepers left calls this.
  void HandOverLocked() REQUIRES(progress_mu_) {
    if (reading_) return;
    for (Waiter* w = waiters_; w != nullptr; w = w->next) {
      if (w->woken) return;
    }
    if (waiters_ != nullptr) {
      waiters_->woken = true;
      waiters_->cv.Signal();
    }
  }

  void Link(Waiter* w) REQUIRES(progress_mu_) {
    w->prev = nullptr;
    w->next = waiters_;
    if (waiters_ != nullptr) waiters_->prev = w;
    waiters_ = w;
  }
  void Unlink(Waiter* w) REQUIRES(progress_mu_) {
    if (w->prev != nullptr) {
      w->prev->next = w->next;
    } else {
      waiters_ = w->next;
    }
    if (w->next != nullptr) w->next->prev = w->prev;
    w->prev = w->next = nullptr;
  }

  // The reader only (reading_ was set by this thread). Receives once (waiting for bytes until
  // the deadline when `block`) and completes every whole frame received; a broken stream or a
  // bad frame fails the connection. Returns how many READs and Calls it completed.
  // Datapath: no allocation unless a frame is larger than any before, or the stream fails.
  size_t ReadPass(Clock::time_point deadline, Clock::time_point spin_until, bool block) {
    if (!alive_.load(std::memory_order_acquire)) {
      // Another thread is failing the connection: finish marking every operation done here
      // (Fail is idempotent), so whoever waits sees its operation complete, never a false
      // timeout in the window before that thread has marked them.
      Fail("");
      return 0;
    }
    size_t want = kRecvChunk;
    if (need_ > in_.size()) want = std::max(want, need_ - in_.size());
    std::span<uint8_t> w = in_.PrepareWrite(want);
    std::string why;
    ssize_t n = Receive(w, deadline, spin_until, block, &why);
    if (n == kNothingYet) return 0;
    if (n == 0) {
      Fail(why.empty() ? "the server closed the connection" : why);
      return 0;
    }
    if (n < 0) {
      Fail(std::string("recv: ") + strerror(errno));
      return 0;
    }
    in_.Commit(static_cast<size_t>(n));
    uint64_t reads = 0;
    size_t completed = 0;
    for (;;) {
      auto f = NextFrame(in_.readable(), receive_limit_);
      if (!f.ok()) {
        why = f.status().message();
        break;
      }
      if (!f->complete) {
        need_ = f->have_header ? f->frame_size : kFrameHeaderSize;
        if (f->have_header) in_.Reserve(f->frame_size);
        break;
      }
      bool good;
      if (f->header.type == FrameType::kReadResponse) {
        good = CompleteRead(f->body, &why);
        reads += good ? 1 : 0;
      } else if (f->header.type == FrameType::kCallResponse) {
        good = CompleteCall(f->body, &why);
      } else if (f->header.type == FrameType::kCallError) {
        good = CompleteCallError(f->body, &why);
      } else {
        why = "unexpected " + std::string(FrameTypeName(f->header.type)) + " frame";
        good = false;
      }
      if (!good) break;
      ++completed;
      in_.Consume(f->frame_size);
      need_ = kFrameHeaderSize;
    }
    if (reads > 0) reads_completed_.fetch_add(reads, std::memory_order_acq_rel);
    if (!why.empty()) Fail("protocol error from the server: " + why);
    return completed;
  }

  // Writes every byte of iov before the deadline: plain SendAllBefore, or through TLS (the
  // TLS stream is locked for each write only, never while waiting for room).
  // Datapath: no allocation unless it fails.
  Status SendBefore(iovec* iov, int iovcnt, Clock::time_point deadline, size_t* sent)
      REQUIRES(send_mu_) EXCLUDES(tls_mu_) {
    // While the socket has no room, read the answers if nobody else does: the server stops
    // taking requests while its answers pile up unread, and nobody else may be waiting.
    const SendWaitHook read_meanwhile{
        [](void* self) { static_cast<TcpConnection*>(self)->ReadIfIdle(); }, this,
        kSendReadInterval};
    if (tls_ == nullptr) return SendAllBefore(fd_, iov, iovcnt, deadline, sent, &read_meanwhile);
    *sent = 0;
    // A Call's head and a small payload go out as one TLS record (one encryption, one send):
    // copied into a buffer that only grows, so steady state allocates nothing.
    iovec joined;
    if (iovcnt > 1) {
      size_t total = 0;
      for (int i = 0; i < iovcnt; ++i) total += iov[i].iov_len;
      if (total <= kTlsJoinLimit) {
        tls_join_.Clear();
        for (int i = 0; i < iovcnt; ++i) tls_join_.Append(iov[i].iov_base, iov[i].iov_len);
        std::span<const uint8_t> r = tls_join_.readable();
        joined = {const_cast<uint8_t*>(r.data()), r.size()};
        iov = &joined;
        iovcnt = 1;
      }
    }
    for (int i = 0; i < iovcnt; ++i) {
      std::span<const uint8_t> left(static_cast<const uint8_t*>(iov[i].iov_base), iov[i].iov_len);
      while (!left.empty()) {
        size_t n = 0;
        TlsIo io;
        {
          MutexLock lock(&tls_mu_);
          io = tls_->Write(left, &n);
          if (io == TlsIo::kClosed || io == TlsIo::kError) {
            return Status::ConnectionLost(tls_->error());
          }
        }
        if (io == TlsIo::kOk) {
          left = left.subspan(n);
          *sent += n;
          continue;
        }
        // TLS may need to read (a key update) before it can write: the reader's job.
        if (io == TlsIo::kWantRead) read_meanwhile.fn(read_meanwhile.arg);
        const Clock::time_point until =
            std::min(deadline, Clock::now() + Clock::duration(kSendReadInterval));
        if (!WaitSocket(io == TlsIo::kWantWrite ? POLLOUT : POLLIN, until)) {
          if (Clock::now() >= deadline) {
            return Status::TimedOut("the peer made no room before the deadline");
          }
          read_meanwhile.fn(read_meanwhile.arg);
        }
      }
    }
    return Status::Ok();
  }

  static constexpr ssize_t kNothingYet = -2;

  // The reader: receives what is there, waiting for it until the deadline when `block`.
  // >0: bytes; 0: the server closed (*why set when TLS failed); kNothingYet: nothing arrived
  // in time (or, without `block`, nothing was there); -1: errno.
  ssize_t Receive(std::span<uint8_t> w, Clock::time_point deadline, Clock::time_point spin_until,
                  bool block, std::string* why) EXCLUDES(tls_mu_) {
    for (;;) {
      if (tls_ == nullptr) {
        // A blocking recv() returns after about kRecvSlice (SO_RCVTIMEO): used while the
        // deadline is far away, so the common wait costs one system call.
        Clock::time_point now = Clock::now();
        const bool spin = block && now < spin_until;
        const bool slice = block && !spin && slices_ && deadline - now > kSliceMargin;
        ssize_t n = recv(fd_, w.data(), w.size(), slice ? 0 : MSG_DONTWAIT);
        if (n >= 0) return n;
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) return -1;
        if (!block || Clock::now() >= deadline) return kNothingYet;
        if (spin) {
          // Busy-polling: the answer usually comes within the budget. Yielding lets any other
          // runnable thread have this CPU meanwhile (more threads than CPUs), and costs one
          // system call when there is none.
          sched_yield();
          continue;
        }
        if (!slice && !WaitSocket(POLLIN, deadline)) return kNothingYet;
        continue;
      }
      size_t n = 0;
      TlsIo io;
      {
        MutexLock lock(&tls_mu_);
        io = tls_->Read(w, &n);
        if (io == TlsIo::kError) *why = tls_->error();
      }
      switch (io) {
        case TlsIo::kOk:
          return static_cast<ssize_t>(n);
        case TlsIo::kClosed:
        case TlsIo::kError:
          return 0;
        case TlsIo::kWantRead:
        case TlsIo::kWantWrite:
          // Wakes on data, on a hang-up, and on the shutdown() of Fail.
          if (!block || !WaitSocket(io == TlsIo::kWantWrite ? POLLOUT : POLLIN, deadline)) {
            return kNothingYet;
          }
          break;
      }
    }
  }

  // Polls the socket for `events` until the deadline; false when it passed first.
  bool WaitSocket(short events, Clock::time_point deadline) {
    for (;;) {
      int timeout_ms = -1;
      if (deadline != Clock::time_point::max()) {
        const Clock::duration left = deadline - Clock::now();
        if (left <= Clock::duration::zero()) return false;
        timeout_ms = static_cast<int>(
            std::min<int64_t>(std::chrono::ceil<std::chrono::milliseconds>(left).count(), 1 << 30));
      }
      pollfd p{fd_, events, 0};
      int rc = poll(&p, 1, timeout_ms);
      if (rc > 0) return true;
      if (rc < 0 && errno != EINTR) return true;  // the next operation reports the error
    }
  }

  bool CompleteRead(std::span<const uint8_t> body, std::string* why) {
    auto r = DecodeReadResponse(body);
    if (!r.ok()) {
      *why = r.status().message();
      return false;
    }
    uint32_t index = WireSlot(r->wr_id);
    MutexLock lock(&reads_mu_);
    if (index >= read_slots_.size() || !read_slots_[index].busy ||
        read_slots_[index].generation != WireGeneration(r->wr_id)) {
      *why = "READ_RESPONSE for a wr_id that is not outstanding";
      return false;
    }
    ReadSlot& slot = read_slots_[index];
    ReadOp* op = slot.op;
    ReadStatus status = r->status;
    if (status == ReadStatus::kOk) {
      if (r->data.size() != op->length) {
        *why = "READ_RESPONSE of " + std::to_string(r->data.size()) + " bytes for a READ of " +
               std::to_string(op->length);
        return false;
      }
      // Like a NIC's local protection check: the destination must lie inside a region of this
      // fabric registered under op->lkey (held registered while we write into it).
      RegionRegistry::Pin region_pin(registry_.get());
      uint8_t* dst = registry_->FindLocal(op->lkey, op->local, op->length);
      if (dst != nullptr) {
        std::memcpy(dst, r->data.data(), op->length);
      } else {
        status = ReadStatus::kLocalError;
      }
    }
    slot.busy = false;
    slot.op = nullptr;
    free_reads_.push_back(index);
    op->status.store(status, std::memory_order_release);  // op may be reused from here on
    return true;
  }

  bool CompleteCall(std::span<const uint8_t> body, std::string* why) {
    auto m = DecodeCall(body);
    if (!m.ok()) {
      *why = m.status().message();
      return false;
    }
    uint32_t index = WireSlot(m->request_id);
    MutexLock lock(&calls_mu_);
    if (index >= num_call_slots_) {
      *why = "CALL_RESPONSE for an id that was never issued";
      return false;
    }
    CallSlot& slot = call_slots_[index];
    // A response for a call that timed out (generation moved on) is dropped, as documented.
    if (slot.state != CallSlot::kWaiting || slot.generation != WireGeneration(m->request_id)) {
      return true;
    }
    slot.response->assign(m->payload.begin(), m->payload.end());
    slot.code = StatusCode::kOk;
    slot.state = CallSlot::kDone;
    slot.finished.store(true, std::memory_order_release);
    return true;
  }

  // The server could not answer the call (e.g. its response exceeds our max_message_size): the
  // caller's Call fails with the server's code and reason; the connection stays up.
  bool CompleteCallError(std::span<const uint8_t> body, std::string* why) {
    auto e = DecodeCallError(body);
    if (!e.ok()) {
      *why = e.status().message();
      return false;
    }
    uint32_t index = WireSlot(e->request_id);
    MutexLock lock(&calls_mu_);
    if (index >= num_call_slots_) {
      *why = "CALL_ERROR for an id that was never issued";
      return false;
    }
    CallSlot& slot = call_slots_[index];
    if (slot.state != CallSlot::kWaiting || slot.generation != WireGeneration(e->request_id)) {
      return true;  // the call timed out: dropped, like a late CALL_RESPONSE
    }
    // kConnectionLost means "the connection broke" to Call; the server never sends it here.
    slot.code = e->code == StatusCode::kConnectionLost ? StatusCode::kProtocolError : e->code;
    slot.error = "the server could not answer: " + e->reason;
    slot.state = CallSlot::kDone;
    slot.finished.store(true, std::memory_order_release);
    return true;
  }

  // The connection is broken (or being closed): fail every READ and Call in flight, refuse new
  // ones. Idempotent; callable from any thread.
  void Fail(const std::string& why) EXCLUDES(reads_mu_, calls_mu_, progress_mu_) {
    bool was_alive = alive_.exchange(false, std::memory_order_acq_rel);
    shutdown(fd_, SHUT_RDWR);
    uint64_t failed = 0;
    {
      MutexLock lock(&reads_mu_);
      reads_dead_ = true;
      for (uint32_t i = 0; i < read_slots_.size(); ++i) {
        ReadSlot& slot = read_slots_[i];
        if (!slot.busy) continue;
        ReadOp* op = slot.op;
        slot.busy = false;
        slot.op = nullptr;
        free_reads_.push_back(i);
        op->status.store(ReadStatus::kConnectionLost, std::memory_order_release);
        ++failed;
      }
    }
    {
      MutexLock lock(&calls_mu_);
      if (!calls_dead_) dead_reason_ = why.empty() ? "connection lost" : why;
      calls_dead_ = true;
      for (uint32_t i = 0; i < num_call_slots_; ++i) {
        CallSlot& slot = call_slots_[i];
        if (slot.state != CallSlot::kWaiting) continue;
        slot.code = StatusCode::kConnectionLost;
        slot.state = CallSlot::kDone;
        slot.finished.store(true, std::memory_order_release);
      }
    }
    call_free_cv_.SignalAll();
    if (failed > 0) reads_completed_.fetch_add(failed, std::memory_order_acq_rel);
    {
      // Every operation is done now: wake every sleeper (each returns, or reads if none does).
      MutexLock lock(&progress_mu_);
      for (Waiter* w = waiters_; w != nullptr; w = w->next) {
        w->woken = true;
        w->cv.Signal();
      }
    }
    if (was_alive && !closing_.load(std::memory_order_acquire)) {
      LOG(WARNING) << peer_ << ": connection lost: " << why << " (" << failed
                   << " READ(s) in flight failed)";
    }
  }

  const int fd_;
  // TLS (null: plaintext). Not thread-safe: every call on it holds tls_mu_, which no thread
  // holds while it waits for the socket (the reader reads while senders write).
  Mutex tls_mu_ ACQUIRED_AFTER(send_mu_);
  std::unique_ptr<TlsStream> tls_;
  const std::string peer_;
  const std::shared_ptr<RegionRegistry> registry_;
  const std::vector<RegionDescriptor> regions_;
  const size_t receive_limit_;       // largest payload we accept (what we told the server)
  const Clock::duration busy_poll_;  // the reader polls this long before it sleeps in recv()
  bool slices_ = false;              // SO_RCVTIMEO took: blocking recv() slices may be used
  const size_t send_limit_;          // largest request / READ: min(ours, the server's)
  std::atomic<bool> alive_{true};
  std::atomic<bool> closing_{false};

  // Lock order: send_mu_, then reads_mu_, calls_mu_ or progress_mu_ (Post and a failed send
  // hold send_mu_ while they take them, Fail taking the three one after the other, never
  // nested); reads_mu_, then the region registry's lock (CompleteRead's RegionRegistry::Pin).
  // The reader holds none of them while it receives.
  // One writer on the socket at a time.
  Mutex send_mu_ ACQUIRED_BEFORE(reads_mu_, calls_mu_, progress_mu_);
  ByteBuffer send_buf_ GUARDED_BY(send_mu_);
  ByteBuffer tls_join_ GUARDED_BY(send_mu_);  // SendBefore under TLS

  const size_t num_read_slots_;
  Mutex reads_mu_;
  std::vector<ReadSlot> read_slots_ GUARDED_BY(reads_mu_);
  // Capacity reserved up front: push/pop never allocate.
  std::vector<uint32_t> free_reads_ GUARDED_BY(reads_mu_);
  bool reads_dead_ GUARDED_BY(reads_mu_) = false;
  std::atomic<uint64_t> reads_completed_{0};
  std::atomic<uint64_t> reads_reported_{0};
  mutable std::atomic<int64_t> next_probe_{0};  // alive(): Clock ticks of the next look

  // Who reads: at most one thread at a time (reading_), sleepers in waiters_.
  Mutex progress_mu_;
  bool reading_ GUARDED_BY(progress_mu_) = false;
  std::atomic<bool> reading_now_{false};  // reading_, for callers polling without the lock
  Waiter* waiters_ GUARDED_BY(progress_mu_) = nullptr;

  Mutex calls_mu_;
  std::unique_ptr<CallSlot[]> call_slots_ GUARDED_BY(calls_mu_);
  const uint32_t num_call_slots_;
  std::vector<uint32_t> free_calls_ GUARDED_BY(calls_mu_);
  CondVar call_free_cv_;
  bool calls_dead_ GUARDED_BY(calls_mu_) = false;
  std::string dead_reason_ GUARDED_BY(calls_mu_);

  // The reader's only (reading_ orders one reader after the next).
  ByteBuffer in_;
  size_t need_ = kFrameHeaderSize;  // bytes the next whole frame needs
};

class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  ~FdCloser() {
    if (fd_ >= 0) close(fd_);
  }
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

}  // namespace

Result<std::unique_ptr<Connection>> CreateTcpConnection(const ConnectOptions& options,
                                                        std::shared_ptr<RegionRegistry> registry) {
  if (options.max_outstanding_reads == 0 ||
      options.max_outstanding_reads > kMaxOutstandingReadsLimit) {
    return Status::InvalidArgument("max_outstanding_reads must be 1.." +
                                   std::to_string(kMaxOutstandingReadsLimit));
  }
  if (options.max_outstanding_calls == 0 ||
      options.max_outstanding_calls > kMaxOutstandingCallsLimit) {
    return Status::InvalidArgument("max_outstanding_calls must be 1.." +
                                   std::to_string(kMaxOutstandingCallsLimit));
  }
  if (options.max_message_size == 0 || options.max_message_size > kMaxMessageSizeLimit) {
    return Status::InvalidArgument("max_message_size must be 1.." +
                                   std::to_string(kMaxMessageSizeLimit));
  }
  RDKV_RETURN_IF_ERROR(CheckBusyPoll(options.busy_poll));
  if (options.auth_token.size() > kMaxTokenLength) {
    return Status::InvalidArgument("auth token longer than " + std::to_string(kMaxTokenLength));
  }
  std::string where = FormatHostPort(options.host, options.port);
  std::string peer = "tcp " + where;
  Clock::time_point deadline = Clock::now() + options.connect_timeout;

  std::shared_ptr<const TlsContext> tls_context;
  if (options.tls.client_enabled()) {
    auto ctx = TlsContext::CreateClient(options.tls);
    if (!ctx.ok()) return ctx.status();
    tls_context = std::move(ctx).value();
    peer = "tls " + where;
  } else if (options.tls.any()) {
    return Status::InvalidArgument(
        "TLS: a client certificate without a CA file (--tls_ca_file) to verify the server");
  }

  auto fd = ConnectTo(options.host, options.port, deadline);
  if (!fd.ok()) return fd.status();
  FdCloser closer(*fd);
  ConfigureStreamSocket(*fd);

  auto handshake_error = [&](const Status& s) -> Status {
    if (s.Is(StatusCode::kTimedOut)) {
      return Status::TimedOut(peer + ": handshake not finished within connect_timeout");
    }
    return Status::Unavailable(peer + ": handshake failed: " + s.message());
  };
  // TLS first (docs/security.md "TLS (tcp)"); the rdkv handshake below runs inside it.
  std::unique_ptr<TlsStream> tls;
  if (tls_context != nullptr) {
    auto stream = TlsStream::Create(tls_context, *fd, options.host);
    if (!stream.ok()) return stream.status();
    tls = std::move(stream).value();
    Status ts = TlsHandshakeBefore(tls.get(), *fd, deadline);
    if (ts.Is(StatusCode::kTimedOut)) {
      return Status::TimedOut(peer + ": TLS handshake not finished within connect_timeout");
    }
    if (!ts.ok()) return Status::Unavailable(peer + ": " + ts.message());
  }
  auto send_all = [&](std::span<const uint8_t> bytes) {
    return tls ? TlsSendAllBefore(tls.get(), *fd, bytes, deadline)
               : SendAllBefore(*fd, bytes, deadline);
  };
  auto recv_exact = [&](std::span<uint8_t> out) {
    return tls ? TlsRecvExactBefore(tls.get(), *fd, out, deadline)
               : RecvExactBefore(*fd, out, deadline);
  };
  // Mutual challenge-response (common/transport/auth.h): HELLO with our nonce, the server's
  // CHALLENGE (its nonce and its proof, checked before we answer), our PROOF, then WELCOME.
  auto nonce = auth::RandomNonce();
  if (!nonce.ok()) return nonce.status();
  std::vector<uint8_t> hello = EncodeHello(
      {kProtocolVersion, static_cast<uint32_t>(options.max_message_size), {options.role, *nonce}});
  const std::span<const uint8_t> hello_body(hello.data() + kFrameHeaderSize, kHelloBodySize);
  Status s = send_all(hello);
  if (!s.ok()) return handshake_error(s);

  FrameHeader last_header;
  std::vector<uint8_t> body;
  // Reads one frame; a REFUSED is turned into its status (returned through *refused).
  auto read_frame = [&](Status* refused) -> Status {
    uint8_t header_bytes[kFrameHeaderSize];
    Status rs = recv_exact(header_bytes);
    if (!rs.ok()) return handshake_error(rs);
    auto header = DecodeFrameHeader(header_bytes, options.max_message_size);
    if (!header.ok()) return Status::ProtocolError(peer + ": " + header.status().message());
    last_header = *header;
    body.assign(header->body_length, 0);
    rs = recv_exact(body);
    if (!rs.ok()) return handshake_error(rs);
    if (header->type != FrameType::kRefused) return Status::Ok();
    auto r = DecodeRefused(body);
    if (!r.ok()) return Status::ProtocolError(peer + ": " + r.status().message());
    std::string msg = peer + " refused the connection: " + r->reason;
    switch (r->code) {
      case StatusCode::kPermissionDenied:
        *refused = Status::PermissionDenied(msg);
        break;
      case StatusCode::kProtocolError:
        *refused = Status::ProtocolError(msg);
        break;
      default:
        *refused = Status(r->code, msg);
    }
    return Status::Ok();
  };
  Status refused = Status::Ok();
  RDKV_RETURN_IF_ERROR(read_frame(&refused));
  if (!refused.ok()) return refused;
  if (last_header.type != FrameType::kChallenge) {
    return Status::ProtocolError(peer + ": expected CHALLENGE, got " +
                                 std::string(FrameTypeName(last_header.type)) +
                                 " (a server of another protocol version?)");
  }
  auto challenge = DecodeChallenge(body);
  if (!challenge.ok()) return Status::ProtocolError(peer + ": " + challenge.status().message());
  const auth::Mac expected =
      auth::ComputeProof(auth::Side::kServer, options.auth_token, options.role, *nonce,
                         challenge->server_nonce, hello_body);
  if (!auth::ProofsEqual(expected, challenge->server_proof)) {
    return Status::PermissionDenied(
        peer + ": the server could not prove that it knows the " +
        std::string(auth::RoleName(options.role)) +
        " secret: the secrets differ (check --auth_token_file / --admin_token_file on both "
        "sides) or this is not the server you meant");
  }
  auth::AuthProof proof;
  proof.client_proof = auth::ComputeProof(auth::Side::kClient, options.auth_token, options.role,
                                          *nonce, challenge->server_nonce, hello_body);
  s = send_all(EncodeProof(proof));
  if (!s.ok()) return handshake_error(s);
  RDKV_RETURN_IF_ERROR(read_frame(&refused));
  if (!refused.ok()) return refused;
  auto* header = &last_header;
  if (header->type != FrameType::kWelcome) {
    return Status::ProtocolError(peer + ": expected WELCOME, got " +
                                 std::string(FrameTypeName(header->type)));
  }
  auto welcome = DecodeWelcome(body);
  if (!welcome.ok()) return Status::ProtocolError(peer + ": " + welcome.status().message());
  if (welcome->version != kProtocolVersion) {
    return Status::ProtocolError(peer + " speaks protocol version " +
                                 std::to_string(welcome->version) + ", this client version " +
                                 std::to_string(kProtocolVersion));
  }
  auto conn = std::make_unique<TcpConnection>(closer.release(), std::move(tls), peer, options,
                                              *welcome, std::move(registry));
  LOG(INFO) << peer << ": connected (session " << welcome->session_id << ", "
            << welcome->regions.size() << " region(s))";
  return std::unique_ptr<Connection>(std::move(conn));
}

}  // namespace rdkv::transport::tcp

#include "common/transport/tcp/tcp_connection.h"

#include <glog/logging.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "common/transport/tcp/byte_buffer.h"
#include "common/transport/tcp/frame.h"
#include "common/transport/tcp/socket_util.h"
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

// Wire ids of READs and Calls: (generation << 32) | slot. The receive thread accepts a
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
  TcpConnection(int fd, std::string peer, const ConnectOptions& options, const Welcome& welcome,
                std::shared_ptr<RegionRegistry> registry)
      : fd_(fd),
        peer_(std::move(peer)),
        registry_(std::move(registry)),
        regions_(welcome.regions),
        receive_limit_(options.max_message_size),
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
  }

  void Start() {
    receiver_ = std::thread([this] { ReceiveLoop(); });
  }

  ~TcpConnection() override {
    closing_.store(true, std::memory_order_release);
    shutdown(fd_, SHUT_RDWR);  // wakes the receive thread with EOF
    if (receiver_.joinable()) receiver_.join();
    Fail("the connection was closed locally");
    close(fd_);
  }

  const std::vector<RegionDescriptor>& regions() const override { return regions_; }
  bool alive() const override { return alive_.load(std::memory_order_acquire); }
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
      uint64_t seen = reads_completed_.load(std::memory_order_seq_cst);
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
      if (!WaitForProgress(seen, deadline)) {
        // Every slot stayed busy until the deadline: complete the ops that never left this
        // machine with kLocalError, so every op is either done or owned by the transport.
        for (size_t i = posted; i < ops.size(); ++i) {
          ops[i]->status.store(ReadStatus::kLocalError, std::memory_order_release);
        }
        return Status::TimedOut(peer_ + ": no free READ slot before the deadline");
      }
    }
    size_t first = 0;
    for (;;) {
      uint64_t seen = reads_completed_.load(std::memory_order_seq_cst);
      while (first < ops.size() && ops[first]->done()) ++first;
      if (first == ops.size()) return Status::Ok();
      if (!WaitForProgress(seen, deadline)) {
        while (first < ops.size() && ops[first]->done()) ++first;
        if (first == ops.size()) return Status::Ok();
        return Status::TimedOut(peer_ + ": READs not complete by the deadline");
      }
    }
  }

  Status Call(std::span<const uint8_t> request, std::vector<uint8_t>* response,
              std::chrono::milliseconds timeout) override {
    if (request.size() > send_limit_) {
      return Status::InvalidArgument("request of " + std::to_string(request.size()) +
                                     " bytes exceeds the message limit of " +
                                     std::to_string(send_limit_));
    }
    Clock::time_point deadline = Clock::now() + timeout;
    uint32_t slot_index;
    uint32_t generation;
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
      send = SendAllBefore(fd_, iov, request.empty() ? 1 : 2, deadline, &sent_bytes);
      if (!send.ok() && !(send.Is(StatusCode::kTimedOut) && sent_bytes == 0)) {
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
    }

    MutexLock lock(&calls_mu_);
    CallSlot& slot = call_slots_[slot_index];
    while (slot.state == CallSlot::kWaiting && slot.cv.WaitUntil(&calls_mu_, deadline)) {
    }
    bool timed_out = slot.state == CallSlot::kWaiting;
    StatusCode code = slot.code;
    std::string error = std::move(slot.error);
    ReleaseCallSlotLocked(slot_index);
    if (timed_out) {
      return Status::TimedOut(peer_ + ": no response within " + std::to_string(timeout.count()) +
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
    CondVar cv;  // waited on with calls_mu_
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
    Status send = SendAllBefore(fd_, &iov, 1, Clock::now() + kSendStallLimit, &sent_bytes);
    if (!send.ok()) {
      Fail("send: " + send.message());  // completes the ops just taken, too
      return PostCode::kConnectionLost;
    }
    *posted = n;
    return PostCode::kOk;
  }

  // Waits until a READ completes after `seen` was read (or the connection dies).
  bool WaitForProgress(uint64_t seen, Clock::time_point deadline) {
    progress_waiters_.fetch_add(1, std::memory_order_seq_cst);
    bool progressed;
    {
      auto done = [&] {
        return reads_completed_.load(std::memory_order_seq_cst) != seen ||
               !alive_.load(std::memory_order_acquire);
      };
      MutexLock lock(&progress_mu_);
      for (;;) {
        if (done()) {
          progressed = true;
          break;
        }
        if (!progress_cv_.WaitUntil(&progress_mu_, deadline)) {
          progressed = done();
          break;
        }
      }
    }
    progress_waiters_.fetch_sub(1, std::memory_order_relaxed);
    return progressed;
  }

  void NotifyProgress(uint64_t completed) {
    if (completed == 0) return;
    reads_completed_.fetch_add(completed, std::memory_order_seq_cst);
    if (progress_waiters_.load(std::memory_order_seq_cst) > 0) {
      { MutexLock lock(&progress_mu_); }
      progress_cv_.SignalAll();
    }
  }

  void ReceiveLoop() {
    std::string why;
    size_t need = kFrameHeaderSize;
    for (;;) {
      size_t want = kRecvChunk;
      if (need > in_.size()) want = std::max(want, need - in_.size());
      std::span<uint8_t> w = in_.PrepareWrite(want);
      ssize_t n = recv(fd_, w.data(), w.size(), 0);
      if (n == 0) {
        why = "the server closed the connection";
        break;
      }
      if (n < 0) {
        if (errno == EINTR) continue;
        why = std::string("recv: ") + strerror(errno);
        break;
      }
      in_.Commit(static_cast<size_t>(n));
      uint64_t completed = 0;
      bool bad = false;
      for (;;) {
        auto f = NextFrame(in_.readable(), receive_limit_);
        if (!f.ok()) {
          why = f.status().message();
          bad = true;
          break;
        }
        if (!f->complete) {
          need = f->have_header ? f->frame_size : kFrameHeaderSize;
          if (f->have_header) in_.Reserve(f->frame_size);
          break;
        }
        if (f->header.type == FrameType::kReadResponse) {
          bad = !CompleteRead(f->body, &why);
          if (!bad) ++completed;
        } else if (f->header.type == FrameType::kCallResponse) {
          bad = !CompleteCall(f->body, &why);
        } else if (f->header.type == FrameType::kCallError) {
          bad = !CompleteCallError(f->body, &why);
        } else {
          why = "unexpected " + std::string(FrameTypeName(f->header.type)) + " frame";
          bad = true;
        }
        if (bad) break;
        in_.Consume(f->frame_size);
        need = kFrameHeaderSize;
      }
      NotifyProgress(completed);
      if (bad) {
        why = "protocol error from the server: " + why;
        break;
      }
    }
    Fail(why);
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
    slot.cv.Signal();
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
    slot.cv.Signal();
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
        slot.cv.Signal();
      }
    }
    call_free_cv_.SignalAll();
    if (failed > 0) reads_completed_.fetch_add(failed, std::memory_order_seq_cst);
    { MutexLock lock(&progress_mu_); }
    progress_cv_.SignalAll();
    if (was_alive && !closing_.load(std::memory_order_acquire)) {
      LOG(WARNING) << peer_ << ": connection lost: " << why << " (" << failed
                   << " READ(s) in flight failed)";
    }
  }

  const int fd_;
  const std::string peer_;
  const std::shared_ptr<RegionRegistry> registry_;
  const std::vector<RegionDescriptor> regions_;
  const size_t receive_limit_;  // largest payload we accept (what we told the server)
  const size_t send_limit_;     // largest request / READ: min(ours, the server's)
  std::atomic<bool> alive_{true};
  std::atomic<bool> closing_{false};

  // Lock order: send_mu_, then reads_mu_, calls_mu_ or progress_mu_ (Post and a failed send
  // hold send_mu_ while they take them, Fail taking the three one after the other, never
  // nested); reads_mu_, then the region registry's lock (CompleteRead's RegionRegistry::Pin).
  // progress_mu_ guards nothing: it orders a waiter's check against NotifyProgress's wake-up.
  // One writer on the socket at a time.
  Mutex send_mu_ ACQUIRED_BEFORE(reads_mu_, calls_mu_, progress_mu_);
  ByteBuffer send_buf_ GUARDED_BY(send_mu_);

  const size_t num_read_slots_;
  Mutex reads_mu_;
  std::vector<ReadSlot> read_slots_ GUARDED_BY(reads_mu_);
  // Capacity reserved up front: push/pop never allocate.
  std::vector<uint32_t> free_reads_ GUARDED_BY(reads_mu_);
  bool reads_dead_ GUARDED_BY(reads_mu_) = false;
  std::atomic<uint64_t> reads_completed_{0};
  std::atomic<uint64_t> reads_reported_{0};
  Mutex progress_mu_;
  CondVar progress_cv_;
  std::atomic<int> progress_waiters_{0};

  Mutex calls_mu_;
  std::unique_ptr<CallSlot[]> call_slots_ GUARDED_BY(calls_mu_);
  const uint32_t num_call_slots_;
  std::vector<uint32_t> free_calls_ GUARDED_BY(calls_mu_);
  CondVar call_free_cv_;
  bool calls_dead_ GUARDED_BY(calls_mu_) = false;
  std::string dead_reason_ GUARDED_BY(calls_mu_);

  ByteBuffer in_;  // receive thread only
  std::thread receiver_;
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
  if (options.auth_token.size() > kMaxTokenLength) {
    return Status::InvalidArgument("auth token longer than " + std::to_string(kMaxTokenLength));
  }
  std::string where = FormatHostPort(options.host, options.port);
  std::string peer = "tcp " + where;
  Clock::time_point deadline = Clock::now() + options.connect_timeout;

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
  std::vector<uint8_t> hello = EncodeHello(
      {kProtocolVersion, static_cast<uint32_t>(options.max_message_size), options.auth_token});
  Status s = SendAllBefore(*fd, hello, deadline);
  if (!s.ok()) return handshake_error(s);
  uint8_t header_bytes[kFrameHeaderSize];
  s = RecvExactBefore(*fd, header_bytes, deadline);
  if (!s.ok()) return handshake_error(s);
  auto header = DecodeFrameHeader(header_bytes, options.max_message_size);
  if (!header.ok()) return Status::ProtocolError(peer + ": " + header.status().message());
  std::vector<uint8_t> body(header->body_length);
  s = RecvExactBefore(*fd, body, deadline);
  if (!s.ok()) return handshake_error(s);

  if (header->type == FrameType::kRefused) {
    auto refused = DecodeRefused(body);
    if (!refused.ok()) return Status::ProtocolError(peer + ": " + refused.status().message());
    std::string msg = peer + " refused the connection: " + refused->reason;
    switch (refused->code) {
      case StatusCode::kPermissionDenied:
        return Status::PermissionDenied(msg);
      case StatusCode::kProtocolError:
        return Status::ProtocolError(msg);
      default:
        return Status(refused->code, msg);
    }
  }
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
  auto conn = std::make_unique<TcpConnection>(closer.release(), peer, options, *welcome,
                                              std::move(registry));
  conn->Start();
  LOG(INFO) << peer << ": connected (session " << welcome->session_id << ", "
            << welcome->regions.size() << " region(s))";
  return std::unique_ptr<Connection>(std::move(conn));
}

}  // namespace rdkv::transport::tcp

#include "common/transport/tcp/tcp_listener.h"

#include <glog/logging.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <unordered_map>

#include "common/transport/tcp/byte_buffer.h"
#include "common/transport/tcp/frame.h"
#include "common/transport/tcp/socket_util.h"
#include "common/util/mutex.h"
#include "common/util/thread_annotations.h"
#include "common/util/units.h"

namespace rdkv::transport::tcp {

namespace {

constexpr int kNicThreads = 2;
constexpr size_t kInitialInBuffer = 64 << 10;
constexpr size_t kRecvChunk = 64 << 10;
// Output backpressure: above the high mark the NIC stops reading that connection's requests
// (TCP flow control then pushes back on the client) until the send buffer drains below the low
// mark. Bounds the memory a client that does not read its responses can make us hold.
constexpr size_t kOutHighWater = 8 << 20;
constexpr size_t kOutLowWater = 1 << 20;
// Requests of one connection queued for the workers: above this the NIC stops reading that
// connection until the workers catch up (checked every sweep), so a client that ignores
// max_outstanding_calls cannot grow the queue without bound.
constexpr uint32_t kMaxQueuedPerSession = 1024;
constexpr auto kHandshakeTimeout = std::chrono::seconds(5);
constexpr auto kDrainTimeout = std::chrono::seconds(1);
constexpr int kEpollTimeoutMs = 200;
constexpr int kMaxEvents = 64;
constexpr uint64_t kWakeId = 0;  // epoll data of a NIC thread's eventfd; sessions start at 1

class NicThread;

// ---------------------------------------------------------------------------------------------
// One client connection on the server.
class TcpSession final : public ServerSession {
 public:
  TcpSession(uint64_t id, int fd, std::string peer, NicThread* nic)
      : fd(fd), id_(id), peer_(std::move(peer)), nic_(nic) {}

  Status Reply(uint64_t request_id, std::span<const uint8_t> response) override;
  std::string peer() const override { return peer_; }
  uint64_t id() const override { return id_; }

  // Send what is buffered without blocking; arms EPOLLOUT for the rest.
  void FlushLocked() REQUIRES(out_mu);
  // Makes the epoll interest match the state.
  void UpdateEventsLocked() REQUIRES(out_mu);
  // Closes the socket; Reply returns kConnectionLost from now on.
  void CloseLocked() REQUIRES(out_mu);

  // The NIC thread's reads of out_mu's fields without out_mu: closed, input_paused,
  // queue_paused and fd are written only by the NIC thread (under out_mu, for the other
  // threads' reads) or by the listener's teardown after the NIC threads stopped, and
  // reply_limit is set at the handshake, before any request of the session is queued, so the
  // NIC thread reads them bare. The analysis cannot express "written only by this thread".
  bool nic_closed() const NO_THREAD_SAFETY_ANALYSIS { return closed; }
  bool nic_input_paused() const NO_THREAD_SAFETY_ANALYSIS { return input_paused; }
  bool nic_queue_paused() const NO_THREAD_SAFETY_ANALYSIS { return queue_paused; }
  int nic_fd() const NO_THREAD_SAFETY_ANALYSIS { return fd; }
  size_t nic_reply_limit() const NO_THREAD_SAFETY_ANALYSIS { return reply_limit; }

  // ---- NIC-thread-only state ----
  enum class State { kAwaitHello, kReady, kDraining };
  State state = State::kAwaitHello;
  Clock::time_point deadline;  // for the handshake (kAwaitHello) or the lingering close
  ByteBuffer in{kInitialInBuffer};
  size_t need = kFrameHeaderSize;  // bytes the frame at the head of `in` needs in total
  bool authenticated = false;

  // ---- under out_mu (the NIC thread reads some bare: nic_closed() and the others above) ----
  // Lock order: a READ holds the region registry's lock (shared) and then takes out_mu.
  Mutex out_mu;
  ByteBuffer out GUARDED_BY(out_mu);
  int fd GUARDED_BY(out_mu);
  bool closed GUARDED_BY(out_mu) = false;
  // A send failed; the NIC thread closes on the error event.
  bool broken GUARDED_BY(out_mu) = false;
  // Backpressure: not reading requests until `out` drains.
  bool input_paused GUARDED_BY(out_mu) = false;
  // Not reading requests until the workers catch up.
  bool queue_paused GUARDED_BY(out_mu) = false;
  uint32_t armed GUARDED_BY(out_mu) = 0;  // events registered with epoll
  // Largest payload of a response or READ to this client: min(ours, the client's). Set at the
  // handshake, before any request of this session is queued (the queue's mutex orders it).
  size_t reply_limit GUARDED_BY(out_mu) = 0;
  std::atomic<uint32_t> queued{0};  // requests of this session waiting for or in a worker

 private:
  const uint64_t id_;
  const std::string peer_;
  NicThread* const nic_;
};

// ---------------------------------------------------------------------------------------------
// Two-sided requests waiting for a worker. Items are recycled (with their payload capacity), so
// in steady state queueing a request allocates nothing.
struct WorkItem {
  std::shared_ptr<TcpSession> session;
  uint64_t request_id = 0;
  std::vector<uint8_t> payload;
  WorkItem* next = nullptr;
};

class WorkQueue {
 public:
  ~WorkQueue() {
    DeleteList(head_);
    DeleteList(free_);
  }

  WorkItem* Acquire() EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    if (free_ == nullptr) return new WorkItem();  // only while warming up to peak concurrency
    WorkItem* item = free_;
    free_ = item->next;
    item->next = nullptr;
    return item;
  }
  void Release(WorkItem* item) EXCLUDES(mu_) {
    item->session.reset();
    MutexLock lock(&mu_);
    item->next = free_;
    free_ = item;
  }
  void Push(WorkItem* item) EXCLUDES(mu_) {
    {
      MutexLock lock(&mu_);
      item->next = nullptr;
      if (tail_ != nullptr) {
        tail_->next = item;
      } else {
        head_ = item;
      }
      tail_ = item;
    }
    cv_.Signal();
  }
  // Blocks until a request may run; nullptr once stopped.
  WorkItem* Pop() EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    while (!(stopping_ || (!paused_ && head_ != nullptr))) cv_.Wait(&mu_);
    if (stopping_) return nullptr;
    WorkItem* item = head_;
    head_ = item->next;
    if (head_ == nullptr) tail_ = nullptr;
    item->next = nullptr;
    return item;
  }
  void SetPaused(bool paused) EXCLUDES(mu_) {
    {
      MutexLock lock(&mu_);
      paused_ = paused;
    }
    cv_.SignalAll();
  }
  void Stop() EXCLUDES(mu_) {
    {
      MutexLock lock(&mu_);
      stopping_ = true;
    }
    cv_.SignalAll();
  }
  // After the workers are joined: drops queued requests (their sessions are closed).
  void DropQueued() EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    for (WorkItem* i = head_; i != nullptr; i = i->next) i->session.reset();
  }

 private:
  static void DeleteList(WorkItem* i) {
    while (i != nullptr) {
      WorkItem* next = i->next;
      delete i;
      i = next;
    }
  }
  Mutex mu_;
  CondVar cv_;
  WorkItem* head_ GUARDED_BY(mu_) = nullptr;
  WorkItem* tail_ GUARDED_BY(mu_) = nullptr;
  WorkItem* free_ GUARDED_BY(mu_) = nullptr;
  bool paused_ GUARDED_BY(mu_) = false;
  bool stopping_ GUARDED_BY(mu_) = false;
};

// ---------------------------------------------------------------------------------------------
// What every thread of one listener shares.
struct ListenerCore {
  ListenOptions options;
  std::shared_ptr<RegionRegistry> registry;
  std::string name;  // "tcp listener 127.0.0.1:7400", for logs
  WorkQueue queue;
  std::atomic<uint32_t> authenticated{0};  // sessions past the handshake, for max_connections
  std::atomic<uint32_t> sockets{0};        // open sockets, handshaking or not

  std::atomic<uint64_t> connections_accepted{0};
  std::atomic<uint64_t> connections_refused{0};
  std::atomic<uint64_t> requests{0};
  std::atomic<uint64_t> reads_served{0};
  std::atomic<uint64_t> read_bytes_served{0};
  std::atomic<uint64_t> reads_refused{0};
  std::atomic<uint64_t> protocol_errors{0};
};

// ---------------------------------------------------------------------------------------------
class NicThread {
 public:
  explicit NicThread(ListenerCore* core) : core_(core) {}
  ~NicThread() {
    if (wake_fd_ >= 0) close(wake_fd_);
    if (epfd_ >= 0) close(epfd_);
  }

  Status Start() {
    epfd_ = epoll_create1(EPOLL_CLOEXEC);
    if (epfd_ < 0) return Status::FromErrno("epoll_create1", errno);
    wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wake_fd_ < 0) return Status::FromErrno("eventfd", errno);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = kWakeId;
    if (epoll_ctl(epfd_, EPOLL_CTL_ADD, wake_fd_, &ev) != 0) {
      return Status::FromErrno("epoll_ctl", errno);
    }
    thread_ = std::thread([this] { Run(); });
    return Status::Ok();
  }

  // From the accept thread: this NIC thread takes the socket over.
  void Adopt(std::shared_ptr<TcpSession> s) EXCLUDES(pending_mu_) {
    {
      MutexLock lock(&pending_mu_);
      pending_.push_back(std::move(s));
    }
    Wake();
  }

  void Stop() {
    stop_.store(true, std::memory_order_release);
    Wake();
    if (thread_.joinable()) thread_.join();
  }

  // After Stop(): closes every session this thread owned or was about to own.
  void CloseAll() EXCLUDES(pending_mu_) {
    std::vector<std::shared_ptr<TcpSession>> all;
    {
      MutexLock lock(&pending_mu_);
      all.swap(pending_);
    }
    for (auto& [id, s] : sessions_) all.push_back(s);
    sessions_.clear();
    for (auto& s : all) {
      MutexLock lock(&s->out_mu);
      s->CloseLocked();
    }
  }

  int epfd() const { return epfd_; }

 private:
  void Wake() {
    uint64_t one = 1;
    ssize_t n = write(wake_fd_, &one, sizeof one);
    (void)n;  // a full counter already guarantees a wakeup
  }

  void Run() {
    epoll_event events[kMaxEvents];
    Clock::time_point next_sweep = Clock::now() + std::chrono::milliseconds(kEpollTimeoutMs);
    while (!stop_.load(std::memory_order_acquire)) {
      int n = epoll_wait(epfd_, events, kMaxEvents, kEpollTimeoutMs);
      if (n < 0 && errno != EINTR) {
        PLOG(ERROR) << core_->name << ": epoll_wait";
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      for (int i = 0; i < n; ++i) {
        if (events[i].data.u64 == kWakeId) {
          uint64_t v;
          ssize_t r = read(wake_fd_, &v, sizeof v);
          (void)r;
          AdoptPending();
          continue;
        }
        auto it = sessions_.find(events[i].data.u64);
        if (it == sessions_.end()) continue;
        std::shared_ptr<TcpSession> s = it->second;  // keeps it alive while Close() erases it
        HandleEvent(*s, events[i].events);
      }
      Clock::time_point now = Clock::now();
      if (now >= next_sweep) {
        Sweep(now);
        next_sweep = now + std::chrono::milliseconds(kEpollTimeoutMs);
      }
    }
  }

  void AdoptPending() EXCLUDES(pending_mu_) {
    std::vector<std::shared_ptr<TcpSession>> batch;
    {
      MutexLock lock(&pending_mu_);
      batch.swap(pending_);
    }
    for (auto& s : batch) {
      MutexLock lock(&s->out_mu);
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.u64 = s->id();
      if (epoll_ctl(epfd_, EPOLL_CTL_ADD, s->fd, &ev) != 0) {
        PLOG(WARNING) << core_->name << ": cannot watch the socket of " << s->peer();
        s->CloseLocked();
        core_->sockets.fetch_sub(1, std::memory_order_relaxed);
        continue;
      }
      s->armed = EPOLLIN;
      sessions_.emplace(s->id(), s);
    }
  }

  void HandleEvent(TcpSession& s, uint32_t events) {
    if (events & EPOLLERR) {
      int err = 0;
      socklen_t len = sizeof err;
      getsockopt(s.nic_fd(), SOL_SOCKET, SO_ERROR, &err, &len);
      Close(s, std::string("socket error: ") + strerror(err));
      return;
    }
    if (events & EPOLLOUT) {
      OnWritable(s);
      if (s.nic_closed()) return;
    }
    if (events & (EPOLLIN | EPOLLHUP)) {
      if (!s.nic_input_paused() && !s.nic_queue_paused()) {
        ReadSocket(s);
      } else if (events & EPOLLHUP) {
        Close(s, "peer hung up");
      }
    }
  }

  void OnWritable(TcpSession& s) {
    bool resume = false;
    {
      MutexLock lock(&s.out_mu);
      s.FlushLocked();
      if (s.input_paused && s.out.size() < kOutLowWater) {
        s.input_paused = false;
        resume = true;
        s.UpdateEventsLocked();
      }
    }
    if (resume) ProcessInput(s);
  }

  void ReadSocket(TcpSession& s) {
    for (int round = 0; round < 8; ++round) {
      size_t want = kRecvChunk;
      if (s.need > s.in.size()) want = std::max(want, s.need - s.in.size());
      std::span<uint8_t> w = s.in.PrepareWrite(want);
      ssize_t n = recv(s.nic_fd(), w.data(), w.size(), MSG_DONTWAIT);
      if (n > 0) {
        if (s.state == TcpSession::State::kDraining) {
          continue;  // refused: discard whatever the client still sends until it closes
        }
        s.in.Commit(static_cast<size_t>(n));
        ProcessInput(s);
        if (s.nic_closed() || s.nic_input_paused() || s.nic_queue_paused()) return;
        if (static_cast<size_t>(n) < w.size()) return;  // drained the socket
        continue;
      }
      if (n == 0) {
        if (!s.in.empty() && s.state != TcpSession::State::kDraining) {
          ProtocolError(s, "connection closed in the middle of a frame (" +
                               std::to_string(s.in.size()) + " of " + std::to_string(s.need) +
                               " bytes)");
        } else {
          Close(s, "peer closed the connection");
        }
        return;
      }
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      Close(s, std::string("recv: ") + strerror(errno));
      return;
    }
  }

  // Parses and acts on every complete frame in `s.in`.
  void ProcessInput(TcpSession& s) {
    while (!s.nic_closed() && !s.nic_input_paused() && !s.nic_queue_paused() &&
           s.state != TcpSession::State::kDraining) {
      auto f = NextFrame(s.in.readable(), core_->options.max_message_size);
      if (!f.ok()) {
        ProtocolError(s, f.status().message());
        return;
      }
      if (!f->have_header) {
        s.need = kFrameHeaderSize;
        break;
      }
      FrameType type = f->header.type;
      if (s.state == TcpSession::State::kAwaitHello && type != FrameType::kHello) {
        ProtocolError(s, std::string(FrameTypeName(type)) + " before HELLO");
        return;
      }
      if (s.state == TcpSession::State::kReady && type != FrameType::kReadRequest &&
          type != FrameType::kCallRequest) {
        ProtocolError(s, std::string("unexpected ") + std::string(FrameTypeName(type)) +
                             " frame from a client");
        return;
      }
      if (!f->complete) {
        s.need = f->frame_size;
        s.in.Reserve(f->frame_size);
        break;
      }
      switch (type) {
        case FrameType::kHello:
          HandleHello(s, f->body);
          break;
        case FrameType::kReadRequest:
          ServeRead(s, f->body);
          break;
        case FrameType::kCallRequest:
          QueueCall(s, f->body);
          break;
        default:
          break;  // excluded above
      }
      if (s.nic_closed()) return;
      s.in.Consume(f->frame_size);
      s.need = kFrameHeaderSize;
    }
    if (!s.nic_closed()) {
      MutexLock lock(&s.out_mu);
      if (!s.out.empty()) s.FlushLocked();
    }
  }

  void HandleHello(TcpSession& s, std::span<const uint8_t> body) {
    auto version = PeekHelloVersion(body);
    if (!version.ok()) return ProtocolError(s, version.status().message());
    if (*version != kProtocolVersion) {
      return Refuse(s, StatusCode::kProtocolError,
                    "protocol version " + std::to_string(*version) +
                        " is not supported: this server speaks version " +
                        std::to_string(kProtocolVersion));
    }
    auto hello = DecodeHello(body);
    if (!hello.ok()) return ProtocolError(s, hello.status().message());
    if (!ConstantTimeEquals(hello->auth_token, core_->options.auth_token)) {
      return Refuse(s, StatusCode::kPermissionDenied, "authentication failed: wrong auth token");
    }
    uint32_t max = core_->options.max_connections;
    if (core_->authenticated.fetch_add(1, std::memory_order_relaxed) >= max) {
      core_->authenticated.fetch_sub(1, std::memory_order_relaxed);
      return Refuse(s, StatusCode::kUnavailable,
                    "too many connections (max_connections " + std::to_string(max) + ")");
    }
    s.authenticated = true;
    Welcome w;
    w.max_message_size = static_cast<uint32_t>(core_->options.max_message_size);
    w.session_id = s.id();
    w.regions = core_->options.regions;
    std::vector<uint8_t> frame = EncodeWelcome(w);
    {
      MutexLock lock(&s.out_mu);
      s.reply_limit = std::min<size_t>(core_->options.max_message_size, hello->max_message_size);
      s.out.Append(frame.data(), frame.size());
      s.FlushLocked();
    }
    s.state = TcpSession::State::kReady;
    core_->connections_accepted.fetch_add(1, std::memory_order_relaxed);
    LOG(INFO) << core_->name << ": session " << s.id() << " from " << s.peer() << " authenticated";
  }

  void Refuse(TcpSession& s, StatusCode code, const std::string& reason) {
    core_->connections_refused.fetch_add(1, std::memory_order_relaxed);
    LOG(WARNING) << core_->name << ": refusing " << s.peer() << ": " << reason;
    std::vector<uint8_t> frame = EncodeRefused({code, kProtocolVersion, reason});
    MutexLock lock(&s.out_mu);
    s.out.Append(frame.data(), frame.size());
    s.FlushLocked();
    // FIN after the REFUSED frame; keep reading (and discarding) until the client closes, so
    // the close never turns into a RST that could destroy the frame before the client reads it.
    if (s.out.empty()) shutdown(s.fd, SHUT_WR);
    s.state = TcpSession::State::kDraining;
    s.deadline = Clock::now() + kDrainTimeout;
  }

  // The software NIC's READ: rkey + bounds checked against the registry, bytes copied straight
  // from the registered memory into the response. Never blocks, never calls the handler.
  void ServeRead(TcpSession& s, std::span<const uint8_t> body) {
    auto rq = DecodeReadRequest(body);
    if (!rq.ok()) return ProtocolError(s, rq.status().message());
    const RegionRegistry* registry = core_->registry.get();
    RegionRegistry::Pin region_pin(registry);  // before out_mu (the lock order)
    const uint8_t* src = nullptr;
    if (rq->length <= s.nic_reply_limit()) {
      src = registry->FindRemote(rq->rkey, rq->remote_addr, rq->length);
    }
    MutexLock lock(&s.out_mu);
    if (src != nullptr) {
      std::span<uint8_t> w = s.out.PrepareWrite(kReadResponseHeadSize + rq->length);
      EncodeReadResponseHead(rq->wr_id, ReadStatus::kOk, rq->length,
                             w.first<kReadResponseHeadSize>());
      DmaCopy(w.data() + kReadResponseHeadSize, src, rq->length);
      s.out.Commit(kReadResponseHeadSize + rq->length);
      core_->reads_served.fetch_add(1, std::memory_order_relaxed);
      core_->read_bytes_served.fetch_add(rq->length, std::memory_order_relaxed);
    } else {
      std::span<uint8_t> w = s.out.PrepareWrite(kReadResponseHeadSize);
      EncodeReadResponseHead(rq->wr_id, ReadStatus::kRemoteAccessError, 0,
                             w.first<kReadResponseHeadSize>());
      s.out.Commit(kReadResponseHeadSize);
      core_->reads_refused.fetch_add(1, std::memory_order_relaxed);
    }
    if (s.out.size() >= kOutHighWater) {
      s.FlushLocked();
      if (s.out.size() >= kOutHighWater) {
        s.input_paused = true;
        s.UpdateEventsLocked();
      }
    }
  }

  void QueueCall(TcpSession& s, std::span<const uint8_t> body) {
    auto call = DecodeCall(body);
    if (!call.ok()) return ProtocolError(s, call.status().message());
    auto it = sessions_.find(s.id());
    if (it == sessions_.end()) return;
    WorkItem* item = core_->queue.Acquire();
    item->session = it->second;
    item->request_id = call->request_id;
    item->payload.assign(call->payload.begin(), call->payload.end());
    core_->requests.fetch_add(1, std::memory_order_relaxed);
    bool too_many = s.queued.fetch_add(1, std::memory_order_relaxed) + 1 >= kMaxQueuedPerSession;
    core_->queue.Push(item);
    MutexLock lock(&s.out_mu);
    if (too_many) s.queue_paused = true;
    if (s.out.size() >= kOutHighWater) {  // replies pile up unread: stop taking requests
      s.FlushLocked();
      if (s.out.size() >= kOutHighWater) s.input_paused = true;
    }
    s.UpdateEventsLocked();
  }

  void ProtocolError(TcpSession& s, const std::string& what) {
    core_->protocol_errors.fetch_add(1, std::memory_order_relaxed);
    if (!s.authenticated) core_->connections_refused.fetch_add(1, std::memory_order_relaxed);
    LOG(WARNING) << core_->name << ": protocol error from " << s.peer() << " (session " << s.id()
                 << "): " << what << "; dropping the connection";
    Close(s, {});
  }

  void Close(TcpSession& s, const std::string& why) {
    if (!why.empty() && s.authenticated) {
      LOG(INFO) << core_->name << ": session " << s.id() << " from " << s.peer()
                << " closed: " << why;
    }
    {
      MutexLock lock(&s.out_mu);
      epoll_ctl(epfd_, EPOLL_CTL_DEL, s.fd, nullptr);
      s.CloseLocked();
    }
    s.in = ByteBuffer();
    if (s.authenticated) core_->authenticated.fetch_sub(1, std::memory_order_relaxed);
    core_->sockets.fetch_sub(1, std::memory_order_relaxed);
    sessions_.erase(s.id());
  }

  void Sweep(Clock::time_point now) {
    std::vector<std::shared_ptr<TcpSession>> expired, resumed;
    for (auto& [id, s] : sessions_) {
      if (s->state != TcpSession::State::kReady && now >= s->deadline) expired.push_back(s);
      if (s->nic_queue_paused() &&
          s->queued.load(std::memory_order_relaxed) < kMaxQueuedPerSession / 2) {
        resumed.push_back(s);
      }
    }
    for (auto& s : resumed) {
      {
        MutexLock lock(&s->out_mu);
        s->queue_paused = false;
        s->UpdateEventsLocked();
      }
      ProcessInput(*s);
    }
    for (auto& s : expired) {
      if (s->state == TcpSession::State::kAwaitHello) {
        core_->connections_refused.fetch_add(1, std::memory_order_relaxed);
        LOG(WARNING) << core_->name << ": " << s->peer() << " sent no HELLO within "
                     << std::chrono::duration_cast<std::chrono::seconds>(kHandshakeTimeout).count()
                     << " s; dropping the connection";
      }
      Close(*s, {});
    }
  }

  ListenerCore* const core_;
  int epfd_ = -1;
  int wake_fd_ = -1;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  Mutex pending_mu_;
  std::vector<std::shared_ptr<TcpSession>> pending_ GUARDED_BY(pending_mu_);
  std::unordered_map<uint64_t, std::shared_ptr<TcpSession>> sessions_;  // NIC thread only
};

// ---------------------------------------------------------------------------------------------
Status TcpSession::Reply(uint64_t request_id, std::span<const uint8_t> response) {
  MutexLock lock(&out_mu);
  if (closed || broken) return Status::ConnectionLost("client " + peer_ + " is gone");
  if (response.size() > reply_limit) {
    // Tell the caller's Call at once (CALL_ERROR) instead of letting it time out.
    Status s = Status::InvalidArgument("response of " + std::to_string(response.size()) +
                                       " bytes exceeds the message limit of " +
                                       std::to_string(reply_limit));
    std::vector<uint8_t> frame = EncodeCallError({request_id, s.code(), s.message()});
    out.Append(frame.data(), frame.size());
    FlushLocked();
    return s;
  }
  std::span<uint8_t> w = out.PrepareWrite(kCallHeadSize + response.size());
  EncodeCallHead(FrameType::kCallResponse, request_id, static_cast<uint32_t>(response.size()),
                 w.first<kCallHeadSize>());
  if (!response.empty()) std::memcpy(w.data() + kCallHeadSize, response.data(), response.size());
  out.Commit(kCallHeadSize + response.size());
  FlushLocked();
  if (broken) return Status::ConnectionLost("client " + peer_ + " is gone");
  return Status::Ok();
}

void TcpSession::FlushLocked() {
  if (closed) return;
  while (!out.empty()) {
    std::span<const uint8_t> r = out.readable();
    ssize_t n = send(fd, r.data(), r.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      out.Consume(static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    broken = true;  // EPIPE/ECONNRESET: the NIC thread sees the error event and closes
    out.Clear();
    break;
  }
  UpdateEventsLocked();
}

void TcpSession::UpdateEventsLocked() {
  if (closed) return;
  uint32_t want = 0;
  if (!input_paused && !queue_paused) want |= EPOLLIN;
  if (!out.empty() || input_paused) want |= EPOLLOUT;
  if (want == armed) return;
  epoll_event ev{};
  ev.events = want;
  ev.data.u64 = id_;
  if (epoll_ctl(nic_->epfd(), EPOLL_CTL_MOD, fd, &ev) == 0) armed = want;
}

void TcpSession::CloseLocked() {
  if (closed) return;
  closed = true;
  shutdown(fd, SHUT_RDWR);
  close(fd);
  fd = -1;
  out = ByteBuffer();
}

// ---------------------------------------------------------------------------------------------
class TcpListener final : public Listener {
 public:
  explicit TcpListener(std::unique_ptr<ListenerCore> core) : core_(std::move(core)) {}

  ~TcpListener() override {
    Shutdown();
    if (port_ != 0) LOG(INFO) << core_->name << ": stopped";
  }

  Status Start() {
    auto fd = ListenOn(core_->options.host, core_->options.port, 128);
    if (!fd.ok()) return fd.status();
    listen_fd_ = *fd;
    port_ = LocalPort(listen_fd_);
    core_->name = "tcp listener " + FormatHostPort(core_->options.host, port_);
    stop_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (stop_fd_ < 0) return Status::FromErrno("eventfd", errno);
    for (int i = 0; i < kNicThreads; ++i) {
      nics_.push_back(std::make_unique<NicThread>(core_.get()));
      RDKV_RETURN_IF_ERROR(nics_.back()->Start());
    }
    for (int i = 0; i < core_->options.worker_threads; ++i) {
      workers_.emplace_back([this] { WorkerLoop(); });
    }
    accept_thread_ = std::thread([this] { AcceptLoop(); });
    LOG(INFO) << core_->name << ": serving " << core_->options.regions.size() << " region(s) with "
              << kNicThreads << " NIC thread(s) and " << core_->options.worker_threads
              << " worker(s)";
    return Status::Ok();
  }

  uint16_t port() const override { return port_; }

  ListenerStats stats() const override {
    ListenerStats s;
    s.connections_accepted = core_->connections_accepted.load(std::memory_order_relaxed);
    s.connections_refused = core_->connections_refused.load(std::memory_order_relaxed);
    s.requests = core_->requests.load(std::memory_order_relaxed);
    s.connections_open = core_->authenticated.load(std::memory_order_relaxed);
    s.reads_served = core_->reads_served.load(std::memory_order_relaxed);
    s.read_bytes_served = core_->read_bytes_served.load(std::memory_order_relaxed);
    s.reads_refused = core_->reads_refused.load(std::memory_order_relaxed);
    s.protocol_errors = core_->protocol_errors.load(std::memory_order_relaxed);
    return s;
  }

  void PauseWorkers(bool paused) override { core_->queue.SetPaused(paused); }

 private:
  void Shutdown() {
    if (stop_fd_ >= 0) {
      uint64_t one = 1;
      ssize_t n = write(stop_fd_, &one, sizeof one);
      (void)n;
    }
    if (accept_thread_.joinable()) accept_thread_.join();
    if (listen_fd_ >= 0) close(listen_fd_);
    listen_fd_ = -1;
    for (auto& nic : nics_) nic->Stop();
    core_->queue.Stop();
    for (auto& w : workers_) w.join();
    workers_.clear();
    for (auto& nic : nics_) nic->CloseAll();
    core_->queue.DropQueued();
    nics_.clear();
    if (stop_fd_ >= 0) close(stop_fd_);
    stop_fd_ = -1;
  }

  void AcceptLoop() {
    size_t next_nic = 0;
    uint64_t next_id = 1;
    uint32_t socket_cap = 2 * core_->options.max_connections + 16;
    for (;;) {
      pollfd p[2] = {{listen_fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
      int rc = poll(p, 2, -1);
      if (rc < 0) {
        if (errno == EINTR) continue;
        PLOG(ERROR) << core_->name << ": poll";
        return;
      }
      if (p[1].revents != 0) return;
      if ((p[0].revents & POLLIN) == 0) continue;
      int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        int err = errno;
        if (err == EAGAIN || err == EWOULDBLOCK || err == EINTR || err == ECONNABORTED) continue;
        LOG(WARNING) << core_->name << ": accept: " << strerror(err);
        if (err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM) {
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
        continue;
      }
      if (core_->sockets.load(std::memory_order_relaxed) >= socket_cap) {
        core_->connections_refused.fetch_add(1, std::memory_order_relaxed);
        LOG(WARNING) << core_->name << ": " << socket_cap
                     << " sockets open already; closing a new connection";
        close(fd);
        continue;
      }
      ConfigureStreamSocket(fd);
      core_->sockets.fetch_add(1, std::memory_order_relaxed);
      NicThread* nic = nics_[next_nic++ % nics_.size()].get();
      auto s = std::make_shared<TcpSession>(next_id++, fd, PeerName(fd), nic);
      s->deadline = Clock::now() + kHandshakeTimeout;
      nic->Adopt(std::move(s));
    }
  }

  void WorkerLoop() {
    const RequestHandler& handler = core_->options.handler;
    while (WorkItem* item = core_->queue.Pop()) {
      handler(std::span<const uint8_t>(item->payload.data(), item->payload.size()),
              ReplyHandle{item->session, item->request_id});
      item->session->queued.fetch_sub(1, std::memory_order_relaxed);
      core_->queue.Release(item);
    }
  }

  std::unique_ptr<ListenerCore> core_;
  int listen_fd_ = -1;
  int stop_fd_ = -1;
  uint16_t port_ = 0;
  std::vector<std::unique_ptr<NicThread>> nics_;
  std::vector<std::thread> workers_;
  std::thread accept_thread_;
};

}  // namespace

Result<std::unique_ptr<Listener>> CreateTcpListener(ListenOptions options,
                                                    std::shared_ptr<RegionRegistry> registry) {
  if (!options.handler) return Status::InvalidArgument("ListenOptions::handler is required");
  if (options.worker_threads < 1 || options.worker_threads > 1024) {
    return Status::InvalidArgument("worker_threads must be 1..1024, not " +
                                   std::to_string(options.worker_threads));
  }
  if (options.max_message_size == 0 || options.max_message_size > kMaxMessageSizeLimit) {
    return Status::InvalidArgument("max_message_size must be 1.." +
                                   std::to_string(kMaxMessageSizeLimit));
  }
  if (options.max_connections == 0) return Status::InvalidArgument("max_connections must be > 0");
  if (options.auth_token.size() > kMaxTokenLength) {
    return Status::InvalidArgument("auth token longer than " + std::to_string(kMaxTokenLength));
  }
  if (options.regions.size() > kMaxRegions) {
    return Status::InvalidArgument("at most " + std::to_string(kMaxRegions) + " regions");
  }
  for (const RegionDescriptor& r : options.regions) {
    if (r.length == 0 || r.addr + r.length < r.addr) {
      return Status::InvalidArgument("an advertised region is empty or wraps the address space");
    }
  }
  auto core = std::make_unique<ListenerCore>();
  core->options = std::move(options);
  core->registry = std::move(registry);
  auto listener = std::make_unique<TcpListener>(std::move(core));
  RDKV_RETURN_IF_ERROR(listener->Start());
  return std::unique_ptr<Listener>(std::move(listener));
}

}  // namespace rdkv::transport::tcp

#include "common/transport/tcp/tcp_listener.h"

#include <glog/logging.h>
#include <poll.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <deque>
#include <memory>
#include <unordered_map>

#include <arpa/inet.h>
#include <netinet/in.h>

#include "common/transport/auth.h"
#include "common/transport/tcp/byte_buffer.h"
#include "common/transport/tcp/frame.h"
#include "common/transport/tcp/socket_util.h"
#include "common/transport/tcp/tls.h"
#include "common/util/cpu_contention.h"
#include "common/util/mutex.h"
#include "common/util/thread_annotations.h"
#include "common/util/thread_name.h"
#include "common/util/units.h"

namespace rdkv::transport::tcp {

namespace {

constexpr int kNicThreads = 2;
constexpr size_t kInitialInBuffer = 64 << 10;
constexpr size_t kRecvChunk = 64 << 10;
// Output backpressure: above the high mark the NIC stops reading that connection's requests
// (TCP flow control then pushes back on the client) until the send buffer drains below the low
// mark. Bounds the memory a client that does not read its responses can make us hold; such a
// client is cut off after output_stall_timeout, or at once when worker replies push its unsent
// output past TcpSession::out_limit (max(4 MiB, 2 largest messages)).
constexpr size_t kOutHighWater = 1 << 20;
constexpr size_t kOutLowWater = 256 << 10;
constexpr size_t kOutHardMin = 4 << 20;
// One warning line per kind per this period, with the count of the suppressed ones.
constexpr auto kLogPeriod = std::chrono::seconds(10);
// Requests of one connection queued for the workers, and their payloads' bytes: at either limit
// the NIC stops reading that connection until the workers are through half of it (checked every
// sweep), so a client that ignores max_outstanding_calls cannot grow the queue without bound.
// The bytes' limit is max(kQueuedBytesMin, 2 largest messages), as for unsent output: without
// it 1,024 requests of the largest size held a GiB per connection.
constexpr uint32_t kMaxQueuedPerSession = 1024;
constexpr size_t kQueuedBytesMin = 4 << 20;
// The queued payload bytes at which a session's reading pauses.
size_t QueuedBytesLimitOf(const ListenOptions& o) {
  return std::max(kQueuedBytesMin, 2 * o.max_message_size);
}
// A paused session reads again once both are below these (half of each limit).
constexpr uint32_t kResumeQueuedBelow = kMaxQueuedPerSession / 2;
size_t ResumeQueuedBytesBelowOf(const ListenOptions& o) { return QueuedBytesLimitOf(o) / 2; }
// A queued request's payload buffer goes back to the pool with its capacity up to this; a larger
// one is freed, so that a burst of large requests does not stay allocated in the pool.
constexpr size_t kPooledPayloadMax = 64 << 10;
// Requests of one connection the inline handler answers in one receive pass (ReadSocket); the
// rest of the pass goes to the workers, so that one client's stream of small writes cannot
// hold up the other sessions of its NIC thread (their READs) for long.
constexpr uint32_t kMaxInlinePerPass = 64;
constexpr auto kDrainTimeout = std::chrono::seconds(1);
constexpr int kEpollTimeoutMs = 200;
constexpr int kMaxEvents = 64;
constexpr uint64_t kWakeId = 0;  // epoll data of a NIC thread's eventfd; sessions start at 1

class NicThread;

// Rate limit for a kind of log line (hostile peers must not be able to fill the disk).
class LogThrottle {
 public:
  // True when a line may be written now; *suppressed receives how many were not since the last.
  bool Allow(uint64_t* suppressed) {
    const int64_t now = Clock::now().time_since_epoch().count();
    const int64_t period = std::chrono::duration_cast<Clock::duration>(kLogPeriod).count();
    int64_t last = last_.load(std::memory_order_relaxed);
    if ((last != kNever && now - last < period) ||
        !last_.compare_exchange_strong(last, now, std::memory_order_relaxed)) {
      suppressed_.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    *suppressed = suppressed_.exchange(0, std::memory_order_relaxed);
    return true;
  }

 private:
  static constexpr int64_t kNever = INT64_MIN;
  std::atomic<int64_t> last_{kNever};
  std::atomic<uint64_t> suppressed_{0};
};

// " (N similar line(s) suppressed since the last one; ...)" or "".
std::string Suppressed(uint64_t n) {
  if (n == 0) return "";
  return " (" + std::to_string(n) + " similar line(s) suppressed since the last one; at most " +
         "one per " +
         std::to_string(std::chrono::duration_cast<std::chrono::seconds>(kLogPeriod).count()) +
         " s)";
}

// The close of this socket resets the connection and drops what the kernel still holds for it
// (for a client cut off for not reading: its unsent responses would otherwise stay in the
// kernel's send buffer, trickling out, after the session is gone).
void SetAbortiveClose(int fd) {
  linger l{1, 0};
  setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
}

// Peer address as 16 bytes (IPv4 mapped into IPv6), for the per-source handshake limit.
using SourceKey = std::array<uint8_t, 16>;
void PeerSource(int fd, SourceKey* key, bool* loopback) {
  key->fill(0);
  *loopback = false;
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return;
  if (ss.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    (*key)[10] = (*key)[11] = 0xff;
    std::memcpy(key->data() + 12, &a->sin_addr, 4);
    *loopback = ((*key)[12] == 127);
  } else if (ss.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    std::memcpy(key->data(), &a->sin6_addr, 16);
    static const SourceKey kLoop6 = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
    bool mapped4 = std::all_of(key->begin(), key->begin() + 10, [](uint8_t b) { return b == 0; }) &&
                   (*key)[10] == 0xff && (*key)[11] == 0xff;
    *loopback = *key == kLoop6 || (mapped4 && (*key)[12] == 127);
  }
}

// ---------------------------------------------------------------------------------------------
// One client connection on the server.
class TcpSession final : public ServerSession, public std::enable_shared_from_this<TcpSession> {
 public:
  TcpSession(uint64_t id, int fd, std::string peer, NicThread* nic)
      : fd(fd), id_(id), peer_(std::move(peer)), nic_(nic) {}

  Status Reply(uint64_t request_id, std::span<const uint8_t> response) override;
  void SendHeld() override EXCLUDES(out_mu);
  std::string peer() const override { return peer_; }
  uint64_t id() const override { return id_; }
  NicThread* nic() const { return nic_; }
  SessionRole role() const override { return role_.load(std::memory_order_acquire); }
  void set_role(SessionRole r) { role_.store(r, std::memory_order_release); }

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
  // kTls: the TLS handshake (listeners with TLS), before HELLO; it counts as handshaking.
  enum class State { kTls, kAwaitHello, kAwaitProof, kReady, kDraining };
  State state = State::kAwaitHello;
  bool uses_tls = false;            // the listener has TLS: reads go through `tls` once it exists
  Clock::time_point deadline;       // for the handshake (kAwaitHello/kAwaitProof) or the close
  Clock::time_point last_activity;  // last frame received (idle_timeout)
  // Handshake (kAwaitProof): what the client's proof must be.
  auth::Mac expected_proof{};
  SessionRole requested_role = SessionRole::kData;
  SessionRole granted_role = SessionRole::kData;
  SessionRole proven_secret = SessionRole::kData;  // whose secret keys the proof (revocation)
  uint64_t secrets_epoch = 0;  // the secrets epoch the proof's key came from (RotateSecrets)
  bool peer_loopback = false;
  SourceKey source{};
  // True while this socket counts against the handshake limits. Whoever clears it (the NIC
  // thread when the handshake ends or the socket closes, the accept thread when it evicts the
  // socket) gives the slot back, exactly once.
  std::atomic<bool> in_handshake{true};
  ByteBuffer in{kInitialInBuffer};
  size_t need = kFrameHeaderSize;  // bytes the frame at the head of `in` needs in total
  bool authenticated = false;
  uint32_t inline_in_pass = 0;  // requests answered inline in this receive pass (ReadSocket)

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
  // TLS (docs/security.md "TLS (tcp)"): the stream, created once the client's first byte shows
  // a TLS record; every call on it holds out_mu (the NIC thread reads while workers write).
  std::unique_ptr<TlsStream> tls GUARDED_BY(out_mu);
  // The TLS stream must write before it can go on (handshake or read): wait for EPOLLOUT.
  bool tls_want_write GUARDED_BY(out_mu) = false;
  // Largest payload of a response or READ to this client: min(ours, the client's). Set at the
  // handshake, before any request of this session is queued (the queue's mutex orders it).
  size_t reply_limit GUARDED_BY(out_mu) = 0;
  // Unsent output above which a worker's Reply cuts the client off (it does not read).
  size_t out_limit GUARDED_BY(out_mu) = kOutHardMin;
  // When `out` last drained a byte into the socket (for output_stall_timeout).
  Clock::time_point out_progress GUARDED_BY(out_mu);
  // The client was cut off for not reading; counted once.
  bool cut_off GUARDED_BY(out_mu) = false;
  std::atomic<uint32_t> queued{0};        // requests of this session waiting for or in a worker
  std::atomic<uint64_t> queued_bytes{0};  // and their payloads' bytes

 private:
  const uint64_t id_;
  const std::string peer_;
  NicThread* const nic_;
  std::atomic<SessionRole> role_{SessionRole::kData};
};

// The session whose receive pass this NIC thread is answering inline (QueueCall), if any.
thread_local const TcpSession* t_reply_in_pass = nullptr;

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
    if (item->payload.capacity() > kPooledPayloadMax) std::vector<uint8_t>().swap(item->payload);
    MutexLock lock(&mu_);
    item->next = free_;
    free_ = item;
  }
  void Push(WorkItem* item) EXCLUDES(mu_) {
    bool wake;
    {
      MutexLock lock(&mu_);
      item->next = nullptr;
      if (tail_ != nullptr) {
        tail_->next = item;
      } else {
        head_ = item;
      }
      tail_ = item;
      wake = sleepers_ > 0;
    }
    if (wake) cv_.Signal();  // no futex call while every worker is busy
  }
  // Blocks until a request may run; nullptr once stopped. (Workers do not poll: on two CPUs a
  // polling worker took the CPU from the thread that had the work, 5x slower PUTs.)
  WorkItem* Pop() EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    while (!(stopping_ || (!paused_ && head_ != nullptr))) {
      ++sleepers_;
      cv_.Wait(&mu_);
      --sleepers_;
    }
    if (stopping_) return nullptr;
    WorkItem* item = head_;
    head_ = item->next;
    if (head_ == nullptr) tail_ = nullptr;
    item->next = nullptr;
    return item;
  }
  // Whether the workers are paused (the test hook), without the lock: the inline handler
  // stands for a worker and must not run either.
  bool paused() const { return paused_flag_.load(std::memory_order_acquire); }
  void SetPaused(bool paused) EXCLUDES(mu_) {
    {
      MutexLock lock(&mu_);
      paused_ = paused;
      paused_flag_.store(paused, std::memory_order_release);
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
  std::atomic<bool> paused_flag_{false};
  bool stopping_ GUARDED_BY(mu_) = false;
  int sleepers_ GUARDED_BY(mu_) = 0;  // workers waiting on cv_
};

// ---------------------------------------------------------------------------------------------
// What every thread of one listener shares.
struct ListenerCore {
  ListenOptions options;
  std::shared_ptr<RegionRegistry> registry;
  std::string name;  // "tcp listener 127.0.0.1:7400", for logs
  WorkQueue queue;
  // The secrets handshakes are checked against, replaced by RotateSecrets. Each replacement
  // is a new secrets epoch; a role whose secret changed is revoked from that epoch on: its
  // sessions whose key was chosen in an earlier epoch are closed by their NIC thread's sweep.
  Mutex secrets_mu;
  auth::ServerSecrets secrets GUARDED_BY(secrets_mu);
  std::atomic<uint64_t> secrets_epoch{0};
  std::atomic<uint64_t> role_revoked_at[2] = {0, 0};  // by SessionRole (data, admin)
  std::atomic<uint64_t> sessions_revoked{0};
  std::shared_ptr<const TlsContext> tls;   // null: plaintext
  std::atomic<uint32_t> authenticated{0};  // sessions past the handshake, for max_connections
  std::atomic<uint32_t> sockets{0};        // open sockets, handshaking or not
  std::atomic<uint32_t> handshaking{0};    // sockets with in_handshake set
  std::atomic<uint64_t> handshakes_evicted{0};
  std::atomic<uint64_t> handshakes_timed_out{0};
  std::atomic<uint64_t> idle_closed{0};
  std::atomic<uint64_t> slow_readers_cut{0};
  std::atomic<uint64_t> busy_poll_holds{0};
  LogThrottle log_refused, log_timeout, log_evicted, log_protocol, log_session, log_cut;

  std::atomic<uint64_t> connections_accepted{0};
  std::atomic<uint64_t> connections_refused{0};
  std::atomic<uint64_t> requests{0};
  std::atomic<uint64_t> requests_inline{0};  // answered by the inline handler
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
    thread_ = std::thread([this] {
      rdkv::util::NameThisThread("rdkv-nic");
      Run();
    });
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

  // RotateSecrets: sweep now (revoked sessions are closed there).
  void SweepSoon() { Wake(); }
  // From a worker whose request took a session's queue below half: this thread looks at its
  // paused sessions at once (else only at the next sweep, up to kEpollTimeoutMs later, which
  // held a client of large requests to a few MB per sweep).
  void ResumeSoon() {
    resume_soon_.store(true, std::memory_order_release);
    Wake();
  }
  // The secrets epoch this thread's last sweep acted on.
  uint64_t swept_epoch() const { return swept_epoch_.load(std::memory_order_acquire); }

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

  // From Reply (any thread): a session was cut off for not reading `pending` bytes.
  void CountCut(const TcpSession& s, size_t pending, size_t limit) {
    core_->slow_readers_cut.fetch_add(1, std::memory_order_relaxed);
    uint64_t suppressed = 0;
    if (core_->log_cut.Allow(&suppressed)) {
      LOG(WARNING) << core_->name << ": cutting off session " << s.id() << " from " << s.peer()
                   << ": it does not read its responses (" << pending << " bytes unsent, limit "
                   << limit << ")" << Suppressed(suppressed);
    }
  }

 private:
  void Wake() {
    uint64_t one = 1;
    ssize_t n = write(wake_fd_, &one, sizeof one);
    (void)n;  // a full counter already guarantees a wakeup
  }

  void Run() {
    epoll_event events[kMaxEvents];
    const Clock::duration busy_poll = core_->options.busy_poll;
    const bool poll_always = core_->options.busy_poll_always;
    CpuContention contention;              // this thread's own wait for a CPU (made on this thread)
    uint64_t holds_counted = 0;            // contention.holds() already in core_->busy_poll_holds
    Clock::time_point now = Clock::now();  // one reading per round, after its events
    Clock::time_point next_sweep = now + std::chrono::milliseconds(kEpollTimeoutMs);
    Clock::time_point last_event{};
    while (!stop_.load(std::memory_order_acquire)) {
      // Polls (timeout 0) while the last events were handled less than busy_poll ago and this
      // thread does not wait for its CPU (CpuContention; ListenOptions::busy_poll_always aside);
      // sleeps in the kernel otherwise (always with busy_poll 0).
      const bool poll = now - last_event < busy_poll && (poll_always || !contention.Contended(now));
      if (contention.holds() != holds_counted) {
        core_->busy_poll_holds.fetch_add(contention.holds() - holds_counted,
                                         std::memory_order_relaxed);
        holds_counted = contention.holds();
      }
      int n = epoll_wait(epfd_, events, kMaxEvents, poll ? 0 : kEpollTimeoutMs);
      if (n == 0 && poll) sched_yield();  // other runnable threads first (see the connection)
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
          if (resume_soon_.exchange(false, std::memory_order_acq_rel)) ResumeQueuePaused();
          continue;
        }
        auto it = sessions_.find(events[i].data.u64);
        if (it == sessions_.end()) continue;
        std::shared_ptr<TcpSession> s = it->second;  // keeps it alive while Close() erases it
        HandleEvent(*s, events[i].events);
      }
      now = Clock::now();
      if (n > 0) last_event = now;
      if (now >= next_sweep || swept_epoch_.load(std::memory_order_relaxed) !=
                                   core_->secrets_epoch.load(std::memory_order_acquire)) {
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
        if (s->in_handshake.exchange(false, std::memory_order_acq_rel)) {
          core_->handshaking.fetch_sub(1, std::memory_order_relaxed);
        }
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
    if (s.state == TcpSession::State::kTls) {
      DriveTls(s);
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

  // The TLS handshake, as far as the socket allows. A first byte that is not a TLS record is a
  // plaintext client: REFUSED in plaintext, saying that this server requires TLS.
  void DriveTls(TcpSession& s) {
    enum { kWait, kPlaintext, kEof, kFailed, kDone } outcome = kWait;
    std::string error;
    {
      MutexLock lock(&s.out_mu);
      if (s.closed) return;
      if (s.tls == nullptr) {
        uint8_t first = 0;
        ssize_t n = recv(s.fd, &first, 1, MSG_PEEK | MSG_DONTWAIT);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
        if (n <= 0) {
          outcome = kEof;
        } else if (first != kTlsHandshakeRecord) {
          outcome = kPlaintext;
        } else {
          auto stream = TlsStream::Create(core_->tls, s.fd, {});
          if (stream.ok()) {
            s.tls = std::move(stream).value();
          } else {
            outcome = kFailed;
            error = stream.status().message();
          }
        }
      }
      if (s.tls != nullptr) {
        switch (s.tls->Handshake()) {
          case TlsIo::kOk:
            outcome = kDone;
            s.tls_want_write = false;
            s.state = TcpSession::State::kAwaitHello;
            break;
          case TlsIo::kWantRead:
            s.tls_want_write = false;
            break;
          case TlsIo::kWantWrite:
            s.tls_want_write = true;
            break;
          case TlsIo::kClosed:
          case TlsIo::kError:
            outcome = kFailed;
            error = s.tls->error();
            break;
        }
        if (outcome != kFailed) s.UpdateEventsLocked();
      }
    }
    switch (outcome) {
      case kWait:
        return;
      case kDone:
        ReadSocket(s);  // HELLO may be waiting already
        return;
      case kEof:
        return Close(s, {});
      case kPlaintext:
        return Refuse(s, StatusCode::kUnavailable,
                      "this server requires TLS: the client sent plaintext (connect with "
                      "--tls_ca_file, ClientOptions::tls)");
      case kFailed: {
        // An evicted socket (shut down by the accept thread) was counted there already.
        if (!s.in_handshake.load(std::memory_order_acquire)) return Close(s, {});
        core_->connections_refused.fetch_add(1, std::memory_order_relaxed);
        uint64_t suppressed = 0;
        if (core_->log_refused.Allow(&suppressed)) {
          LOG(WARNING) << core_->name << ": " << s.peer() << ": " << error
                       << "; dropping the connection" << Suppressed(suppressed);
        }
        return Close(s, {});
      }
    }
  }

  // Reads what the socket (or TLS stream) has: >0 bytes, 0 on EOF, -1 with errno (EAGAIN: come
  // back on the next event). -2: TLS failed (*error says why). Datapath: no allocation.
  ssize_t RecvSome(TcpSession& s, std::span<uint8_t> w, std::string* error) {
    if (!s.uses_tls) return recv(s.nic_fd(), w.data(), w.size(), MSG_DONTWAIT);
    MutexLock lock(&s.out_mu);
    if (s.tls == nullptr) return recv(s.fd, w.data(), w.size(), MSG_DONTWAIT);  // refused
    size_t n = 0;
    switch (s.tls->Read(w, &n)) {
      case TlsIo::kOk:
        return static_cast<ssize_t>(n);
      case TlsIo::kWantWrite:
        s.tls_want_write = true;
        s.UpdateEventsLocked();
        errno = EAGAIN;
        return -1;
      case TlsIo::kWantRead:
        errno = EAGAIN;
        return -1;
      case TlsIo::kClosed:
        return 0;
      case TlsIo::kError:
        *error = s.tls->error();
        return -2;
    }
    return -2;
  }

  void OnWritable(TcpSession& s) {
    bool resume = false;
    bool reread = false;
    {
      MutexLock lock(&s.out_mu);
      reread = s.tls_want_write;
      s.tls_want_write = false;
      s.FlushLocked();
      if (s.input_paused && s.out.size() < kOutLowWater) {
        s.input_paused = false;
        resume = true;
        s.UpdateEventsLocked();
      }
    }
    if (resume) ProcessInput(s);
    if (reread && !s.nic_closed()) ReadSocket(s);
  }

  void ReadSocket(TcpSession& s) {
    s.inline_in_pass = 0;
    for (int round = 0; round < 8; ++round) {
      size_t want = kRecvChunk;
      if (s.need > s.in.size()) want = std::max(want, s.need - s.in.size());
      std::span<uint8_t> w = s.in.PrepareWrite(want);
      std::string tls_error;
      ssize_t n = RecvSome(s, w, &tls_error);
      if (n > 0) {
        if (s.state == TcpSession::State::kDraining) {
          continue;  // refused: discard whatever the client still sends until it closes
        }
        if (round == 0) s.last_activity = Clock::now();
        s.in.Commit(static_cast<size_t>(n));
        ProcessInput(s);
        if (s.nic_closed() || s.nic_input_paused() || s.nic_queue_paused()) return;
        // A TLS read returns one record at a time: read on until it would block.
        if (!s.uses_tls && static_cast<size_t>(n) < w.size()) return;  // drained the socket
        continue;
      }
      if (n == 0) {
        if (!s.in.empty() && s.state != TcpSession::State::kDraining) {
          ProtocolError(s, "connection closed in the middle of a frame (" +
                               std::to_string(s.in.size()) + " of " + std::to_string(s.need) +
                               " bytes)");
        } else {
          // A client that hangs up after our CHALLENGE found our proof wrong (the secrets
          // differ) or gave up: a refused handshake either way.
          if (s.state == TcpSession::State::kAwaitProof) {
            core_->connections_refused.fetch_add(1, std::memory_order_relaxed);
          }
          Close(s, "peer closed the connection");
        }
        return;
      }
      if (n == -2) {
        core_->protocol_errors.fetch_add(1, std::memory_order_relaxed);
        return Close(s, tls_error);
      }
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      Close(s, std::string("recv: ") + strerror(errno));
      return;
    }
  }

  // Parses and acts on every complete frame in `s.in`.
  void ProcessInput(TcpSession& s) {
    if (s.state == TcpSession::State::kAwaitHello && !s.uses_tls && !s.in.empty() &&
        s.in.readable()[0] == kTlsHandshakeRecord) {
      // A TLS ClientHello where HELLO belongs: say so in plaintext (the client's TLS layer
      // reports a server that answered in plaintext).
      return Refuse(s, StatusCode::kUnavailable,
                    "this server does not have TLS enabled, and a TLS client connected (start "
                    "the server with --tls_cert_file and --tls_key_file)");
    }
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
      if (s.state == TcpSession::State::kAwaitProof && type != FrameType::kProof) {
        ProtocolError(s, std::string(FrameTypeName(type)) + " instead of PROOF");
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
        case FrameType::kProof:
          HandleProof(s, f->body);
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

  // HELLO: version, then the role's key; answers CHALLENGE (our nonce and our proof). Nothing
  // about this server is revealed before the client's PROOF checks out.
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
    auth::ServerSecrets secrets;
    {
      MutexLock lock(&core_->secrets_mu);
      secrets = core_->secrets;
      s.secrets_epoch = core_->secrets_epoch.load(std::memory_order_relaxed);
    }
    auto key = auth::ServerKeyFor(secrets, hello->auth.role, s.peer_loopback);
    if (!key.ok()) return Refuse(s, StatusCode::kPermissionDenied, key.status().message());
    s.granted_role = auth::GrantRole(secrets, hello->auth.role, s.peer_loopback);
    s.proven_secret = auth::ProvenSecret(secrets, hello->auth.role);
    auto nonce = auth::RandomNonce();
    if (!nonce.ok()) return Refuse(s, StatusCode::kUnavailable, nonce.status().message());
    auth::AuthChallenge c;
    c.server_nonce = *nonce;
    c.server_proof = auth::ComputeProof(auth::Side::kServer, *key, hello->auth.role,
                                        hello->auth.client_nonce, c.server_nonce, body);
    s.expected_proof = auth::ComputeProof(auth::Side::kClient, *key, hello->auth.role,
                                          hello->auth.client_nonce, c.server_nonce, body);
    s.requested_role = hello->auth.role;
    s.state = TcpSession::State::kAwaitProof;
    std::vector<uint8_t> frame = EncodeChallenge(c);
    MutexLock lock(&s.out_mu);
    s.reply_limit = std::min<size_t>(core_->options.max_message_size, hello->max_message_size);
    s.out.Append(frame.data(), frame.size());
    s.FlushLocked();
  }

  // PROOF: the client's MAC over both nonces; then max_connections; then WELCOME.
  void HandleProof(TcpSession& s, std::span<const uint8_t> body) {
    auto proof = DecodeProof(body);
    if (!proof.ok()) return ProtocolError(s, proof.status().message());
    if (!auth::ProofsEqual(proof->client_proof, s.expected_proof)) {
      return Refuse(s, StatusCode::kPermissionDenied,
                    "authentication failed: wrong secret for the " +
                        std::string(auth::RoleName(s.requested_role)) +
                        " role (the client's --auth_token_file / --admin_token_file must hold "
                        "the server's secret)");
    }
    uint32_t max = core_->options.max_connections;
    if (core_->authenticated.fetch_add(1, std::memory_order_relaxed) >= max) {
      core_->authenticated.fetch_sub(1, std::memory_order_relaxed);
      return Refuse(s, StatusCode::kUnavailable,
                    "too many connections (max_connections " + std::to_string(max) +
                        "; the server's --max_connections)");
    }
    if (!s.in_handshake.exchange(false, std::memory_order_acq_rel)) {
      // Evicted by the accept thread while finishing: it was the oldest of a flood.
      core_->authenticated.fetch_sub(1, std::memory_order_relaxed);
      return Close(s, {});
    }
    core_->handshaking.fetch_sub(1, std::memory_order_relaxed);
    s.authenticated = true;
    s.set_role(s.granted_role);
    Welcome w;
    w.max_message_size = static_cast<uint32_t>(core_->options.max_message_size);
    w.session_id = s.id();
    w.regions = core_->options.regions;
    std::vector<uint8_t> frame = EncodeWelcome(w);
    const Clock::time_point now = Clock::now();
    {
      MutexLock lock(&s.out_mu);
      s.out_limit = std::max(kOutHardMin, 2 * (s.reply_limit + kReadResponseHeadSize));
      s.out_progress = now;
      s.out.Append(frame.data(), frame.size());
      s.FlushLocked();
    }
    s.state = TcpSession::State::kReady;
    s.last_activity = now;
    core_->connections_accepted.fetch_add(1, std::memory_order_relaxed);
    uint64_t suppressed = 0;
    if (core_->log_session.Allow(&suppressed)) {
      LOG(INFO) << core_->name << ": session " << s.id() << " from " << s.peer()
                << " authenticated as " << auth::RoleName(s.role()) << Suppressed(suppressed);
    }
  }

  void Refuse(TcpSession& s, StatusCode code, const std::string& reason) {
    core_->connections_refused.fetch_add(1, std::memory_order_relaxed);
    uint64_t suppressed = 0;
    if (core_->log_refused.Allow(&suppressed)) {
      LOG(WARNING) << core_->name << ": refusing " << s.peer() << ": " << reason
                   << Suppressed(suppressed);
    }
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
        s.out_progress = Clock::now();
        s.UpdateEventsLocked();
      }
    }
  }

  void QueueCall(TcpSession& s, std::span<const uint8_t> body) {
    auto call = DecodeCall(body);
    if (!call.ok()) return ProtocolError(s, call.status().message());
    auto it = sessions_.find(s.id());
    if (it == sessions_.end()) return;
    // Not while an earlier request of this session is still with a worker: answered here, this
    // one would overtake it, where the workers start a connection's requests in arrival order
    // (a write that timed out at the client while the workers were busy would apply after the
    // write sent next). Only that order is kept: requests in flight together are unordered on
    // either path. Nor past kMaxInlinePerPass in one receive pass.
    if (core_->options.inline_handler && !core_->queue.paused() &&
        s.inline_in_pass < kMaxInlinePerPass && s.queued.load(std::memory_order_acquire) == 0) {
      // Answered here when it can be: the reply joins this receive pass's output (flushed once
      // at the end of the pass) and no worker is involved.
      thread_local std::vector<uint8_t> response;
      response.clear();
      ReplyHandle reply{it->second, call->request_id};
      if (core_->options.inline_handler(call->payload, &response, &reply)) {
        ++s.inline_in_pass;
        core_->requests.fetch_add(1, std::memory_order_relaxed);
        core_->requests_inline.fetch_add(1, std::memory_order_relaxed);
        if (reply.session == nullptr) return;  // taken: answered later, from another thread
        t_reply_in_pass = &s;                  // Reply leaves the flush to the end of the pass
        s.Reply(call->request_id, response).IgnoreError();  // a cut-off client: nothing to do
        t_reply_in_pass = nullptr;
        MutexLock lock(&s.out_mu);
        if (PauseInputIfBacklogged(s)) s.UpdateEventsLocked();
        return;
      }
    }
    WorkItem* item = core_->queue.Acquire();
    item->session = it->second;
    item->request_id = call->request_id;
    item->payload.assign(call->payload.begin(), call->payload.end());
    core_->requests.fetch_add(1, std::memory_order_relaxed);
    const size_t bytes = item->payload.size();
    // Both counts always (a worker takes both off again).
    const uint32_t queued = s.queued.fetch_add(1, std::memory_order_relaxed) + 1;
    const uint64_t queued_bytes =
        s.queued_bytes.fetch_add(bytes, std::memory_order_relaxed) + bytes;
    const bool too_many = queued >= kMaxQueuedPerSession || queued_bytes >= QueuedBytesLimit();
    core_->queue.Push(item);
    MutexLock lock(&s.out_mu);
    if (too_many) s.queue_paused = true;
    PauseInputIfBacklogged(s);
    s.UpdateEventsLocked();
  }

  size_t QueuedBytesLimit() const { return QueuedBytesLimitOf(core_->options); }

  // A session whose reading paused for its queue may read again: the workers are through half
  // of it, by count and by bytes.
  bool MayResume(const TcpSession& s) const {
    return s.nic_queue_paused() && s.queued.load(std::memory_order_relaxed) < kResumeQueuedBelow &&
           s.queued_bytes.load(std::memory_order_relaxed) <
               ResumeQueuedBytesBelowOf(core_->options);
  }

  // Answers pile up unread (past the high-water mark even after a flush): stop taking the
  // session's requests until its output drains. True when input was paused here (the caller
  // updates the epoll interest).
  static bool PauseInputIfBacklogged(TcpSession& s) REQUIRES(s.out_mu) {
    if (s.out.size() < kOutHighWater) return false;
    s.FlushLocked();
    if (s.out.size() < kOutHighWater || s.input_paused) return false;
    s.input_paused = true;
    s.out_progress = Clock::now();
    return true;
  }

  void ProtocolError(TcpSession& s, const std::string& what) {
    core_->protocol_errors.fetch_add(1, std::memory_order_relaxed);
    if (!s.authenticated) core_->connections_refused.fetch_add(1, std::memory_order_relaxed);
    uint64_t suppressed = 0;
    if (core_->log_protocol.Allow(&suppressed)) {
      LOG(WARNING) << core_->name << ": protocol error from " << s.peer() << " (session " << s.id()
                   << "): " << what << "; dropping the connection" << Suppressed(suppressed);
    }
    Close(s, {});
  }

  void Close(TcpSession& s, const std::string& why) {
    uint64_t suppressed = 0;
    if (!why.empty() && s.authenticated && core_->log_session.Allow(&suppressed)) {
      LOG(INFO) << core_->name << ": session " << s.id() << " from " << s.peer()
                << " closed: " << why << Suppressed(suppressed);
    }
    if (s.in_handshake.exchange(false, std::memory_order_acq_rel)) {
      core_->handshaking.fetch_sub(1, std::memory_order_relaxed);
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

  // Reads again from a session that paused for its queue: what its buffer holds first.
  void Resume(TcpSession& s) {
    {
      MutexLock lock(&s.out_mu);
      s.queue_paused = false;
      s.UpdateEventsLocked();
    }
    ProcessInput(s);
  }

  void ResumeQueuePaused() {
    std::vector<std::shared_ptr<TcpSession>> resumed;
    for (auto& [id, s] : sessions_) {
      if (s->state == TcpSession::State::kReady && MayResume(*s)) resumed.push_back(s);
    }
    for (auto& s : resumed) Resume(*s);
  }

  void Sweep(Clock::time_point now) {
    std::vector<std::shared_ptr<TcpSession>> expired, resumed, idle, stalled, revoked, rekeyed;
    const auto idle_timeout = core_->options.idle_timeout;
    const auto stall_timeout = core_->options.output_stall_timeout;
    const uint64_t epoch = core_->secrets_epoch.load(std::memory_order_acquire);
    const uint64_t revoked_at[2] = {core_->role_revoked_at[0].load(std::memory_order_acquire),
                                    core_->role_revoked_at[1].load(std::memory_order_acquire)};
    auto is_revoked = [&](const TcpSession& s, SessionRole role) {
      return auth::RevokedByRotation(s.proven_secret, role, s.secrets_epoch < revoked_at[0],
                                     s.secrets_epoch < revoked_at[1]);
    };
    for (auto& [id, s] : sessions_) {
      if (s->state == TcpSession::State::kAwaitProof && is_revoked(*s, s->granted_role)) {
        rekeyed.push_back(s);  // its expected proof uses a replaced secret
        continue;
      }
      if (s->state != TcpSession::State::kReady) {
        if (now >= s->deadline) expired.push_back(s);
        continue;
      }
      if (is_revoked(*s, s->role())) {
        revoked.push_back(s);
        continue;
      }
      if (MayResume(*s)) resumed.push_back(s);
      if (idle_timeout.count() > 0 && now - s->last_activity >= idle_timeout &&
          s->queued.load(std::memory_order_relaxed) == 0) {
        idle.push_back(s);
      } else if (s->nic_input_paused() && stall_timeout.count() > 0) {
        MutexLock lock(&s->out_mu);
        if (!s->out.empty() && now - s->out_progress >= stall_timeout) stalled.push_back(s);
      }
    }
    for (auto& s : resumed) Resume(*s);
    for (auto& s : expired) {
      if (s->nic_closed()) continue;
      if (s->state == TcpSession::State::kTls || s->state == TcpSession::State::kAwaitHello ||
          s->state == TcpSession::State::kAwaitProof) {
        core_->connections_refused.fetch_add(1, std::memory_order_relaxed);
        core_->handshakes_timed_out.fetch_add(1, std::memory_order_relaxed);
        uint64_t suppressed = 0;
        if (core_->log_timeout.Allow(&suppressed)) {
          LOG(WARNING) << core_->name << ": " << s->peer()
                       << " did not finish the handshake within "
                       << core_->options.handshake_timeout.count() << " ms; dropping the connection"
                       << Suppressed(suppressed);
        }
      }
      Close(*s, {});
    }
    for (auto& s : rekeyed) {
      if (s->nic_closed()) continue;
      core_->connections_refused.fetch_add(1, std::memory_order_relaxed);
      Close(*s, {});
    }
    for (auto& s : revoked) {
      if (s->nic_closed()) continue;
      core_->sessions_revoked.fetch_add(1, std::memory_order_relaxed);
      Close(*s, "its credentials were revoked (the server's secret was rotated)");
    }
    swept_epoch_.store(epoch, std::memory_order_release);
    for (auto& s : idle) {
      if (s->nic_closed()) continue;
      core_->idle_closed.fetch_add(1, std::memory_order_relaxed);
      Close(*s, "idle for " +
                    std::to_string(
                        std::chrono::duration_cast<std::chrono::seconds>(idle_timeout).count()) +
                    " s (idle_timeout)");
    }
    for (auto& s : stalled) {
      if (s->nic_closed()) continue;
      core_->slow_readers_cut.fetch_add(1, std::memory_order_relaxed);
      {
        MutexLock lock(&s->out_mu);
        if (!s->closed) SetAbortiveClose(s->fd);
      }
      uint64_t suppressed = 0;
      if (core_->log_cut.Allow(&suppressed)) {
        LOG(WARNING) << core_->name << ": cutting off session " << s->id() << " from " << s->peer()
                     << ": it has not read its responses for " << stall_timeout.count() << " ms"
                     << Suppressed(suppressed);
      }
      Close(*s, {});
    }
  }

  ListenerCore* const core_;
  int epfd_ = -1;
  int wake_fd_ = -1;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> swept_epoch_{0};
  std::atomic<bool> resume_soon_{false};  // ResumeSoon: resume paused sessions now
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
  // An inline answer on the NIC thread is sent with the rest of its receive pass (one write for
  // all of them), a reply under a ReplyBatch with the batch's others; any other goes out now.
  bool held = false;
  if (out.size() < kOutHighWater) {
    if (t_reply_in_pass == this) {
      held = true;  // the pass's end flushes
    } else if (ReplyBatch::Open()) {
      ReplyBatch::Hold(shared_from_this());
      held = true;
    }
  }
  if (!held) FlushLocked();
  if (!broken && out.size() > out_limit) {
    // The client does not read its answers: cut it off rather than grow without bound. The
    // NIC thread sees the shutdown as a hang-up and closes the session.
    broken = true;
    cut_off = true;
    const size_t pending = out.size();
    out = ByteBuffer();
    SetAbortiveClose(fd);
    shutdown(fd, SHUT_RDWR);
    nic_->CountCut(*this, pending, out_limit);
  }
  if (broken) return Status::ConnectionLost("client " + peer_ + " is gone");
  return Status::Ok();
}

void TcpSession::SendHeld() {
  MutexLock lock(&out_mu);
  FlushLocked();
}

void TcpSession::FlushLocked() {
  if (closed) return;
  while (!out.empty()) {
    std::span<const uint8_t> r = out.readable();
    if (tls != nullptr) {
      size_t put = 0;
      TlsIo io = tls->Write(r, &put);
      if (io == TlsIo::kOk) {
        out.Consume(put);
        if (input_paused) out_progress = Clock::now();
        continue;
      }
      if (io == TlsIo::kWantWrite) break;  // EPOLLOUT is armed while `out` holds bytes
      if (io == TlsIo::kWantRead) break;   // goes on after the next read (not in TLS 1.3 use)
      broken = true;
      out.Clear();
      break;
    }
    ssize_t n = send(fd, r.data(), r.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      out.Consume(static_cast<size_t>(n));
      if (input_paused) out_progress = Clock::now();  // only a stalled reader needs the time
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
  if (!out.empty() || input_paused || tls_want_write) want |= EPOLLOUT;
  if (want == armed) return;
  epoll_event ev{};
  ev.events = want;
  ev.data.u64 = id_;
  if (epoll_ctl(nic_->epfd(), EPOLL_CTL_MOD, fd, &ev) == 0) armed = want;
}

void TcpSession::CloseLocked() {
  if (closed) return;
  closed = true;
  tls.reset();  // before its socket is closed
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
      workers_.emplace_back([this] {
        rdkv::util::NameThisThread("rdkv-worker");
        WorkerLoop();
      });
    }
    accept_thread_ = std::thread([this] {
      rdkv::util::NameThisThread("rdkv-accept");
      AcceptLoop();
    });
    LOG(INFO) << core_->name << ": serving " << core_->options.regions.size() << " region(s) with "
              << kNicThreads << " NIC thread(s) and " << core_->options.worker_threads
              << " worker(s)"
              << (core_->tls == nullptr ? ", plaintext (no TLS)"
                  : core_->options.tls.require_client_cert
                      ? ", TLS 1.3 with client certificates required"
                      : ", TLS 1.3");
    return Status::Ok();
  }

  uint16_t port() const override { return port_; }

  ListenerStats stats() const override {
    ListenerStats s;
    s.connections_accepted = core_->connections_accepted.load(std::memory_order_relaxed);
    s.connections_refused = core_->connections_refused.load(std::memory_order_relaxed);
    s.requests = core_->requests.load(std::memory_order_relaxed);
    s.requests_inline = core_->requests_inline.load(std::memory_order_relaxed);
    s.connections_open = core_->authenticated.load(std::memory_order_relaxed);
    s.reads_served = core_->reads_served.load(std::memory_order_relaxed);
    s.read_bytes_served = core_->read_bytes_served.load(std::memory_order_relaxed);
    s.reads_refused = core_->reads_refused.load(std::memory_order_relaxed);
    s.protocol_errors = core_->protocol_errors.load(std::memory_order_relaxed);
    s.handshakes_evicted = core_->handshakes_evicted.load(std::memory_order_relaxed);
    s.handshakes_timed_out = core_->handshakes_timed_out.load(std::memory_order_relaxed);
    s.idle_closed = core_->idle_closed.load(std::memory_order_relaxed);
    s.slow_readers_cut = core_->slow_readers_cut.load(std::memory_order_relaxed);
    s.busy_poll_holds = core_->busy_poll_holds.load(std::memory_order_relaxed);
    return s;
  }

  void PauseWorkers(bool paused) override { core_->queue.SetPaused(paused); }

  Result<uint64_t> RotateSecrets(const std::string& auth_token,
                                 const std::string& admin_token) override {
    if (auth_token.size() > kMaxTokenLength || admin_token.size() > kMaxTokenLength) {
      return Status::InvalidArgument("auth tokens are limited to " +
                                     std::to_string(kMaxTokenLength) + " bytes");
    }
    const uint64_t before = core_->sessions_revoked.load(std::memory_order_relaxed);
    uint64_t epoch = 0;
    {
      MutexLock lock(&core_->secrets_mu);
      const bool data_changed = core_->secrets.data != auth_token;
      const bool admin_changed = core_->secrets.admin != admin_token;
      core_->secrets.data = auth_token;
      core_->secrets.admin = admin_token;
      epoch = core_->secrets_epoch.load(std::memory_order_relaxed) + 1;
      if (data_changed) core_->role_revoked_at[0].store(epoch, std::memory_order_relaxed);
      if (admin_changed) core_->role_revoked_at[1].store(epoch, std::memory_order_relaxed);
      core_->secrets_epoch.store(epoch, std::memory_order_release);
    }
    for (auto& nic : nics_) nic->SweepSoon();
    // Every NIC thread sweeps within a poll; a stuck one is reported rather than waited for.
    const Clock::time_point until = Clock::now() + std::chrono::seconds(5);
    for (auto& nic : nics_) {
      while (nic->swept_epoch() < epoch) {
        if (Clock::now() > until) {
          return Status::TimedOut(core_->name +
                                  ": the secrets were replaced, but revoked sessions were not "
                                  "all closed within 5 s");
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
    return core_->sessions_revoked.load(std::memory_order_relaxed) - before;
  }

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

  // A socket still in its handshake, oldest first (the accept thread's own list).
  struct Handshaking {
    std::weak_ptr<TcpSession> session;
    SourceKey source;
  };

  static bool StillHandshaking(const Handshaking& h) {
    auto s = h.session.lock();
    return s != nullptr && s->in_handshake.load(std::memory_order_acquire);
  }

  // Closes a handshaking socket to make room (its NIC thread sees the hang-up and drops it).
  void Evict(const Handshaking& h) {
    auto s = h.session.lock();
    if (s == nullptr || !s->in_handshake.exchange(false, std::memory_order_acq_rel)) return;
    core_->handshaking.fetch_sub(1, std::memory_order_relaxed);
    core_->handshakes_evicted.fetch_add(1, std::memory_order_relaxed);
    core_->connections_refused.fetch_add(1, std::memory_order_relaxed);
    MutexLock lock(&s->out_mu);
    if (!s->closed) shutdown(s->fd, SHUT_RDWR);
  }

  // Makes room for one more handshaking socket from `source`: at the total or per-source limit
  // the oldest one (of that source) is evicted, so a flood of silent sockets only ever delays
  // itself and a client that completes its handshake promptly always gets in.
  void AdmitHandshake(std::deque<Handshaking>* list, const SourceKey& source) {
    while (!list->empty() && !StillHandshaking(list->front())) list->pop_front();
    const uint32_t cap = core_->options.max_handshakes;
    if (list->size() > 4 * static_cast<size_t>(cap) + 64) {
      std::erase_if(*list, [](const Handshaking& h) { return !StillHandshaking(h); });
    }
    bool evicted = false;
    if (core_->handshaking.load(std::memory_order_relaxed) >= cap) {
      for (auto& h : *list) {
        if (StillHandshaking(h)) {
          Evict(h);
          evicted = true;
          break;
        }
      }
    }
    const Handshaking* oldest_same = nullptr;
    uint32_t same = 0;
    for (auto& h : *list) {
      if (h.source == source && StillHandshaking(h)) {
        if (oldest_same == nullptr) oldest_same = &h;
        ++same;
      }
    }
    if (oldest_same != nullptr && same >= core_->options.max_handshakes_per_source) {
      Evict(*oldest_same);
      evicted = true;
    }
    uint64_t suppressed = 0;
    if (evicted && core_->log_evicted.Allow(&suppressed)) {
      LOG(WARNING) << core_->name << ": too many unfinished handshakes (max_handshakes " << cap
                   << ", per source " << core_->options.max_handshakes_per_source
                   << "): closing the oldest to admit new connections" << Suppressed(suppressed);
    }
  }

  void AcceptLoop() {
    size_t next_nic = 0;
    uint64_t next_id = 1;
    // Sessions, handshakes, and sockets lingering after a REFUSED or a close.
    const uint32_t socket_cap =
        core_->options.max_connections + 2 * core_->options.max_handshakes + 16;
    std::deque<Handshaking> handshaking;
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
        uint64_t suppressed = 0;
        if (core_->log_refused.Allow(&suppressed)) {
          LOG(WARNING) << core_->name << ": accept: " << strerror(err) << Suppressed(suppressed);
        }
        if (err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM) {
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
        continue;
      }
      SourceKey source;
      bool loopback = false;
      PeerSource(fd, &source, &loopback);
      AdmitHandshake(&handshaking, source);
      if (core_->sockets.load(std::memory_order_relaxed) >= socket_cap) {
        core_->connections_refused.fetch_add(1, std::memory_order_relaxed);
        uint64_t suppressed = 0;
        if (core_->log_refused.Allow(&suppressed)) {
          LOG(WARNING) << core_->name << ": " << socket_cap
                       << " sockets open already; closing a new connection"
                       << Suppressed(suppressed);
        }
        close(fd);
        continue;
      }
      ConfigureStreamSocket(fd);
      core_->sockets.fetch_add(1, std::memory_order_relaxed);
      core_->handshaking.fetch_add(1, std::memory_order_relaxed);
      NicThread* nic = nics_[next_nic++ % nics_.size()].get();
      auto s = std::make_shared<TcpSession>(next_id++, fd, PeerName(fd), nic);
      s->deadline = Clock::now() + core_->options.handshake_timeout;
      if (core_->tls != nullptr) {
        s->uses_tls = true;
        s->state = TcpSession::State::kTls;
      }
      s->source = source;
      s->peer_loopback = loopback;
      handshaking.push_back({s, source});
      nic->Adopt(std::move(s));
    }
  }

  void WorkerLoop() {
    const RequestHandler& handler = core_->options.handler;
    while (WorkItem* item = core_->queue.Pop()) {
      handler(std::span<const uint8_t>(item->payload.data(), item->payload.size()),
              ReplyHandle{item->session, item->request_id});
      TcpSession& s = *item->session;
      const size_t bytes = item->payload.size();
      const uint64_t bytes_before = s.queued_bytes.fetch_sub(bytes, std::memory_order_relaxed);
      const uint32_t before = s.queued.fetch_sub(1, std::memory_order_release);  // inline test
      // Below half of either limit now: the NIC thread resumes the session if it paused.
      const uint64_t resume_bytes = ResumeQueuedBytesBelowOf(core_->options);
      if (before == kResumeQueuedBelow ||
          (bytes_before >= resume_bytes && bytes_before - bytes < resume_bytes)) {
        s.nic()->ResumeSoon();
      }
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
  RDKV_RETURN_IF_ERROR(CheckBusyPoll(options.busy_poll));
  if (options.max_message_size == 0 || options.max_message_size > kMaxMessageSizeLimit) {
    return Status::InvalidArgument("max_message_size must be 1.." +
                                   std::to_string(kMaxMessageSizeLimit));
  }
  if (options.max_connections == 0) return Status::InvalidArgument("max_connections must be > 0");
  if (options.auth_token.size() > kMaxTokenLength || options.admin_token.size() > kMaxTokenLength) {
    return Status::InvalidArgument("auth/admin secret longer than " +
                                   std::to_string(kMaxTokenLength) + " bytes");
  }
  if (options.max_handshakes == 0 || options.max_handshakes_per_source == 0) {
    return Status::InvalidArgument("max_handshakes and max_handshakes_per_source must be > 0");
  }
  if (options.handshake_timeout.count() <= 0) {
    return Status::InvalidArgument("handshake_timeout must be > 0");
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
  if (options.tls.server_enabled()) {
    auto tls = TlsContext::CreateServer(options.tls);
    if (!tls.ok()) return tls.status();
    core->tls = std::move(tls).value();
  } else if (options.tls.any()) {
    return Status::InvalidArgument(
        "TLS: a CA file without a server certificate and key (--tls_cert_file, --tls_key_file)");
  }
  {
    MutexLock lock(&core->secrets_mu);
    core->secrets = {options.auth_token, options.admin_token, options.loopback_admin};
  }
  core->options = std::move(options);
  core->registry = std::move(registry);
  auto listener = std::make_unique<TcpListener>(std::move(core));
  RDKV_RETURN_IF_ERROR(listener->Start());
  return std::unique_ptr<Listener>(std::move(listener));
}

}  // namespace rdkv::transport::tcp

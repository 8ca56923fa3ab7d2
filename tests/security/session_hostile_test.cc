// Hostile clients against the tcp transport's listener (docs/security.md): silent sockets,
// replayed handshakes, wrong secrets, a server that cannot prove the secret, clients that never
// read their answers, idle sessions and the connection limit. Uses a raw-socket client
// (session_raw_client.h) for what a real Connection never sends.
#include <glog/logging.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "common/transport/auth.h"
#include "common/transport/tcp/frame.h"
#include "common/transport/transport.h"
#include "tests/security/session_raw_client.h"

namespace rdkv::transport::tcp {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
namespace raw = rawtest;

constexpr char kData[] = "data-secret";
constexpr char kAdmin[] = "admin-secret";

// Counts the WARNING+ lines glog writes while it is installed.
class LineCounter : public google::LogSink {
 public:
  LineCounter() { google::AddLogSink(this); }
  ~LineCounter() override { google::RemoveLogSink(this); }
  void send(google::LogSeverity severity, const char*, const char*, int, const struct tm*,
            const char*, size_t) override {
    if (severity >= google::GLOG_WARNING) warnings.fetch_add(1);
  }
  std::atomic<int> warnings{0};
};

// Resident memory of this process, in bytes (VmRSS of /proc/self/status).
uint64_t RssBytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  return 0;
}

// Threads of this process (Threads: of /proc/self/status).
int ThreadCount() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("Threads:", 0) == 0) return std::stoi(line.substr(8));
  }
  return 0;
}
// What a test's own client side may add (a connection's reader thread, the glog sink's).
constexpr int kThreadSlack = 4;

class HostileClients : public ::testing::Test {
 protected:
  void SetUp() override {
    // The flood tests hold ~1000 sockets on each side: raise the soft fd limit to the hard one.
    rlimit rl{};
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
      rl.rlim_cur = rl.rlim_max;
      setrlimit(RLIMIT_NOFILE, &rl);
    }
    auto f = Fabric::Create({TransportKind::kTcp, "", false});
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    fabric_ = std::move(f).value();
    auto r = fabric_->AllocateRegion(8 << 20, RegionAccess::kRemoteRead);
    ASSERT_TRUE(r.ok());
    region_ = std::move(r).value();
    std::memset(region_->data(), 0x5a, region_->size());
  }
  void TearDown() override {
    for (int fd : fds_) close(fd);
    listener_.reset();
  }

  // The flood tests hold ~1000 sockets on each side. Without the file descriptors for them a
  // test cannot run: SKIPPED and why, except in CI ($CI set), where a skipped hostile-client
  // test would hide a regression, so it fails.
  bool HasFds(rlim_t needed) {
    rlimit rl{};
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= needed) return true;
    const char* ci = std::getenv("CI");
    if (ci != nullptr && ci[0] != '\0') {
      ADD_FAILURE() << "needs " << needed << " file descriptors (ulimit -n), has " << rl.rlim_cur
                    << "; CI must give them (raise the hard limit)";
    } else {
      std::printf("SKIPPED: needs %llu file descriptors (ulimit -n), has %llu\n",
                  static_cast<unsigned long long>(needed),
                  static_cast<unsigned long long>(rl.rlim_cur));
    }
    return false;
  }

  ListenOptions Options() {
    ListenOptions lo;
    lo.host = "127.0.0.1";
    lo.auth_token = kData;
    lo.admin_token = kAdmin;
    lo.regions = {region_->Describe(1)};
    lo.handler = [this](std::span<const uint8_t> p, ReplyHandle r) {
      last_role_.store(static_cast<int>(r.session->role()));
      r.session->Reply(r.request_id, p).IgnoreError();
    };
    return lo;
  }
  void Listen(ListenOptions lo) {
    auto l = fabric_->Listen(std::move(lo));
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    listener_ = std::move(l).value();
  }
  Result<std::unique_ptr<Connection>> Connect(std::string secret = kData,
                                              SessionRole role = SessionRole::kData) {
    ConnectOptions co;
    co.host = "127.0.0.1";
    co.port = listener_->port();
    co.auth_token = std::move(secret);
    co.role = role;
    co.connect_timeout = 5s;
    return fabric_->Connect(co);
  }
  int Raw(const char* source = nullptr) {
    int fd = raw::RawConnect(listener_->port(), source);
    EXPECT_GE(fd, 0) << strerror(errno);
    if (fd >= 0) fds_.push_back(fd);
    return fd;
  }
  // The role the handler saw for one Call on `c`.
  SessionRole RoleSeenBy(Connection* c) {
    last_role_ = 0;
    std::vector<uint8_t> req = {1}, resp;
    EXPECT_TRUE(c->Call(req, &resp, 5s).ok());
    return static_cast<SessionRole>(last_role_.load());
  }

  std::unique_ptr<Fabric> fabric_;
  std::unique_ptr<MemoryRegion> region_;
  std::unique_ptr<Listener> listener_;
  std::vector<int> fds_;
  std::atomic<int> last_role_{0};
};

// Observed on main: ~530 silent sockets filled the socket cap and refused everyone for 5 s,
// with one warning line per refused connection.
TEST_F(HostileClients, SixHundredSilentSocketsDoNotLockOutALegitimateClient) {
  if (!HasFds(4096)) GTEST_SKIP() << "too few file descriptors";
  Listen(Options());
  const int threads_before = ThreadCount();
  LineCounter lines;
  const char* sources[] = {nullptr, "127.0.0.2", "127.0.0.3", "127.0.0.4"};
  for (int i = 0; i < 600; ++i) Raw(sources[i % 4]);
  // Let the accept thread take them all in: at most 256 stay (64 per source); the others were
  // evicted, oldest first, or (on a slow machine) already reached the 2 s handshake deadline.
  auto gone = [&] {
    ListenerStats st = listener_->stats();
    return st.handshakes_evicted + st.handshakes_timed_out;
  };
  for (int i = 0; i < 300 && gone() < 600 - 256; ++i) std::this_thread::sleep_for(10ms);
  Clock::time_point start = Clock::now();
  auto c = Connect();
  auto took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  RecordProperty("connect_ms_with_600_silent_sockets", std::to_string(took.count()));
  std::printf("legitimate connect with 600 silent sockets open: %lld ms\n",
              static_cast<long long>(took.count()));
  EXPECT_LT(took, 1000ms);
  EXPECT_GE(gone(), 600u - 256u);
  EXPECT_GT(listener_->stats().handshakes_evicted, 0u);
  // The handshake deadline (2 s) then closes the rest: a reconnect loop of silent sockets
  // still cannot hold a slot for long, and a second client gets in too.
  std::this_thread::sleep_for(2500ms);
  EXPECT_GE(gone(), 600u);
  auto c2 = Connect();
  ASSERT_TRUE(c2.ok()) << c2.status().ToString();
  // Warnings are rate-limited: a handful of lines, not one per socket.
  std::printf("warning lines for 600 silent sockets: %d\n", lines.warnings.load());
  EXPECT_LE(lines.warnings.load(), 10);
  // The sockets cost the server no threads.
  const int threads_after = ThreadCount();
  std::printf("threads: %d before the flood, %d after it with two sessions\n", threads_before,
              threads_after);
  EXPECT_LE(threads_after, threads_before + kThreadSlack);
}

// Observed on main: under a reconnect loop of silent sockets the lockout lasted indefinitely.
// Here a flood keeps opening silent sockets (from two addresses) while a legitimate client
// connects again and again: every connect succeeds, quickly.
TEST_F(HostileClients, AReconnectLoopOfSilentSocketsDoesNotLockOutClients) {
  if (!HasFds(4096)) GTEST_SKIP() << "too few file descriptors";
  Listen(Options());
  std::atomic<bool> stop{false};
  std::atomic<int> opened{0};
  std::thread flood([&] {
    const char* sources[] = {"127.0.0.2", "127.0.0.3"};
    std::vector<int> mine;
    for (int i = 0; !stop.load(); ++i) {
      int fd = raw::RawConnect(listener_->port(), sources[i % 2]);
      if (fd >= 0) {
        mine.push_back(fd);
        opened.fetch_add(1);
      }
      if (mine.size() >= 900) {  // stay below the fd limit: recycle the oldest
        close(mine.front());
        mine.erase(mine.begin());
      }
    }
    for (int fd : mine) close(fd);
  });
  while (opened.load() < 600) std::this_thread::sleep_for(5ms);
  std::chrono::milliseconds worst{0};
  for (int i = 0; i < 20; ++i) {
    Clock::time_point start = Clock::now();
    auto c = Connect();
    auto took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
    ASSERT_TRUE(c.ok()) << "connect " << i << ": " << c.status().ToString();
    worst = std::max(worst, took);
  }
  stop = true;
  flood.join();
  std::printf("20 connects during a flood of %d silent sockets: worst %lld ms\n", opened.load(),
              static_cast<long long>(worst.count()));
  EXPECT_LT(worst, 2000ms);
  EXPECT_GT(listener_->stats().handshakes_evicted, 0u);
}

TEST_F(HostileClients, AReplayedHandshakeIsRefused) {
  Listen(Options());
  // Capture a legitimate client's bytes (what an eavesdropper sees).
  int fd = Raw();
  FrameHeader h;
  std::vector<uint8_t> body, captured;
  ASSERT_TRUE(raw::ClientHandshake(fd, kData, SessionRole::kData, &h, &body, &captured));
  ASSERT_EQ(h.type, FrameType::kWelcome);
  // The secret is nowhere in them.
  std::string wire(captured.begin(), captured.end());
  EXPECT_EQ(wire.find(kData), std::string::npos);
  const uint64_t served = listener_->stats().reads_served;
  // Replay HELLO + PROOF on a new connection: the server's nonce is new, so the proof is wrong.
  int fd2 = Raw();
  ASSERT_TRUE(raw::SendBytes(fd2, captured));
  ASSERT_TRUE(raw::RecvFrame(fd2, &h, &body));
  ASSERT_EQ(h.type, FrameType::kChallenge);
  ASSERT_TRUE(raw::RecvFrame(fd2, &h, &body));
  ASSERT_EQ(h.type, FrameType::kRefused);
  auto r = DecodeRefused(body);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->code, StatusCode::kPermissionDenied) << r->reason;
  // And a READ after the replay is never served.
  ReadRequest rq{1, region_->Describe(1).addr, region_->rkey(), 16};
  std::vector<uint8_t> f(kReadRequestFrameSize);
  EncodeReadRequest(rq, std::span<uint8_t, kReadRequestFrameSize>(f.data(), f.size()));
  raw::SendBytes(fd2, f);
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(listener_->stats().reads_served, served);
}

TEST_F(HostileClients, WrongSecretsAreRefusedAndTheRightOnesGetTheirRole) {
  Listen(Options());
  auto bad = Connect("wrong");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kPermissionDenied) << bad.status().ToString();
  bad = Connect(kData, SessionRole::kAdmin);  // the data secret is not the admin secret
  EXPECT_EQ(bad.status().code(), StatusCode::kPermissionDenied) << bad.status().ToString();
  bad = Connect(kAdmin, SessionRole::kData);
  EXPECT_EQ(bad.status().code(), StatusCode::kPermissionDenied) << bad.status().ToString();
  // A raw client that ignores the server's proof and answers with a wrong one: REFUSED.
  int fd = Raw();
  FrameHeader h;
  std::vector<uint8_t> body;
  ASSERT_TRUE(raw::ClientHandshake(fd, "wrong", SessionRole::kData, &h, &body, nullptr, false));
  EXPECT_EQ(h.type, FrameType::kRefused);

  auto data = Connect(kData, SessionRole::kData);
  ASSERT_TRUE(data.ok()) << data.status().ToString();
  // An admin secret is configured, so loopback gets no upgrade.
  EXPECT_EQ(RoleSeenBy(data->get()), SessionRole::kData);
  auto admin = Connect(kAdmin, SessionRole::kAdmin);
  ASSERT_TRUE(admin.ok()) << admin.status().ToString();
  EXPECT_EQ(RoleSeenBy(admin->get()), SessionRole::kAdmin);
}

TEST_F(HostileClients, WithoutAnAdminSecretOnlyLoopbackIsAdmin) {
  ListenOptions lo = Options();
  lo.admin_token.clear();
  Listen(lo);
  auto c = Connect(kData, SessionRole::kData);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(RoleSeenBy(c->get()), SessionRole::kAdmin);  // protected mode: loopback peer
  listener_.reset();
  lo = Options();
  lo.admin_token.clear();
  lo.loopback_admin = false;  // as if every peer were remote
  Listen(lo);
  c = Connect(kData, SessionRole::kData);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(RoleSeenBy(c->get()), SessionRole::kData);
  auto a = Connect(kData, SessionRole::kAdmin);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), StatusCode::kPermissionDenied);
  EXPECT_NE(a.status().message().find("admin"), std::string::npos) << a.status().ToString();
}

TEST_F(HostileClients, TheClientRefusesAServerThatDoesNotKnowTheSecret) {
  int server = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(server, 0);
  fds_.push_back(server);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(server, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(listen(server, 1), 0);
  socklen_t len = sizeof a;
  ASSERT_EQ(getsockname(server, reinterpret_cast<sockaddr*>(&a), &len), 0);
  std::atomic<bool> got_proof{false};
  std::thread impostor([&] {
    int fd = accept4(server, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) return;
    got_proof = raw::ServerHandshake(fd, "not-the-secret");
    close(fd);
  });
  ConnectOptions co;
  co.host = "127.0.0.1";
  co.port = ntohs(a.sin_port);
  co.auth_token = kData;
  co.connect_timeout = 3s;
  auto c = fabric_->Connect(co);
  impostor.join();
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kPermissionDenied) << c.status().ToString();
  EXPECT_NE(c.status().message().find("could not prove"), std::string::npos);
  EXPECT_FALSE(got_proof.load());  // the client never answered the impostor
}

// Observed on main: a client that never reads costs ~8-11 MiB; 250 took a 64 MiB server to
// 2.8 GB. Now its output is bounded and it is cut off.
TEST_F(HostileClients, ClientsThatNeverReadAreCutOffAndMemoryStaysBounded) {
  ListenOptions lo = Options();
  lo.output_stall_timeout = 1s;
  Listen(lo);
  constexpr int kClients = 60;
  const uint64_t rss_before = RssBytes();
  const int threads_before = ThreadCount();
  std::vector<int> fds;
  for (int i = 0; i < kClients; ++i) {
    int fd = raw::RawConnect(listener_->port(), nullptr);
    ASSERT_GE(fd, 0);
    fds_.push_back(fd);
    int small = 4096;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    FrameHeader h;
    std::vector<uint8_t> body;
    ASSERT_TRUE(raw::ClientHandshake(fd, kData, SessionRole::kData, &h, &body));
    ASSERT_EQ(h.type, FrameType::kWelcome);
    fds.push_back(fd);
  }
  // Each asks for 1000 READs of 64 KiB (64 MB) and reads none of the answers.
  std::vector<uint8_t> batch;
  for (int i = 0; i < 1000; ++i) {
    std::vector<uint8_t> f(kReadRequestFrameSize);
    EncodeReadRequest(
        {static_cast<uint64_t>(i), region_->Describe(1).addr, region_->rkey(), 64 << 10},
        std::span<uint8_t, kReadRequestFrameSize>(f.data(), f.size()));
    batch.insert(batch.end(), f.begin(), f.end());
  }
  for (int fd : fds) send(fd, batch.data(), batch.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  uint64_t peak = 0;
  Clock::time_point deadline = Clock::now() + 15s;
  while (listener_->stats().slow_readers_cut < kClients && Clock::now() < deadline) {
    peak = std::max(peak, RssBytes());
    std::this_thread::sleep_for(20ms);
  }
  peak = std::max(peak, RssBytes());
  const int threads_peak = ThreadCount();
  std::printf("threads: %d before, %d with %d clients that never read\n", threads_before,
              threads_peak, kClients);
  EXPECT_LE(threads_peak, threads_before + kThreadSlack);
  const uint64_t growth = peak > rss_before ? peak - rss_before : 0;
  std::printf("%d clients that never read: RSS %.1f MiB -> peak %.1f MiB (+%.2f MiB per client)\n",
              kClients, rss_before / 1048576.0, peak / 1048576.0, growth / 1048576.0 / kClients);
  EXPECT_EQ(listener_->stats().slow_readers_cut, static_cast<uint64_t>(kClients));
  // Bounded: about the 1 MiB backpressure mark plus one frame each (main: 8-11 MiB each).
  // ASan keeps freed memory (quarantine) and pads every block: a looser bound. TSan shadows
  // every byte touched several times over (6.1 MiB per client seen at load), so RSS measures
  // nothing of the server's buffers there: the cuts above are checked, the bound is not.
#if defined(__SANITIZE_THREAD__)
  std::printf("SKIPPED: the RSS bound per client (ThreadSanitizer's shadow memory)\n");
#else
#if defined(__SANITIZE_ADDRESS__)
  constexpr uint64_t kPerClientBound = 6u << 20;
#else
  constexpr uint64_t kPerClientBound = 3u << 20;
#endif
  EXPECT_LT(growth, uint64_t{kClients} * kPerClientBound);
#endif
  // Each was closed: reading now gives what was sent, then EOF or a reset.
  for (int fd : fds) {
    timeval tv{5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    std::vector<uint8_t> buf(1 << 20);
    ssize_t n;
    while ((n = recv(fd, buf.data(), buf.size(), 0)) > 0) {
    }
    EXPECT_TRUE(n == 0 || errno == ECONNRESET) << strerror(errno);
  }
  // The server still serves others.
  auto c = Connect();
  ASSERT_TRUE(c.ok()) << c.status().ToString();
}

// The same through two-sided requests: the workers' replies pile up unread until the hard
// bound (max(4 MiB, 2 largest messages)) cuts the client off, long before any stall timeout.
TEST_F(HostileClients, UnreadRepliesPastTheBoundCutTheClientOff) {
  ListenOptions lo = Options();
  lo.output_stall_timeout = std::chrono::hours(1);  // only the hard bound can act
  // Room in the input queue for all 200 requests (max(4 MiB, 2 x 8 MiB) of payloads), while
  // the output bound stays at 4 MiB (this client's HELLO offers 1 MiB messages).
  lo.max_message_size = 8 << 20;
  Listen(lo);
  int fd = Raw();
  int small = 4096;
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
  FrameHeader h;
  std::vector<uint8_t> body;
  ASSERT_TRUE(raw::ClientHandshake(fd, kData, SessionRole::kData, &h, &body));
  ASSERT_EQ(h.type, FrameType::kWelcome);
  const std::vector<uint8_t> payload(60 << 10, 0x42);
  const std::vector<uint8_t> frames = raw::CallRequests(0, 200, payload);  // 12 MB of echoes
  // Workers paused: all 200 requests queue (the NIC reads them: no output yet), then the
  // workers answer them all at once.
  listener_->PauseWorkers(true);
  ASSERT_TRUE(raw::SendBytes(fd, frames));
  Clock::time_point deadline = Clock::now() + 10s;
  while (listener_->stats().requests < 200 && Clock::now() < deadline) {
    std::this_thread::sleep_for(5ms);
  }
  ASSERT_EQ(listener_->stats().requests, 200u);
  listener_->PauseWorkers(false);
  while (listener_->stats().slow_readers_cut == 0 && Clock::now() < deadline) {
    std::this_thread::sleep_for(5ms);
  }
  EXPECT_EQ(listener_->stats().slow_readers_cut, 1u);
  auto c = Connect();
  ASSERT_TRUE(c.ok()) << c.status().ToString();
}

// The count bound: a client that pipelines more small requests than a connection may queue
// (1,024) stops being read there, and once the workers catch up every request is answered
// (reading resumes as soon as the queue is below half, not at the next sweep). Found by review:
// the 1,024th request skipped the byte count that its worker then took off, and the session
// never resumed.
TEST_F(HostileClients, RequestsBeyondTheQueuedCountAreAllAnswered) {
  Listen(Options());
  int fd = Raw();
  FrameHeader h;
  std::vector<uint8_t> body;
  ASSERT_TRUE(raw::ClientHandshake(fd, kData, SessionRole::kData, &h, &body));
  ASSERT_EQ(h.type, FrameType::kWelcome);
  timeval tv{20, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  constexpr int kRequests = 1100;
  const std::vector<uint8_t> payload(16, 0x33);
  const std::vector<uint8_t> frames = raw::CallRequests(0, kRequests, payload);
  listener_->PauseWorkers(true);
  ASSERT_TRUE(raw::SendBytes(fd, frames));  // 57 KB: the socket buffers take what is not read
  uint64_t queued = 0;
  for (int stable = 0; stable < 10;) {
    std::this_thread::sleep_for(50ms);
    const uint64_t now = listener_->stats().requests;
    stable = now == queued ? stable + 1 : 0;
    queued = now;
  }
  EXPECT_EQ(queued, 1024u) << "the count bound did not stop reading";
  listener_->PauseWorkers(false);
  const Clock::time_point start = Clock::now();
  int answered = 0;
  while (answered < kRequests && raw::RecvFrame(fd, &h, &body)) {
    ASSERT_EQ(h.type, FrameType::kCallResponse);
    ++answered;
  }
  EXPECT_EQ(answered, kRequests) << "the session did not resume reading";
  std::printf("%d answers %.0f ms after the workers resumed\n", answered,
              std::chrono::duration<double, std::milli>(Clock::now() - start).count());
  // The queue's accounting came back to zero: requests smaller than any before (a count that
  // wrapped below zero would pause on them and never resume) are all answered.
  const std::vector<uint8_t> small(4, 0x44);
  ASSERT_TRUE(raw::SendBytes(fd, raw::CallRequests(kRequests, 4, small)));
  int more = 0;
  while (more < 4 && raw::RecvFrame(fd, &h, &body)) ++more;
  EXPECT_EQ(more, 4);
}

// Requests queued for the workers are bounded by their bytes as well as their number: one client
// pipelining large requests to workers that do not keep up (paused here, as slow fsyncs would)
// stops being read at max(4 MiB, 2 largest messages) of queued payloads, not at 1,024 requests
// (about 1 GiB at the largest size). Found by review. All its requests are answered once the
// workers catch up.
TEST_F(HostileClients, OneClientsQueuedRequestsAreBoundedInBytes) {
  ListenOptions lo = Options();
  lo.max_message_size = 1 << 20;  // the bound: max(4 MiB, 2 MiB) = 4 MiB of queued payloads
  Listen(lo);
  int fd = Raw();
  FrameHeader h;
  std::vector<uint8_t> body;
  ASSERT_TRUE(raw::ClientHandshake(fd, kData, SessionRole::kData, &h, &body));
  ASSERT_EQ(h.type, FrameType::kWelcome);
  constexpr int kRequests = 100;
  const std::vector<uint8_t> payload(256 << 10, 0x5a);
  const std::vector<uint8_t> frames = raw::CallRequests(0, kRequests, payload);  // 25 MiB
  listener_->PauseWorkers(true);
  std::thread sender([&] { EXPECT_TRUE(raw::SendBytes(fd, frames)); });
  // Let the NIC read all it will: the count stops growing at the bound.
  uint64_t queued = 0;
  for (int stable = 0; stable < 10;) {
    std::this_thread::sleep_for(50ms);
    const uint64_t now = listener_->stats().requests;
    stable = now == queued ? stable + 1 : 0;
    queued = now;
  }
  std::printf("%llu requests of 256 KiB queued before the server stopped reading\n",
              static_cast<unsigned long long>(queued));
  EXPECT_GE(queued, 16u);  // 4 MiB
  EXPECT_LE(queued, 17u);
  // The workers catch up; reading resumes and every request is answered (an echo each).
  listener_->PauseWorkers(false);
  int answered = 0;
  while (answered < kRequests && raw::RecvFrame(fd, &h, &body)) {
    ASSERT_EQ(h.type, FrameType::kCallResponse);
    ++answered;
  }
  EXPECT_EQ(answered, kRequests);
  sender.join();
  EXPECT_EQ(listener_->stats().requests, static_cast<uint64_t>(kRequests));
}

TEST_F(HostileClients, IdleSessionsAreClosedAndMaxConnectionsIsHonoured) {
  ListenOptions lo = Options();
  lo.idle_timeout = 1500ms;
  lo.max_connections = 4;
  Listen(lo);
  std::vector<std::unique_ptr<Connection>> conns;
  for (int i = 0; i < 4; ++i) {
    auto c = Connect();
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    conns.push_back(std::move(c).value());
  }
  auto fifth = Connect();
  ASSERT_FALSE(fifth.ok());
  EXPECT_EQ(fifth.status().code(), StatusCode::kUnavailable) << fifth.status().ToString();
  EXPECT_NE(fifth.status().message().find("max_connections"), std::string::npos);
  // conns[0] stays active; the other three go idle and are closed after the timeout.
  Clock::time_point until = Clock::now() + 3s;
  while (Clock::now() < until) {
    std::vector<uint8_t> req = {7}, resp;
    ASSERT_TRUE(conns[0]->Call(req, &resp, 2s).ok());
    std::this_thread::sleep_for(200ms);
  }
  EXPECT_TRUE(conns[0]->alive());
  for (int i = 1; i < 4; ++i) EXPECT_FALSE(conns[i]->alive()) << i;
  EXPECT_EQ(listener_->stats().idle_closed, 3u);
  // Their slots are free again.
  auto again = Connect();
  ASSERT_TRUE(again.ok()) << again.status().ToString();
}

// Revocation (docs/security.md "Rotating secrets"): a rotated secret closes the sessions that
// proved it, by role, before RotateSecrets returns; the old secret is refused from then on.
TEST_F(HostileClients, RotatingASecretRevokesTheSessionsThatProvedIt) {
  Listen(Options());
  auto data = Connect(kData);
  ASSERT_TRUE(data.ok()) << data.status().ToString();
  auto admin = Connect(kAdmin, SessionRole::kAdmin);
  ASSERT_TRUE(admin.ok()) << admin.status().ToString();
  // A handshake in progress with the old data secret: HELLO sent, proof not yet.
  int half = Raw();
  {
    auth::Nonce nonce;
    std::vector<uint8_t> hello;
    auth::AuthChallenge challenge;
    ASSERT_TRUE(raw::HelloUntilChallenge(half, SessionRole::kData, &nonce, &hello, &challenge));
  }

  Result<uint64_t> revoked = listener_->RotateSecrets("new-data", kAdmin);
  ASSERT_TRUE(revoked.ok()) << revoked.status().ToString();
  EXPECT_EQ(*revoked, 1u);
  // The revoked session's next request and READ fail; the admin session is untouched.
  std::vector<uint8_t> req = {1}, resp;
  EXPECT_FALSE((*data)->Call(req, &resp, 5s).ok());
  EXPECT_FALSE((*data)->alive());
  EXPECT_EQ(RoleSeenBy(admin->get()), SessionRole::kAdmin);
  // The half-done handshake was cut (its expected proof used the old secret).
  {
    uint8_t b;
    const ssize_t n = recv(half, &b, 1, 0);  // EOF or a reset; a timeout (5 s) means it lived
    EXPECT_TRUE(n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK))
        << "a handshake keyed by the old secret lived on (recv " << n << ", " << strerror(errno)
        << ")";
  }
  // Old secret refused, new one admitted.
  auto stale = Connect(kData);
  ASSERT_FALSE(stale.ok());
  EXPECT_EQ(stale.status().code(), StatusCode::kPermissionDenied) << stale.status().ToString();
  auto fresh = Connect("new-data");
  ASSERT_TRUE(fresh.ok()) << fresh.status().ToString();
  EXPECT_EQ(RoleSeenBy(fresh->get()), SessionRole::kData);

  // The admin secret next: the admin session goes, the new data session stays.
  revoked = listener_->RotateSecrets("new-data", "new-admin");
  ASSERT_TRUE(revoked.ok()) << revoked.status().ToString();
  EXPECT_EQ(*revoked, 1u);
  EXPECT_FALSE((*admin)->Call(req, &resp, 5s).ok());
  EXPECT_TRUE((*fresh)->Call(req, &resp, 5s).ok());
  // Rotating to the same secrets revokes nothing.
  revoked = listener_->RotateSecrets("new-data", "new-admin");
  ASSERT_TRUE(revoked.ok());
  EXPECT_EQ(*revoked, 0u);
  EXPECT_TRUE((*fresh)->Call(req, &resp, 5s).ok());
  // A secret over the limit changes nothing.
  EXPECT_EQ(listener_->RotateSecrets(std::string(5000, 'x'), "new-admin").status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE((*fresh)->Call(req, &resp, 5s).ok());
}

// Protected mode (no admin secret; loopback peers that prove the data secret are admin): the
// admin role comes from the data secret, so rotating the data secret must revoke those admin
// sessions too, and a handshake keyed by the old data secret must not finish as admin. Found
// by review: revocation went by the granted role, so both lived on.
TEST_F(HostileClients, RotatingTheDataSecretRevokesProtectedModeAdmins) {
  ListenOptions lo = Options();
  lo.admin_token.clear();
  Listen(std::move(lo));
  auto admin = Connect(kData);
  ASSERT_TRUE(admin.ok()) << admin.status().ToString();
  ASSERT_EQ(RoleSeenBy(admin->get()), SessionRole::kAdmin) << "not in protected mode";
  // A handshake in progress with the old data secret: HELLO answered, PROOF not yet sent.
  int half = Raw();
  auth::Nonce nonce;
  std::vector<uint8_t> hello;
  auth::AuthChallenge challenge;
  ASSERT_TRUE(raw::HelloUntilChallenge(half, SessionRole::kData, &nonce, &hello, &challenge));

  Result<uint64_t> revoked = listener_->RotateSecrets("new-data", "");
  ASSERT_TRUE(revoked.ok()) << revoked.status().ToString();
  EXPECT_EQ(*revoked, 1u);
  std::vector<uint8_t> req = {1}, resp;
  EXPECT_FALSE((*admin)->Call(req, &resp, 5s).ok()) << "the admin session outlived its secret";
  // The old secret's proof after the rotation: refused or cut, never WELCOME.
  auth::AuthProof p;
  p.client_proof = auth::ComputeProof(
      auth::Side::kClient, kData, SessionRole::kData, nonce, challenge.server_nonce,
      std::span<const uint8_t>(hello.data() + kFrameHeaderSize, kHelloBodySize));
  raw::SendBytes(half, EncodeProof(p));  // may fail: the server may have closed it already
  FrameHeader h;
  std::vector<uint8_t> body;
  const bool answered = raw::RecvFrame(half, &h, &body);
  EXPECT_TRUE(!answered || h.type != FrameType::kWelcome)
      << "a proof with the replaced data secret was welcomed after the rotation";
  // The new secret still gives a loopback peer the admin role (protected mode).
  auto fresh = Connect("new-data");
  ASSERT_TRUE(fresh.ok()) << fresh.status().ToString();
  EXPECT_EQ(RoleSeenBy(fresh->get()), SessionRole::kAdmin);
  // Setting an admin secret ends protected mode: that admin session goes as well.
  revoked = listener_->RotateSecrets("new-data", "first-admin");
  ASSERT_TRUE(revoked.ok()) << revoked.status().ToString();
  EXPECT_EQ(*revoked, 1u);
  EXPECT_FALSE((*fresh)->Call(req, &resp, 5s).ok());
  auto data = Connect("new-data");
  ASSERT_TRUE(data.ok()) << data.status().ToString();
  EXPECT_EQ(RoleSeenBy(data->get()), SessionRole::kData);
}

}  // namespace
}  // namespace rdkv::transport::tcp

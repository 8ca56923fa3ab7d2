// kvserver's admission flags (docs/security.md "Admission (tcp)"), through the binary: the
// listener's own tests (session_hostile_test) set ListenOptions directly; these fork the
// build's kvserver with --max_connections=2 --idle_timeout_s=1 --handshake_timeout_ms=300 and
// show that each flag reaches the listener, and that bad values are refused at start (exit 2).
//
// The data secret travels in a 0600 file (--auth_token_file), never on the command line.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/kv/wire.h"
#include "common/transport/transport.h"
#include "tests/security/session_raw_client.h"

namespace rdkv::transport {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
namespace raw = tcp::rawtest;

constexpr char kSecret[] = "admission-data-secret-5f1c9e";

long long MsSince(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count();
}

// The flags under test; every server of this file runs with them.
const std::vector<std::string> kAdmissionFlags = {
    "--transport=tcp",     "--memory=16MiB",     "--huge_pages=false",
    "--max_connections=2", "--idle_timeout_s=1", "--handshake_timeout_ms=300",
    "--worker_threads=2",  "--metrics_port=-1",
};

class KvserverAdmission : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/rdkv-admission-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr) << strerror(errno);
    dir_ = dir;
    secret_file_ = dir_ + "/data-secret";
    int fd = open(secret_file_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    ASSERT_GE(fd, 0) << strerror(errno);
    std::string line = std::string(kSecret) + "\n";
    ASSERT_EQ(write(fd, line.data(), line.size()), static_cast<ssize_t>(line.size()));
    close(fd);
    auto f = Fabric::Create({TransportKind::kTcp, "", false});
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    fabric_ = std::move(f).value();
  }

  void TearDown() override {
    for (int fd : raw_fds_) close(fd);
    StopServer();
    if (HasFailure() && !dir_.empty()) {
      std::printf("--- kvserver log (%s)\n%s\n", (dir_ + "/server.log").c_str(), Log().c_str());
    }
    std::error_code ec;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
  }

  // Forks kvserver with kAdmissionFlags, the secret file and `extra`; waits for its port.
  void StartServer(const std::vector<std::string>& extra = {}) {
    const std::string port_file = dir_ + "/port", log = dir_ + "/server.log";
    std::vector<std::string> args = {"kvserver", "--port=0", "--port_file=" + port_file,
                                     "--auth_token_file=" + secret_file_};
    args.insert(args.end(), kAdmissionFlags.begin(), kAdmissionFlags.end());
    args.insert(args.end(), extra.begin(), extra.end());
    pid_ = fork();
    ASSERT_GE(pid_, 0) << strerror(errno);
    if (pid_ == 0) {
      int out = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      if (out >= 0) {
        dup2(out, 1);
        dup2(out, 2);
      }
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(RDKV_KVSERVER_PATH, argv.data());
      _exit(127);
    }
    std::string port;
    for (int i = 0; i < 400 && port.empty(); ++i) {  // 20 s (sanitizer builds start slowly)
      std::ifstream(port_file) >> port;
      if (!port.empty()) break;
      int st = 0;
      if (waitpid(pid_, &st, WNOHANG) == pid_) {
        pid_ = -1;
        FAIL() << "kvserver exited before serving (status " << st << "):\n" << Log();
      }
      std::this_thread::sleep_for(50ms);
    }
    ASSERT_FALSE(port.empty()) << "kvserver wrote no port file in 20 s:\n" << Log();
    port_ = static_cast<uint16_t>(std::stoi(port));
  }

  void StopServer() {
    if (pid_ <= 0) return;
    kill(pid_, SIGTERM);
    int st = 0;
    for (int i = 0; i < 200; ++i) {  // 10 s, then SIGKILL
      if (waitpid(pid_, &st, WNOHANG) == pid_) {
        pid_ = -1;
        return;
      }
      std::this_thread::sleep_for(50ms);
    }
    kill(pid_, SIGKILL);
    waitpid(pid_, &st, 0);
    pid_ = -1;
  }

  std::string Log() const {
    std::ifstream in(dir_ + "/server.log");
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

  // Threads: of the kvserver process.
  int ServerThreads() const {
    std::ifstream in("/proc/" + std::to_string(pid_) + "/status");
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("Threads:", 0) == 0) return std::stoi(line.substr(8));
    }
    return -1;
  }

  Result<std::unique_ptr<Connection>> Connect(const std::string& secret = kSecret) {
    ConnectOptions co;
    co.host = "127.0.0.1";
    co.port = port_;
    co.auth_token = secret;
    co.role = SessionRole::kData;
    co.connect_timeout = 5s;
    return fabric_->Connect(co);
  }

  // One PING on `c`: the transport's status, else the server's answer's.
  static Status Ping(Connection& c) {
    kv::Request r;
    r.op = kv::Op::kPing;
    std::vector<uint8_t> req, resp;
    kv::EncodeRequest(r, &req);
    Status s = c.Call(req, &resp, 2s);
    if (!s.ok()) return s;
    auto d = kv::DecodeResponse(resp);
    return d.ok() ? d->status : d.status();
  }

  // A raw TCP connection that sends nothing (closed in TearDown).
  int Raw(const char* source = nullptr) {
    int fd = raw::RawConnect(port_, source);
    if (fd >= 0) raw_fds_.push_back(fd);
    return fd;
  }

  std::string dir_, secret_file_;
  pid_t pid_ = -1;
  uint16_t port_ = 0;
  std::unique_ptr<Fabric> fabric_;
  std::vector<int> raw_fds_;
};

// --max_connections=2: two sessions, a third refused with the reason while the two serve on;
// one closes, and its slot is free again (and only its slot).
TEST_F(KvserverAdmission, MaxConnectionsAdmitsTwoRefusesTheThirdAndFreesASlotOnClose) {
  StartServer();
  auto c1 = Connect();
  ASSERT_TRUE(c1.ok()) << c1.status().ToString();
  auto c2 = Connect();
  ASSERT_TRUE(c2.ok()) << c2.status().ToString();
  ASSERT_TRUE(Ping(**c1).ok());
  ASSERT_TRUE(Ping(**c2).ok());

  auto third = Connect();
  ASSERT_FALSE(third.ok()) << "a third session was admitted with --max_connections=2";
  EXPECT_EQ(third.status().code(), StatusCode::kUnavailable) << third.status().ToString();
  EXPECT_NE(third.status().message().find("too many connections"), std::string::npos)
      << third.status().ToString();
  EXPECT_NE(third.status().message().find("max_connections 2"), std::string::npos)
      << third.status().ToString();
  // The refusal did not disturb the two sessions.
  EXPECT_TRUE(Ping(**c1).ok());
  EXPECT_TRUE(Ping(**c2).ok());
  EXPECT_TRUE((*c1)->alive());
  EXPECT_TRUE((*c2)->alive());

  // c1 leaves; c2 keeps busy (the idle timeout is 1 s), so the slot that frees is c1's.
  c1->reset();
  Clock::time_point start = Clock::now();
  Result<std::unique_ptr<Connection>> c3 = Status::Unavailable("not tried");
  while (MsSince(start) < 3000) {
    ASSERT_TRUE(Ping(**c2).ok());
    c3 = Connect();
    if (c3.ok()) break;
    ASSERT_NE(c3.status().message().find("too many connections"), std::string::npos)
        << c3.status().ToString();
    std::this_thread::sleep_for(50ms);
  }
  ASSERT_TRUE(c3.ok()) << "no session admitted within 3 s of one closing: "
                       << c3.status().ToString();
  std::printf("a new session got in %lld ms after one of two closed\n", MsSince(start));
  EXPECT_TRUE(Ping(**c3).ok());
  EXPECT_TRUE(Ping(**c2).ok());
  EXPECT_TRUE((*c2)->alive());
  // Two again: the next one is refused.
  auto fourth = Connect();
  ASSERT_FALSE(fourth.ok()) << "a third session was admitted after the slot was reused";
  EXPECT_NE(fourth.status().message().find("too many connections"), std::string::npos)
      << fourth.status().ToString();
  EXPECT_TRUE(Ping(**c2).ok());
  EXPECT_TRUE(Ping(**c3).ok());
}

// --idle_timeout_s=1: the server closes a session that sent nothing for 1 s (swept every
// 200 ms), and its next call fails; a session that keeps calling stays open meanwhile.
TEST_F(KvserverAdmission, ASessionThatSendsNothingForTheIdleTimeoutIsClosed) {
  StartServer();
  auto idle = Connect();
  ASSERT_TRUE(idle.ok()) << idle.status().ToString();
  auto busy = Connect();
  ASSERT_TRUE(busy.ok()) << busy.status().ToString();
  ASSERT_TRUE(Ping(**idle).ok());
  const Clock::time_point last_call = Clock::now();
  long long closed_after = -1;
  while (MsSince(last_call) < 4000) {
    ASSERT_TRUE(Ping(**busy).ok()) << "the active session was closed";
    if (!(*idle)->alive()) {
      closed_after = MsSince(last_call);
      break;
    }
    std::this_thread::sleep_for(100ms);
  }
  ASSERT_GE(closed_after, 0) << "the idle session was still open 4 s after its last call";
  std::printf("idle session closed by the server %lld ms after its last call\n", closed_after);
  // Not before the timeout (the server saw the PING before we got its answer), and not much
  // after it: 1 s + a 200 ms sweep + scheduling slack.
  EXPECT_GE(closed_after, 900);
  EXPECT_LE(closed_after, 2500);
  Status s = Ping(**idle);
  EXPECT_EQ(s.code(), StatusCode::kConnectionLost) << s.ToString();
  // The active one is still served, for as long again.
  for (int i = 0; i < 8; ++i) {
    ASSERT_TRUE(Ping(**busy).ok());
    std::this_thread::sleep_for(200ms);
  }
  EXPECT_TRUE((*busy)->alive());
}

// --handshake_timeout_ms=300: a socket that never sends HELLO, and one that stops in the middle
// of it, are closed by the server after about 300 ms (swept every 200 ms), long before the
// default of 2000 ms.
TEST_F(KvserverAdmission, ASocketThatNeverFinishesTheHandshakeIsClosedAtTheDeadline) {
  StartServer();
  auto hello = raw::MakeHello(SessionRole::kData, auth::Nonce{});
  for (bool partial : {false, true}) {
    SCOPED_TRACE(partial ? "half a HELLO" : "nothing sent");
    Clock::time_point start = Clock::now();
    int fd = Raw();
    ASSERT_GE(fd, 0) << strerror(errno);
    if (partial) {
      ASSERT_TRUE(raw::SendBytes(fd, std::span<const uint8_t>(hello.data(), hello.size() / 2)));
    }
    char b;
    ssize_t n = recv(fd, &b, 1, 0);  // SO_RCVTIMEO 5 s
    int err = errno;
    long long took = MsSince(start);
    std::printf("%s: the server closed the socket after %lld ms\n",
                partial ? "half a HELLO" : "silent socket", took);
    ASSERT_TRUE(n == 0 || (n < 0 && err == ECONNRESET))
        << "recv returned " << n << " (" << strerror(err) << ") after " << took << " ms";
    EXPECT_GE(took, 250) << "closed before the handshake deadline";
    EXPECT_LT(took, 1500) << "closed late: --handshake_timeout_ms=300 not in effect?";
  }
  EXPECT_NE(Log().find("did not finish the handshake within 300 ms"), std::string::npos)
      << "the server did not log the 300 ms deadline";
  // A client that completes its handshake promptly is unaffected.
  auto c = Connect();
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(Ping(**c).ok());
}

// 300 silent sockets cost the kvserver no threads; a real client still gets in meanwhile, and
// every one of them is closed by the server (handshake deadline, or evicted as the oldest).
TEST_F(KvserverAdmission, ThreeHundredSilentSocketsCostTheServerNoThreads) {
  StartServer();
  {
    auto warm = Connect();  // anything a first session creates lazily exists before counting
    ASSERT_TRUE(warm.ok()) << warm.status().ToString();
    ASSERT_TRUE(Ping(**warm).ok());
  }
  std::this_thread::sleep_for(300ms);
  const int before = ServerThreads();
  ASSERT_GT(before, 0);
  int peak = before;
  const char* sources[] = {nullptr, "127.0.0.2", "127.0.0.3", "127.0.0.4"};
  Clock::time_point start = Clock::now();
  for (int i = 0; i < 300; ++i) {
    ASSERT_GE(Raw(sources[i % 4]), 0) << "socket " << i << ": " << strerror(errno);
    if (i % 25 == 0) peak = std::max(peak, ServerThreads());
  }
  std::printf("300 silent sockets opened in %lld ms\n", MsSince(start));
  auto c = Connect();
  ASSERT_TRUE(c.ok()) << "a real client during the flood: " << c.status().ToString();
  EXPECT_TRUE(Ping(**c).ok());
  // Wait for the server to close every one of them.
  std::vector<pollfd> open;
  for (int fd : raw_fds_) open.push_back({fd, POLLIN, 0});
  start = Clock::now();
  while (!open.empty() && MsSince(start) < 5000) {
    peak = std::max(peak, ServerThreads());
    ASSERT_GE(poll(open.data(), open.size(), 100), 0);
    std::vector<pollfd> still;
    for (pollfd p : open) {
      if (p.revents == 0) {
        still.push_back({p.fd, POLLIN, 0});
        continue;
      }
      char b;
      ssize_t n = recv(p.fd, &b, 1, MSG_DONTWAIT);
      EXPECT_TRUE(n == 0 || (n < 0 && errno == ECONNRESET)) << "the server sent a byte";
    }
    open.swap(still);
  }
  EXPECT_TRUE(open.empty()) << open.size() << " silent socket(s) still open after 5 s";
  const int after = ServerThreads();
  std::printf("kvserver threads: %d before, peak %d during, %d after 300 silent sockets\n", before,
              peak, after);
  EXPECT_LE(peak, before + 2);
  EXPECT_LE(after, before + 2);
  EXPECT_TRUE(Ping(**c).ok());
}

// Bad values are usage errors: exit 2 with a message naming the flag, before any port opens.
TEST(KvserverAdmissionFlags, BadValuesExitWithStatusTwo) {
  struct Case {
    const char* flag;
    const char* message;
  };
  for (const Case& c : {Case{"--max_connections=0", "--max_connections must be at least 1"},
                        Case{"--max_connections=-3", "--max_connections must be at least 1"},
                        Case{"--handshake_timeout_ms=0", "--handshake_timeout_ms must be >= 1"},
                        Case{"--idle_timeout_s=-1", "--idle_timeout_s must be >= 0"}}) {
    SCOPED_TRACE(c.flag);
    // Under `timeout`: a kvserver that took the value would serve until killed (exit 124).
    std::string cmd = "timeout 20 " + std::string(RDKV_KVSERVER_PATH) +
                      " --transport=tcp --port=0 --memory=16MiB --huge_pages=false " + c.flag +
                      " 2>&1";
    FILE* p = popen(cmd.c_str(), "r");
    ASSERT_NE(p, nullptr);
    std::string out;
    char buf[512];
    while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
    int st = pclose(p);
    ASSERT_TRUE(WIFEXITED(st)) << out;
    EXPECT_EQ(WEXITSTATUS(st), 2) << out;
    EXPECT_NE(out.find(c.message), std::string::npos) << out;
  }
}

}  // namespace
}  // namespace rdkv::transport

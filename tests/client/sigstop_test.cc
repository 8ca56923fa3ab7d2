// One-sidedness, shown the only way real verbs can: a kvserver process stopped with SIGSTOP runs
// no code at all, yet the client still resolves GETs of stored keys (the NIC, here the kernel's
// rxe driver, serves the READs), while a PUT, which needs the server's CPU, times out with a
// clear error. After SIGCONT everything resumes.
//
// Runs on verbs (inside tests/rxe/vm.sh; RDKV_RXE_ADDR names the rxe address). On a machine
// without an RDMA device it is SKIPPED (RDKV_REQUIRE_VERBS=1 makes that a failure). Over tcp the
// software NIC lives in the server process, so SIGSTOP would stop it too; the tcp equivalent
// is client_e2e_test's paused-workers test.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

#include "common/transport/transport.h"
#include "rdkv/client.h"

namespace {

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

class SigstopTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    addr_ = Env("RDKV_RXE_ADDR");
    if (!rdkv::transport::RdmaDeviceAvailable(&why) || addr_.empty()) {
      if (addr_.empty()) why += "; RDKV_RXE_ADDR is not set";
      if (Env("RDKV_REQUIRE_VERBS") == "1") FAIL() << "RDKV_REQUIRE_VERBS=1 but: " << why;
      GTEST_SKIP() << "SKIPPED: needs real verbs (" << why
                   << "); runs inside the Soft-RoCE VM via tests/rxe/run-verbs-tests.sh";
    }
    char dir[] = "/tmp/rdkv-sigstop-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    port_file_ = std::string(dir) + "/port";
    pid_ = fork();
    ASSERT_GE(pid_, 0);
    if (pid_ == 0) {
      std::string pf = "--port_file=" + port_file_;
      setenv("RDKV_AUTH_TOKEN", "sigstop", 1);  // never on the command line
      std::string host = "--host=" + addr_;
      execl(RDKV_KVSERVER_PATH, "kvserver", "--transport=verbs", host.c_str(), "--port=0",
            pf.c_str(), "--memory=64MiB", static_cast<char*>(nullptr));
      _exit(127);
    }
    std::string port;
    for (int i = 0; i < 600 && port.empty(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      std::ifstream(port_file_) >> port;
    }
    ASSERT_FALSE(port.empty()) << "kvserver did not start";
    rdkv::ClientOptions o;
    o.seed = addr_ + ":" + port;
    o.transport = "verbs";
    o.auth_token = "sigstop";
    o.op_timeout = std::chrono::milliseconds(3000);
    // The first connect to a freshly started kvserver in the emulated VM was answered only
    // after 7-9 s in two full-suite runs (never when this test runs alone; the cause is not
    // known yet, see docs/transport-verbs.md "Known limitations"): allow for it.
    o.connect_timeout = std::chrono::milliseconds(30000);
    auto c = rdkv::Client::Connect(o);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    client_ = std::move(*c);
  }
  void TearDown() override {
    if (pid_ > 0) {
      kill(pid_, SIGCONT);
      kill(pid_, SIGTERM);
      int st;
      waitpid(pid_, &st, 0);
    }
  }
  std::string addr_, port_file_;
  pid_t pid_ = -1;
  std::unique_ptr<rdkv::Client> client_;
};

TEST_F(SigstopTest, GetsNeedNoServerCpuWritesDo) {
  constexpr int kKeys = 50;
  for (int i = 0; i < kKeys; ++i) {
    ASSERT_TRUE(client_->Put("key" + std::to_string(i), "value" + std::to_string(i)).ok());
  }
  std::fprintf(stderr, "sigstop_test: %d keys stored; stopping kvserver (pid %d)\n", kKeys, pid_);
  ASSERT_EQ(kill(pid_, SIGSTOP), 0);
  // Make sure the process really is stopped before measuring anything.
  for (int i = 0; i < 100; ++i) {
    std::ifstream stat("/proc/" + std::to_string(pid_) + "/stat");
    std::string pid, comm, state;
    stat >> pid >> comm >> state;
    if (state == "T") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  uint64_t server_ticks_before = 0;
  {
    std::ifstream stat("/proc/" + std::to_string(pid_) + "/stat");
    std::string f;
    for (int i = 0; i < 13 && stat >> f; ++i) {
    }
    uint64_t utime = 0, stime = 0;
    stat >> utime >> stime;
    server_ticks_before = utime + stime;
  }
  for (int i = 0; i < kKeys; ++i) {
    auto r = client_->Get("key" + std::to_string(i));
    ASSERT_TRUE(r.ok()) << "GET while the server is stopped: " << r.status().ToString();
    EXPECT_EQ(r->value, "value" + std::to_string(i));
  }
  EXPECT_EQ(client_->Get("never-stored").status().code(), rdkv::StatusCode::kNotFound);
  std::fprintf(stderr,
               "sigstop_test: %d GETs answered while stopped; now a PUT (expect a timeout)\n",
               kKeys);
  auto put = client_->Put("key0", "while-stopped");
  EXPECT_EQ(put.status().code(), rdkv::StatusCode::kTimedOut) << put.status().ToString();
  {
    std::ifstream stat("/proc/" + std::to_string(pid_) + "/stat");
    std::string f;
    for (int i = 0; i < 13 && stat >> f; ++i) {
    }
    uint64_t utime = 0, stime = 0;
    stat >> utime >> stime;
    EXPECT_EQ(utime + stime, server_ticks_before) << "the stopped server used CPU";
  }
  std::fprintf(stderr, "sigstop_test: PUT while stopped: %s; resuming kvserver\n",
               put.status().ToString().c_str());
  ASSERT_EQ(kill(pid_, SIGCONT), 0);
  // The timed-out PUT's outcome is unknown: it waits in the server's receive queue and may be
  // applied after SIGCONT, even after a later PUT from another worker (linearizable: an
  // unknown write may take effect at any time). Give it time to land before the next write.
  bool landed = false;
  for (int i = 0; i < 100 && !landed; ++i) {
    auto now = client_->Get("key0");
    landed = now.ok() && now->value == "while-stopped";
    if (!landed) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::fprintf(stderr, "sigstop_test: the timed-out PUT %s\n",
               landed ? "was applied after the resume" : "did not show within 5 s");
  auto after = client_->Put("key0", "after-resume");
  ASSERT_TRUE(after.ok()) << after.status().ToString();
  auto got = client_->Get("key0");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->value, "after-resume");
}

}  // namespace

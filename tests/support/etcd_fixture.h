// A real etcd for tests: 1 or 3 members on free 127.0.0.1 ports, each with its own data dir
// under one temp dir, started from the `etcd` found on PATH, never the system's default etcd.
//
//   rdkv::testing::EtcdCluster etcd(3);
//   RDKV_REQUIRE_ETCD(etcd);                 // SKIPPED when etcd is not installed, fails when it
//                                            // is installed but did not start
//   EtcdOptions o{.endpoints = etcd.endpoints()};
//   etcd.Kill(1); ... etcd.Start(1);         // SIGKILL; start again on the same data dir
//
// Stop(i) is SIGTERM and wait, Kill(i) SIGKILL and wait, Start(i) starts a stopped member and
// waits until it serves (a linearizable read succeeds; in a 3-member cluster that needs a
// quorum), Restart(i) = Stop + Start. The destructor kills every member and removes the dir. A
// member's output goes to <dir>/member<i>.log, whose tail a failed start prints.
//
// Header-only; a test that includes it links rdkv_etcd. Not thread-safe: drive it from the test.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/etcd/etcd_client.h"
#include "tests/support/free_port.h"

namespace rdkv::testing {

// The path of `etcd` on PATH; "" when there is none.
inline std::string FindEtcdBinary() {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path != nullptr ? path : "/usr/bin:/bin");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    std::string candidate = (dir.empty() ? "." : dir) + "/etcd";
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

class EtcdCluster {
 public:
  explicit EtcdCluster(int members = 1) : binary_(FindEtcdBinary()) {
    if (binary_.empty()) return;
    char tmpl[] = "/tmp/rdkv-etcd-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) {
      error_ = "mkdtemp /tmp/rdkv-etcd-XXXXXX failed";
      return;
    }
    dir_ = tmpl;
    members_.resize(members);
    for (int i = 0; i < members; ++i) {
      members_[i].name = "m" + std::to_string(i);
      members_[i].client_port = FreePort();
      members_[i].peer_port = FreePort();
    }
    for (int i = 0; i < members; ++i) Spawn(i);  // all first: a cluster needs its quorum
    for (int i = 0; i < members; ++i) {
      if (!WaitServing(i)) return;
    }
    started_ = true;
  }

  ~EtcdCluster() {
    for (int i = 0; i < static_cast<int>(members_.size()); ++i) Signal(i, SIGKILL);
    if (!dir_.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(dir_, ec);
    }
  }
  EtcdCluster(const EtcdCluster&) = delete;
  EtcdCluster& operator=(const EtcdCluster&) = delete;

  bool installed() const { return !binary_.empty(); }
  // Every member serves (after the constructor).
  bool started() const { return started_; }
  // Why the cluster did not start ("" when it did).
  const std::string& error() const { return error_; }

  int size() const { return static_cast<int>(members_.size()); }
  std::string endpoint(int i) const {
    return "http://127.0.0.1:" + std::to_string(members_[i].client_port);
  }
  std::vector<std::string> endpoints() const {
    std::vector<std::string> out;
    for (int i = 0; i < size(); ++i) out.push_back(endpoint(i));
    return out;
  }
  const std::string& dir() const { return dir_; }

  bool Stop(int i) { return Signal(i, SIGTERM); }
  bool Kill(int i) { return Signal(i, SIGKILL); }
  // Starts member i again (same ports and data dir) and waits until it serves.
  bool Start(int i) {
    if (members_[i].pid > 0) return true;
    Spawn(i);
    return WaitServing(i);
  }
  bool Restart(int i) { return Stop(i) && Start(i); }

 private:
  struct Member {
    std::string name;
    uint16_t client_port = 0;
    uint16_t peer_port = 0;
    pid_t pid = -1;
  };

  std::string PeerUrl(int i) const {
    return "http://127.0.0.1:" + std::to_string(members_[i].peer_port);
  }

  void Spawn(int i) {
    std::string initial;
    for (int k = 0; k < size(); ++k) {
      initial += (k ? "," : "") + members_[k].name + "=" + PeerUrl(k);
    }
    std::vector<std::string> args = {binary_,
                                     "--name",
                                     members_[i].name,
                                     "--data-dir",
                                     dir_ + "/" + members_[i].name,
                                     "--listen-client-urls",
                                     endpoint(i),
                                     "--advertise-client-urls",
                                     endpoint(i),
                                     "--listen-peer-urls",
                                     PeerUrl(i),
                                     "--initial-advertise-peer-urls",
                                     PeerUrl(i),
                                     "--initial-cluster",
                                     initial,
                                     "--initial-cluster-token",
                                     dir_,
                                     "--heartbeat-interval",
                                     "50",
                                     "--election-timeout",
                                     "250"};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::string log = dir_ + "/" + members_[i].name + ".log";
    pid_t pid = fork();
    if (pid == 0) {  // child: async-signal-safe calls only
      int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (fd >= 0) {
        dup2(fd, 1);
        dup2(fd, 2);
      }
      execv(argv[0], argv.data());
      _exit(127);
    }
    members_[i].pid = pid;
  }

  // Sends `sig` and reaps the member (SIGKILL after 10 s).
  bool Signal(int i, int sig) {
    pid_t pid = members_[i].pid;
    if (pid <= 0) return true;
    kill(pid, sig);
    for (int t = 0; t < 1000; ++t) {
      if (waitpid(pid, nullptr, WNOHANG) == pid) {
        members_[i].pid = -1;
        return true;
      }
      if (t == 999) kill(pid, SIGKILL);
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    waitpid(pid, nullptr, 0);
    members_[i].pid = -1;
    return true;
  }

  bool WaitServing(int i) {
    auto client = etcd::EtcdClient::Create(
        {.endpoints = {endpoint(i)}, .request_timeout = std::chrono::milliseconds(500)});
    if (!client.ok()) {
      error_ = client.status().ToString();
      return false;
    }
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    Status last;
    while (std::chrono::steady_clock::now() < deadline) {
      if (waitpid(members_[i].pid, nullptr, WNOHANG) == members_[i].pid) {
        members_[i].pid = -1;
        last = Status::Unavailable("the process exited");
        break;
      }
      auto r = (*client)->Get("rdkv-fixture-probe");
      if (r.ok()) return true;
      last = r.status();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    std::ifstream in(dir_ + "/" + members_[i].name + ".log");
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    error_ = "etcd member " + std::to_string(i) + " at " + endpoint(i) +
             " did not serve: " + last.ToString() + "\nlog tail:\n" +
             text.substr(text.size() > 3000 ? text.size() - 3000 : 0);
    return false;
  }

  std::string binary_;
  std::string dir_;
  std::string error_;
  std::vector<Member> members_;
  bool started_ = false;
};

}  // namespace rdkv::testing

// In a test: skips when etcd is not installed, fails when it did not start.
#define RDKV_REQUIRE_ETCD(cluster)                                                        \
  do {                                                                                    \
    if (!(cluster).installed()) {                                                         \
      GTEST_SKIP() << "SKIPPED: etcd not installed (deploy/install-deps.sh installs it)"; \
    }                                                                                     \
    ASSERT_TRUE((cluster).started()) << (cluster).error();                                \
  } while (0)

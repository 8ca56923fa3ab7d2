// TcpProxy: a loopback TCP relay in front of a test's server (etcd, a kvserver) that can lose
// one answer on purpose: the request that contains a given string is delivered, the server's
// answer to it is thrown away and the client's connection is reset. That is what a client sees
// when a connection breaks after its request was applied: the case where a retry must not be
// taken for someone else's success.
//
//   TcpProxy proxy(etcd_port);            // listens on 127.0.0.1:proxy.port()
//   proxy.DropAnswerTo("/v3/kv/txn");     // the next transaction applies, its answer is lost
//
//   proxy.Swallow("/v3/kv/put");         // puts hang: taken, never answered
//   proxy.Swallow("");                   // everything hangs, both ways
//
// One thread accepts, one thread per connection relays both ways. Thread-safe.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common/util/mutex.h"
#include "tests/support/free_port.h"

namespace rdkv::testing {

// The port of an endpoint "http://127.0.0.1:PORT" or "HOST:PORT".
inline uint16_t PortOf(const std::string& endpoint) {
  return static_cast<uint16_t>(std::stoi(endpoint.substr(endpoint.rfind(':') + 1)));
}

class TcpProxy {
 public:
  explicit TcpProxy(uint16_t target_port) : target_port_(target_port) {
    listen_fd_ = ListenLoopback(&port_);
    if (listen_fd_ >= 0) accept_thread_ = std::thread([this] { AcceptLoop(); });
  }
  ~TcpProxy() {
    stop_.store(true);
    if (accept_thread_.joinable()) accept_thread_.join();
    std::vector<std::thread> relays;
    {
      MutexLock l(&mu_);
      relays.swap(relays_);
    }
    for (std::thread& t : relays) t.join();
    if (listen_fd_ >= 0) close(listen_fd_);
  }
  TcpProxy(const TcpProxy&) = delete;
  TcpProxy& operator=(const TcpProxy&) = delete;

  bool ok() const { return listen_fd_ >= 0; }
  uint16_t port() const { return port_; }
  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port_); }

  // The next request whose bytes contain `needle` (within one read) reaches the server; the
  // server's answer on that connection is discarded and the client's connection reset.
  void DropAnswerTo(std::string needle) {
    MutexLock l(&mu_);
    needle_ = std::move(needle);
  }
  int answers_dropped() const { return dropped_.load(); }

  // From now on a request whose bytes contain `needle` is taken and never delivered nor
  // answered, and its connection carries nothing more either way (it stays open): a member
  // that hangs on some requests. An empty needle: every connection, new or open, goes silent
  // both ways at once (a partition that drops packets). Off again with Swallow(std::nullopt).
  void Swallow(std::optional<std::string> needle) {
    MutexLock l(&mu_);
    swallow_ = std::move(needle);
    swallow_all_.store(swallow_.has_value() && swallow_->empty());
  }

 private:
  static int ConnectLoopback(uint16_t port) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(port);
    if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      close(fd);
      return -1;
    }
    return fd;
  }

  static void Reset(int fd) {
    linger l{1, 0};  // close with RST, as a broken connection looks
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
    close(fd);
  }

  static bool SendAll(int fd, const char* p, size_t n) {
    while (n > 0) {
      const ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
      if (w <= 0) return false;
      p += w;
      n -= static_cast<size_t>(w);
    }
    return true;
  }

  void AcceptLoop() {
    while (!stop_.load()) {
      pollfd p{listen_fd_, POLLIN, 0};
      if (poll(&p, 1, 50) <= 0) continue;
      const int client = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (client < 0) continue;
      const int server = ConnectLoopback(target_port_);
      if (server < 0) {
        Reset(client);
        continue;
      }
      MutexLock l(&mu_);
      relays_.emplace_back([this, client, server] { Relay(client, server); });
    }
  }

  // Takes the armed needle when `chunk` contains it.
  bool TakeNeedleIn(std::string_view chunk) {
    MutexLock l(&mu_);
    if (needle_.empty() || chunk.find(needle_) == std::string_view::npos) return false;
    needle_.clear();
    return true;
  }

  bool SwallowsRequest(std::string_view chunk) {
    MutexLock l(&mu_);
    return swallow_.has_value() && chunk.find(*swallow_) != std::string_view::npos;
  }

  void Relay(int client, int server) {
    bool drop_answer = false;
    bool silent = false;  // this connection swallowed a request: it carries nothing more
    char buf[64 * 1024];
    while (!stop_.load()) {
      pollfd p[2] = {{client, POLLIN, 0}, {server, POLLIN, 0}};
      if (poll(p, 2, 50) <= 0) continue;
      if (p[0].revents != 0) {
        const ssize_t n = recv(client, buf, sizeof buf, 0);
        if (n <= 0) break;
        const std::string_view chunk(buf, static_cast<size_t>(n));
        if (!silent && SwallowsRequest(chunk)) silent = true;
        if (!silent && !swallow_all_.load()) {
          if (!SendAll(server, buf, static_cast<size_t>(n))) break;
          if (TakeNeedleIn(chunk)) drop_answer = true;
        }
      }
      if (p[1].revents != 0) {
        const ssize_t n = recv(server, buf, sizeof buf, 0);
        if (n <= 0) break;
        if (silent || swallow_all_.load()) continue;
        if (drop_answer) {
          dropped_.fetch_add(1);
          Reset(client);
          close(server);
          return;
        }
        if (!SendAll(client, buf, static_cast<size_t>(n))) break;
      }
    }
    close(client);
    close(server);
  }

  const uint16_t target_port_;
  uint16_t port_ = 0;
  int listen_fd_ = -1;
  std::atomic<bool> stop_{false};
  std::atomic<int> dropped_{0};
  std::atomic<bool> swallow_all_{false};
  Mutex mu_;
  std::string needle_ GUARDED_BY(mu_);
  std::optional<std::string> swallow_ GUARDED_BY(mu_);
  std::vector<std::thread> relays_ GUARDED_BY(mu_);
  std::thread accept_thread_;
};

}  // namespace rdkv::testing

#include "common/transport/tcp/socket_util.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "common/util/resolve.h"
#include "common/util/units.h"

namespace rdkv::transport::tcp {

namespace {

int MillisUntil(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  if (left.count() <= 0) return 0;
  return static_cast<int>(std::min<int64_t>(left.count(), 1 << 30));
}

}  // namespace

void ConfigureStreamSocket(int fd) {
  // Failures here only weaken dead-peer detection or latency; they are not fatal.
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
  int idle = 2, interval = 1, count = 3;
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof count);
  unsigned int user_timeout_ms =
      5000;  // unacknowledged data (or unanswered probes) this long: gone
  setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout_ms, sizeof user_timeout_ms);
}

Status SetNonBlocking(int fd, bool nonblocking) {
  int flags = fcntl(fd, F_GETFL, 0);
  if (flags < 0) return Status::FromErrno("fcntl(F_GETFL)", errno);
  flags = nonblocking ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK);
  if (fcntl(fd, F_SETFL, flags) < 0) return Status::FromErrno("fcntl(F_SETFL)", errno);
  return Status::Ok();
}

Result<int> ConnectTo(const std::string& host, uint16_t port, Clock::time_point deadline) {
  RDKV_ASSIGN_OR_RETURN(std::vector<ResolvedAddress> addresses, ResolveStream(host, port, false));
  std::string last_error = "no address";
  for (const ResolvedAddress& ai : addresses) {
    int fd = socket(ai.family, ai.socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai.protocol);
    if (fd < 0) {
      last_error = std::string("socket: ") + strerror(errno);
      continue;
    }
    int rc = connect(fd, ai.sockaddr_ptr(), ai.length);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      int prc;
      do {
        prc = poll(&p, 1, MillisUntil(deadline));
      } while (prc < 0 && errno == EINTR);
      if (prc == 0) {
        close(fd);
        return Status::TimedOut("connect to " + FormatHostPort(host, port) + " timed out");
      }
      int err = 0;
      socklen_t len = sizeof err;
      getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      rc = err == 0 ? 0 : -1;
      errno = err;
    }
    if (rc == 0 && IsSelfConnected(fd)) {
      // Closed at once so the port is free again for the server that should be listening on it.
      std::string self = PeerName(fd);
      close(fd);
      return Status::Unavailable("connect to " + FormatHostPort(host, port) +
                                 ": connected to itself (" + self + " <-> " + self +
                                 ", TCP simultaneous open: no server listens on the port and it "
                                 "lies in net.ipv4.ip_local_port_range)");
    }
    if (rc == 0) {
      Status s = SetNonBlocking(fd, false);
      if (!s.ok()) {
        close(fd);
        return s;
      }
      return fd;
    }
    last_error = strerror(errno);
    close(fd);
  }
  return Status::Unavailable("connect to " + FormatHostPort(host, port) + ": " + last_error);
}

Result<int> ListenOn(const std::string& host, uint16_t port, int backlog) {
  RDKV_ASSIGN_OR_RETURN(std::vector<ResolvedAddress> addresses, ResolveStream(host, port, true));
  Status last = Status::Unavailable("no address for " + FormatHostPort(host, port));
  for (const ResolvedAddress& ai : addresses) {
    int fd = socket(ai.family, ai.socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai.protocol);
    if (fd < 0) {
      last = Status::FromErrno("socket", errno);
      continue;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, ai.sockaddr_ptr(), ai.length) != 0) {
      last = Status::FromErrno("bind " + FormatHostPort(host, port), errno);
      close(fd);
      continue;
    }
    if (listen(fd, backlog) != 0) {
      last = Status::FromErrno("listen " + FormatHostPort(host, port), errno);
      close(fd);
      continue;
    }
    return fd;
  }
  return last;
}

uint16_t LocalPort(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return 0;
  if (ss.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  if (ss.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
  return 0;
}

bool IsSelfConnected(int fd) {
  sockaddr_storage local{}, peer{};
  socklen_t local_len = sizeof local, peer_len = sizeof peer;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_len) != 0) return false;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0) return false;
  if (local.ss_family != peer.ss_family) return false;
  if (local.ss_family == AF_INET) {
    auto* l = reinterpret_cast<sockaddr_in*>(&local);
    auto* p = reinterpret_cast<sockaddr_in*>(&peer);
    return l->sin_port == p->sin_port && l->sin_addr.s_addr == p->sin_addr.s_addr;
  }
  if (local.ss_family == AF_INET6) {
    auto* l = reinterpret_cast<sockaddr_in6*>(&local);
    auto* p = reinterpret_cast<sockaddr_in6*>(&peer);
    return l->sin6_port == p->sin6_port &&
           memcmp(&l->sin6_addr, &p->sin6_addr, sizeof l->sin6_addr) == 0;
  }
  return false;
}

std::string PeerName(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "?";
  char host[INET6_ADDRSTRLEN] = "?";
  uint16_t port = 0;
  if (ss.ss_family == AF_INET) {
    auto* a = reinterpret_cast<sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
    port = ntohs(a->sin_port);
  } else if (ss.ss_family == AF_INET6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
    port = ntohs(a->sin6_port);
  }
  return FormatHostPort(host, port);
}

Status SendAllBefore(int fd, struct iovec* iov, int iovcnt, Clock::time_point deadline,
                     size_t* sent, const SendWaitHook* hook) {
  *sent = 0;
  while (iovcnt > 0) {
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(iovcnt);
    ssize_t n = sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        // The socket buffer is full: the peer is not reading (or the network is slow).
        pollfd p{fd, POLLOUT, 0};
        int wait_ms = MillisUntil(deadline);
        if (hook != nullptr) wait_ms = std::min(wait_ms, static_cast<int>(hook->interval.count()));
        int rc = poll(&p, 1, wait_ms);
        if (rc == 0 && hook != nullptr && Clock::now() < deadline) {
          hook->fn(hook->arg);
          continue;
        }
        if (rc == 0) {
          return Status::TimedOut("the peer read nothing for the rest of the deadline (" +
                                  std::to_string(*sent) + " bytes of the frame sent)");
        }
        if (rc < 0 && errno != EINTR) {
          return Status::ConnectionLost(std::string("poll: ") + strerror(errno));
        }
        continue;
      }
      return Status::ConnectionLost(std::string("send: ") + strerror(errno));
    }
    *sent += static_cast<size_t>(n);
    size_t left = static_cast<size_t>(n);
    while (iovcnt > 0 && left >= iov->iov_len) {
      left -= iov->iov_len;
      ++iov;
      --iovcnt;
    }
    if (iovcnt > 0) {
      iov->iov_base = static_cast<uint8_t*>(iov->iov_base) + left;
      iov->iov_len -= left;
    }
  }
  return Status::Ok();
}

Status SendAllBefore(int fd, std::span<const uint8_t> bytes, Clock::time_point deadline) {
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = send(fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd, POLLOUT, 0};
      int rc = poll(&p, 1, MillisUntil(deadline));
      if (rc == 0) return Status::TimedOut("send timed out");
      continue;
    }
    return Status::ConnectionLost(std::string("send: ") + strerror(errno));
  }
  return Status::Ok();
}

Status RecvExactBefore(int fd, std::span<uint8_t> out, Clock::time_point deadline) {
  size_t done = 0;
  while (done < out.size()) {
    ssize_t n = recv(fd, out.data() + done, out.size() - done, MSG_DONTWAIT);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n == 0) return Status::ConnectionLost("the server closed the connection");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      pollfd p{fd, POLLIN, 0};
      int rc = poll(&p, 1, MillisUntil(deadline));
      if (rc == 0) return Status::TimedOut("no answer from the server");
      continue;
    }
    return Status::ConnectionLost(std::string("recv: ") + strerror(errno));
  }
  return Status::Ok();
}

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  // Walk the longer string in full so the time does not reveal a matching prefix.
  size_t n = std::max(a.size(), b.size());
  unsigned diff = a.size() != b.size() ? 1u : 0u;
  for (size_t i = 0; i < n; ++i) {
    unsigned x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0u;
    unsigned y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0u;
    diff |= x ^ y;
  }
  // Keep the compiler from turning the loop into an early-exit compare.
  volatile unsigned sink = diff;
  return sink == 0;
}

}  // namespace rdkv::transport::tcp

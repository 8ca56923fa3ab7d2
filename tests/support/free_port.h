// FreePort: a TCP port on 127.0.0.1 for a test's listener, one definition for every fixture.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <random>

namespace rdkv::testing {

// The lowest port of the kernel's ephemeral range (net.ipv4.ip_local_port_range), 32768 when
// it cannot be read.
inline uint16_t EphemeralPortLow() {
  unsigned low = 32768, high = 60999;
  if (FILE* f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
    if (std::fscanf(f, "%u %u", &low, &high) != 2) low = 32768;
    std::fclose(f);
  }
  return static_cast<uint16_t>(low);
}

// A TCP socket bound to 127.0.0.1:`port` (with SO_REUSEADDR when `reuse`), or -1 when the
// port cannot be bound.
inline int BindLoopback(uint16_t port, bool reuse) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  int one = 1;
  if (reuse) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// A listening TCP socket on 127.0.0.1 at a FreePort() (SO_REUSEADDR), *port set to it; -1 when
// none could be made. For a test's own fake servers and relays.
inline int ListenLoopback(uint16_t* port, int backlog = 64);

// True when 127.0.0.1:`port` can be bound now (no SO_REUSEADDR: a port in TIME_WAIT is busy).
inline bool PortBindable(uint16_t port) {
  const int fd = BindLoopback(port, /*reuse=*/false);
  if (fd < 0) return false;
  close(fd);
  return true;
}

// Holds 127.0.0.1:`port` with a bound, never-listening SO_REUSEADDR socket until the process
// exits; false when it cannot be bound. While it is held, another process's PortBindable
// check (and so its FreePort) fails on the port, but a listener that sets SO_REUSEADDR (every
// rdkv server, etcd) still binds and listens on it: Linux lets SO_REUSEADDR sockets share a
// port while none of them listens, and a connect to the held socket alone is refused. Each
// test runs in its own process, so a port is held for one test.
inline bool ReservePortForThisProcess(uint16_t port) {
  return BindLoopback(port, /*reuse=*/true) >= 0;  // the descriptor stays open until exit
}

// A port on 127.0.0.1 that nothing holds, below the kernel's ephemeral range, reserved for
// this process (ReservePortForThisProcess). The kernel's own choice for port 0 lies inside
// that range, where the outgoing connections of tests running in parallel take their local
// ports: a port picked there and released can be taken by another test's connection before
// this test's server binds it, and stays taken as long as that connection lives (a server that
// then failed to start for 5 s was seen in CI). Below the range only another test's pick could
// collide, and a released pick could be taken between the check and the server's bind (also
// seen, under load); the reservation closes that window, since another test's check then fails.
inline uint16_t FreePort() {
  const unsigned low = 10000;
  unsigned high = EphemeralPortLow();
  if (high <= low + 1000) high = 32768;
  static thread_local std::mt19937 rng{std::random_device{}()};
  std::uniform_int_distribution<unsigned> pick(low, high - 1);
  for (int attempt = 0; attempt < 200; ++attempt) {
    const auto port = static_cast<uint16_t>(pick(rng));
    if (PortBindable(port) && ReservePortForThisProcess(port)) return port;
  }
  ADD_FAILURE() << "no bindable port in [" << low << ", " << high << ")";
  return 0;
}

inline int ListenLoopback(uint16_t* port, int backlog) {
  *port = FreePort();
  const int fd = BindLoopback(*port, /*reuse=*/true);
  if (fd >= 0 && listen(fd, backlog) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

}  // namespace rdkv::testing

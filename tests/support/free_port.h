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

// True when 127.0.0.1:`port` can be bound now (no SO_REUSEADDR: a port in TIME_WAIT is busy).
inline bool PortBindable(uint16_t port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  close(fd);
  return ok;
}

// A port on 127.0.0.1 that nothing holds right now, below the kernel's ephemeral range. The
// kernel's own choice for port 0 lies inside that range, where the outgoing connections of
// tests running in parallel take their local ports: a port picked there and released can be
// taken by another test's connection before this test's server binds it, and stays taken as
// long as that connection lives (a server that then failed to start for 5 s was seen in CI).
// Below the range only another test's explicit pick can collide, which a random pick makes rare
// and StartServerRetrying's retries absorb.
inline uint16_t FreePort() {
  const unsigned low = 10000;
  unsigned high = EphemeralPortLow();
  if (high <= low + 1000) high = 32768;
  static thread_local std::mt19937 rng{std::random_device{}()};
  std::uniform_int_distribution<unsigned> pick(low, high - 1);
  for (int attempt = 0; attempt < 200; ++attempt) {
    const auto port = static_cast<uint16_t>(pick(rng));
    if (PortBindable(port)) return port;
  }
  ADD_FAILURE() << "no bindable port in [" << low << ", " << high << ")";
  return 0;
}

}  // namespace rdkv::testing

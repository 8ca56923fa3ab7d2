// Name resolution of a server address for a stream socket: the one getaddrinfo call of the
// transports (tcp connects and listens, verbs resolves for rdma_cm). Control path.
//
// Thread-safety: ResolveStream is safe from any thread (getaddrinfo is).
#pragma once

#include <sys/socket.h>

#include <cstdint>
#include <string>
#include <vector>

#include "rdkv/status.h"

namespace rdkv {

// One address `host:port` resolved to, with what socket(2) needs for it.
struct ResolvedAddress {
  int family = 0;
  int socktype = 0;
  int protocol = 0;
  sockaddr_storage addr{};
  socklen_t length = 0;

  const sockaddr* sockaddr_ptr() const { return reinterpret_cast<const sockaddr*>(&addr); }
};

// Every TCP address of `host` (a name or a numeric address; empty: any, with `passive`) on
// `port`, in getaddrinfo's order; `passive` for an address to bind. Never empty on OK.
// kUnavailable "cannot resolve host:port: why" otherwise.
Result<std::vector<ResolvedAddress>> ResolveStream(const std::string& host, uint16_t port,
                                                   bool passive);

// Whether a TCP listener (SO_REUSEADDR, as the listeners set) could bind host:port now, without
// listening (0: any port, always). For a start-up check before long work: kUnavailable "WHAT
// HOST:PORT is in use by another process ..." when it is taken, the bind error otherwise. The
// real bind comes later and can still lose a race.
Status CheckTcpPortFree(const std::string& what, const std::string& host, uint16_t port);

}  // namespace rdkv

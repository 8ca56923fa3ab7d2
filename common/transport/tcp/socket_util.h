// Socket helpers shared by the tcp listener and connection (control path unless noted).
#pragma once

#include <sys/uio.h>

#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "rdkv/status.h"

namespace rdkv::transport::tcp {

using Clock = std::chrono::steady_clock;

// TCP_NODELAY, SO_KEEPALIVE with short probes (idle 2 s, interval 1 s, 3 probes) and a 5 s
// TCP_USER_TIMEOUT, so a peer that vanishes without FIN/RST is detected within about 5 s.
void ConfigureStreamSocket(int fd);

Status SetNonBlocking(int fd, bool nonblocking);

// Resolves host:port and connects (non-blocking connect + poll) before `deadline`.
// Returns a connected, blocking socket. kUnavailable (refused, unreachable, or connected to
// itself: see IsSelfConnected) or kTimedOut.
Result<int> ConnectTo(const std::string& host, uint16_t port, Clock::time_point deadline);

// Binds and listens on host:port (SO_REUSEADDR, so a restarted server gets its port back).
Result<int> ListenOn(const std::string& host, uint16_t port, int backlog);
uint16_t LocalPort(int fd);

// True when the socket's local address equals its peer address. A client connecting to a local
// port P with no listener, P in net.ipv4.ip_local_port_range, can be given P as its own ephemeral
// port, and TCP simultaneous open then connects it to itself (127.0.0.1:P <-> 127.0.0.1:P): the
// connect "succeeds", and a server restarted on P fails with "address already in use" while that
// socket lives. ConnectTo closes such a socket at once.
bool IsSelfConnected(int fd);
std::string PeerName(int fd);  // "10.0.0.1:51234" or "?"

// Called while a sender waits for room in the socket, at least every `interval`: e.g. a client
// connection reads the answers nobody else is reading, so that the peer can take requests again.
struct SendWaitHook {
  void (*fn)(void* arg);
  void* arg;
  std::chrono::milliseconds interval;
};

// Writes every byte of `iov` (MSG_NOSIGNAL | MSG_DONTWAIT, polling for room) until `deadline`.
// Datapath: no allocation unless it fails. *sent receives the bytes written. kTimedOut when
// the peer made no room before the deadline (a frame may then be partly written: unless
// *sent is 0 the stream is unusable), kConnectionLost when the socket broke.
Status SendAllBefore(int fd, struct iovec* iov, int iovcnt, Clock::time_point deadline,
                     size_t* sent, const SendWaitHook* hook = nullptr);

// Writes all of `bytes` to a non-blocking socket, polling until `deadline` (control path).
Status SendAllBefore(int fd, std::span<const uint8_t> bytes, Clock::time_point deadline);
// Reads exactly `out.size()` bytes, polling until `deadline` (control path).
// kConnectionLost on EOF, kTimedOut on the deadline.
Status RecvExactBefore(int fd, std::span<uint8_t> out, Clock::time_point deadline);

// Compares in time that depends only on the lengths, never on where the first difference is.
bool ConstantTimeEquals(std::string_view a, std::string_view b);

}  // namespace rdkv::transport::tcp

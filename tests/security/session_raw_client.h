// A small raw-socket client (and server side) of the tcp transport's handshake, for tests that
// must send what a real Connection never would: silent sockets, replays, wrong proofs.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/transport/auth.h"
#include "common/transport/tcp/frame.h"

namespace rdkv::transport::tcp::rawtest {

// A blocking TCP connection to 127.0.0.1:port (or from `source`, e.g. "127.0.0.2"); -1 on error.
inline int RawConnect(uint16_t port, const char* source = nullptr, int recv_timeout_s = 5) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (source != nullptr) {
    sockaddr_in b{};
    b.sin_family = AF_INET;
    inet_pton(AF_INET, source, &b.sin_addr);
    if (bind(fd, reinterpret_cast<sockaddr*>(&b), sizeof b) != 0) {
      close(fd);
      return -1;
    }
  }
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    close(fd);
    return -1;
  }
  timeval tv{recv_timeout_s, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

inline bool SendBytes(int fd, std::span<const uint8_t> bytes) {
  return send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size());
}

// Reads one frame (header + body); false on EOF, error or timeout.
inline bool RecvFrame(int fd, FrameHeader* header, std::vector<uint8_t>* body,
                      size_t max_message = 1 << 20) {
  uint8_t h[kFrameHeaderSize];
  if (recv(fd, h, sizeof h, MSG_WAITALL) != static_cast<ssize_t>(sizeof h)) return false;
  auto d = DecodeFrameHeader(h, max_message);
  if (!d.ok()) return false;
  *header = *d;
  body->resize(d->body_length);
  if (d->body_length == 0) return true;
  return recv(fd, body->data(), body->size(), MSG_WAITALL) == static_cast<ssize_t>(body->size());
}

inline std::vector<uint8_t> MakeHello(SessionRole role, const auth::Nonce& nonce,
                                      uint32_t max_message = 1 << 20) {
  return EncodeHello({kProtocolVersion, max_message, {role, nonce}});
}

// `count` CALL_REQUEST frames with request ids first_id, first_id + 1, ..., each carrying
// `payload`, back to back (a pipelining client).
inline std::vector<uint8_t> CallRequests(uint64_t first_id, int count,
                                         std::span<const uint8_t> payload) {
  std::vector<uint8_t> frames;
  frames.reserve(static_cast<size_t>(count) * (kCallHeadSize + payload.size()));
  for (int i = 0; i < count; ++i) {
    uint8_t head[kCallHeadSize];
    EncodeCallHead(FrameType::kCallRequest, first_id + i, static_cast<uint32_t>(payload.size()),
                   head);
    frames.insert(frames.end(), head, head + sizeof head);
    frames.insert(frames.end(), payload.begin(), payload.end());
  }
  return frames;
}

// The first half of a client's handshake over `fd`: HELLO with a fresh nonce, then the
// server's CHALLENGE. Fills what a later PROOF needs. False when the server sent anything else.
inline bool HelloUntilChallenge(int fd, SessionRole role, auth::Nonce* nonce,
                                std::vector<uint8_t>* hello, auth::AuthChallenge* challenge) {
  auto n = auth::RandomNonce();
  if (!n.ok()) return false;
  *nonce = *n;
  *hello = MakeHello(role, *nonce);
  FrameHeader h;
  std::vector<uint8_t> body;
  if (!SendBytes(fd, *hello) || !RecvFrame(fd, &h, &body) || h.type != FrameType::kChallenge) {
    return false;
  }
  auto c = DecodeChallenge(body);
  if (!c.ok()) return false;
  *challenge = *c;
  return true;
}

// The client side of the handshake over `fd`: HELLO, CHALLENGE (the server proof is checked
// only when check_server), PROOF. Fills the final frame (WELCOME or REFUSED; or the REFUSED
// that answered the HELLO). `sent` receives every byte this client wrote (a captured
// handshake, for replay tests). False when the server closed or sent garbage.
inline bool ClientHandshake(int fd, std::string_view secret, SessionRole role, FrameHeader* last,
                            std::vector<uint8_t>* body, std::vector<uint8_t>* sent = nullptr,
                            bool check_server = true) {
  auto nonce = auth::RandomNonce();
  if (!nonce.ok()) return false;
  std::vector<uint8_t> hello = MakeHello(role, *nonce);
  if (sent != nullptr) sent->insert(sent->end(), hello.begin(), hello.end());
  if (!SendBytes(fd, hello)) return false;
  if (!RecvFrame(fd, last, body)) return false;
  if (last->type != FrameType::kChallenge) return true;
  auto c = DecodeChallenge(*body);
  if (!c.ok()) return false;
  std::span<const uint8_t> ctx(hello.data() + kFrameHeaderSize, kHelloBodySize);
  if (check_server &&
      !auth::ProofsEqual(c->server_proof, auth::ComputeProof(auth::Side::kServer, secret, role,
                                                             *nonce, c->server_nonce, ctx))) {
    return false;
  }
  auth::AuthProof p;
  p.client_proof =
      auth::ComputeProof(auth::Side::kClient, secret, role, *nonce, c->server_nonce, ctx);
  std::vector<uint8_t> proof = EncodeProof(p);
  if (sent != nullptr) sent->insert(sent->end(), proof.begin(), proof.end());
  if (!SendBytes(fd, proof)) return false;
  return RecvFrame(fd, last, body);
}

// The server side of the handshake (a fake server in a test): reads HELLO, answers CHALLENGE,
// reads PROOF and checks it. True when the client proved `secret`; the caller then sends
// WELCOME (or anything else).
inline bool ServerHandshake(int fd, std::string_view secret) {
  FrameHeader h;
  std::vector<uint8_t> hello;
  if (!RecvFrame(fd, &h, &hello) || h.type != FrameType::kHello) return false;
  auto d = DecodeHello(hello);
  if (!d.ok()) return false;
  auto ns = auth::RandomNonce();
  if (!ns.ok()) return false;
  auth::AuthChallenge c;
  c.server_nonce = *ns;
  c.server_proof = auth::ComputeProof(auth::Side::kServer, secret, d->auth.role,
                                      d->auth.client_nonce, *ns, hello);
  if (!SendBytes(fd, EncodeChallenge(c))) return false;
  std::vector<uint8_t> body;
  if (!RecvFrame(fd, &h, &body) || h.type != FrameType::kProof) return false;
  auto p = DecodeProof(body);
  return p.ok() && auth::ProofsEqual(p->client_proof,
                                     auth::ComputeProof(auth::Side::kClient, secret, d->auth.role,
                                                        d->auth.client_nonce, *ns, hello));
}

}  // namespace rdkv::transport::tcp::rawtest

// TLS 1.3 for the tcp transport (OpenSSL libssl): RAII owners of SSL_CTX and SSL, and a
// non-blocking byte stream over a socket. See docs/security.md "TLS (tcp)".
//
// The stream never blocks and never raises SIGPIPE: its socket BIO uses send/recv with
// MSG_DONTWAIT | MSG_NOSIGNAL, whatever the socket's own blocking mode. Callers wait for the
// socket themselves (epoll on the server, poll on the client) when an operation answers
// kWantRead or kWantWrite, and then repeat it with the same bytes (a write may be repeated with
// the bytes at another address: SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER).
//
// Thread-safety: a TlsContext is immutable after creation and may be shared by any number of
// threads and streams. A TlsStream is NOT thread-safe: every call on one stream (read, write,
// handshake, error) must be serialized by the caller, including a read on one thread and a write
// on another.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "common/transport/transport.h"
#include "rdkv/status.h"

struct ssl_st;
struct ssl_ctx_st;

namespace rdkv::transport::tcp {

// The first byte of every TLS handshake record (ContentType handshake). A server tells a TLS
// ClientHello from an rdkv frame (magic "RDKT") by it.
inline constexpr uint8_t kTlsHandshakeRecord = 0x16;

class TlsContext {
 public:
  // Server: options.cert_file and key_file (PEM) are required; ca_file, when set, verifies
  // client certificates (required ones with require_client_cert). kInvalidArgument with the
  // file and OpenSSL's reason when a file cannot be loaded or the key does not match.
  static Result<std::shared_ptr<const TlsContext>> CreateServer(const TlsOptions& options);
  // Client: options.ca_file is required (the server is always verified); cert_file and key_file
  // (both or neither) are presented when the server asks for a client certificate.
  static Result<std::shared_ptr<const TlsContext>> CreateClient(const TlsOptions& options);

  ~TlsContext();
  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;

  bool server() const { return server_; }
  ssl_ctx_st* get() const { return ctx_; }

 private:
  TlsContext(ssl_ctx_st* ctx, bool server) : ctx_(ctx), server_(server) {}
  ssl_ctx_st* const ctx_;
  const bool server_;
};

enum class TlsIo : uint8_t {
  kOk,         // progress (bytes moved, or the handshake finished)
  kWantRead,   // wait until the socket is readable, then repeat
  kWantWrite,  // wait until the socket is writable, then repeat
  kClosed,     // the peer closed the connection (EOF, with or without close_notify)
  kError,      // failed: error() says why; the stream is unusable
};

class TlsStream {
 public:
  // A stream over the connected socket `fd` (not owned: the caller closes it after destroying
  // the stream). A client stream verifies the server's certificate against `peer_name` (a DNS
  // name, or an IP address in text form, matched against the subjectAltName).
  static Result<std::unique_ptr<TlsStream>> Create(std::shared_ptr<const TlsContext> context,
                                                   int fd, const std::string& peer_name);
  ~TlsStream();
  TlsStream(const TlsStream&) = delete;
  TlsStream& operator=(const TlsStream&) = delete;

  // Runs the TLS handshake as far as the socket allows (control path).
  TlsIo Handshake();
  // Datapath (no allocation unless it fails). *moved receives the bytes read or written when
  // the answer is kOk (at least 1); a read returns the plaintext of at most one record.
  TlsIo Read(std::span<uint8_t> out, size_t* moved);
  TlsIo Write(std::span<const uint8_t> bytes, size_t* moved);

  // Why the last call answered kError (or kClosed during the handshake), in words, with a hint
  // when the peer is evidently not speaking TLS.
  const std::string& error() const { return error_; }
  // The peer's certificate subject ("CN=..."), or "" when it sent none (control path).
  std::string PeerSubject() const;

 private:
  TlsStream(std::shared_ptr<const TlsContext> context, ssl_st* ssl)
      : context_(std::move(context)), ssl_(ssl) {}
  TlsIo Classify(int ret, const char* what);

  std::shared_ptr<const TlsContext> context_;
  ssl_st* const ssl_;
  bool handshake_done_ = false;
  std::string error_;
};

using TlsClock = std::chrono::steady_clock;

// Blocking helpers for a client's handshake (one thread, before the stream is shared): they
// poll the socket until `deadline`. kTimedOut on the deadline, kUnavailable with the TLS reason
// on a failed handshake, kConnectionLost on EOF.
Status TlsHandshakeBefore(TlsStream* stream, int fd, TlsClock::time_point deadline);
Status TlsSendAllBefore(TlsStream* stream, int fd, std::span<const uint8_t> bytes,
                        TlsClock::time_point deadline);
Status TlsRecvExactBefore(TlsStream* stream, int fd, std::span<uint8_t> out,
                          TlsClock::time_point deadline);

}  // namespace rdkv::transport::tcp

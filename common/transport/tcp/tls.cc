#include "common/transport/tcp/tls.h"

#include <arpa/inet.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <mutex>

namespace rdkv::transport::tcp {

namespace {

// Drains OpenSSL's (thread-local) error queue into words.
std::string DrainErrors() {
  std::string out;
  while (unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof buf);
    if (!out.empty()) out += "; ";
    // "error:0A000086:SSL routines::certificate verify failed" -> keep the reason part.
    const char* reason = ERR_reason_error_string(e);
    out += reason != nullptr ? reason : buf;
  }
  return out;
}

bool ErrorsHaveReason(int reason) {
  unsigned long e = ERR_peek_error();
  return e != 0 && ERR_GET_LIB(e) == ERR_LIB_SSL && ERR_GET_REASON(e) == reason;
}

// ---- a socket BIO that never blocks and never raises SIGPIPE ----
int SockWrite(BIO* bio, const char* data, size_t len, size_t* written) {
  const int fd = static_cast<int>(reinterpret_cast<intptr_t>(BIO_get_data(bio)));
  BIO_clear_retry_flags(bio);
  for (;;) {
    ssize_t n = send(fd, data, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n >= 0) {
      *written = static_cast<size_t>(n);
      return 1;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) BIO_set_retry_write(bio);
    return 0;
  }
}

int SockRead(BIO* bio, char* data, size_t len, size_t* read) {
  const int fd = static_cast<int>(reinterpret_cast<intptr_t>(BIO_get_data(bio)));
  BIO_clear_retry_flags(bio);
  for (;;) {
    ssize_t n = recv(fd, data, len, MSG_DONTWAIT);
    if (n > 0) {
      *read = static_cast<size_t>(n);
      return 1;
    }
    if (n == 0) {
      *read = 0;
      return 0;  // EOF: not retryable
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) BIO_set_retry_read(bio);
    return 0;
  }
}

long SockCtrl(BIO*, int cmd, long, void*) {
  switch (cmd) {
    case BIO_CTRL_FLUSH:
    case BIO_CTRL_PUSH:
    case BIO_CTRL_POP:
      return 1;
    default:
      return 0;
  }
}

int SockCreate(BIO* bio) {
  BIO_set_init(bio, 1);
  return 1;
}

BIO_METHOD* SocketMethod() {
  static BIO_METHOD* method = [] {
    BIO_METHOD* m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "rdkv socket");
    if (m == nullptr) return m;
    BIO_meth_set_write_ex(m, SockWrite);
    BIO_meth_set_read_ex(m, SockRead);
    BIO_meth_set_ctrl(m, SockCtrl);
    BIO_meth_set_create(m, SockCreate);
    return m;
  }();
  return method;
}

Result<SSL_CTX*> NewContext(bool server) {
  ERR_clear_error();
  SSL_CTX* ctx = SSL_CTX_new(server ? TLS_server_method() : TLS_client_method());
  if (ctx == nullptr) return Status::Internal("SSL_CTX_new: " + DrainErrors());
  SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
  SSL_CTX_set_max_proto_version(ctx, TLS1_3_VERSION);
  // Long-lived connections: no tickets, no resumption (and no unsolicited post-handshake
  // writes from the server).
  SSL_CTX_set_options(ctx, SSL_OP_NO_TICKET);
  SSL_CTX_set_num_tickets(ctx, 0);
  SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
  SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  return ctx;
}

Status LoadCertAndKey(SSL_CTX* ctx, const TlsOptions& o) {
  if (o.cert_file.empty() != o.key_file.empty()) {
    return Status::InvalidArgument(
        "TLS: a certificate file and a key file go together (got only the " +
        std::string(o.cert_file.empty() ? "key" : "certificate") + ")");
  }
  if (o.cert_file.empty()) return Status::Ok();
  if (SSL_CTX_use_certificate_chain_file(ctx, o.cert_file.c_str()) != 1) {
    return Status::InvalidArgument("TLS: cannot load the certificate " + o.cert_file + ": " +
                                   DrainErrors());
  }
  if (SSL_CTX_use_PrivateKey_file(ctx, o.key_file.c_str(), SSL_FILETYPE_PEM) != 1) {
    if (ERR_GET_REASON(ERR_peek_error()) == X509_R_KEY_VALUES_MISMATCH) {
      ERR_clear_error();
      return Status::InvalidArgument("TLS: the key " + o.key_file +
                                     " does not match the certificate " + o.cert_file);
    }
    return Status::InvalidArgument("TLS: cannot load the private key " + o.key_file + ": " +
                                   DrainErrors());
  }
  if (SSL_CTX_check_private_key(ctx) != 1) {
    return Status::InvalidArgument("TLS: the key " + o.key_file +
                                   " does not match the certificate " + o.cert_file + ": " +
                                   DrainErrors());
  }
  return Status::Ok();
}

Status LoadCa(SSL_CTX* ctx, const std::string& ca_file) {
  if (SSL_CTX_load_verify_locations(ctx, ca_file.c_str(), nullptr) != 1) {
    return Status::InvalidArgument("TLS: cannot load the CA file " + ca_file + ": " +
                                   DrainErrors());
  }
  return Status::Ok();
}

struct CtxFree {
  void operator()(SSL_CTX* c) const { SSL_CTX_free(c); }
};

}  // namespace

TlsContext::~TlsContext() { SSL_CTX_free(ctx_); }

Result<std::shared_ptr<const TlsContext>> TlsContext::CreateServer(const TlsOptions& options) {
  if (options.cert_file.empty() || options.key_file.empty()) {
    return Status::InvalidArgument("TLS: a server needs both a certificate and a key file");
  }
  if (options.require_client_cert && options.ca_file.empty()) {
    return Status::InvalidArgument(
        "TLS: requiring client certificates needs a CA file to verify them");
  }
  auto raw = NewContext(/*server=*/true);
  if (!raw.ok()) return raw.status();
  std::unique_ptr<SSL_CTX, CtxFree> ctx(*raw);
  RDKV_RETURN_IF_ERROR(LoadCertAndKey(ctx.get(), options));
  if (!options.ca_file.empty()) {
    RDKV_RETURN_IF_ERROR(LoadCa(ctx.get(), options.ca_file));
    // Ask for a client certificate (and name the acceptable CAs) only when one is required;
    // otherwise clients are authenticated by the HMAC handshake alone.
    if (options.require_client_cert) {
      SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
      STACK_OF(X509_NAME)* names = SSL_load_client_CA_file(options.ca_file.c_str());
      if (names != nullptr) SSL_CTX_set_client_CA_list(ctx.get(), names);
    }
  }
  return std::shared_ptr<const TlsContext>(new TlsContext(ctx.release(), /*server=*/true));
}

Result<std::shared_ptr<const TlsContext>> TlsContext::CreateClient(const TlsOptions& options) {
  if (options.ca_file.empty()) {
    return Status::InvalidArgument("TLS: a client needs a CA file to verify the server");
  }
  auto raw = NewContext(/*server=*/false);
  if (!raw.ok()) return raw.status();
  std::unique_ptr<SSL_CTX, CtxFree> ctx(*raw);
  RDKV_RETURN_IF_ERROR(LoadCa(ctx.get(), options.ca_file));
  RDKV_RETURN_IF_ERROR(LoadCertAndKey(ctx.get(), options));
  SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER, nullptr);
  return std::shared_ptr<const TlsContext>(new TlsContext(ctx.release(), /*server=*/false));
}

Result<std::unique_ptr<TlsStream>> TlsStream::Create(std::shared_ptr<const TlsContext> context,
                                                     int fd, const std::string& peer_name) {
  ERR_clear_error();
  BIO_METHOD* method = SocketMethod();
  if (method == nullptr) return Status::Internal("TLS: BIO_meth_new failed");
  SSL* ssl = SSL_new(context->get());
  if (ssl == nullptr) return Status::Internal("TLS: SSL_new: " + DrainErrors());
  std::unique_ptr<TlsStream> stream(new TlsStream(std::move(context), ssl));
  BIO* bio = BIO_new(method);
  if (bio == nullptr) return Status::Internal("TLS: BIO_new: " + DrainErrors());
  BIO_set_data(bio, reinterpret_cast<void*>(static_cast<intptr_t>(fd)));
  SSL_set_bio(ssl, bio, bio);  // the SSL owns the BIO (one reference for both directions)
  if (stream->context_->server()) {
    SSL_set_accept_state(ssl);
    return stream;
  }
  SSL_set_connect_state(ssl);
  in6_addr addr6;
  in_addr addr4;
  const bool is_ip = inet_pton(AF_INET, peer_name.c_str(), &addr4) == 1 ||
                     inet_pton(AF_INET6, peer_name.c_str(), &addr6) == 1;
  X509_VERIFY_PARAM* param = SSL_get0_param(ssl);
  if (is_ip) {
    if (X509_VERIFY_PARAM_set1_ip_asc(param, peer_name.c_str()) != 1) {
      return Status::InvalidArgument("TLS: bad IP address " + peer_name);
    }
  } else {
    X509_VERIFY_PARAM_set_hostflags(param, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
    if (SSL_set1_host(ssl, peer_name.c_str()) != 1 ||
        SSL_set_tlsext_host_name(ssl, peer_name.c_str()) != 1) {
      return Status::InvalidArgument("TLS: bad host name " + peer_name);
    }
  }
  return stream;
}

TlsStream::~TlsStream() { SSL_free(ssl_); }

TlsIo TlsStream::Classify(int ret, const char* what) {
  const int err = SSL_get_error(ssl_, ret);
  switch (err) {
    case SSL_ERROR_WANT_READ:
      return TlsIo::kWantRead;
    case SSL_ERROR_WANT_WRITE:
      return TlsIo::kWantWrite;
    case SSL_ERROR_ZERO_RETURN:
      error_ = "the peer closed the TLS session";
      return TlsIo::kClosed;
    default:
      break;
  }
  const int saved_errno = errno;
  // The peer is not speaking TLS: an rdkv frame ("RDKT...") or other bytes where a TLS record
  // should be.
  const bool not_tls = ErrorsHaveReason(SSL_R_WRONG_VERSION_NUMBER) ||
                       ErrorsHaveReason(SSL_R_PACKET_LENGTH_TOO_LONG) ||
                       ErrorsHaveReason(SSL_R_HTTP_REQUEST) ||
                       ErrorsHaveReason(SSL_R_RECORD_LENGTH_MISMATCH);
  const bool eof = ErrorsHaveReason(SSL_R_UNEXPECTED_EOF_WHILE_READING) ||
                   (err == SSL_ERROR_SYSCALL && ERR_peek_error() == 0);
  std::string reasons = DrainErrors();
  if (err == SSL_ERROR_SSL && SSL_get_verify_result(ssl_) != X509_V_OK) {
    reasons += std::string(reasons.empty() ? "" : ": ") +
               X509_verify_cert_error_string(SSL_get_verify_result(ssl_));
  }
  if (err == SSL_ERROR_SYSCALL && reasons.empty() && ret < 0 && saved_errno != 0) {
    reasons = strerror(saved_errno);
  }
  if (eof) {
    error_ = handshake_done_
                 ? std::string("the peer closed the connection")
                 : std::string("the peer closed the connection during the TLS handshake");
    return handshake_done_ ? TlsIo::kClosed : TlsIo::kError;
  }
  error_ = std::string(what) + " failed: " + (reasons.empty() ? "unknown error" : reasons);
  if (not_tls && !handshake_done_) {
    error_ += context_->server()
                  ? " (the client is not speaking TLS)"
                  : " (the server answered in plaintext: it does not have TLS enabled; start it "
                    "with --tls_cert_file and --tls_key_file, or connect without --tls_ca_file)";
  }
  return TlsIo::kError;
}

TlsIo TlsStream::Handshake() {
  if (handshake_done_) return TlsIo::kOk;
  ERR_clear_error();
  int ret = SSL_do_handshake(ssl_);
  if (ret == 1) {
    handshake_done_ = true;
    return TlsIo::kOk;
  }
  return Classify(ret, "TLS handshake");
}

TlsIo TlsStream::Read(std::span<uint8_t> out, size_t* moved) {
  ERR_clear_error();
  size_t n = 0;
  if (SSL_read_ex(ssl_, out.data(), out.size(), &n) == 1) {
    *moved = n;
    return TlsIo::kOk;
  }
  return Classify(0, "TLS read");
}

TlsIo TlsStream::Write(std::span<const uint8_t> bytes, size_t* moved) {
  ERR_clear_error();
  size_t n = 0;
  if (SSL_write_ex(ssl_, bytes.data(), bytes.size(), &n) == 1) {
    *moved = n;
    return TlsIo::kOk;
  }
  return Classify(0, "TLS write");
}

std::string TlsStream::PeerSubject() const {
  X509* cert = SSL_get1_peer_certificate(ssl_);
  if (cert == nullptr) return "";
  char buf[256];
  X509_NAME_oneline(X509_get_subject_name(cert), buf, sizeof buf);
  X509_free(cert);
  return buf;
}

namespace {

// Waits for `events` on fd until the deadline. False on the deadline.
bool WaitFd(int fd, short events, TlsClock::time_point deadline) {
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - TlsClock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd, events, 0};
    int rc = poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count() + 1, INT_MAX)));
    if (rc > 0) return true;
    if (rc < 0 && errno != EINTR) return true;  // let the next operation report the error
  }
}

Status Wait(TlsIo io, int fd, TlsClock::time_point deadline, const char* what) {
  short events = io == TlsIo::kWantWrite ? POLLOUT : POLLIN;
  if (!WaitFd(fd, events, deadline)) return Status::TimedOut(std::string(what) + " timed out");
  return Status::Ok();
}

}  // namespace

Status TlsHandshakeBefore(TlsStream* stream, int fd, TlsClock::time_point deadline) {
  for (;;) {
    TlsIo io = stream->Handshake();
    if (io == TlsIo::kOk) return Status::Ok();
    if (io == TlsIo::kClosed || io == TlsIo::kError) return Status::Unavailable(stream->error());
    RDKV_RETURN_IF_ERROR(Wait(io, fd, deadline, "TLS handshake"));
  }
}

Status TlsSendAllBefore(TlsStream* stream, int fd, std::span<const uint8_t> bytes,
                        TlsClock::time_point deadline) {
  while (!bytes.empty()) {
    size_t n = 0;
    TlsIo io = stream->Write(bytes, &n);
    if (io == TlsIo::kOk) {
      bytes = bytes.subspan(n);
      continue;
    }
    if (io == TlsIo::kClosed) return Status::ConnectionLost(stream->error());
    if (io == TlsIo::kError) return Status::Unavailable(stream->error());
    RDKV_RETURN_IF_ERROR(Wait(io, fd, deadline, "TLS send"));
  }
  return Status::Ok();
}

Status TlsRecvExactBefore(TlsStream* stream, int fd, std::span<uint8_t> out,
                          TlsClock::time_point deadline) {
  while (!out.empty()) {
    size_t n = 0;
    TlsIo io = stream->Read(out, &n);
    if (io == TlsIo::kOk) {
      out = out.subspan(n);
      continue;
    }
    if (io == TlsIo::kClosed) return Status::ConnectionLost("the server closed the connection");
    if (io == TlsIo::kError) return Status::Unavailable(stream->error());
    RDKV_RETURN_IF_ERROR(Wait(io, fd, deadline, "TLS receive"));
  }
  return Status::Ok();
}

}  // namespace rdkv::transport::tcp

// One HTTP/1.1 POST to an etcd gateway endpoint with libcurl: a whole response (unary calls) or
// a stream of chunks (watch), abortable from another thread. Internal to rdkv_etcd.
//
// Thread-safety: an HttpConnection is used by one thread at a time (EtcdClient keeps a pool);
// Post's `stop` flag may be set from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <string_view>

namespace rdkv::etcd::internal {

// The largest unary reply body read (HttpConnection::Post without on_chunk), and the longest
// line a watch stream may send: beyond either the transfer is cut.
inline constexpr size_t kMaxReplyBytes = 64u << 20;

struct HttpResponse {
  enum class Failure {
    kNone,      // a response arrived (any HTTP status): see http_status and body
    kConnect,   // no connection (refused, unresolvable): the request was not sent
    kBroken,    // the connection broke or the reply was cut: the outcome is unknown
    kTimedOut,  // the deadline passed: the outcome is unknown
    kAborted,   // `stop` was set or the chunk callback refused more data
  };
  Failure failure = Failure::kNone;
  std::string error;  // libcurl's description when failure != kNone
  long http_status = 0;
  std::string body;  // the whole body (unary calls only)
};

// TLS files for https:// URLs (EtcdOptions' ca_file, cert_file, key_file); empty: none.
struct HttpTls {
  std::string ca_file;
  std::string cert_file;
  std::string key_file;
};

// A curl easy handle; keeps its connection to the last host for reuse. Not copyable.
class HttpConnection {
 public:
  explicit HttpConnection(HttpTls tls = {});
  ~HttpConnection();
  HttpConnection(const HttpConnection&) = delete;
  HttpConnection& operator=(const HttpConnection&) = delete;

  // POSTs `body` (JSON) to `url`. `timeout` bounds the whole transfer (zero: none, for streams).
  // `on_chunk`, when set, receives the body as it arrives instead of HttpResponse::body; it
  // returns false to abort. `stop`, when set, aborts the transfer within ~100 ms of becoming true
  // (such a transfer does not reuse connections). `require_leader`: the request carries etcd's
  // "hasleader" metadata (the gateway's Grpc-Metadata-hasleader header), so a member without a
  // raft leader refuses it, and ends such a watch stream once it has been leaderless for a few
  // election timeouts, instead of keeping it open and silent.
  HttpResponse Post(const std::string& url, std::string_view body,
                    std::chrono::milliseconds timeout,
                    const std::function<bool(std::string_view)>& on_chunk = nullptr,
                    const std::atomic<bool>* stop = nullptr, bool require_leader = false);

 private:
  const HttpTls tls_;
  void* curl_;  // CURL*
};

}  // namespace rdkv::etcd::internal

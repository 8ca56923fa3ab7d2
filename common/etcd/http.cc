#include "common/etcd/http.h"

#include <curl/curl.h>

#include <mutex>

namespace rdkv::etcd::internal {
namespace {

// curl_global_init is not thread-safe: run it once, before the first handle.
void GlobalInitOnce() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

struct Transfer {
  const std::function<bool(std::string_view)>* on_chunk;
  const std::atomic<bool>* stop;
  std::string* body;
  bool too_large = false;
};

size_t OnWrite(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  std::string_view chunk(data, size * n);
  if (t->on_chunk != nullptr && *t->on_chunk) {
    if (!(*t->on_chunk)(chunk)) return 0;  // a short count aborts with CURLE_WRITE_ERROR
  } else {
    // A reply larger than any this client asks for (a map, the registrations, the events
    // list) is a wrong or hostile endpoint: stop reading instead of growing without bound.
    if (t->body->size() + chunk.size() > kMaxReplyBytes) {
      t->too_large = true;
      return 0;
    }
    t->body->append(chunk);
  }
  return chunk.size();
}

// Called by libcurl on transfer steps and at least once a second while idle; non-zero aborts.
int OnProgress(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  auto* t = static_cast<Transfer*>(user);
  return t->stop != nullptr && t->stop->load(std::memory_order_acquire) ? 1 : 0;
}

// curl_easy_perform through a private multi handle polled every 100 ms, so that `stop` ends
// even an idle stream promptly (the progress callback alone may wait up to a second).
CURLcode PerformStoppable(CURL* h, const std::atomic<bool>& stop) {
  CURLM* m = curl_multi_init();
  if (m == nullptr) return CURLE_OUT_OF_MEMORY;
  curl_multi_add_handle(m, h);
  CURLcode rc = CURLE_OK;
  int running = 1;
  while (true) {
    if (curl_multi_perform(m, &running) != CURLM_OK) {
      rc = CURLE_RECV_ERROR;
      break;
    }
    if (running == 0) {
      int left = 0;
      rc = CURLE_RECV_ERROR;
      while (CURLMsg* msg = curl_multi_info_read(m, &left)) {
        if (msg->msg == CURLMSG_DONE) rc = msg->data.result;
      }
      break;
    }
    if (stop.load(std::memory_order_acquire)) {
      rc = CURLE_ABORTED_BY_CALLBACK;
      break;
    }
    curl_multi_poll(m, nullptr, 0, 100, nullptr);
  }
  curl_multi_remove_handle(m, h);
  curl_multi_cleanup(m);
  return rc;
}

}  // namespace

HttpConnection::HttpConnection(HttpTls tls) : tls_(std::move(tls)) {
  GlobalInitOnce();
  curl_ = curl_easy_init();
}

HttpConnection::~HttpConnection() {
  if (curl_ != nullptr) curl_easy_cleanup(static_cast<CURL*>(curl_));
}

HttpResponse HttpConnection::Post(const std::string& url, std::string_view body,
                                  std::chrono::milliseconds timeout,
                                  const std::function<bool(std::string_view)>& on_chunk,
                                  const std::atomic<bool>* stop, bool require_leader) {
  HttpResponse r;
  auto* h = static_cast<CURL*>(curl_);
  if (h == nullptr) {
    r.failure = HttpResponse::Failure::kConnect;
    r.error = "curl_easy_init failed";
    return r;
  }
  Transfer t{&on_chunk, stop, &r.body};
  curl_easy_reset(h);  // keeps the connection cache
  curl_slist* headers = curl_slist_append(nullptr, "Content-Type: application/json");
  if (require_leader) headers = curl_slist_append(headers, "Grpc-Metadata-hasleader: true");
  char errbuf[CURL_ERROR_SIZE] = {0};
  curl_easy_setopt(h, CURLOPT_URL, url.c_str());
  curl_easy_setopt(h, CURLOPT_POST, 1L);
  curl_easy_setopt(h, CURLOPT_POSTFIELDS, body.data());
  curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);  // threads: no SIGALRM for timeouts
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, &OnWrite);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &t);
  curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, &OnProgress);
  curl_easy_setopt(h, CURLOPT_XFERINFODATA, &t);
  // A peer that vanishes without closing (host down, partition) is found by TCP keepalive.
  curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
  curl_easy_setopt(h, CURLOPT_TCP_KEEPIDLE, 5L);
  curl_easy_setopt(h, CURLOPT_TCP_KEEPINTVL, 2L);
  if (timeout.count() > 0) {
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, static_cast<long>(timeout.count()));
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(timeout.count()));
  } else {
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, 2000L);
  }
  if (url.starts_with("https://")) {
    // TLS: the server's certificate is verified against the CA and must name the host.
    curl_easy_setopt(h, CURLOPT_SSL_VERIFYPEER, 1L);
    curl_easy_setopt(h, CURLOPT_SSL_VERIFYHOST, 2L);
    curl_easy_setopt(h, CURLOPT_SSLVERSION, static_cast<long>(CURL_SSLVERSION_TLSv1_2));
    if (!tls_.ca_file.empty()) curl_easy_setopt(h, CURLOPT_CAINFO, tls_.ca_file.c_str());
    if (!tls_.cert_file.empty()) {
      curl_easy_setopt(h, CURLOPT_SSLCERT, tls_.cert_file.c_str());
      curl_easy_setopt(h, CURLOPT_SSLKEY, tls_.key_file.c_str());
    }
  }
  CURLcode rc = stop == nullptr ? curl_easy_perform(h) : PerformStoppable(h, *stop);
  curl_slist_free_all(headers);
  if (rc == CURLE_OK) {
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &r.http_status);
    return r;
  }
  r.error = errbuf[0] != '\0' ? errbuf : curl_easy_strerror(rc);
  if (t.too_large) {
    r.error = "the reply is larger than " + std::to_string(kMaxReplyBytes >> 20) +
              " MiB: not an etcd answer to this request";
  }
  switch (rc) {
    case CURLE_COULDNT_CONNECT:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_UNSUPPORTED_PROTOCOL:
    case CURLE_URL_MALFORMAT:
    // The TLS handshake failed: nothing was sent.
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_CIPHER:
      r.failure = HttpResponse::Failure::kConnect;
      break;
    case CURLE_OPERATION_TIMEDOUT:
      r.failure = HttpResponse::Failure::kTimedOut;
      break;
    case CURLE_ABORTED_BY_CALLBACK:
    case CURLE_WRITE_ERROR:
      r.failure = HttpResponse::Failure::kAborted;
      break;
    default:
      r.failure = HttpResponse::Failure::kBroken;
      break;
  }
  return r;
}

}  // namespace rdkv::etcd::internal

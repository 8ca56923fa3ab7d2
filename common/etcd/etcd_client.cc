// EtcdClient: requests with failover across endpoints, and the KV and lease calls as JSON.
#include "common/etcd/etcd_client.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <nlohmann/json.hpp>

#include "common/etcd/codec.h"
#include "common/etcd/http.h"
#include "common/util/json_bounded.h"

namespace rdkv::etcd {

using internal::Base64Encode;
using internal::Int64Field;
using internal::KeyValueFromJson;
using Json = nlohmann::json;

namespace {

// gRPC status codes as the gateway reports them.
StatusCode CodeFromGrpc(int64_t grpc) {
  switch (grpc) {
    case 3:   // INVALID_ARGUMENT
    case 11:  // OUT_OF_RANGE (e.g. a compacted revision)
      return StatusCode::kInvalidArgument;
    case 4:  // DEADLINE_EXCEEDED
      return StatusCode::kTimedOut;
    case 5:  // NOT_FOUND
      return StatusCode::kNotFound;
    case 6:  // ALREADY_EXISTS
      return StatusCode::kAlreadyExists;
    case 7:   // PERMISSION_DENIED
    case 16:  // UNAUTHENTICATED
      return StatusCode::kPermissionDenied;
    case 8:  // RESOURCE_EXHAUSTED
      return StatusCode::kBusy;
    case 9:  // FAILED_PRECONDITION
      return StatusCode::kVersionMismatch;
    case 12:  // UNIMPLEMENTED
      return StatusCode::kNotSupported;
    case 14:  // UNAVAILABLE (no leader, stopped, ...)
      return StatusCode::kUnavailable;
    default:
      return StatusCode::kInternal;
  }
}

// Parses a reply body; kProtocolError naming the call when it is not a JSON object.
Result<Json> ParseReply(std::string_view what, const std::string& body) {
  Json j = ParseJsonBounded(body);
  if (j.is_discarded() || !j.is_object()) {
    return Status::ProtocolError("etcd " + std::string(what) +
                                 ": reply is not a JSON object: " + body.substr(0, 200));
  }
  return j;
}

Result<int64_t> HeaderRevision(const Json& reply) {
  auto it = reply.find("header");
  if (it == reply.end() || !it->is_object()) return int64_t{0};
  return Int64Field(*it, "revision");
}

Result<std::vector<KeyValue>> Kvs(const Json& range_reply) {
  std::vector<KeyValue> out;
  auto it = range_reply.find("kvs");
  if (it == range_reply.end()) return out;
  if (!it->is_array()) return Status::ProtocolError("etcd range reply: 'kvs' is not an array");
  for (const Json& kv : *it) {
    RDKV_ASSIGN_OR_RETURN(KeyValue v, KeyValueFromJson(kv));
    out.push_back(std::move(v));
  }
  return out;
}

}  // namespace

Status StatusFromErrorBody(std::string_view endpoint, std::string_view what, std::string_view body,
                           long http_status) {
  Json j = ParseJsonBounded(body);
  std::string message;
  int64_t grpc = -1;
  if (j.is_object()) {
    const Json* e = &j;
    if (auto it = j.find("error"); it != j.end() && it->is_object()) e = &*it;  // stream form
    if (auto it = e->find("message"); it != e->end() && it->is_string()) message = *it;
    for (const char* name : {"code", "grpc_code"}) {
      if (auto it = e->find(name); it != e->end() && it->is_number_integer()) grpc = *it;
    }
  }
  std::string prefix = "etcd " + std::string(endpoint) + " " + std::string(what) + ": ";
  if (grpc < 0) {
    return Status::ProtocolError(prefix + "HTTP " + std::to_string(http_status) +
                                 " with an unexpected body: " + std::string(body.substr(0, 200)));
  }
  return Status(CodeFromGrpc(grpc), prefix + message + " (gRPC code " + std::to_string(grpc) + ")");
}

Result<std::unique_ptr<EtcdClient>> EtcdClient::Create(EtcdOptions options) {
  if (options.endpoints.empty()) {
    return Status::InvalidArgument("etcd client: no endpoints; give at least one client URL");
  }
  std::string joined;
  for (const std::string& e : options.endpoints) joined += (joined.empty() ? "" : ",") + e;
  RDKV_ASSIGN_OR_RETURN(options.endpoints, ParseEndpoints(joined));
  const bool https = options.endpoints.front().starts_with("https://");
  const bool any_tls =
      !options.ca_file.empty() || !options.cert_file.empty() || !options.key_file.empty();
  if (any_tls && !https) {
    return Status::InvalidArgument(
        "etcd client: TLS files (--etcd_cacert, --etcd_cert, --etcd_key) were given but the "
        "endpoints are http://; write them as https://host:port");
  }
  if (options.cert_file.empty() != options.key_file.empty()) {
    return Status::InvalidArgument(
        "etcd client: a client certificate needs its key and a key its certificate "
        "(--etcd_cert and --etcd_key together)");
  }
  for (const std::string* f : {&options.ca_file, &options.cert_file, &options.key_file}) {
    if (!f->empty() && access(f->c_str(), R_OK) != 0) {
      return Status::InvalidArgument("etcd client: cannot read " + *f + ": " +
                                     std::strerror(errno));
    }
  }
  if (options.request_timeout.count() <= 0) {
    return Status::InvalidArgument("etcd client: request_timeout must be positive");
  }
  return std::unique_ptr<EtcdClient>(new EtcdClient(std::move(options)));
}

EtcdClient::EtcdClient(EtcdOptions options) : options_(std::move(options)) {}
EtcdClient::~EtcdClient() = default;

std::string EtcdClient::current_endpoint() {
  MutexLock l(&mu_);
  return options_.endpoints[current_];
}

std::unique_ptr<internal::HttpConnection> EtcdClient::TakeConnection() {
  {
    MutexLock l(&mu_);
    if (!idle_.empty()) {
      auto c = std::move(idle_.back());
      idle_.pop_back();
      return c;
    }
  }
  return std::make_unique<internal::HttpConnection>(
      internal::HttpTls{options_.ca_file, options_.cert_file, options_.key_file});
}

void EtcdClient::ReturnConnection(std::unique_ptr<internal::HttpConnection> c) {
  MutexLock l(&mu_);
  if (idle_.size() < 8) idle_.push_back(std::move(c));
}

std::string EtcdClient::TransportHint(const std::string& endpoint,
                                      const internal::HttpResponse& r) const {
  const bool https = endpoint.starts_with("https://");
  if (!https && r.error.find("Empty reply") != std::string::npos) {
    return " (does this member serve https? then write the endpoint as https://)";
  }
  if (https && r.failure == internal::HttpResponse::Failure::kBroken &&
      options_.cert_file.empty()) {
    return " (etcd closed the TLS connection: if it runs with --client-cert-auth, give a client "
           "certificate: --etcd_cert and --etcd_key)";
  }
  return "";
}

namespace internal {
std::chrono::milliseconds AttemptBudget(std::chrono::milliseconds remaining, size_t members_left) {
  constexpr std::chrono::milliseconds kMinAttempt{200};
  if (members_left <= 1) return remaining;
  const auto share = remaining / static_cast<int64_t>(members_left);
  return std::max(share, std::min(remaining, kMinAttempt));
}
}  // namespace internal

Result<std::string> EtcdClient::Call(std::string_view path, const std::string& json_body,
                                     bool idempotent) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + options_.request_timeout;
  const size_t n = options_.endpoints.size();
  size_t start;
  {
    MutexLock l(&mu_);
    start = current_;
  }
  std::string tried;
  bool unknown_outcome = false;  // a request was (maybe) sent but got no answer
  for (size_t i = 0; i < n; ++i) {
    const size_t idx = (start + i) % n;
    const std::string& endpoint = options_.endpoints[idx];
    auto remaining = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (remaining.count() <= 0) {
      unknown_outcome = true;
      break;
    }
    // A member that takes the connection or the request and never answers (its host powered
    // off, the process stopped, a disk stalled) must not use the whole budget: each attempt
    // of an idempotent call gets an equal share of what is left, so the other members are
    // still tried in time. A call that is not (PutIf) is never sent twice, so it keeps the
    // whole budget: a slow commit (a leader election, a slow fsync) still succeeds, and one
    // that meets a silent member fails once, after which the next call starts elsewhere.
    const auto attempt = idempotent ? internal::AttemptBudget(remaining, n - i) : remaining;
    auto conn = TakeConnection();
    internal::HttpResponse r = conn->Post(endpoint + std::string(path), json_body, attempt);
    ReturnConnection(std::move(conn));
    if (r.failure != internal::HttpResponse::Failure::kNone) {
      // The next call starts at the member after this one, unless another call has already
      // moved on from it.
      MutexLock l(&mu_);
      if (current_ == idx) current_ = (idx + 1) % n;
    }
    if (r.failure == internal::HttpResponse::Failure::kNone) {
      if (r.http_status == 200) {
        MutexLock l(&mu_);
        current_ = idx;
        return std::move(r.body);
      }
      Status s = StatusFromErrorBody(endpoint, path, r.body, r.http_status);
      // A member without a leader (or stopping) answers UNAVAILABLE: another may serve.
      if (s.Is(StatusCode::kUnavailable) && i + 1 < n) {
        tried += (tried.empty() ? "" : "; ") + endpoint + ": " + s.message();
        continue;
      }
      if (!tried.empty()) s = Status(s.code(), s.message() + "; before it: " + tried);
      MutexLock l(&mu_);
      current_ = idx;
      return s;
    }
    tried += (tried.empty() ? "" : "; ") + endpoint + ": " + r.error + TransportHint(endpoint, r);
    if (r.failure != internal::HttpResponse::Failure::kConnect) {
      unknown_outcome = true;
      // Sent, maybe applied: a retry elsewhere could apply it twice (a PutIf would then see its
      // own write and report a lost race). Let the caller read and decide.
      if (!idempotent) {
        return Status::ConnectionLost("etcd " + endpoint + std::string(path) + ": " + r.error +
                                      "; the request may or may not have applied: read the key "
                                      "to learn its outcome");
      }
    }
  }
  if (unknown_outcome) {
    return Status::TimedOut("etcd " + std::string(path) + ": no answer within " +
                            std::to_string(options_.request_timeout.count()) +
                            " ms (a write may or may not have applied); tried " + tried);
  }
  return Status::Unavailable("etcd unreachable for " + std::string(path) + ": tried " + tried +
                             "; check that etcd runs and that the endpoints are its client URLs");
}

Result<GetResult> EtcdClient::Get(std::string_view key) {
  Json req = {{"key", Base64Encode(key)}};
  RDKV_ASSIGN_OR_RETURN(std::string body, Call("/v3/kv/range", req.dump()));
  RDKV_ASSIGN_OR_RETURN(Json reply, ParseReply("range", body));
  GetResult out;
  RDKV_ASSIGN_OR_RETURN(out.revision, HeaderRevision(reply));
  RDKV_ASSIGN_OR_RETURN(std::vector<KeyValue> kvs, Kvs(reply));
  if (!kvs.empty()) out.kv = std::move(kvs.front());
  return out;
}

Result<RangeResult> EtcdClient::GetPrefix(std::string_view prefix) {
  Json req = {{"key", Base64Encode(prefix.empty() ? std::string_view("\0", 1) : prefix)},
              {"range_end", Base64Encode(internal::PrefixRangeEnd(prefix))}};
  RDKV_ASSIGN_OR_RETURN(std::string body, Call("/v3/kv/range", req.dump()));
  RDKV_ASSIGN_OR_RETURN(Json reply, ParseReply("range", body));
  RangeResult out;
  RDKV_ASSIGN_OR_RETURN(out.revision, HeaderRevision(reply));
  RDKV_ASSIGN_OR_RETURN(out.kvs, Kvs(reply));
  return out;
}

Result<int64_t> EtcdClient::Put(std::string_view key, std::string_view value, int64_t lease) {
  Json req = {{"key", Base64Encode(key)}, {"value", Base64Encode(value)}};
  if (lease != 0) req["lease"] = std::to_string(lease);
  RDKV_ASSIGN_OR_RETURN(std::string body, Call("/v3/kv/put", req.dump()));
  RDKV_ASSIGN_OR_RETURN(Json reply, ParseReply("put", body));
  return HeaderRevision(reply);
}

Result<PutIfResult> EtcdClient::PutIf(std::string_view key, std::string_view value,
                                      int64_t expected_mod_revision, int64_t lease) {
  return PutIfImpl(key, value, expected_mod_revision, nullptr, lease);
}

Result<PutIfResult> EtcdClient::PutIfGuarded(std::string_view key, std::string_view value,
                                             int64_t expected_mod_revision,
                                             const CreateGuard& guard, int64_t lease) {
  if (guard.create_revision <= 0) {
    return Status::InvalidArgument("etcd PutIfGuarded: the guard's create_revision must be > 0");
  }
  return PutIfImpl(key, value, expected_mod_revision, &guard, lease);
}

Result<PutIfResult> EtcdClient::PutIfImpl(std::string_view key, std::string_view value,
                                          int64_t expected_mod_revision, const CreateGuard* guard,
                                          int64_t lease) {
  if (expected_mod_revision < 0) {
    return Status::InvalidArgument("etcd PutIf: expected_mod_revision must be >= 0 (0 = absent)");
  }
  const std::string k = Base64Encode(key);
  // mod_revision == 0 holds exactly when the key does not exist.
  Json compare = Json::array({{{"key", k},
                               {"target", "MOD"},
                               {"result", "EQUAL"},
                               {"mod_revision", std::to_string(expected_mod_revision)}}});
  if (guard != nullptr) {
    compare.push_back({{"key", Base64Encode(guard->key)},
                       {"target", "CREATE"},
                       {"result", "EQUAL"},
                       {"create_revision", std::to_string(guard->create_revision)}});
  }
  return PutOrRead(key, value, lease, std::move(compare));
}

Result<PutIfResult> EtcdClient::PutIfLease(std::string_view key, std::string_view value,
                                           int64_t lease, int64_t expected_lease) {
  if (expected_lease < 0 || lease < 0) {
    return Status::InvalidArgument("etcd PutIfLease: leases are >= 0 (0 = none)");
  }
  // A key that does not exist compares as one with lease 0.
  Json compare = Json::array({{{"key", Base64Encode(key)},
                               {"target", "LEASE"},
                               {"result", "EQUAL"},
                               {"lease", std::to_string(expected_lease)}}});
  return PutOrRead(key, value, lease, std::move(compare));
}

Result<PutIfResult> EtcdClient::PutOrRead(std::string_view key, std::string_view value,
                                          int64_t lease, Json compare) {
  const std::string k = Base64Encode(key);
  Json put = {{"key", k}, {"value", Base64Encode(value)}};
  if (lease != 0) put["lease"] = std::to_string(lease);
  Json req = {{"compare", std::move(compare)},
              {"success", Json::array({{{"request_put", put}}})},
              {"failure", Json::array({{{"request_range", {{"key", k}}}}})}};
  RDKV_ASSIGN_OR_RETURN(std::string body, Call("/v3/kv/txn", req.dump(), /*idempotent=*/false));
  RDKV_ASSIGN_OR_RETURN(Json reply, ParseReply("txn", body));
  PutIfResult out;
  RDKV_ASSIGN_OR_RETURN(out.revision, HeaderRevision(reply));
  auto succeeded = reply.find("succeeded");
  out.succeeded = succeeded != reply.end() && succeeded->is_boolean() && succeeded->get<bool>();
  if (!out.succeeded) {
    auto responses = reply.find("responses");
    if (responses == reply.end() || !responses->is_array() || responses->empty() ||
        !(*responses)[0].is_object() || !(*responses)[0].contains("response_range")) {
      return Status::ProtocolError("etcd txn: a failed PutIf's reply has no range response");
    }
    RDKV_ASSIGN_OR_RETURN(std::vector<KeyValue> kvs, Kvs((*responses)[0]["response_range"]));
    if (!kvs.empty()) out.current = std::move(kvs.front());
  }
  return out;
}

Result<DeleteResult> EtcdClient::Delete(std::string_view key) {
  Json req = {{"key", Base64Encode(key)}};
  RDKV_ASSIGN_OR_RETURN(std::string body, Call("/v3/kv/deleterange", req.dump()));
  RDKV_ASSIGN_OR_RETURN(Json reply, ParseReply("deleterange", body));
  DeleteResult out;
  RDKV_ASSIGN_OR_RETURN(out.revision, HeaderRevision(reply));
  RDKV_ASSIGN_OR_RETURN(out.deleted, Int64Field(reply, "deleted"));
  return out;
}

Result<Lease> EtcdClient::LeaseGrant(int64_t ttl_seconds) {
  if (ttl_seconds <= 0) return Status::InvalidArgument("etcd LeaseGrant: ttl must be positive");
  Json req = {{"TTL", std::to_string(ttl_seconds)}};
  RDKV_ASSIGN_OR_RETURN(std::string body, Call("/v3/lease/grant", req.dump()));
  RDKV_ASSIGN_OR_RETURN(Json reply, ParseReply("lease grant", body));
  if (auto e = reply.find("error"); e != reply.end() && e->is_string() && !e->empty()) {
    return Status::Unavailable("etcd lease grant refused: " + e->get<std::string>());
  }
  Lease out;
  RDKV_ASSIGN_OR_RETURN(out.id, Int64Field(reply, "ID"));
  RDKV_ASSIGN_OR_RETURN(out.ttl_seconds, Int64Field(reply, "TTL"));
  if (out.id == 0 || out.ttl_seconds <= 0) {
    return Status::ProtocolError("etcd lease grant: reply without ID or TTL: " + body);
  }
  return out;
}

Result<int64_t> EtcdClient::LeaseKeepAlive(int64_t id) {
  // The gateway's keepalive is a stream; one request gets one {"result": ...} and the end.
  Json req = {{"ID", std::to_string(id)}};
  RDKV_ASSIGN_OR_RETURN(std::string body, Call("/v3/lease/keepalive", req.dump()));
  // A stream may carry several newline-separated objects: the first decides.
  RDKV_ASSIGN_OR_RETURN(Json reply, ParseReply("lease keepalive", body.substr(0, body.find('\n'))));
  if (reply.contains("error")) return StatusFromErrorBody("", "lease keepalive", body, 200);
  auto result = reply.find("result");
  if (result == reply.end() || !result->is_object()) {
    return Status::ProtocolError("etcd lease keepalive: reply without result: " + body);
  }
  RDKV_ASSIGN_OR_RETURN(int64_t ttl, Int64Field(*result, "TTL"));
  if (ttl <= 0) {
    return Status::NotFound("etcd lease " + std::to_string(id) +
                            " has expired or is unknown: grant a new one");
  }
  return ttl;
}

Status EtcdClient::LeaseRevoke(int64_t id) {
  Json req = {{"ID", std::to_string(id)}};
  auto body = Call("/v3/lease/revoke", req.dump());
  return body.status();
}

}  // namespace rdkv::etcd

// A client of etcd 3.4's v3 JSON gateway (HTTP POST on the client port, libcurl): the control
// plane's store for the cluster map and server registrations (docs/design.md, "Control plane").
//
//   ParseEndpoints("10.0.0.1:2379,10.0.0.2:2379")  the --etcd flag's value -> endpoints
//   EtcdClient   Get, GetPrefix, Put, PutIf (one txn), Delete, LeaseGrant/KeepAlive/Revoke
//   Watch        (watch.h) every event of a key or prefix, in order, across reconnects
//   LeaseKeeper  (lease_keeper.h) a lease kept alive, with a conservative validity deadline
//
// Keys and values are arbitrary bytes (base64 on the wire). Revisions are etcd's store
// revisions: every change gets a new, larger one.
//
// Errors: etcd unreachable on every endpoint -> kUnavailable naming each endpoint and why; no
// answer within request_timeout -> kTimedOut (a write may or may not have applied); etcd's own
// errors -> the matching code (kNotFound for an unknown lease, kInvalidArgument, kUnavailable
// for "no leader", ...) with etcd's message; a reply that cannot be decoded -> kProtocolError.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/util/mutex.h"
#include "rdkv/status.h"

namespace rdkv::etcd {

namespace internal {
class HttpConnection;
struct HttpResponse;

// The time one attempt on one member may take when `remaining` is left of a request's budget
// and `members_left` members (this one included) may still be tried: an equal share, but not
// under 200 ms while that much remains (a healthy member must be able to answer).
std::chrono::milliseconds AttemptBudget(std::chrono::milliseconds remaining, size_t members_left);
}  // namespace internal

struct EtcdOptions {
  // Client URLs of the etcd members, "http://127.0.0.1:2379", "https://10.0.0.1:2379" or
  // "host:port" (http:// is added). Requests go to one of them at a time and fail over to the
  // next on connection errors, and (idempotent calls) on no answer within the attempt's share
  // of request_timeout (internal::AttemptBudget). PutIf is never sent twice: it has the whole
  // request_timeout, and a missing answer is kConnectionLost.
  // A member that failed is tried last by the next request.
  std::vector<std::string> endpoints;
  // Bound on one request, failover to other endpoints included.
  std::chrono::milliseconds request_timeout{2000};
  // TLS for https:// endpoints (docs/security.md "etcd over TLS"): the CA file (PEM) that signed
  // etcd's certificate (empty: the system's CA store), and this process's client certificate
  // and key (PEM, both or neither) for an etcd run with --client-cert-auth. The server's
  // certificate must name the host of the endpoint. Refused with http:// endpoints only.
  std::string ca_file{};
  std::string cert_file{};
  std::string key_file{};
};

// Parses the --etcd flag: comma-separated endpoints, each "host:port", "http://host:port" or
// "https://host:port" (a trailing '/' is dropped). Returns them normalized to
// "http[s]://host:port" (no scheme: http). kInvalidArgument names the bad item: empty list or
// item, missing or non-numeric port, port out of 1..65535, a path, another scheme, or http and
// https mixed.
Result<std::vector<std::string>> ParseEndpoints(std::string_view flag);

// One key as etcd stores it (mvccpb.KeyValue).
struct KeyValue {
  std::string key;
  std::string value;
  int64_t create_revision = 0;  // revision of the put that created the key
  int64_t mod_revision = 0;     // revision of the last change of the key
  int64_t version = 0;          // number of puts since creation (1 after the first)
  int64_t lease = 0;            // lease the key is attached to; 0 = none
};

struct GetResult {
  std::optional<KeyValue> kv;  // nullopt: the key does not exist
  int64_t revision = 0;        // the store's revision when read
};

struct RangeResult {
  std::vector<KeyValue> kvs;  // in key order
  int64_t revision = 0;
};

struct PutIfResult {
  bool succeeded = false;
  int64_t revision = 0;             // the store's revision after the txn (the put's, on success)
  std::optional<KeyValue> current;  // on failure: the key as it is now (nullopt: absent)
};

// A key that must still exist with exactly this create_revision for a guarded PutIf to apply:
// an election key held under the caller's lease (gone or re-created: the caller was deposed).
struct CreateGuard {
  std::string key;
  int64_t create_revision = 0;
};

struct DeleteResult {
  int64_t deleted = 0;  // number of keys deleted (0 or 1)
  int64_t revision = 0;
};

struct Lease {
  int64_t id = 0;
  int64_t ttl_seconds = 0;  // as granted (etcd may raise a small TTL to its minimum)
};

// Thread-safe: any number of threads may call concurrently; each request uses its own HTTP
// connection (pooled). Not copyable.
class EtcdClient {
 public:
  // Checks the options (endpoints as ParseEndpoints accepts them, request_timeout > 0); does not
  // contact etcd. kInvalidArgument on bad options.
  static Result<std::unique_ptr<EtcdClient>> Create(EtcdOptions options);
  ~EtcdClient();
  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;

  Result<GetResult> Get(std::string_view key);
  // Every key that starts with `prefix` ("" = every key).
  Result<RangeResult> GetPrefix(std::string_view prefix);
  // Returns the put's revision. `lease` 0 = none; an unknown lease is kNotFound.
  Result<int64_t> Put(std::string_view key, std::string_view value, int64_t lease = 0);
  // One transaction: if the key's mod_revision is `expected_mod_revision` (0 = the key must not
  // exist) put the value, else read the key. Exactly one of racing PutIfs on the same expected
  // revision succeeds.
  Result<PutIfResult> PutIf(std::string_view key, std::string_view value,
                            int64_t expected_mod_revision, int64_t lease = 0);
  // PutIf that also requires `guard` (one transaction comparing both): fails, like a lost race,
  // when the guard key is gone or was created again.
  Result<PutIfResult> PutIfGuarded(std::string_view key, std::string_view value,
                                   int64_t expected_mod_revision, const CreateGuard& guard,
                                   int64_t lease = 0);
  // One transaction: if the key is attached to lease `expected_lease` (0: the key is absent or
  // has no lease) put the value under `lease`, else read the key. Never sent twice (a missing
  // answer is kConnectionLost). A write that must not land after a newer one of the same
  // writer under another lease (a server's registration) compares the lease it replaces.
  Result<PutIfResult> PutIfLease(std::string_view key, std::string_view value, int64_t lease,
                                 int64_t expected_lease);
  Result<DeleteResult> Delete(std::string_view key);

  Result<Lease> LeaseGrant(int64_t ttl_seconds);
  // Renews the lease once; returns the TTL it now has. kNotFound when it expired or is unknown.
  Result<int64_t> LeaseKeepAlive(int64_t id);
  // kNotFound when the lease is unknown (expired or already revoked).
  Status LeaseRevoke(int64_t id);

  // Low level: POSTs `json_body` to `path` ("/v3/kv/range") with failover; returns the reply's
  // JSON text (HTTP 200) or the error status. Fails over on connection refused and on etcd's
  // UNAVAILABLE; after a broken connection or a timeout (sent, outcome unknown) only when
  // `idempotent`, else kConnectionLost. Used by the calls above.
  Result<std::string> Call(std::string_view path, const std::string& json_body,
                           bool idempotent = true);

  const EtcdOptions& options() const { return options_; }
  // The endpoint the next request goes to first (the last one that answered).
  std::string current_endpoint();

 private:
  // A likely cause to add to a transport error of `endpoint` (a TLS mismatch), or "".
  std::string TransportHint(const std::string& endpoint, const internal::HttpResponse& r) const;

 public:
 private:
  explicit EtcdClient(EtcdOptions options);
  Result<PutIfResult> PutIfImpl(std::string_view key, std::string_view value,
                                int64_t expected_mod_revision, const CreateGuard* guard,
                                int64_t lease);
  // The transaction of PutIf and PutIfLease: `compare` (a JSON array), then put or read.
  Result<PutIfResult> PutOrRead(std::string_view key, std::string_view value, int64_t lease,
                                nlohmann::json compare);
  std::unique_ptr<internal::HttpConnection> TakeConnection();
  void ReturnConnection(std::unique_ptr<internal::HttpConnection> c);

  const EtcdOptions options_;
  Mutex mu_;
  size_t current_ GUARDED_BY(mu_) = 0;
  std::vector<std::unique_ptr<internal::HttpConnection>> idle_ GUARDED_BY(mu_);
};

// The Status for an etcd error body ({"error": ..., "code": <gRPC code>, "message": ...}, or a
// stream's {"error": {"grpc_code", "message"}}) from `endpoint` for `what`; used by the client
// and the watch.
Status StatusFromErrorBody(std::string_view endpoint, std::string_view what, std::string_view body,
                           long http_status);

}  // namespace rdkv::etcd

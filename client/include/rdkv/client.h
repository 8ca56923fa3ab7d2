// rdkv client library: the API applications use.
//
//   #include <rdkv/client.h>
//   rdkv::ClientOptions opts;
//   opts.seed = "10.0.0.5:7400";
//   auto client = rdkv::Client::Connect(opts);
//   if (!client.ok()) { ... client.status().ToString() ... }
//   auto put = (*client)->Put("user:1", "alice");        // Result<uint64_t>: the new version
//   auto got = (*client)->Get("user:1");                 // Result<GetResult>, kNotFound if absent
//
// CMake:  find_package(rdkv REQUIRED)  +  target_link_libraries(app PRIVATE rdkv::client)
//
// GETs are resolved by the client itself with one-sided READs of the server's registered
// region (the server's CPU does nothing for them). Every item read is checked (key, version,
// checksum, liveness); a torn or reused read is retried and never returned.
// Writes (Put/Insert/Delete/Cas) are requests to the server that owns the key.
// Operator calls (snapshots, the servers of a cluster, moving shards) are in rdkv/admin.h.
//
// Ownership: Connect returns the only owner of the Client; destroying it closes its
// connections and frees its registered buffers. It must not be destroyed while another
// thread is inside one of its calls. Every result owns its data (no views into the client).
// Thread-safety: a Client is thread-safe; share one per process (it shares its
// connections_per_server connections to each server between threads, and keeps a small pool of
// registered READ buffers, about one per concurrently calling thread). Errors: every call returns a
// Status or Result; see rdkv/status.h for the codes. kTimedOut and kConnectionLost on a write mean
// the outcome is unknown (it may have applied). A broken connection is replaced by the next call
// (which re-reads the server's region header); if the server cannot be reached that call fails with
// kUnavailable naming it.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "rdkv/status.h"

namespace rdkv {

// TLS to the servers (tcp transport only; docs/security.md "TLS (tcp)"). File paths, read by
// Client::Connect and by every reconnect (the client keeps copies of the strings, not the
// files). Errors: an unreadable or mismatched file is kInvalidArgument; a server that fails
// verification (a CA that did not sign it, a certificate for another name) or that does not
// speak TLS is kUnavailable with the reason; TLS with transport "verbs" is kInvalidArgument.
struct ClientTlsOptions {
  // PEM CA bundle that signed the servers' certificates. Setting it turns TLS on. Each server is
  // verified by chain and by the host (name or IP address) of its address.
  std::string ca_file;
  // This client's certificate and key (PEM), for servers that require one
  // (--tls_require_client_cert). Both or neither.
  std::string cert_file;
  std::string key_file;
};

struct ClientOptions {
  // A server to contact first, "host:port" (IPv6: "[::1]:7400"). Required.
  std::string seed;
  // "auto" (verbs when an RDMA device is active, else tcp), "verbs" or "tcp".
  std::string transport = "auto";
  // verbs only: the RDMA device to use ("mlx5_0", "rxe0"); empty = the first active one.
  std::string device;
  // The servers' data secret (their --auth_token_file); empty for servers without one. Never
  // sent: the handshake proves it (docs/security.md).
  std::string auth_token;
  // The servers' admin secret (their --admin_token_file). When set, every connection of this
  // client authenticates with it as the admin role, which admin requests (rdkv::Admin: moves,
  // snapshots, map installs) need. Empty: the data role, which a server without an admin secret
  // upgrades to admin for loopback peers only.
  std::string admin_token;
  ClientTlsOptions tls;  // empty: plaintext
  std::chrono::milliseconds connect_timeout{5000};
  // Deadline for one write request, and for one GET including its retries.
  std::chrono::milliseconds op_timeout{2000};
  // A one-sided GET attempt slower than this restarts from the index (the server does not
  // reuse freed memory for at least twice this long; see docs/design.md). Must be below the
  // servers' grace period / 2.
  std::chrono::milliseconds read_deadline{40};
  // Attempts for one GET before giving up with kCorruption (never a wrong value).
  int max_get_attempts = 16;
  // Remembers item locations so a repeated GET can take one READ. 0 disables.
  size_t location_cache_entries = 65536;
  // With the location cache: also READ the index bucket that held the key in the same batch as
  // the cached item (one round trip, two READs) and accept the item only if a slot of it still
  // points at it.
  // Off: a cached GET is one READ, linearizable only if the server never lets an item look
  // LIVE while no slot points at it (see docs/design.md, "cache path").
  bool cache_checks_slot = false;
  // Most READs one call posts at once (MultiGet batches; never above the connection's limit).
  uint32_t max_batch_reads = 256;
  // READs in flight at once on one connection, shared by the threads that use it.
  uint32_t max_outstanding_reads = 1024;
  // Connections to each server, opened as threads first need them: threads are numbered in the
  // order they first use any Client of the process, and thread i uses connection
  // i % connections_per_server. With one, every thread shares one socket (tcp) or queue pair
  // (verbs), which one server NIC thread serves (tcp); more let a multi-threaded client spread
  // over the server's NIC threads (accepted connections go to them round robin). Each costs a
  // session on the server (its --max_connections); a connection the server refuses is not
  // an error while another one to it works (that one is used). 1..64.
  uint32_t connections_per_server = 2;
  // tcp: how long a thread waiting for an answer polls before it sleeps in the kernel
  // (docs/transport-tcp.md "Polling before sleeping"). Polling keeps an idle CPU from being
  // put to sleep between a request and its answer, which on small VMs costs more than the
  // round trip itself; it costs CPU only while an answer is awaited. 0: sleep at once.
  std::chrono::microseconds busy_poll{50};
  // Cluster: the ownership lease of one-sided GETs (docs/design.md "Stale maps and one-sided
  // GETs"). Must not exceed the servers' --ownership_lease (default 100 ms).
  std::chrono::milliseconds ownership_lease{100};
};

struct GetResult {
  std::string value;
  uint64_t version = 0;
};

// Counters for benchmarks and monitoring; totals since Connect.
struct ClientStats {
  uint64_t gets = 0;             // keys looked up (a MultiGet of n keys counts n)
  uint64_t get_reads = 0;        // one-sided READs posted by GETs (reads per GET = get_reads/gets)
  uint64_t get_round_trips = 0;  // batches of READs GETs posted and waited for (one each)
  uint64_t get_retries = 0;      // attempts that failed a check or the deadline and were retried
  uint64_t cache_hits = 0;       // GETs answered by one READ from the location cache
  uint64_t torn_reads = 0;       // items that failed their checksum
  uint64_t writes = 0;
  uint64_t errors = 0;        // failed calls (kNotFound, kAlreadyExists and
                              // kVersionMismatch are answers, not errors)
  uint64_t cache_misses = 0;  // cached locations that no longer held the key (fell back)
  uint64_t slow_reads = 0;    // attempts restarted because they exceeded read_deadline
  uint64_t reconnects = 0;    // connections replaced after a failure
  // GETs answered with an item that a write replaced (or just linked) between the GET's slot
  // READ and its item READ: the value of the key at the slot READ (docs/design.md "index path,
  // found"); high on keys rewritten faster than a round trip.
  uint64_t retired_accepts = 0;
};

// The client's counters for an application's own metrics (docs/operations.md "Metrics"): a
// registry hook, no HTTP server. The library links no metrics library; an application feeds
// these into its own registry (e.g. a prometheus-cpp Collectable that returns them at scrape
// time) or appends the text form to what its /metrics already serves.
//
// One counter of ClientStats, named by Prometheus conventions: rdkv_client_<what>_total, a
// monotonic count since Connect.
struct MetricSample {
  std::string name;  // e.g. "rdkv_client_gets_total"
  std::string help;  // one line, for # HELP
  double value = 0;  // every sample is a counter
};
// One sample per ClientStats field, in a fixed order. Thread-safe (a pure function).
std::vector<MetricSample> ClientMetricSamples(const ClientStats& stats);
// The same samples in the Prometheus text exposition format (version 0.0.4): # HELP, # TYPE
// counter and the value of each. `labels` (e.g. `app="checkout"`, without braces) is put on
// every sample when not empty. Thread-safe (a pure function).
std::string ClientMetricsText(const ClientStats& stats, std::string_view labels = {});

class Client {
 public:
  // Connects to the seed (and, in a cluster, lazily to the other servers).
  // kInvalidArgument for bad options (e.g. a malformed seed), kUnavailable /
  // kPermissionDenied / kTimedOut when the server cannot be used, kProtocolError when its
  // region header is not one this library understands.
  static Result<std::unique_ptr<Client>> Connect(const ClientOptions& options);
  virtual ~Client() = default;

  // kNotFound when absent. kInvalidArgument for an empty or oversize key. kCorruption after
  // max_get_attempts failed attempts (a value is never returned unchecked); kTimedOut when
  // op_timeout passed; kRemoteAccessError / kConnectionLost when a READ failed (the next
  // call reconnects).
  virtual Result<GetResult> Get(std::string_view key) = 0;
  // One result per key, in order (same errors as Get, per key). READs of all keys are posted
  // in batches of up to max_batch_reads.
  virtual std::vector<Result<GetResult>> MultiGet(std::span<const std::string_view> keys) = 0;

  // Upsert. Returns the key's new version. Keys are 1..1024 bytes; values at most the
  // server's max_value_bytes (kInvalidArgument otherwise, checked before sending).
  virtual Result<uint64_t> Put(std::string_view key, std::string_view value) = 0;
  // kAlreadyExists when present. Returns the new version.
  virtual Result<uint64_t> Insert(std::string_view key, std::string_view value) = 0;
  // kNotFound when absent.
  virtual Status Delete(std::string_view key) = 0;
  // Replaces only when the current version equals expected_version: kVersionMismatch otherwise
  // (its message names the current version), kNotFound when absent. Returns the new version.
  virtual Result<uint64_t> Cas(std::string_view key, uint64_t expected_version,
                               std::string_view value) = 0;

  // The server's statistics as a JSON object. In a cluster: {"servers": n, "reachable": k,
  // "total": {every numeric field summed over the reachable servers}, "per_server": [{"id",
  // "address", "stats" or "error"}, ...]}; an error only when no server is reachable.
  virtual Result<std::string> Stats() = 0;

  // Round trip to the seed server.
  virtual Status Ping() = 0;

  virtual ClientStats stats() const = 0;
  // The largest value the connected server accepts (from its region header).
  virtual uint64_t max_value_bytes() const = 0;
};

}  // namespace rdkv

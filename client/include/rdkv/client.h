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
// GETs are resolved by the client itself with one-sided READs of the server's registered
// region (the server's CPU does nothing for them). Every item read is checked (key, version,
// checksum, liveness); a torn or reused read is retried and never returned.
// Writes (Put/Insert/Delete/Cas) are requests to the server that owns the key.
//
// Thread-safety: a Client is thread-safe; share one per process (it shares one connection per
// server between threads). Results own their data.
// Errors: every call returns a Status or Result; see rdkv/status.h for the codes. kTimedOut
// and kConnectionLost on a write mean the outcome is unknown (it may have applied).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "rdkv/status.h"

namespace rdkv {

struct ClientOptions {
  // A server to contact first, "host:port". Required.
  std::string seed;
  // "auto" (verbs when an RDMA device is active, else tcp), "verbs" or "tcp".
  std::string transport = "auto";
  // Must match the servers' --auth_token.
  std::string auth_token;
  std::chrono::milliseconds connect_timeout{5000};
  // Deadline for one write request, and for one GET including its retries.
  std::chrono::milliseconds op_timeout{2000};
  // A one-sided GET attempt slower than this restarts from the index (the server does not
  // reuse freed memory for at least twice this long; see docs/design.md).
  std::chrono::milliseconds read_deadline{40};
  // Attempts for one GET before giving up with kCorruption (never a wrong value).
  int max_get_attempts = 16;
  // Remembers item locations so a repeated GET can take one READ. 0 disables.
  size_t location_cache_entries = 65536;
};

struct GetResult {
  std::string value;
  uint64_t version = 0;
};

// Counters for benchmarks and monitoring; totals since Connect.
struct ClientStats {
  uint64_t gets = 0;
  uint64_t get_reads = 0;          // one-sided READs posted by GETs (reads per GET = get_reads/gets)
  uint64_t get_retries = 0;        // attempts that failed a check and were retried
  uint64_t cache_hits = 0;         // GETs answered by one READ from the location cache
  uint64_t torn_reads = 0;         // items that failed their checksum
  uint64_t writes = 0;
  uint64_t errors = 0;
};

class Client {
 public:
  // Connects to the seed (and, in a cluster, lazily to the other servers).
  // kInvalidArgument for bad options, kUnavailable / kPermissionDenied / kTimedOut otherwise.
  static Result<std::unique_ptr<Client>> Connect(const ClientOptions& options);
  virtual ~Client() = default;

  // kNotFound when absent.
  virtual Result<GetResult> Get(std::string_view key) = 0;
  // One result per key, in order. READs of all keys are posted in batches.
  virtual std::vector<Result<GetResult>> MultiGet(std::span<const std::string_view> keys) = 0;

  // Upsert. Returns the key's new version.
  virtual Result<uint64_t> Put(std::string_view key, std::string_view value) = 0;
  // kAlreadyExists when present. Returns the new version.
  virtual Result<uint64_t> Insert(std::string_view key, std::string_view value) = 0;
  // kNotFound when absent.
  virtual Status Delete(std::string_view key) = 0;
  // Replaces only when the current version equals expected_version: kVersionMismatch otherwise,
  // kNotFound when absent. Returns the new version.
  virtual Result<uint64_t> Cas(std::string_view key, uint64_t expected_version,
                               std::string_view value) = 0;

  // The server's statistics as a JSON object (per server; "all" in a cluster).
  virtual Result<std::string> Stats() = 0;
  // Round trip to the seed server.
  virtual Status Ping() = 0;

  virtual ClientStats stats() const = 0;
};

}  // namespace rdkv

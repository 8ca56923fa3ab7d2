// The request handler: decodes a two-sided request, applies it to the Store, hands writes to
// the persister (when the server persists), encodes the response. Bad input gets an error
// response; it never takes the server down.
//
// A request goes through steps of one job each:
//   Decode    (service.cc)        frame and limits; kProtocolError / kInvalidArgument
//   Dispatch  (service.cc)        one switch over the ops, every op by name, no default: an op
//                                 with no handler is answered kNotSupported, never applied
//   writes    (service_write.cc)  Admit (backpressure; refused while the disk fails), the
//                                 ownership check, count, apply to the store, enqueue for
//                                 RocksDB, answer now or once durable
//   queries   (service.cc)        STATS, PING, CLUSTER_MAP
//   admin     (service_admin.cc)  SNAPSHOT, INSTALL_MAP, SHARD_SCAN, DROP_SHARD (IMPORT is a
//                                 write whose ownership check and apply are its own)
//
// Writers of one key hold a key-stripe lock across apply + enqueue, so RocksDB receives each
// key's writes in version order. In sync mode the reply is deferred until the write's group is
// in the WAL and synced (docs/persistence.md).
//
// Thread-safety: Handle() runs on many worker threads at once.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/kv/wire.h"
#include "common/transport/transport.h"
#include "common/util/mutex.h"
#include "server/cluster_state.h"
#include "server/persistence/persister.h"
#include "server/request_metrics.h"
#include "server/store.h"

namespace rdkv::server {

struct OpCounters {
  std::atomic<uint64_t> puts{0}, inserts{0}, deletes{0}, cas{0}, stats{0}, pings{0};
  std::atomic<uint64_t> snapshots{0};
  std::atomic<uint64_t> wrong_owner{0}, map_changes{0}, imports{0};
  std::atomic<uint64_t> errors{0}, protocol_errors{0}, out_of_space{0}, io_errors{0};
};

class Service {
 public:
  // `persister` may be null (durability=none); it must outlive the Service's last Handle.
  Service(Store* store, kv::WireLimits limits, persistence::Persister* persister = nullptr)
      : store_(store), limits_(limits), persister_(persister) {}

  // Handles one request. Returns true when `*response` (overwritten) holds the answer, to be
  // sent now. Returns false when the answer is deferred (a sync-mode write waiting for its
  // WAL sync, a snapshot): the Service has then taken `*reply` and answers through it, once,
  // from another thread. Appends nothing to logs on the fast path; a malformed request is
  // logged (rate-limited) and answered with kProtocolError.
  bool Handle(std::span<const uint8_t> request, std::vector<uint8_t>* response,
              transport::ReplyHandle* reply);
  // Blocking form (tests, benchmarks): waits for a deferred answer.
  void Handle(std::span<const uint8_t> request, std::vector<uint8_t>* response);
  // Blocking, for a request that is already decoded: what Handle does after decoding. Tests
  // use it for requests no decoder lets through (an op number with no handler).
  void HandleDecoded(const kv::Request& request, std::vector<uint8_t>* response);

  // Whether Dispatch has a handler for `op`; false for a number that is no op. Every op of
  // kv::kOpTable has one (tests check it).
  static bool HasHandler(kv::Op op);

  // Cluster mode: ownership checks on writes, map requests, shard moves. Null = standalone.
  // Set before the first Handle; `cluster` must outlive the Service.
  void set_cluster(ClusterState* cluster) { cluster_ = cluster; }

  const OpCounters& counters() const { return counters_; }
  // Every answered request by op and result, with its latency (the Prometheus exporter's).
  RequestMetricsSnapshot request_metrics() const { return request_metrics_.Snapshot(); }
  // The stats body: JSON with items, bytes, free space, ops by type, errors.
  std::string StatsJson() const;

  // A copy into this server (a DROP_SHARD with a version floor, then IMPORTs) counts as active
  // until this long after its last request: another copy of the same shard is refused
  // (kBusy) meanwhile, so two movers cannot interleave their drops and imports.
  static constexpr std::chrono::milliseconds kCopyQuiet{3000};

 private:
  // Sends an answer later, from any thread, exactly once.
  using Deliver = std::function<void(std::span<const uint8_t> response)>;
  // Where one request's answer goes: into *response now, or through the Deliver that defer()
  // makes (taking the transport's reply handle) later. Handlers return the Exchange's result:
  // true when answered now, false when deferred. `op` (0 until decoded) and `received` are
  // what the answer is recorded under in request_metrics_.
  struct Exchange {
    std::vector<uint8_t>* response;
    const std::function<Deliver()>* defer;
    uint8_t op = 0;
    std::chrono::steady_clock::time_point received = std::chrono::steady_clock::now();
  };

  bool HandleImpl(std::span<const uint8_t> request, std::vector<uint8_t>* response,
                  const std::function<Deliver()>& defer);
  // The decoded request's handler.
  bool Dispatch(const kv::Request& r, Exchange ex);

  // Encodes the answer into ex.response, counting an error; returns true.
  bool AnswerNow(Exchange ex, const Status& status, uint64_t version = 0,
                 std::string_view body = {});
  // A Deliver that encodes (counting an error) and sends a deferred answer.
  std::function<void(const Status&, uint64_t, std::string_view)> AnswerLater(Exchange ex);
  void CountError(const Status& s);
  // Records one answer (any result) in request_metrics_.
  void RecordAnswer(uint8_t op, std::chrono::steady_clock::time_point received, StatusCode result);
  void CountWrite(kv::Op op);

  // --- writes (service_write.cc): PUT, INSERT, CAS, DELETE, IMPORT ---
  bool HandleWrite(const kv::Request& r, Exchange ex);
  // Applies a write to the store; *version is the new version, or the current one for
  // kVersionMismatch / kAlreadyExists. kInternal for an op that is no write.
  Status ApplyToStore(const kv::Request& r, uint64_t* version);
  // Hands an applied write to the persister and answers now, or once it is durable (sync
  // mode, IMPORT). The caller holds the key's stripe.
  bool Persist(const kv::Request& r, uint64_t version, Exchange ex);

  // --- queries and admin (service.cc, service_admin.cc) ---
  bool HandleStats(const kv::Request& r, Exchange ex);
  bool HandlePing(const kv::Request& r, Exchange ex);
  bool HandleMapFetch(const kv::Request& r, Exchange ex);
  bool HandleSnapshot(const kv::Request& r, Exchange ex);
  bool HandleMapInstall(const kv::Request& r, Exchange ex);
  bool HandleShardScan(const kv::Request& r, Exchange ex);
  bool HandleDropShard(const kv::Request& r, Exchange ex);
  // The drop itself: deletes (and persists the deletes of) every item of `shard`; *dropped
  // counts them.
  Status DropShard(uint32_t shard, uint64_t version_floor, uint64_t* dropped);
  // kInvalidArgument for a shard this server's map does not have.
  Status CheckShardInRange(uint32_t shard) const;
  // kNotSupported when standalone.
  Status RequireCluster(std::string_view what) const;

  // Notes copy activity on `shard` now; with `begin`, first refuses (kBusy) while another
  // copy of it is active.
  Status NoteCopy(uint32_t shard, bool begin) EXCLUDES(copies_mu_);

  // The stripe writers of `key` hold across apply + enqueue.
  Mutex* KeyStripe(std::string_view key);

  Store* store_;
  kv::WireLimits limits_;
  persistence::Persister* persister_;
  ClusterState* cluster_ = nullptr;
  OpCounters counters_;
  RequestMetrics request_metrics_;
  static constexpr size_t kKeyStripes = 1024;
  // Serialize writers of one key across the store and the persister; guard no member.
  std::array<Mutex, kKeyStripes> key_stripes_;

  Mutex copies_mu_;
  // When each shard last saw a copy into this server.
  std::map<uint32_t, std::chrono::steady_clock::time_point> copy_seen_ GUARDED_BY(copies_mu_);
};

}  // namespace rdkv::server

// The request handler: decodes a two-sided request, applies it to the Store, hands writes to
// the persister (when the server persists), encodes the response. Bad input gets an error
// response; it never takes the server down.
//
// With a persister, a write is: Admit (backpressure; refused while the disk fails), apply to
// the store, enqueue for RocksDB, reply. Writers of one key hold a key-stripe lock across
// apply + enqueue, so RocksDB receives each key's writes in version order. In sync mode the
// reply is deferred until the write's group is in the WAL and synced (docs/persistence.md).
//
// Thread-safety: Handle() runs on many worker threads at once.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <map>
#include <cstdint>
#include <functional>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "common/kv/wire.h"
#include "common/transport/transport.h"
#include "server/cluster_state.h"
#include "server/persistence/persister.h"
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

  // Cluster mode: ownership checks on writes, map requests, shard moves. Null = standalone.
  // Set before the first Handle; `cluster` must outlive the Service.
  void set_cluster(ClusterState* cluster) { cluster_ = cluster; }

  const OpCounters& counters() const { return counters_; }
  // The stats body: JSON with items, bytes, free space, ops by type, errors.
  std::string StatsJson() const;

 private:
  using Deliver = std::function<void(std::span<const uint8_t> response)>;
  bool HandleImpl(std::span<const uint8_t> request, std::vector<uint8_t>* response,
                  const std::function<Deliver()>& defer);
  void CountError(const Status& s);
  // Admin ops of shard moves (kClusterMap, kShardScan, kDropShard); never deferred.
  Status HandleCluster(const kv::Request& r, uint64_t* version, std::string* body);

  Store* store_;
  kv::WireLimits limits_;
  persistence::Persister* persister_;
  ClusterState* cluster_ = nullptr;
  OpCounters counters_;
  static constexpr size_t kKeyStripes = 1024;
  std::array<std::mutex, kKeyStripes> key_stripes_;

 public:
  // A copy into this server (a DROP_SHARD with a version floor, then IMPORTs) counts as active
  // until this long after its last request: another copy of the same shard is refused
  // (kBusy) meanwhile, so two movers cannot interleave their drops and imports.
  static constexpr std::chrono::milliseconds kCopyQuiet{3000};

 private:
  // Notes copy activity on `shard` at `now`; with `begin`, first refuses (kBusy) while
  // another copy of it is active.
  Status NoteCopy(uint32_t shard, bool begin);
  std::mutex copies_mu_;
  std::map<uint32_t, std::chrono::steady_clock::time_point> copy_seen_;  // under copies_mu_
};

}  // namespace rdkv::server

// The failover coordinator (kvcoord; docs/design.md "Failover"). Any number of kvcoord
// processes may run for one cluster; one at a time is elected through etcd and acts:
//
//   * Election: the key /rdkv/<cluster>/coordinator is created under this process's etcd lease
//     (a PutIf on "absent"); its create_revision identifies the term. Every map change the
//     coordinator commits is one etcd transaction that also compares that create_revision, so a
//     deposed coordinator (its lease expired, the key gone or re-created by the next one)
//     changes nothing.
//   * Decisions (PlanFailover, coordinator/plan.h): a server whose registration is gone (lease
//     expired) or that restarted without durable data leaves its replica sets; its shards get
//     an in-sync backup as primary; restarted servers are admitted.
//   * Fast detection (tcp clusters, `probe_refused`): a server whose port refuses a TCP
//     connection has no process; its etcd lease is revoked at once instead of waiting for the
//     TTL, so the decision above follows within a probe period.
//   * Re-replication (NextReplicaTask): every replica missing is added in one task
//     (rdkv::Admin::AddReplicas: two map changes, the copies side by side in between) until
//     every shard has the map's replication_factor replicas again.
//   * Events: each decision and copy is logged and appended to /rdkv/<cluster>/events/
//     (`kvcli cluster events`).
//   * Metrics: with CoordinatorOptions::metrics_port, Prometheus /metrics (leadership, terms,
//     failovers, promotions, decision latency, re-replications, stranded shards, map epoch;
//     docs/operations.md "Metrics").
//
// Thread-safety: Start/Stop from one thread; the coordinator runs on its own threads; stats()
// and metrics_port() from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/etcd/etcd_client.h"
#include "common/etcd/lease_keeper.h"
#include "common/metrics/metrics_http.h"
#include "common/util/histogram.h"
#include "common/util/mutex.h"
#include "coordinator/plan.h"
#include "rdkv/status.h"

namespace rdkv::coordinator {

// Where one committed decision's time went (also in the log line "committed map epoch ...").
// Detection by lease expiry: the registration's absence is seen by the read that starts the
// round, so read + plan + commit is the time from "expiry seen" to "map committed".
struct DecisionTiming {
  uint64_t epoch = 0;            // the committed map's
  std::vector<uint32_t> failed;  // servers taken out of replica sets (empty: admissions only)
  size_t registrations = 0;      // registrations read
  double read_ms = 0;            // the registrations and the map read from etcd
  double plan_ms = 0;            // probes (when on) and PlanFailover
  double commit_ms = 0;          // the guarded transaction
  double total_ms() const { return read_ms + plan_ms + commit_ms; }
};

struct CoordinatorOptions {
  etcd::EtcdOptions etcd;
  std::string cluster_name = "rdkv";
  std::string name;  // this process in logs and the election key (default host:pid)
  int64_t lease_ttl_seconds = 2;
  std::chrono::milliseconds poll_interval{50};
  // Probe each server's address with a TCP connect this often (0: never); a refused connection
  // counts as a dead process (only for the tcp transport; see the header comment).
  std::chrono::milliseconds probe_interval{100};
  std::chrono::milliseconds probe_timeout{200};
  bool rereplicate = true;
  // How the catch-up copies reach the servers (rdkv::ClientOptions).
  std::string transport = "tcp";
  std::string auth_token;
  std::string admin_token;
  // TLS to the servers (tcp; rdkv::ClientOptions::tls): PEM files; ca_file empty = plaintext.
  std::string tls_ca_file;
  std::string tls_cert_file;
  std::string tls_key_file;
  // Called on the coordinator's thread after each committed decision (benchmarks, tests); must
  // not block for long or call back into the Coordinator.
  std::function<void(const DecisionTiming&)> on_decision;
  // Prometheus /metrics (docs/operations.md "Metrics", kvcoord): served on
  // metrics_host:metrics_port when set (0 picks a free port, see Coordinator::metrics_port()).
  // Unset: no HTTP server.
  std::string metrics_host = "127.0.0.1";
  std::optional<uint16_t> metrics_port;
};

struct CoordinatorStats {
  bool leader = false;
  uint64_t terms = 0;           // times elected
  uint64_t maps_committed = 0;  // failover decisions committed
  uint64_t servers_failed = 0;  // servers taken out of replica sets
  uint64_t shards_promoted = 0;
  uint64_t probe_revocations = 0;  // leases revoked after a refused probe
  uint64_t replicas_added = 0;     // replicas added (one per shard and server), copies done
  uint64_t replica_errors = 0;
  DecisionTiming last_decision;  // the newest committed decision
  bool replica_running = false;  // a catch-up copy is under way
  // What the leader's latest round read (0 before its first round, and on a process that was
  // never the leader): the map's epoch, shards with no available in-sync replica (kept on
  // their primary), shards with fewer replicas (in sync and joining) than the map's
  // replication_factor.
  uint64_t map_epoch = 0;
  uint64_t stranded_shards = 0;
  uint64_t under_replicated_shards = 0;
  // Seconds from a round's first etcd read to its map committed, for rounds that committed a
  // failover decision or admission (bounds AtomicHistogram::LatencySecondsBounds).
  HistogramSnapshot decision_seconds;
  // Seconds per catch-up copy (AddReplica), finished or failed.
  HistogramSnapshot rereplication_seconds;
};

// The coordinator's Prometheus families (docs/operations.md "Metrics"): rdkv_coordinator_*.
std::vector<prometheus::MetricFamily> CoordinatorMetricFamilies(const CoordinatorStats& stats);

class Coordinator {
 public:
  static Result<std::unique_ptr<Coordinator>> Start(CoordinatorOptions options);
  ~Coordinator();  // Stop()
  // Leaves the election (revokes the lease) and joins the threads. Idempotent.
  void Stop();
  CoordinatorStats stats() const EXCLUDES(mu_);
  // The port /metrics is served on; 0 when CoordinatorOptions::metrics_port was not set.
  uint16_t metrics_port() const;
  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

 private:
  explicit Coordinator(CoordinatorOptions options, std::unique_ptr<etcd::EtcdClient> client);
  void Run();
  bool Campaign();  // true when this process holds the election key
  void Step();      // one round as the leader
  // Revokes the lease of every probed server that refuses connections; returns their ids.
  std::vector<uint32_t> Probe(const std::map<uint32_t, Registration>& regs,
                              const std::map<uint32_t, int64_t>& leases);
  void StartReplicaTask(const ReplicaTask& task, const std::map<uint32_t, Registration>& regs);
  void Event(const std::string& kind, const std::string& text);

  const CoordinatorOptions options_;
  const std::unique_ptr<etcd::EtcdClient> client_;
  const std::string election_key_;
  std::atomic<bool> stopping_{false};
  std::unique_ptr<etcd::LeaseKeeper> lease_;  // Run's thread only
  int64_t term_revision_ = 0;                 // Run's thread only; 0: not the leader
  std::chrono::steady_clock::time_point next_probe_{};
  std::thread run_thread_;

  mutable Mutex mu_;
  CoordinatorStats stats_ GUARDED_BY(mu_);
  AtomicHistogram decision_seconds_{AtomicHistogram::LatencySecondsBounds()};
  AtomicHistogram rereplication_seconds_{RereplicationBounds()};
  static std::vector<double> RereplicationBounds() {
    return {0.01, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600};
  }
  std::thread replica_thread_ GUARDED_BY(mu_);
  std::atomic<bool> replica_running_{false};
  // Last: destroyed first, while everything a scrape reads is still there.
  std::unique_ptr<metrics::MetricsHttp> metrics_http_;  // null unless metrics_port is set
};

}  // namespace rdkv::coordinator

// kvserver as a library: the region, the store, the request handler and the listener.
// kvserver's main() is a thin shell around this; tests embed it in-process.
//
// Thread-safety: Start/Stop from one thread; stats() and PauseWorkers() from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/cluster/cluster_map.h"
#include "common/kv/admin_wire.h"
#include "common/kv/layout.h"
#include "common/kv/limits.h"
#include "common/transport/transport.h"
#include "rdkv/status.h"
#include "server/persistence/persister.h"
#include "server/request_metrics.h"

namespace rdkv::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 7400;  // 0: pick a free port (see Server::port())
  transport::TransportKind transport = transport::TransportKind::kTcp;
  std::string device;       // verbs device name; empty = first active
  std::string auth_token;   // the data secret (docs/security.md); empty: open data access
  std::string admin_token;  // the admin secret; empty: admin ops from loopback only
  // TLS on the tcp transport (docs/security.md "TLS (tcp)"): cert_file+key_file turn it on for
  // the listener; ca_file verifies the servers this one connects to (replication), which then
  // use TLS and present cert_file as their client certificate. verbs: must be empty.
  transport::TlsOptions tls;
  uint32_t max_connections = 256;
  std::chrono::milliseconds idle_timeout{std::chrono::seconds(300)};  // 0: never
  std::chrono::milliseconds handshake_timeout{2000};
  uint64_t memory_bytes = 256ull << 20;                  // the registered region
  double index_fraction = kv::kDefaultIndexFraction;     // share of the region for the hash index
  uint64_t max_value_bytes = kv::kDefaultMaxValueBytes;  // kv::kMinMaxValueBytes..kMaxValueBytes
  int worker_threads = 2;
  // tcp: how long the NIC threads poll after activity (transport::ListenOptions::busy_poll).
  std::chrono::microseconds busy_poll{50};
  // tcp: the NIC threads poll even while they wait for their CPU
  // (transport::ListenOptions::busy_poll_always).
  bool busy_poll_always = false;
  std::chrono::milliseconds grace{90};  // freed memory is reused no earlier than this
  bool huge_pages = true;
  // Durability, data dir, snapshots, RocksDB tuning (docs/persistence.md). The default is
  // durability=none: nothing on disk. max_value_bytes above is passed on to it.
  persistence::PersistOptions persist;
  // Cluster (docs/design.md "Cluster"): the map and this server's id in it. No map: standalone.
  // A map requires persist.data_dir (any durability; Start refuses kInvalidArgument without
  // one): every map installed later is saved to <data_dir>/cluster_map.json before it is
  // acknowledged, and at start a saved map with a higher epoch than `cluster_map` is used
  // instead (server/saved_map.h), so a restart never takes back shards moved away.
  std::optional<cluster::ClusterMap> cluster_map;
  // etcd as the control plane (docs/design.md "Control plane"): the map comes from etcd (at
  // /rdkv/<etcd_cluster_name>/map; cluster_map must be unset), the server registers there under
  // a lease of etcd_lease_ttl_seconds and fences itself when it cannot renew it. Empty: no etcd.
  std::vector<std::string> etcd_endpoints;
  // TLS for https:// etcd endpoints (etcd::EtcdOptions' ca_file, cert_file, key_file).
  std::string etcd_ca_file, etcd_cert_file, etcd_key_file;
  std::string etcd_cluster_name = "rdkv";
  int64_t etcd_lease_ttl_seconds = 2;
  std::string cluster_map_file;  // where `cluster_map` came from, for messages (may be empty)
  uint32_t server_id = 0;
  // A server that loses a shard waits this long before acknowledging the map change; clients
  // trust an ownership READ for at most this long.
  std::chrono::milliseconds ownership_lease{100};
  // Replication (docs/design.md "Replication"): how long a primary waits for a backup to apply
  // a forwarded write before it answers the write kUnavailable.
  std::chrono::milliseconds replication_timeout{2000};
  // A replicated write holds no thread while its backups answer (docs/design.md "No thread
  // waits for the backups"); false: it waits on a worker or writer thread (the earlier path).
  bool async_replicated_writes = true;
  // Writes that failed at a backup and await repair are kept in memory with their values; once
  // their keys and values reach this many bytes (or 65,536 keys), the primary refuses new
  // replicated writes (kUnavailable) until the repair pass catches up.
  size_t max_repair_bytes = 64 << 20;
  // Replicated writes waiting for the writer pool (Service::set_max_pool_writes): beyond this
  // many (or 64 MiB of keys and values) a write is refused with kUnavailable.
  size_t max_pool_writes = 4096;
  // Tests only (Service::set_before_replica_apply): called on a backup with a forwarded
  // write after its role check, before it is applied; it may block. A status other than OK
  // refuses the write with it (an injected fault). Empty: none.
  std::function<Status(const kv::ReplicateRequest&)> before_replica_apply;
  // Prometheus /metrics over HTTP (server/metrics.h, docs/operations.md "Metrics"): served on
  // metrics_host:metrics_port when set (0 picks a free port, see Server::metrics_port()).
  // Unset: no HTTP server.
  std::string metrics_host = "127.0.0.1";
  std::optional<uint16_t> metrics_port;
};

struct ServerStats {
  uint64_t items = 0;
  uint64_t item_bytes = 0;                      // bytes of live items (headers + keys + values)
  uint64_t in_place_updates = 0;                // writes that rewrote the key's item where it was
  uint64_t writes_on_receiving_thread = 0;      // tcp: writes answered with no handoff to a worker
  uint64_t replicates_on_receiving_thread = 0;  // tcp: REPLICATEs applied likewise (a backup)
  uint64_t heap_bytes = 0;
  uint64_t free_bytes = 0;  // heap not in use by live items nor waiting in limbo
  uint64_t limbo_bytes = 0;
  uint64_t heap_merges = 0;  // allocator passes that merged adjacent free blocks
  uint64_t puts = 0, inserts = 0, deletes = 0, cas = 0, stats = 0, pings = 0;
  uint64_t errors = 0;  // requests answered with an error status
  uint64_t protocol_errors = 0;
  uint64_t out_of_space = 0;
  uint64_t io_errors = 0;  // writes refused or not made durable because the disk failed
  persistence::RecoveryStats recovered;  // what was loaded from disk at start
  // For the Prometheus exporter (server/metrics.h):
  uint64_t region_bytes = 0;
  uint64_t used_bytes = 0;   // heap handed out to items and not freed
  uint64_t index_slots = 0;  // one item per slot
  transport::ListenerStats transport;
  std::optional<persistence::PersisterStats> persist;  // none with durability=none
  bool clustered = false;
  uint64_t map_epoch = 0, shards = 1, owned_shards = 1;
  // Replication (docs/design.md "Replication"): shards this server backs (in sync, joining),
  // writes it forwarded as a primary and applied as a backup, forwards that failed (in-sync:
  // the write failed; joining: only counted), retries, and whether it has fenced itself.
  uint64_t backup_shards = 0, joining_shards = 0;
  uint64_t replicated_writes = 0, replicas_applied = 0, retries_answered = 0;
  // Writes parked behind their key's stripe, the groups they went in, and the writes those
  // groups forwarded (docs/design.md "A hot key's writes go together").
  uint64_t writes_parked = 0, write_groups = 0, grouped_writes = 0;
  uint64_t forward_errors = 0, joining_errors = 0, epoch_retries = 0, version_retries = 0;
  bool fenced = false;
  // Failover as this server saw it: times it fenced itself; shards it took over as primary
  // from an in-sync backup role (a failover or a planned promote).
  uint64_t fences = 0, promoted_shards = 0;
  uint64_t write_pause_ns = 0, write_pauses = 0;  // map changes holding off writes
  // Batching: REPLICATE requests sent as a primary and the writes they carried; batches
  // applied as a backup.
  uint64_t batches_sent = 0, batched_writes = 0, batches_applied = 0;
  // Writes refused because the writer pool's queue was full (kUnavailable, nothing applied);
  // forwarded PUTs this backup refused as older than a delete it applied (stale REPLICATEs).
  uint64_t overload_refused = 0, stale_forwards_refused = 0;
  // Earlier writes' request ids sent to backups as answers, and answers REPLICATEs taken.
  uint64_t answers_sent = 0, answers_received = 0;
  // Forwards of replicated writes that no thread waited for (the asynchronous path).
  uint64_t async_forwards = 0;
  // Repair of failed replicated writes: kept now, and since the start kept, repaired,
  // dropped (superseded), failed again. Request ids the retry table keeps.
  uint64_t repairs_pending = 0, repair_bytes_pending = 0, repairs_noted = 0, repairs_done = 0,
           repairs_dropped = 0, repair_failures = 0, retry_ids_kept = 0;
  // Lag per backup this primary forwards to (replication::Replicator::PeerState).
  struct Backup {
    uint32_t id = 0;
    bool connected = false;
    uint64_t pending = 0;    // writes queued or in flight to it, unanswered
    double lag_seconds = 0;  // how long the oldest of them has waited
  };
  std::vector<Backup> backups;
  // Catch-up: writes taken as a joining backup; items sent in SHARD_SCAN answers; how far the
  // latest scan of each shard got (0..1, by shard).
  uint64_t catchup_applied = 0, scan_items = 0;
  // A copy's request ids: sent in SHARD_IDS answers, recorded from RECORD_IDS.
  uint64_t shard_ids_sent = 0, copied_ids_recorded = 0;
  // Keys whose deletes this server remembers while it joins shards (see Service).
  uint64_t catchup_tombstones = 0;
  std::vector<std::pair<uint32_t, double>> scan_progress;
  RequestMetricsSnapshot requests;
};

class Server {
 public:
  // Allocates and registers the region, formats it, loads the data on disk into it (when
  // persisting; docs/persistence.md "Recovery"), and only then starts listening: no client
  // can see a half-loaded table.
  static Result<std::unique_ptr<Server>> Start(const ServerOptions& options);
  // Waits for queued writes to be durable, stops listening, closes the database, frees the
  // region.
  virtual ~Server() = default;

  virtual uint16_t port() const = 0;
  // The port /metrics is served on; 0 when ServerOptions::metrics_port was not set.
  virtual uint16_t metrics_port() const = 0;
  virtual ServerStats stats() const = 0;
  virtual std::string StatsJson() const = 0;
  // Test hook: worker threads stop running requests; one-sided READs go on.
  virtual void PauseWorkers(bool paused) = 0;
  // Replaces the data and admin secrets (kvserver's SIGHUP re-reads its secret files): new
  // handshakes need the new ones, sessions that proved a replaced secret are closed
  // (Listener::RotateSecrets), and connections this server opens to other servers from now
  // on present the new admin secret (or the data secret without one). Returns how many
  // sessions were revoked. Thread-safe.
  virtual Result<uint64_t> RotateSecrets(const std::string& auth_token,
                                         const std::string& admin_token) = 0;
};

}  // namespace rdkv::server

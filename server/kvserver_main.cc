// kvserver: serves one registered region of the rdkv store.
#include <gflags/gflags.h>
#include <glog/logging.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>

#include "common/cluster/cluster_map.h"
#include "common/transport/transport.h"
#include "common/util/units.h"
#include "server/server.h"

DEFINE_string(host, "127.0.0.1", "Address to listen on (verbs: the RDMA device's IP address).");
DEFINE_int32(port, 7400, "Port to listen on; 0 picks a free one (see --port_file).");
DEFINE_string(port_file, "",
              "If set, the port actually used is written to this file once "
              "the server is serving (for scripts and tests).");
DEFINE_string(transport, "auto",
              "Fabric: auto (verbs when an RDMA device is active, else tcp), "
              "verbs, or tcp (the software NIC).");
DEFINE_string(device, "", "RDMA device to use with verbs (e.g. rxe0); empty = the first active.");
DEFINE_string(auth_token, "",
              "Token clients must present in the connection handshake. "
              "Empty accepts any client (use only on a trusted network).");
DEFINE_string(memory, "256MiB",
              "Size of the registered region holding the index and the items "
              "(e.g. 512MiB, 4GiB). Allocated and registered once at start.");
DEFINE_double(index_fraction, 1.0 / 16,
              "Share of --memory given to the hash index (0.001..0.5). "
              "One 8-byte slot per item; raise it for many small items.");
DEFINE_string(max_value_size, "1MiB", "Largest value accepted (at most 1MiB).");
DEFINE_int32(worker_threads, 2, "Threads that poll receive completions and apply writes.");
DEFINE_int32(grace_ms, 90,
             "Freed item memory is reused no earlier than this many ms later; "
             "must exceed twice the clients' read deadline (40 ms by default).");
DEFINE_string(cluster_map, "",
              "Cluster map file (JSON, see docs/design.md \"Cluster\"): which "
              "server owns which shard. Empty: a standalone server owning every key. Needs "
              "--data_dir (any --durability, none too): a newer map the server was sent later "
              "is kept in <data_dir>/cluster_map.json and wins at start when its epoch is "
              "higher, so a restart does not take back shards moved away.");
DEFINE_int32(server_id, -1, "This server's id in --cluster_map (required with it).");
DEFINE_int32(ownership_lease_ms, 100,
             "A server that loses a shard waits this long before "
             "acknowledging the map change; clients trust an ownership READ this long.");
DEFINE_int32(metrics_port, -1,
             "Serve Prometheus metrics at http://<metrics_host>:<port>/metrics "
             "(docs/operations.md \"Metrics\"); 0 picks a free port; -1 (default): off.");
DEFINE_string(metrics_host, "127.0.0.1", "Address the /metrics HTTP server listens on.");
DEFINE_bool(huge_pages, true, "Back the region with 2 MiB huge pages when the system has them.");

// Persistence (docs/persistence.md).
DEFINE_string(data_dir, "",
              "Directory for this server's RocksDB database (<data_dir>/db), "
              "snapshots (<data_dir>/snapshots) and the newest cluster map it was sent "
              "(<data_dir>/cluster_map.json). Required with --cluster_map, and unless "
              "--durability=none (with none it holds only the cluster map).");
DEFINE_string(durability, "",
              "sync: acknowledge a write only after it is in the WAL and "
              "fsynced (group commit); async: acknowledge when applied in memory, WAL fsynced "
              "within --persist_lag_ms; none: a pure cache, nothing on disk. "
              "Default: sync when --data_dir is set, none otherwise.");
DEFINE_int32(persist_lag_ms, 100,
             "async: the WAL is fsynced at least this often, and writers "
             "are slowed while the oldest unwritten write is older than half of it.");
DEFINE_string(persist_queue, "64MiB",
              "Bound on applied writes (keys + values) not yet handed to "
              "RocksDB; writers wait while it is exceeded (backpressure, nothing dropped).");
DEFINE_string(snapshot_dir, "",
              "Where snapshots go; default <data_dir>/snapshots (keep it on "
              "the data dir's filesystem: snapshot files are hard links).");
DEFINE_string(snapshot_interval, "0",
              "Take a snapshot periodically (e.g. 30m, 6h, 3600s); 0 = "
              "only on request (kvcli snapshot).");
DEFINE_int32(snapshot_keep, 5,
             "Periodic snapshots kept (older ones are pruned); 0 keeps all. "
             "Snapshots taken on request are never pruned.");
DEFINE_string(restore_from, "",
              "Start from this snapshot directory: it is loaded, then copied "
              "to <data_dir>/db (a database already there is renamed db.pre-restore-<time>). "
              "A one-time action: drop the flag afterwards.");
DEFINE_string(rocksdb_compression, "lz4", "RocksDB block compression: none, snappy, lz4, zstd.");
DEFINE_string(rocksdb_write_buffer, "64MiB", "RocksDB memtable size (up to 3 are kept).");
DEFINE_string(rocksdb_block_cache, "32MiB",
              "RocksDB block cache (reads come from the region, so "
              "it only helps compactions and recovery; 0 disables it).");
DEFINE_int32(rocksdb_background_jobs, 2, "RocksDB flush + compaction threads.");

namespace {
volatile sig_atomic_t g_stop = 0;
void OnSignal(int) { g_stop = 1; }

// "0", "250ms", "30s", "15m", "6h"; a bare number is seconds.
rdkv::Result<std::chrono::milliseconds> ParseDuration(const std::string& text) {
  size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
  std::string unit = text.substr(digits);
  if (digits == 0 || digits > 12) {
    return rdkv::Status::InvalidArgument("'" + text + "' is not a duration (e.g. 30s, 15m, 6h)");
  }
  uint64_t n = std::stoull(text.substr(0, digits));
  if (unit == "ms") return std::chrono::milliseconds(n);
  if (unit.empty() || unit == "s") return std::chrono::milliseconds(n * 1000);
  if (unit == "m") return std::chrono::milliseconds(n * 60 * 1000);
  if (unit == "h") return std::chrono::milliseconds(n * 3600 * 1000);
  return rdkv::Status::InvalidArgument("'" + text + "': unknown unit '" + unit + "' (ms, s, m, h)");
}
}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage(
      "kvserver: one node of the rdkv key-value store.\n"
      "Clients GET with one-sided READs of this server's registered region; PUT, INSERT,\n"
      "DELETE and CAS arrive as requests. Example:\n"
      "  kvserver --memory=1GiB --port=7400 --transport=auto");
  gflags::SetVersionString("0.1.0");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);

  auto fail = [](const std::string& what) {
    LOG(ERROR) << what;
    std::fprintf(stderr, "kvserver: %s\n", what.c_str());
    return 2;
  };
  rdkv::server::ServerOptions o;
  o.host = FLAGS_host;
  if (FLAGS_port < 0 || FLAGS_port > 65535) return fail("--port must be 0..65535");
  o.port = static_cast<uint16_t>(FLAGS_port);
  rdkv::Result<rdkv::transport::TransportKind> kind =
      rdkv::transport::ChooseTransport(FLAGS_transport);
  if (!kind.ok()) return fail("--transport: " + kind.status().message());
  o.transport = *kind;
  o.device = FLAGS_device;
  o.auth_token = FLAGS_auth_token;
  rdkv::Result<uint64_t> mem = rdkv::ParseByteSize(FLAGS_memory);
  if (!mem.ok()) return fail("--memory: " + mem.status().message());
  o.memory_bytes = *mem;
  rdkv::Result<uint64_t> maxv = rdkv::ParseByteSize(FLAGS_max_value_size);
  if (!maxv.ok()) return fail("--max_value_size: " + maxv.status().message());
  if (*maxv > rdkv::kv::kMaxValueBytes) {
    return fail("--max_value_size: at most " + std::to_string(rdkv::kv::kMaxValueBytes) +
                " bytes (1MiB)");
  }
  o.max_value_bytes = *maxv;
  if (FLAGS_index_fraction < 0.001 || FLAGS_index_fraction > 0.5) {
    return fail("--index_fraction must be within 0.001..0.5");
  }
  o.index_fraction = FLAGS_index_fraction;
  o.worker_threads = FLAGS_worker_threads;
  if (FLAGS_grace_ms < 1) return fail("--grace_ms must be positive");
  o.grace = std::chrono::milliseconds(FLAGS_grace_ms);
  o.huge_pages = FLAGS_huge_pages;
  if (FLAGS_metrics_port < -1 || FLAGS_metrics_port > 65535) {
    return fail("--metrics_port must be -1 (off) or 0..65535");
  }
  if (FLAGS_metrics_port >= 0) o.metrics_port = static_cast<uint16_t>(FLAGS_metrics_port);
  o.metrics_host = FLAGS_metrics_host;
  if (!FLAGS_cluster_map.empty()) {
    rdkv::Result<rdkv::cluster::ClusterMap> map = rdkv::cluster::LoadClusterMap(FLAGS_cluster_map);
    if (!map.ok()) return fail("--cluster_map: " + map.status().message());
    if (FLAGS_server_id < 0) return fail("--server_id is required with --cluster_map");
    if (map->FindServer(static_cast<uint32_t>(FLAGS_server_id)) == nullptr) {
      return fail("--server_id=" + std::to_string(FLAGS_server_id) + " is not in " +
                  FLAGS_cluster_map);
    }
    o.cluster_map = std::move(*map);
    o.cluster_map_file = FLAGS_cluster_map;
    o.server_id = static_cast<uint32_t>(FLAGS_server_id);
  } else if (FLAGS_server_id >= 0) {
    return fail("--server_id needs --cluster_map");
  }
  if (FLAGS_ownership_lease_ms < 1) return fail("--ownership_lease_ms must be positive");
  o.ownership_lease = std::chrono::milliseconds(FLAGS_ownership_lease_ms);

  namespace persistence = rdkv::server::persistence;
  persistence::PersistOptions& p = o.persist;
  std::string mode =
      FLAGS_durability.empty() ? (FLAGS_data_dir.empty() ? "none" : "sync") : FLAGS_durability;
  rdkv::Result<persistence::Durability> durability = persistence::ParseDurability(mode);
  if (!durability.ok()) return fail("--durability: " + durability.status().message());
  p.durability = *durability;
  p.data_dir = FLAGS_data_dir;
  if (p.durability != persistence::Durability::kNone && p.data_dir.empty()) {
    return fail("--durability=" + mode + " needs --data_dir");
  }
  if (p.durability == persistence::Durability::kNone && !p.data_dir.empty()) {
    LOG(WARNING) << "--durability=none: --data_dir=" << p.data_dir << " holds no data, only "
                 << "the cluster map this server was last sent (cluster_map.json)";
  }
  if (FLAGS_persist_lag_ms < 1) return fail("--persist_lag_ms must be positive");
  p.persist_lag = std::chrono::milliseconds(FLAGS_persist_lag_ms);
  rdkv::Result<uint64_t> queue = rdkv::ParseByteSize(FLAGS_persist_queue);
  if (!queue.ok()) return fail("--persist_queue: " + queue.status().message());
  if (*queue < 4096) return fail("--persist_queue: at least 4KiB");
  p.queue_bytes = *queue;
  p.snapshot_dir = FLAGS_snapshot_dir;
  rdkv::Result<std::chrono::milliseconds> interval = ParseDuration(FLAGS_snapshot_interval);
  if (!interval.ok()) return fail("--snapshot_interval: " + interval.status().message());
  p.snapshot_interval = *interval;
  if (p.snapshot_interval.count() > 0 && p.durability == persistence::Durability::kNone) {
    return fail("--snapshot_interval needs --durability=sync or async (none has no data on disk)");
  }
  if (FLAGS_snapshot_keep < 0) return fail("--snapshot_keep must be >= 0");
  p.snapshot_keep = FLAGS_snapshot_keep;
  p.restore_from = FLAGS_restore_from;
  p.tuning.compression = FLAGS_rocksdb_compression;
  rdkv::Result<uint64_t> wb = rdkv::ParseByteSize(FLAGS_rocksdb_write_buffer);
  if (!wb.ok()) return fail("--rocksdb_write_buffer: " + wb.status().message());
  p.tuning.write_buffer_bytes = *wb;
  rdkv::Result<uint64_t> bc = rdkv::ParseByteSize(FLAGS_rocksdb_block_cache);
  if (!bc.ok()) return fail("--rocksdb_block_cache: " + bc.status().message());
  p.tuning.block_cache_bytes = *bc;
  p.tuning.background_jobs = FLAGS_rocksdb_background_jobs;
  // The mode and its promise, before anything else is logged about the data.
  std::fprintf(stderr, "kvserver: %s\n", persistence::PromiseText(p).c_str());

  rdkv::Result<std::unique_ptr<rdkv::server::Server>> server = rdkv::server::Server::Start(o);
  if (!server.ok()) return fail("cannot start: " + server.status().ToString());
  uint16_t port = (*server)->port();
  if (!FLAGS_port_file.empty()) {
    std::string tmp = FLAGS_port_file + ".tmp";
    std::ofstream(tmp) << port << "\n";
    if (std::rename(tmp.c_str(), FLAGS_port_file.c_str()) != 0) {
      return fail("cannot write --port_file " + FLAGS_port_file);
    }
  }
  LOG(INFO) << "kvserver serving on " << o.host << ":" << port << " over "
            << rdkv::transport::TransportKindName(o.transport) << " (" << FLAGS_memory
            << " region, " << o.worker_threads
            << " worker threads, durability=" << persistence::DurabilityName(p.durability) << ")";

  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  while (!g_stop) pause();
  LOG(INFO) << "kvserver shutting down: " << (*server)->StatsJson();
  server->reset();
  return 0;
}

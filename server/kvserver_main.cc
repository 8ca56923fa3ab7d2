// kvserver: serves one registered region of the rdkv store.
#include <gflags/gflags.h>
#include <glog/logging.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>

#include "common/cluster/cluster_map.h"
#include "common/etcd/etcd_client.h"
#include "common/transport/transport.h"
#include "common/util/cli_flags.h"
#include "common/util/secret.h"
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
// ---- Session security and admission (docs/security.md) ----
DEFINE_string(auth_token_file, "",
              "File holding the data secret clients must prove (never sent; mode 0600). "
              "Else $RDKV_AUTH_TOKEN. Neither: any client may open a data session.");
DEFINE_string(admin_token_file, "",
              "File holding the admin secret that admin requests (moves, snapshots, map "
              "installs, IMPORT, SHARD_SCAN, DROP_SHARD) need. Else $RDKV_ADMIN_TOKEN. Neither: "
              "admin requests are accepted only from loopback clients.");
DEFINE_string(auth_token, "",
              "Refused (a secret here is visible in ps): use --auth_token_file or "
              "$RDKV_AUTH_TOKEN.");
// ---- TLS (tcp transport only; docs/security.md "TLS (tcp)") ----
DEFINE_string(tls_cert_file, "",
              "tcp: PEM certificate chain of this server; with --tls_key_file turns TLS 1.3 on "
              "for its port (clients then need --tls_ca_file). verbs has no TLS.");
DEFINE_string(tls_key_file, "", "tcp: PEM private key of --tls_cert_file (mode 0600).");
DEFINE_string(tls_ca_file, "",
              "tcp: PEM CA bundle that verifies the other servers this one connects to "
              "(replication; needed in a cluster with TLS) and, with --tls_require_client_cert, "
              "its clients.");
DEFINE_bool(tls_require_client_cert, false,
            "tcp: clients must present a certificate signed by --tls_ca_file (mutual TLS).");
DEFINE_int32(max_connections, 256, "Authenticated client sessions at once (tcp and verbs).");
DEFINE_int32(idle_timeout_s, 300,
             "tcp: close a session that sent nothing for this many seconds (0: never).");
DEFINE_int32(handshake_timeout_ms, 2000,
             "tcp: close a socket that has not finished the handshake within this time.");
DEFINE_string(memory, "256MiB",
              "Size of the registered region holding the index and the items "
              "(e.g. 512MiB, 4GiB). Allocated and registered once at start.");
DEFINE_double(index_fraction, 1.0 / 8,
              "Share of --memory given to the hash index (0.001..0.5). One 8-byte slot per "
              "item, usable to ~95%; the default suits items of any size (even 64-byte ones, two "
              "32-byte units, fill the heap first); lower it for large items "
              "(docs/operations.md).");
DEFINE_string(max_value_size, "1MiB", "Largest value accepted (64B..1MiB).");
DEFINE_int32(worker_threads, 2, "Threads that poll receive completions and apply writes.");
DEFINE_int32(busy_poll_us, 50,
             "tcp: after activity, the NIC threads poll their sockets this many microseconds "
             "before sleeping in the kernel (docs/transport-tcp.md); 0 sleeps at once. An idle "
             "server uses no CPU either way. A NIC thread polls only while it does not wait for "
             "its CPU (from 20% of 50 ms spent waiting it stops for 0.5-8 s), "
             "unless --busy_poll_always.");
DEFINE_bool(busy_poll_always, false,
            "tcp: the NIC threads poll (--busy_poll_us) even while they wait for their CPU; for "
            "NIC threads on cores of their own. No effect with --busy_poll_us=0.");
DEFINE_int32(grace_ms, 90,
             "Freed item memory is reused no earlier than this many ms later; "
             "must exceed twice the clients' read deadline (40 ms by default).");
DEFINE_string(cluster_map, "",
              "Cluster map file (JSON, see docs/design.md \"Cluster\"): which "
              "server owns which shard. Empty: a standalone server owning every key. Needs "
              "--data_dir (any --durability, none too): a newer map the server was sent later "
              "is kept in <data_dir>/cluster_map.json and wins at start when its epoch is "
              "higher, so a restart does not take back shards moved away.");
DEFINE_int32(server_id, -1,
             "This server's id in the cluster map (required with --cluster_map "
             "or --etcd).");
DEFINE_string(etcd, "",
              "etcd endpoints (host:port[,host:port...]): the cluster map lives in etcd "
              "(/rdkv/<cluster_name>/map; import one with `kvcli cluster import-map`), this "
              "server registers there under a lease and installs every new map it sees. "
              "Replaces --cluster_map. docs/operations.md \"etcd\".");
DEFINE_string(cluster_name, "rdkv", "The cluster's name in etcd (its keys are under /rdkv/NAME/).");
DEFINE_string(etcd_cacert, "",
              "With https:// --etcd endpoints: the CA certificate (PEM) that signed etcd's "
              "certificate (default: the system's CA store).");
DEFINE_string(etcd_cert, "",
              "With https:// --etcd endpoints: this process's client certificate (PEM) for an "
              "etcd run with --client-cert-auth (with --etcd_key).");
DEFINE_string(etcd_key, "", "The private key (PEM) of --etcd_cert.");
DEFINE_int32(etcd_lease_ttl_s, 2,
             "TTL of this server's etcd lease: it stops serving (fences itself) when it cannot "
             "renew the lease for about this long.");
DEFINE_int32(replication_timeout_ms, 2000,
             "How long a primary waits for a backup to apply a forwarded write before the write "
             "fails with kUnavailable.");
DEFINE_bool(async_replicated_writes, true,
            "A replicated write holds no thread while its backups answer: the thread that reads "
            "their answers applies and acknowledges it. false: each write waits for its backups "
            "on a thread of its own (the earlier path, for comparison).");
DEFINE_int32(ownership_lease_ms, 100,
             "A server that loses a shard waits this long before "
             "acknowledging the map change; clients trust an ownership READ this long.");
DEFINE_int32(metrics_port, -1,
             "Serve Prometheus metrics at http://<metrics_host>:<port>/metrics "
             "(docs/operations.md \"Metrics\"); 0 picks a free port; -1 (default): off.");
DEFINE_string(metrics_host, "127.0.0.1", "Address the /metrics HTTP server listens on.");
DEFINE_bool(huge_pages, true, "Back the region with 2 MiB huge pages when the system has them.");
DEFINE_bool(check_memory, true,
            "Refuse a --memory larger than the machine can give (MemAvailable, free huge "
            "pages, the cgroup's memory.max, RLIMIT_AS): such a server would be killed by the "
            "OOM killer once filled. false skips the check.");

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
              "A one-time action: a later start with the same snapshot finds "
              "<data_dir>/restored_from and does not restore again; drop the flag afterwards.");
DEFINE_string(rocksdb_compression, "lz4", "RocksDB block compression: none, snappy, lz4, zstd.");
DEFINE_string(rocksdb_write_buffer, "64MiB", "RocksDB memtable size (up to 3 are kept).");
DEFINE_string(rocksdb_block_cache, "32MiB",
              "RocksDB block cache (reads come from the region, so "
              "it only helps compactions and recovery; 0 disables it).");
DEFINE_int32(rocksdb_background_jobs, 2, "RocksDB flush + compaction threads.");
DEFINE_string(
    wal_recovery, "torn_tail",
    "A damaged write-ahead log at start. torn_tail (default): the newest WAL file "
    "ending inside its last record where a write cut off by a crash ends (never "
    "acknowledged in sync mode) is cut, its bytes kept in "
    "<data_dir>/torn-wal-tails/, and the start goes on (storage that lost synced "
    "bytes at such a point looks the same, and is logged); any other damage is "
    "refused as with refuse. refuse: the server does not start, names the file and offset, "
    "changes nothing on disk. point_in_time: recover the writes before the damage "
    "and drop the rest permanently, reporting what was dropped; use only after "
    "deciding the loss is acceptable.");

namespace {
// Set by SIGTERM/SIGINT from the first line of main: recovery checks it between items, the
// serving loop between naps. A lock-free atomic is safe to store from a signal handler.
std::atomic<bool> g_stop{false};
static_assert(std::atomic<bool>::is_always_lock_free);
void OnSignal(int) { g_stop.store(true, std::memory_order_relaxed); }
// Set by SIGHUP: the serving loop re-reads the secret files (ReloadSecrets).
std::atomic<bool> g_reload{false};
void OnHangup(int) { g_reload.store(true, std::memory_order_relaxed); }

constexpr int kExitUsage = 2;  // bad flags or values; also any failure to start

// The flags kvserver accepts besides its own: glog's verbosity.
#define KVSERVER_EXTRA_FLAGS \
  { "v", "vmodule" }

void PrintHelp() {
  std::cout << "kvserver: one node of the rdkv key-value store.\n"
               "Clients GET with one-sided READs of this server's registered region; PUT, "
               "INSERT,\nDELETE and CAS arrive as requests.\n\n"
               "Usage: kvserver [FLAGS]\n\nFlags:\n"
            << rdkv::cli::OwnFlagsHelp(__FILE__, KVSERVER_EXTRA_FLAGS)
            << "    -help (this text; also --helpfull) type: bool default: false\n"
               "    -version (the version) type: bool default: false\n"
               "    -flagfile, -tryfromenv (read flags from a file, or from FLAGS_<name> "
               "environment variables) type: string default: \"\"\n\n"
               "Exit status: 0 after a clean stop (SIGTERM or SIGINT, also during recovery); 2 "
               "for bad flags\nand for any failure to start (the message says which).\n\n"
               "Example:\n  kvserver --memory=1GiB --port=7400 --data_dir=/var/lib/rdkv\n";
}

// The most memory a new region can get on this machine, and what limits it (for messages).
struct MemoryBudget {
  uint64_t bytes = ~uint64_t{0};
  std::string what = "no limit found";
};

uint64_t ReadMeminfoKiB(const std::string& meminfo, const std::string& key, bool* found) {
  std::istringstream in(meminfo);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key + ":", 0) == 0) {
      *found = true;
      return std::strtoull(line.c_str() + key.size() + 1, nullptr, 10);
    }
  }
  *found = false;
  return 0;
}

std::string ReadSmallFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

MemoryBudget AvailableMemory(bool huge_pages) {
  MemoryBudget b;
  auto lower = [&b](uint64_t bytes, std::string what) {
    if (bytes < b.bytes) {
      b.bytes = bytes;
      b.what = std::move(what);
    }
  };
  const std::string meminfo = ReadSmallFile("/proc/meminfo");
  bool found = false;
  uint64_t avail = ReadMeminfoKiB(meminfo, "MemAvailable", &found) * 1024;
  if (found) {
    // The region may come from free huge pages, which MemAvailable does not count.
    bool f1 = false, f2 = false;
    uint64_t huge = ReadMeminfoKiB(meminfo, "HugePages_Free", &f1) *
                    ReadMeminfoKiB(meminfo, "Hugepagesize", &f2) * 1024;
    if (huge_pages && f1 && f2 && huge > avail) {
      lower(huge, "free huge pages (HugePages_Free)");
    } else {
      lower(avail, "MemAvailable in /proc/meminfo");
    }
  }
  // cgroup v2 ("0::/path") or v1 (memory controller): limit minus current use.
  std::istringstream cg(ReadSmallFile("/proc/self/cgroup"));
  std::string line;
  while (std::getline(cg, line)) {
    if (line.rfind("0::", 0) == 0) {
      std::string dir = "/sys/fs/cgroup" + line.substr(3);
      std::string max = ReadSmallFile(dir + "/memory.max");
      if (!max.empty() && max.rfind("max", 0) != 0) {
        uint64_t limit = std::strtoull(max.c_str(), nullptr, 10);
        uint64_t cur = std::strtoull(ReadSmallFile(dir + "/memory.current").c_str(), nullptr, 10);
        lower(limit > cur ? limit - cur : 0, "the cgroup's memory.max (" + dir + ")");
      }
    }
  }
  std::string v1 = ReadSmallFile("/sys/fs/cgroup/memory/memory.limit_in_bytes");
  if (!v1.empty()) {
    uint64_t limit = std::strtoull(v1.c_str(), nullptr, 10);
    uint64_t cur = std::strtoull(
        ReadSmallFile("/sys/fs/cgroup/memory/memory.usage_in_bytes").c_str(), nullptr, 10);
    if (limit < (uint64_t{1} << 60)) {
      lower(limit > cur ? limit - cur : 0, "the cgroup's memory.limit_in_bytes");
    }
  }
  rlimit rl{};
  if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
    lower(rl.rlim_cur, "RLIMIT_AS (ulimit -v)");
  }
  return b;
}

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

// SIGHUP: the secret files are read again and the server switches to what they hold; the
// sessions that proved a replaced secret are closed (docs/security.md "Rotating secrets"). A
// secret given by the environment cannot change. A file that cannot be read changes nothing.
static void ReloadSecrets(rdkv::server::Server* server, rdkv::server::ServerOptions* o) {
  if (FLAGS_auth_token_file.empty() && FLAGS_admin_token_file.empty()) {
    LOG(WARNING) << "SIGHUP: no --auth_token_file or --admin_token_file to read again; the "
                    "secrets are unchanged";
    return;
  }
  std::string data = o->auth_token, admin = o->admin_token;
  if (!FLAGS_auth_token_file.empty()) {
    auto d = rdkv::LoadSecret(FLAGS_auth_token_file, "RDKV_AUTH_TOKEN", "", "auth_token");
    if (!d.ok()) {
      LOG(ERROR) << "SIGHUP: --auth_token_file: " << d.status().ToString()
                 << "; the secrets are unchanged";
      return;
    }
    data = std::move(d).value();
  }
  if (!FLAGS_admin_token_file.empty()) {
    auto a = rdkv::LoadSecret(FLAGS_admin_token_file, "RDKV_ADMIN_TOKEN", "", "admin_token");
    if (!a.ok()) {
      LOG(ERROR) << "SIGHUP: --admin_token_file: " << a.status().ToString()
                 << "; the secrets are unchanged";
      return;
    }
    admin = std::move(a).value();
  }
  const bool data_changed = data != o->auth_token, admin_changed = admin != o->admin_token;
  if (!data_changed && !admin_changed) {
    LOG(INFO) << "SIGHUP: the secret files hold the secrets in use; nothing changed";
    return;
  }
  rdkv::Result<uint64_t> revoked = server->RotateSecrets(data, admin);
  if (!revoked.ok() && !revoked.status().Is(rdkv::StatusCode::kTimedOut)) {
    LOG(ERROR) << "SIGHUP: the new secrets were refused: " << revoked.status().ToString();
    return;
  }
  o->auth_token = std::move(data);
  o->admin_token = std::move(admin);
  LOG(INFO) << "SIGHUP: secrets replaced (data secret " << (data_changed ? "changed" : "unchanged")
            << ", admin secret " << (admin_changed ? "changed" : "unchanged") << "); "
            << (revoked.ok() ? std::to_string(*revoked) + " session(s) revoked and closed"
                             : revoked.status().ToString());
}

int main(int argc, char** argv) {
  // Signals first: a SIGTERM during a long recovery stops it cleanly instead of killing the
  // process (recovery checks g_stop; the database is closed, nothing on disk changed).
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  struct sigaction hup {};
  hup.sa_handler = OnHangup;
  sigemptyset(&hup.sa_mask);
  sigaction(SIGHUP, &hup, nullptr);

  // Only kvserver's own flags: gflags' --help would list (and accept) every flag linked in,
  // RocksDB's tool flags included, and exits 1 on a bad one.
  if (rdkv::cli::AsksForHelp(argc, argv)) {
    PrintHelp();
    return 0;
  }
  if (std::string bad =
          rdkv::cli::CheckCommandLine(argc, argv, "kvserver", __FILE__, KVSERVER_EXTRA_FLAGS);
      !bad.empty()) {
    std::fprintf(stderr, "kvserver: %s\n", bad.c_str());
    return kExitUsage;
  }
  gflags::SetUsageMessage("kvserver: one node of the rdkv key-value store (kvserver --help)");
  gflags::SetVersionString("0.1.0");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  if (argc > 1) {
    std::fprintf(stderr, "kvserver: unexpected argument '%s' (kvserver takes flags only)\n",
                 argv[1]);
    return kExitUsage;
  }
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);

  auto fail = [](const std::string& what) {
    LOG(ERROR) << what;  // on stderr: logtostderr is set above and glog's flags are refused
    return kExitUsage;
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
  o.tls.cert_file = FLAGS_tls_cert_file;
  o.tls.key_file = FLAGS_tls_key_file;
  o.tls.ca_file = FLAGS_tls_ca_file;
  o.tls.require_client_cert = FLAGS_tls_require_client_cert;
  if (o.tls.any() || o.tls.require_client_cert) {
    if (o.transport == rdkv::transport::TransportKind::kVerbs) {
      return fail(
          "--tls_*: verbs has no TLS (the NICs do the READs); use --transport=tcp for TLS, or run "
          "verbs on a trusted fabric (docs/security.md \"TLS (tcp)\")");
    }
    if (o.tls.cert_file.empty() || o.tls.key_file.empty()) {
      return fail("--tls_cert_file and --tls_key_file go together and turn TLS on");
    }
    if (o.tls.require_client_cert && o.tls.ca_file.empty()) {
      return fail("--tls_require_client_cert needs --tls_ca_file to verify the clients");
    }
    if (o.tls.ca_file.empty() && (!FLAGS_cluster_map.empty() || !FLAGS_etcd.empty())) {
      return fail(
          "--tls_ca_file is needed in a cluster with TLS: it verifies the other servers this "
          "one connects to (replication)");
    }
  }
  {
    auto data =
        rdkv::LoadSecret(FLAGS_auth_token_file, "RDKV_AUTH_TOKEN", FLAGS_auth_token, "auth_token");
    if (!data.ok()) return fail(data.status().message());
    auto admin = rdkv::LoadSecret(FLAGS_admin_token_file, "RDKV_ADMIN_TOKEN", "", "admin_token");
    if (!admin.ok()) return fail(admin.status().message());
    o.auth_token = std::move(data).value();
    o.admin_token = std::move(admin).value();
    if (FLAGS_max_connections < 1) return fail("--max_connections must be at least 1");
    if (FLAGS_idle_timeout_s < 0) return fail("--idle_timeout_s must be >= 0 (0: never)");
    if (FLAGS_handshake_timeout_ms < 1) return fail("--handshake_timeout_ms must be >= 1");
    o.max_connections = static_cast<uint32_t>(FLAGS_max_connections);
    o.idle_timeout = std::chrono::seconds(FLAGS_idle_timeout_s);
    o.handshake_timeout = std::chrono::milliseconds(FLAGS_handshake_timeout_ms);
  }
  rdkv::Result<uint64_t> mem = rdkv::ParseByteSize(FLAGS_memory);
  if (!mem.ok()) return fail("--memory: " + mem.status().message());
  constexpr uint64_t kMaxRegionBytes = uint64_t{1} << 50;  // rounding up to huge pages never wraps
  if (*mem > kMaxRegionBytes) {
    return fail("--memory=" + FLAGS_memory + " (" + std::to_string(*mem) +
                " bytes) is above the largest supported region of 1PiB");
  }
  if (FLAGS_check_memory) {
    // The region plus the process around it (docs/operations.md, "Sizing memory").
    MemoryBudget budget = AvailableMemory(FLAGS_huge_pages);
    const uint64_t needed = *mem + *mem / 10 + (uint64_t{256} << 20);
    if (needed > budget.bytes) {
      return fail("--memory=" + FLAGS_memory + " (" + std::to_string(*mem >> 20) + " MiB, about " +
                  std::to_string(needed >> 20) +
                  " MiB with the process) is more than this machine can give: " +
                  std::to_string(budget.bytes >> 20) + " MiB per " + budget.what +
                  "; the server would be killed by the OOM killer once the region fills. Use a "
                  "smaller --memory (or --nocheck_memory to skip this check)");
    }
  }
  o.memory_bytes = *mem;
  rdkv::Result<uint64_t> maxv = rdkv::ParseByteSize(FLAGS_max_value_size);
  if (!maxv.ok()) return fail("--max_value_size: " + maxv.status().message());
  if (*maxv > rdkv::kv::kMaxValueBytes || *maxv < rdkv::kv::kMinMaxValueBytes) {
    return fail("--max_value_size: " + std::to_string(*maxv) + " bytes is outside " +
                std::to_string(rdkv::kv::kMinMaxValueBytes) + ".." +
                std::to_string(rdkv::kv::kMaxValueBytes) + " (64B..1MiB)");
  }
  o.max_value_bytes = *maxv;
  if (!(FLAGS_index_fraction >= 0.001 && FLAGS_index_fraction <= 0.5)) {  // NaN fails too
    return fail("--index_fraction=" + std::to_string(FLAGS_index_fraction) +
                " is not a number within 0.001..0.5");
  }
  o.index_fraction = FLAGS_index_fraction;
  o.worker_threads = FLAGS_worker_threads;
  o.busy_poll = std::chrono::microseconds(FLAGS_busy_poll_us);
  o.busy_poll_always = FLAGS_busy_poll_always;
  if (rdkv::Status bp = rdkv::transport::CheckBusyPoll(o.busy_poll); !bp.ok()) {
    return fail("--busy_poll_us: " + bp.message());
  }
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
  } else if (!FLAGS_etcd.empty()) {
    rdkv::Result<std::vector<std::string>> endpoints = rdkv::etcd::ParseEndpoints(FLAGS_etcd);
    if (!endpoints.ok()) return fail("--etcd: " + endpoints.status().message());
    if (FLAGS_server_id < 0) return fail("--server_id is required with --etcd");
    if (FLAGS_etcd_lease_ttl_s < 1) return fail("--etcd_lease_ttl_s must be at least 1");
    o.etcd_endpoints = std::move(*endpoints);
    o.etcd_ca_file = FLAGS_etcd_cacert;
    o.etcd_cert_file = FLAGS_etcd_cert;
    o.etcd_key_file = FLAGS_etcd_key;
    o.etcd_cluster_name = FLAGS_cluster_name;
    o.etcd_lease_ttl_seconds = FLAGS_etcd_lease_ttl_s;
    o.server_id = static_cast<uint32_t>(FLAGS_server_id);
  } else if (FLAGS_server_id >= 0) {
    return fail("--server_id needs --cluster_map or --etcd");
  }
  if (!FLAGS_cluster_map.empty() && !FLAGS_etcd.empty()) {
    return fail("give either --cluster_map or --etcd, not both");
  }
  if (FLAGS_replication_timeout_ms < 1) return fail("--replication_timeout_ms must be positive");
  o.replication_timeout = std::chrono::milliseconds(FLAGS_replication_timeout_ms);
  o.async_replicated_writes = FLAGS_async_replicated_writes;
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
    std::error_code ec;
    const bool has_db =
        std::filesystem::exists(std::filesystem::path(p.data_dir) / "db" / "CURRENT", ec);
    if (has_db) {
      LOG(WARNING) << "--durability=none: the database in --data_dir=" << p.data_dir
                   << "/db is neither loaded nor written by this run (the server starts empty, "
                      "and a later start in sync or async mode loads the database as it is "
                      "now, without this run's writes and deletes); --data_dir keeps only the "
                      "cluster map this server is sent (cluster_map.json)";
    } else {
      LOG(WARNING) << "--durability=none: --data_dir=" << p.data_dir << " holds no data, only "
                   << "the cluster map this server was last sent (cluster_map.json)";
    }
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
  rdkv::Result<persistence::WalRecovery> wal = persistence::ParseWalRecovery(FLAGS_wal_recovery);
  if (!wal.ok()) return fail("--wal_recovery: " + wal.status().message());
  p.tuning.wal_recovery = *wal;
  p.stop = &g_stop;
  // Tests only (tests/security/defects_kvserver_test.sh): a slow recovery to signal.
  if (const char* d = std::getenv("RDKV_TEST_RECOVERY_DELAY_US"); d != nullptr) {
    p.test_recovery_item_delay = std::chrono::microseconds(std::strtoull(d, nullptr, 10));
  }
  // The mode and its promise, before anything else is logged about the data.
  std::fprintf(stderr, "kvserver: %s\n", persistence::PromiseText(p).c_str());

  rdkv::Result<std::unique_ptr<rdkv::server::Server>> server = rdkv::server::Server::Start(o);
  if (!server.ok() && g_stop.load()) {
    // Stopped by SIGTERM/SIGINT while starting (e.g. during recovery): a clean stop.
    // A stop during the load says what it changed ("[nothing on disk was changed]" unless a
    // torn WAL tail was cut); a stop after it has opened the database for writing.
    LOG(INFO) << "kvserver stopped by a signal before serving: " << server.status().ToString();
    return 0;
  }
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

  while (!g_stop.load()) {
    if (g_reload.exchange(false)) ReloadSecrets(server->get(), &o);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  LOG(INFO) << "kvserver shutting down: " << (*server)->StatsJson();
  server->reset();
  return 0;
}

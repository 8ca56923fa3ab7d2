// kvcoord: the failover coordinator of an rdkv cluster whose map lives in etcd
// (coordinator/coordinator.h, docs/design.md "Failover"). Run two or three per cluster; one is
// elected and acts, the others wait to take over.
#include <gflags/gflags.h>
#include <glog/logging.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <thread>

#include "common/etcd/etcd_client.h"
#include "common/util/cli_flags.h"
#include "common/util/secret.h"
#include "coordinator/coordinator.h"

DEFINE_string(etcd, "", "etcd endpoints (host:port[,host:port...]) of the cluster (required).");
DEFINE_string(cluster_name, "rdkv", "The cluster's name in etcd (its keys are under /rdkv/NAME/).");
DEFINE_string(etcd_cacert, "",
              "With https:// --etcd endpoints: the CA certificate (PEM) that signed etcd's "
              "certificate (default: the system's CA store).");
DEFINE_string(etcd_cert, "",
              "With https:// --etcd endpoints: this process's client certificate (PEM) for an "
              "etcd run with --client-cert-auth (with --etcd_key).");
DEFINE_string(etcd_key, "", "The private key (PEM) of --etcd_cert.");
DEFINE_string(name, "", "This coordinator's name in logs and events (default: host:pid).");
DEFINE_int32(lease_ttl_s, 2,
             "TTL of the coordinator's etcd lease: a dead coordinator is replaced this long "
             "after its last renewal.");
DEFINE_int32(poll_ms, 50, "How often the elected coordinator reads the registrations and map.");
DEFINE_int32(probe_ms, 100,
             "How often each server's address is probed with a TCP connect (tcp transport "
             "only; 0: never). A refused connection means the server's process is gone: its "
             "lease is revoked at once instead of waiting for the TTL. Turn off where a "
             "firewall answers with TCP resets.");
DEFINE_bool(rereplicate, true,
            "Add replicas (catch-up copies) to shards below the map's replication_factor.");
DEFINE_string(transport, "tcp", "How the catch-up copies reach the servers: tcp or verbs.");
DEFINE_string(auth_token_file, "", "File holding the servers' data secret (or RDKV_AUTH_TOKEN).");
DEFINE_int32(metrics_port, -1,
             "Serve Prometheus metrics at http://<metrics_host>:<port>/metrics "
             "(rdkv_coordinator_*; -1: off, 0: a free port, logged).");
DEFINE_string(metrics_host, "127.0.0.1", "Address the /metrics HTTP server listens on.");
DEFINE_string(tls_ca_file, "",
              "PEM CA of the servers' certificates: TLS to them (tcp; docs/security.md).");
DEFINE_string(tls_cert_file, "", "PEM client certificate, for servers that require one.");
DEFINE_string(tls_key_file, "", "PEM private key of --tls_cert_file.");
DEFINE_string(admin_token_file, "",
              "File holding the servers' admin secret (or RDKV_ADMIN_TOKEN): copies and map "
              "changes are admin requests.");

namespace {

std::atomic<bool> g_stop{false};
static_assert(std::atomic<bool>::is_always_lock_free);
void OnSignal(int) { g_stop.store(true, std::memory_order_relaxed); }
constexpr int kExitUsage = 2;

#define KVCOORD_EXTRA_FLAGS \
  { "v", "vmodule" }

void PrintHelp() {
  std::cout
      << "kvcoord: the failover coordinator of an rdkv cluster (map in etcd).\n"
         "Detects failed servers (etcd lease expiry, refused connections), promotes "
         "in-sync backups,\nadmits restarted servers and restores the replication factor. "
         "Run 2-3 per cluster: one is\nelected through etcd.\n\nUsage: kvcoord --etcd=HOST:PORT "
         "[FLAGS]\n\nFlags:\n"
      << rdkv::cli::OwnFlagsHelp(__FILE__, KVCOORD_EXTRA_FLAGS)
      << "    -help (this text)\n\nExit status: 0 after SIGTERM or SIGINT; 2 for bad flags "
         "or a failure to start.\n";
}

}  // namespace

int main(int argc, char** argv) {
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  if (rdkv::cli::AsksForHelp(argc, argv)) {
    PrintHelp();
    return 0;
  }
  if (std::string bad =
          rdkv::cli::CheckCommandLine(argc, argv, "kvcoord", __FILE__, KVCOORD_EXTRA_FLAGS);
      !bad.empty()) {
    std::fprintf(stderr, "kvcoord: %s\n", bad.c_str());
    return kExitUsage;
  }
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  if (argc > 1) {
    std::fprintf(stderr, "kvcoord: unexpected argument '%s' (kvcoord takes flags only)\n", argv[1]);
    return kExitUsage;
  }
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);
  auto fail = [](const std::string& what) {
    std::fprintf(stderr, "kvcoord: %s\n", what.c_str());
    return kExitUsage;
  };
  if (FLAGS_etcd.empty()) return fail("--etcd is required (kvcoord --help)");
  rdkv::coordinator::CoordinatorOptions o;
  rdkv::Result<std::vector<std::string>> endpoints = rdkv::etcd::ParseEndpoints(FLAGS_etcd);
  if (!endpoints.ok()) return fail("--etcd: " + endpoints.status().message());
  o.etcd.endpoints = std::move(endpoints).value();
  o.etcd.ca_file = FLAGS_etcd_cacert;
  o.etcd.cert_file = FLAGS_etcd_cert;
  o.etcd.key_file = FLAGS_etcd_key;
  o.cluster_name = FLAGS_cluster_name;
  o.name = FLAGS_name;
  if (FLAGS_lease_ttl_s < 1) return fail("--lease_ttl_s must be at least 1");
  o.lease_ttl_seconds = FLAGS_lease_ttl_s;
  if (FLAGS_poll_ms < 1) return fail("--poll_ms must be at least 1");
  o.poll_interval = std::chrono::milliseconds(FLAGS_poll_ms);
  if (FLAGS_probe_ms < 0) return fail("--probe_ms must be 0 or more");
  o.probe_interval = std::chrono::milliseconds(FLAGS_probe_ms);
  o.rereplicate = FLAGS_rereplicate;
  if (FLAGS_transport != "tcp" && FLAGS_transport != "verbs") {
    return fail("--transport must be tcp or verbs");
  }
  o.transport = FLAGS_transport;
  auto data = rdkv::LoadSecret(FLAGS_auth_token_file, "RDKV_AUTH_TOKEN", "", "auth_token");
  if (!data.ok()) return fail("--auth_token_file: " + data.status().message());
  auto admin = rdkv::LoadSecret(FLAGS_admin_token_file, "RDKV_ADMIN_TOKEN", "", "admin_token");
  if (!admin.ok()) return fail("--admin_token_file: " + admin.status().message());
  o.auth_token = std::move(data).value();
  o.admin_token = std::move(admin).value();
  o.tls_ca_file = FLAGS_tls_ca_file;
  o.tls_cert_file = FLAGS_tls_cert_file;
  o.tls_key_file = FLAGS_tls_key_file;

  if (FLAGS_metrics_port < -1 || FLAGS_metrics_port > 65535) {
    return fail("--metrics_port must be -1 (off) or 0..65535");
  }
  if (FLAGS_metrics_port >= 0) o.metrics_port = static_cast<uint16_t>(FLAGS_metrics_port);
  o.metrics_host = FLAGS_metrics_host;

  auto coordinator = rdkv::coordinator::Coordinator::Start(std::move(o));
  if (!coordinator.ok()) return fail(coordinator.status().ToString());
  while (!g_stop.load(std::memory_order_relaxed)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  LOG(INFO) << "kvcoord: stopping (signal)";
  (*coordinator)->Stop();
  return 0;
}

// kvserver: serves one registered region of the rdkv store.
#include <gflags/gflags.h>
#include <glog/logging.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "common/transport/transport.h"
#include "common/util/units.h"
#include "server/server.h"

DEFINE_string(host, "127.0.0.1", "Address to listen on (verbs: the RDMA device's IP address).");
DEFINE_int32(port, 7400, "Port to listen on; 0 picks a free one (see --port_file).");
DEFINE_string(port_file, "", "If set, the port actually used is written to this file once "
              "the server is serving (for scripts and tests).");
DEFINE_string(transport, "auto", "Fabric: auto (verbs when an RDMA device is active, else tcp), "
              "verbs, or tcp (the software NIC).");
DEFINE_string(device, "", "RDMA device to use with verbs (e.g. rxe0); empty = the first active.");
DEFINE_string(auth_token, "", "Token clients must present in the connection handshake. "
              "Empty accepts any client (use only on a trusted network).");
DEFINE_string(memory, "256MiB", "Size of the registered region holding the index and the items "
              "(e.g. 512MiB, 4GiB). Allocated and registered once at start.");
DEFINE_double(index_fraction, 1.0 / 16, "Share of --memory given to the hash index (0.001..0.5). "
              "One 8-byte slot per item; raise it for many small items.");
DEFINE_string(max_value_size, "1MiB", "Largest value accepted (at most 1MiB).");
DEFINE_int32(worker_threads, 2, "Threads that poll receive completions and apply writes.");
DEFINE_int32(grace_ms, 90, "Freed item memory is reused no earlier than this many ms later; "
             "must exceed twice the clients' read deadline (40 ms by default).");
DEFINE_bool(huge_pages, true, "Back the region with 2 MiB huge pages when the system has them.");

namespace {
volatile sig_atomic_t g_stop = 0;
void OnSignal(int) { g_stop = 1; }
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
  rdkv::Result<rdkv::transport::TransportKind> kind = rdkv::transport::ChooseTransport(FLAGS_transport);
  if (!kind.ok()) return fail("--transport: " + kind.status().message());
  o.transport = *kind;
  o.device = FLAGS_device;
  o.auth_token = FLAGS_auth_token;
  rdkv::Result<uint64_t> mem = rdkv::ParseByteSize(FLAGS_memory);
  if (!mem.ok()) return fail("--memory: " + mem.status().message());
  o.memory_bytes = *mem;
  rdkv::Result<uint64_t> maxv = rdkv::ParseByteSize(FLAGS_max_value_size);
  if (!maxv.ok()) return fail("--max_value_size: " + maxv.status().message());
  if (*maxv > (1u << 20)) return fail("--max_value_size: at most 1MiB");
  o.max_value_bytes = *maxv;
  if (FLAGS_index_fraction < 0.001 || FLAGS_index_fraction > 0.5) {
    return fail("--index_fraction must be within 0.001..0.5");
  }
  o.index_fraction = FLAGS_index_fraction;
  o.worker_threads = FLAGS_worker_threads;
  if (FLAGS_grace_ms < 1) return fail("--grace_ms must be positive");
  o.grace = std::chrono::milliseconds(FLAGS_grace_ms);
  o.huge_pages = FLAGS_huge_pages;

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
            << " region, " << o.worker_threads << " worker threads)";

  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  while (!g_stop) pause();
  LOG(INFO) << "kvserver shutting down: " << (*server)->StatsJson();
  server->reset();
  return 0;
}

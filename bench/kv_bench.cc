// kv_bench: GET and PUT latency and throughput against one kvserver, with READs per GET.
//
//   kv_bench                                  an embedded server over tcp on 127.0.0.1
//   kv_bench --transport=verbs --host=$RDKV_RXE_ADDR --value_size=64
//   kv_bench --server=10.0.0.5:7400           an already running server
//
// Phases: load --keys keys; GET latency (one thread, one GET at a time, a random loaded key);
// GET throughput (--threads threads for --seconds); PUT latency; PUT throughput. Then, with
// --multiget_keys > 0 and no --server: MultiGet latency of --multiget_keys keys all owned by one
// server vs spread over three, on an embedded three-server cluster (same transport), with the
// location cache (one READ per key) and without it (the index path), and round trips per
// MultiGet (issue 14: every owner's batch in flight together).
#include <arpa/inet.h>
#include <gflags/gflags.h>
#include <glog/logging.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/cluster/cluster_map.h"
#include "common/kv/layout.h"
#include "common/util/units.h"
#include "rdkv/client.h"
#include "server/server.h"

DEFINE_string(server, "", "host:port of a running kvserver; empty = start one in this process");
DEFINE_string(transport, "tcp", "auto, tcp or verbs");
DEFINE_string(host, "127.0.0.1", "Embedded server: address to listen on (verbs: the rxe address)");
DEFINE_int32(keys, 10000, "Keys loaded before measuring");
DEFINE_int32(value_size, 64, "Bytes per value");
DEFINE_int32(ops, 5000, "Operations for each latency phase");
DEFINE_int32(threads, 2, "Client threads for the throughput phases");
DEFINE_double(seconds, 2.0, "Duration of each throughput phase");
DEFINE_string(json, "", "Also write the figures as JSON to this file");
DEFINE_bool(location_cache, true,
            "Use the client's location cache (warm GETs take one READ); "
            "false measures the index path (window READ + item READ)");
DEFINE_int32(multiget_keys, 24,
             "Keys per MultiGet in the 1-vs-3-owner phase (embedded servers only); 0 skips it");

DEFINE_string(tls_cert_file, "",
              "Embedded server: PEM certificate (with --tls_key_file): TLS on its port (tcp)");
DEFINE_string(tls_key_file, "", "Embedded server: PEM key of --tls_cert_file");
DEFINE_string(tls_ca_file, "", "Client: PEM CA of the server's certificate: TLS (tcp)");

using Clock = std::chrono::steady_clock;

namespace {

struct Latency {
  double p50 = 0, p99 = 0, avg = 0;
};

Latency Summarize(std::vector<double> v) {
  Latency l;
  if (v.empty()) return l;
  std::sort(v.begin(), v.end());
  l.p50 = v[v.size() / 2];
  l.p99 = v[std::min(v.size() - 1, v.size() * 99 / 100)];
  l.avg = std::accumulate(v.begin(), v.end(), 0.0) / v.size();
  return l;
}

std::string Key(int i) { return "bench:key:" + std::to_string(i); }

[[noreturn]] void Die(const rdkv::Status& s, const char* what) {
  std::fprintf(stderr, "kv_bench: %s: %s\n", what, s.ToString().c_str());
  std::exit(2);
}

// A TCP port on 127.0.0.1 that nothing holds right now (the kernel's choice for port 0).
uint16_t FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    std::fprintf(stderr, "kv_bench: no free port\n");
    std::exit(2);
  }
  close(fd);
  return ntohs(a.sin_port);
}

// MultiGet latency, 1 owner vs 3, on a three-server cluster started here.
struct MultiGetFigures {
  Latency one, three;              // with the location cache
  Latency one_index, three_index;  // without it (index path)
  double rtt_one = 0, rtt_three = 0, rtt_one_index = 0, rtt_three_index = 0;
};

MultiGetFigures MultiGetPhase(rdkv::transport::TransportKind kind) {
  constexpr uint32_t kShards = 24;
  const std::string root = [] {
    std::string t = "/tmp/rdkv-kv-bench-XXXXXX";
    if (mkdtemp(t.data()) == nullptr) {
      std::fprintf(stderr, "kv_bench: mkdtemp failed\n");
      std::exit(2);
    }
    return t;
  }();
  std::vector<std::string> addrs;
  std::vector<uint16_t> ports;
  for (int i = 0; i < 3; ++i) {
    ports.push_back(FreePort());
    addrs.push_back(rdkv::FormatHostPort(FLAGS_host, ports.back()));
  }
  const rdkv::cluster::ClusterMap map = rdkv::cluster::MakeUniformMap(addrs, kShards);
  std::vector<std::unique_ptr<rdkv::server::Server>> servers;
  for (uint32_t i = 0; i < 3; ++i) {
    rdkv::server::ServerOptions so;
    so.host = FLAGS_host;
    so.port = ports[i];
    so.transport = kind;
    so.memory_bytes = 64ull << 20;
    so.cluster_map = map;
    so.server_id = i;
    so.persist.data_dir = root + "/server-" + std::to_string(i);
    auto s = rdkv::server::Server::Start(so);
    if (!s.ok()) Die(s.status(), "embedded cluster server");
    servers.push_back(std::move(*s));
  }
  // `one`: keys of server 0's shards; `spread`: the same number, a third on each server.
  const int n = std::max(3, FLAGS_multiget_keys / 3 * 3);
  std::vector<std::string> one, spread;
  for (int i = 0; static_cast<int>(one.size()) < n || static_cast<int>(spread.size()) < n; ++i) {
    std::string k = "mg:" + std::to_string(i);
    const uint32_t owner = rdkv::cluster::ShardOf(rdkv::kv::KeyHash(k), kShards) % 3;
    if (owner == 0 && static_cast<int>(one.size()) < n) {
      one.push_back(k);
    } else if (static_cast<int>(spread.size()) < n &&
               std::count_if(spread.begin(), spread.end(), [&](const std::string& x) {
                 return rdkv::cluster::ShardOf(rdkv::kv::KeyHash(x), kShards) % 3 == owner;
               }) < n / 3) {
      spread.push_back(k);
    }
  }
  auto connect = [&](bool cache) {
    rdkv::ClientOptions co;
    co.seed = addrs[0];
    co.transport = FLAGS_transport;
    if (!cache) co.location_cache_entries = 0;
    auto c = rdkv::Client::Connect(co);
    if (!c.ok()) Die(c.status(), "connect to the cluster");
    return std::move(*c);
  };
  const std::string value(FLAGS_value_size, 'v');
  MultiGetFigures f;
  for (bool cache : {true, false}) {
    auto c = connect(cache);
    for (const auto* set : {&one, &spread}) {
      for (const auto& k : *set) {
        auto r = c->Put(k, value);
        if (!r.ok()) Die(r.status(), "cluster load");
      }
    }
    std::vector<std::string_view> v1(one.begin(), one.end()), v3(spread.begin(), spread.end());
    std::vector<double> l1, l3;
    uint64_t rt1 = 0, rt3 = 0;
    auto run = [&](const std::vector<std::string_view>& keys, std::vector<double>* lat,
                   uint64_t* rtt) {
      const uint64_t r0 = c->stats().get_round_trips;
      auto t0 = Clock::now();
      auto res = c->MultiGet(keys);
      lat->push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
      *rtt += c->stats().get_round_trips - r0;
      for (const auto& r : res) {
        if (!r.ok()) Die(r.status(), "multiget");
      }
    };
    for (int i = 0; i < 20; ++i) {  // warm-up (fills the cache when it is on)
      run(v1, &l1, &rt1);
      run(v3, &l3, &rt3);
    }
    l1.clear();
    l3.clear();
    rt1 = rt3 = 0;
    const int ops = std::max(1, FLAGS_ops / 10);
    for (int i = 0; i < ops; ++i) {  // interleaved: both see the same conditions
      run(v1, &l1, &rt1);
      run(v3, &l3, &rt3);
    }
    (cache ? f.one : f.one_index) = Summarize(l1);
    (cache ? f.three : f.three_index) = Summarize(l3);
    (cache ? f.rtt_one : f.rtt_one_index) = double(rt1) / ops;
    (cache ? f.rtt_three : f.rtt_three_index) = double(rt3) / ops;
  }
  servers.clear();
  std::error_code ec;
  std::filesystem::remove_all(root, ec);
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage("GET/PUT latency and throughput of one rdkv server");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);

  std::unique_ptr<rdkv::server::Server> embedded;
  std::string seed = FLAGS_server;
  if (seed.empty()) {
    rdkv::server::ServerOptions so;
    so.host = FLAGS_host;
    so.port = 0;
    auto kind = rdkv::transport::ChooseTransport(FLAGS_transport);
    if (!kind.ok()) Die(kind.status(), "--transport");
    so.transport = *kind;
    so.tls.cert_file = FLAGS_tls_cert_file;
    so.tls.key_file = FLAGS_tls_key_file;
    so.memory_bytes =
        std::max<uint64_t>(256ull << 20, uint64_t(FLAGS_keys) * (FLAGS_value_size + 256) * 4);
    auto s = rdkv::server::Server::Start(so);
    if (!s.ok()) Die(s.status(), "embedded server");
    embedded = std::move(*s);
    seed = rdkv::FormatHostPort(FLAGS_host, embedded->port());
  }
  rdkv::ClientOptions co;
  co.seed = seed;
  co.transport = FLAGS_transport;
  co.tls.ca_file = FLAGS_tls_ca_file;
  if (!FLAGS_location_cache) co.location_cache_entries = 0;
  auto client_or = rdkv::Client::Connect(co);
  if (!client_or.ok()) Die(client_or.status(), "connect");
  rdkv::Client& client = **client_or;

  const std::string value(FLAGS_value_size, 'v');
  // Formatted once: the timed loops measure the store, not std::to_string (perftest's loop
  // formats nothing either).
  std::vector<std::string> keys(FLAGS_keys);
  for (int i = 0; i < FLAGS_keys; ++i) keys[i] = Key(i);
  for (int i = 0; i < FLAGS_keys; ++i) {
    auto r = client.Put(keys[i], value);
    if (!r.ok()) Die(r.status(), "load");
  }

  // Warm up: one GET of every key (fills the location cache when it is on).
  for (int i = 0; i < FLAGS_keys; ++i) {
    auto r = client.Get(keys[i]);
    if (!r.ok()) Die(r.status(), "warm-up get");
  }

  std::mt19937_64 rng(42);
  auto timed = [&](auto&& op) {
    std::vector<double> lat;
    lat.reserve(FLAGS_ops);
    for (int i = 0; i < FLAGS_ops; ++i) {
      int k = static_cast<int>(rng() % FLAGS_keys);
      auto t0 = Clock::now();
      op(k);
      lat.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    }
    return Summarize(std::move(lat));
  };
  rdkv::ClientStats before = client.stats();
  Latency get_lat = timed([&](int k) {
    auto r = client.Get(keys[k]);
    if (!r.ok()) Die(r.status(), "get");
  });
  rdkv::ClientStats after = client.stats();
  double reads_per_get =
      double(after.get_reads - before.get_reads) / std::max<uint64_t>(1, after.gets - before.gets);
  Latency put_lat = timed([&](int k) {
    auto r = client.Put(keys[k], value);
    if (!r.ok()) Die(r.status(), "put");
  });

  auto throughput = [&](bool gets) {
    std::atomic<bool> stop{false};
    std::atomic<uint64_t> total{0};
    std::vector<std::thread> ts;
    for (int t = 0; t < FLAGS_threads; ++t) {
      ts.emplace_back([&, t] {
        std::mt19937_64 r(t + 1);
        uint64_t n = 0;
        while (!stop.load(std::memory_order_relaxed)) {
          int k = static_cast<int>(r() % FLAGS_keys);
          if (gets) {
            auto g = client.Get(keys[k]);
            if (!g.ok()) Die(g.status(), "get");
          } else {
            auto p = client.Put(keys[k], value);
            if (!p.ok()) Die(p.status(), "put");
          }
          ++n;
        }
        total += n;
      });
    }
    auto t0 = Clock::now();
    std::this_thread::sleep_for(std::chrono::duration<double>(FLAGS_seconds));
    stop = true;
    for (auto& th : ts) th.join();
    return total.load() / std::chrono::duration<double>(Clock::now() - t0).count();
  };
  double get_rate = throughput(true);
  double put_rate = throughput(false);

  const std::string label = FLAGS_transport + (FLAGS_tls_ca_file.empty() ? "" : "+tls");
  std::printf(
      "rdkv kv_bench transport=%s value_size=%d keys=%d cache=%d get_lat p50_us=%.2f p99_us=%.2f "
      "avg_us=%.2f reads_per_get=%.3f\n",
      label.c_str(), FLAGS_value_size, FLAGS_keys, FLAGS_location_cache ? 1 : 0, get_lat.p50,
      get_lat.p99, get_lat.avg, reads_per_get);
  std::printf(
      "rdkv kv_bench transport=%s value_size=%d put_lat p50_us=%.2f p99_us=%.2f avg_us=%.2f\n",
      label.c_str(), FLAGS_value_size, put_lat.p50, put_lat.p99, put_lat.avg);
  std::printf(
      "rdkv kv_bench transport=%s value_size=%d threads=%d get_ops_per_s=%.0f put_ops_per_s=%.0f\n",
      label.c_str(), FLAGS_value_size, FLAGS_threads, get_rate, put_rate);
  MultiGetFigures mg;
  const bool multiget = FLAGS_multiget_keys > 0 && FLAGS_server.empty();
  if (multiget) {
    auto kind = rdkv::transport::ChooseTransport(FLAGS_transport);
    if (!kind.ok()) Die(kind.status(), "--transport");
    mg = MultiGetPhase(*kind);
    std::printf(
        "rdkv kv_bench transport=%s multiget keys=%d cache=1 one_owner p50_us=%.2f p99_us=%.2f "
        "rtts=%.2f three_owners p50_us=%.2f p99_us=%.2f rtts=%.2f ratio_p50=%.2f\n",
        label.c_str(), FLAGS_multiget_keys / 3 * 3, mg.one.p50, mg.one.p99, mg.rtt_one,
        mg.three.p50, mg.three.p99, mg.rtt_three, mg.three.p50 / std::max(mg.one.p50, 1e-9));
    std::printf(
        "rdkv kv_bench transport=%s multiget keys=%d cache=0 one_owner p50_us=%.2f p99_us=%.2f "
        "rtts=%.2f three_owners p50_us=%.2f p99_us=%.2f rtts=%.2f ratio_p50=%.2f\n",
        label.c_str(), FLAGS_multiget_keys / 3 * 3, mg.one_index.p50, mg.one_index.p99,
        mg.rtt_one_index, mg.three_index.p50, mg.three_index.p99, mg.rtt_three_index,
        mg.three_index.p50 / std::max(mg.one_index.p50, 1e-9));
  }
  if (!FLAGS_json.empty()) {
    std::ofstream(FLAGS_json) << "{\"transport\":\"" << label
                              << "\",\"value_size\":" << FLAGS_value_size
                              << ",\"get_p50_us\":" << get_lat.p50
                              << ",\"get_p99_us\":" << get_lat.p99
                              << ",\"reads_per_get\":" << reads_per_get
                              << ",\"put_p50_us\":" << put_lat.p50
                              << ",\"put_p99_us\":" << put_lat.p99
                              << ",\"get_ops_per_s\":" << get_rate
                              << ",\"put_ops_per_s\":" << put_rate;
    if (multiget) {
      std::ofstream(FLAGS_json, std::ios::app)
          << ",\"multiget_one_p50_us\":" << mg.one.p50
          << ",\"multiget_three_p50_us\":" << mg.three.p50
          << ",\"multiget_one_index_p50_us\":" << mg.one_index.p50
          << ",\"multiget_three_index_p50_us\":" << mg.three_index.p50;
    }
    std::ofstream(FLAGS_json, std::ios::app) << "}\n";
  }
  return 0;
}

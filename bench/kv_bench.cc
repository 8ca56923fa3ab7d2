// kv_bench: GET and PUT latency and throughput against one kvserver, with READs per GET.
//
//   kv_bench                                  an embedded server over tcp on 127.0.0.1
//   kv_bench --transport=verbs --host=$RDKV_RXE_ADDR --value_size=64
//   kv_bench --server=10.0.0.5:7400           an already running server
//
// Phases: load --keys keys; GET latency (one thread, one GET at a time, a random loaded key);
// GET throughput (--threads threads for --seconds); PUT latency; PUT throughput.
#include <gflags/gflags.h>
#include <glog/logging.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

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
  if (!FLAGS_location_cache) co.location_cache_entries = 0;
  auto client_or = rdkv::Client::Connect(co);
  if (!client_or.ok()) Die(client_or.status(), "connect");
  rdkv::Client& client = **client_or;

  const std::string value(FLAGS_value_size, 'v');
  for (int i = 0; i < FLAGS_keys; ++i) {
    auto r = client.Put(Key(i), value);
    if (!r.ok()) Die(r.status(), "load");
  }

  // Warm up: one GET of every key (fills the location cache when it is on).
  for (int i = 0; i < FLAGS_keys; ++i) {
    auto r = client.Get(Key(i));
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
    auto r = client.Get(Key(k));
    if (!r.ok()) Die(r.status(), "get");
  });
  rdkv::ClientStats after = client.stats();
  double reads_per_get =
      double(after.get_reads - before.get_reads) / std::max<uint64_t>(1, after.gets - before.gets);
  Latency put_lat = timed([&](int k) {
    auto r = client.Put(Key(k), value);
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
            auto g = client.Get(Key(k));
            if (!g.ok()) Die(g.status(), "get");
          } else {
            auto p = client.Put(Key(k), value);
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

  std::printf(
      "rdkv kv_bench transport=%s value_size=%d keys=%d cache=%d get_lat p50_us=%.2f p99_us=%.2f "
      "avg_us=%.2f reads_per_get=%.3f\n",
      FLAGS_transport.c_str(), FLAGS_value_size, FLAGS_keys, FLAGS_location_cache ? 1 : 0,
      get_lat.p50, get_lat.p99, get_lat.avg, reads_per_get);
  std::printf(
      "rdkv kv_bench transport=%s value_size=%d put_lat p50_us=%.2f p99_us=%.2f avg_us=%.2f\n",
      FLAGS_transport.c_str(), FLAGS_value_size, put_lat.p50, put_lat.p99, put_lat.avg);
  std::printf(
      "rdkv kv_bench transport=%s value_size=%d threads=%d get_ops_per_s=%.0f put_ops_per_s=%.0f\n",
      FLAGS_transport.c_str(), FLAGS_value_size, FLAGS_threads, get_rate, put_rate);
  if (!FLAGS_json.empty()) {
    std::ofstream(FLAGS_json) << "{\"transport\":\"" << FLAGS_transport
                              << "\",\"value_size\":" << FLAGS_value_size
                              << ",\"get_p50_us\":" << get_lat.p50
                              << ",\"get_p99_us\":" << get_lat.p99
                              << ",\"reads_per_get\":" << reads_per_get
                              << ",\"put_p50_us\":" << put_lat.p50
                              << ",\"put_p99_us\":" << put_lat.p99
                              << ",\"get_ops_per_s\":" << get_rate
                              << ",\"put_ops_per_s\":" << put_rate << "}\n";
  }
  return 0;
}

// conn_bench: connection scaling of one kvserver (issue 14), driven by bench/connection-scaling.sh.
//
//   conn_bench --server=127.0.0.1:7400 --server_pid=PID --connections=2000
//
// Phases, in one process against one running server:
//   1. load --keys keys (one client);
//   2. storm: --storm_threads threads open --connections clients (rdkv::Client, one connection
//      each) at once, back to back until all are open: connections/s from the first connect to
//      the last one done; every failure is counted and its first error printed;
//   3. the server's RSS (from /proc/--server_pid/status) before the storm, after it, and after
//      every connection has served GETs: bytes per connection;
//   4. GET throughput: --threads threads, each GET on the next client of its share, over the
//      first --base_connections clients, then over all of them (twice each, alternating, so that
//      both see the same host): the ratio all / base is the figure (target >= 0.8), with the
//      server's CPU per GET in each phase (from /proc/--server_pid/stat): the throughput of one
//      driver process also measures the driver's own costs per connection (the kernel's work on
//      sockets idle for a while), the server's CPU per GET only the server.
// The clients run without the location cache by default (--location_cache=false): every GET
// takes the index path whichever connection it uses, so both phases do the same work per GET.
//
// With --memcached=HOST:PORT the same phases run against a memcached instead (raw TCP sockets,
// text protocol, one blocking socket per connection, a GET is "get KEY" answered "VALUE ...
// END"): the reference for what the host's kernel and this driver cost per connection, measured
// the same way (connection-scaling.sh runs both). --server_pid is then memcached's pid.
//
// Prints one line of "key=value" figures (and --json). Exit status 1 when a connection failed,
// 2 on a setup error.
#include <arpa/inet.h>
#include <gflags/gflags.h>
#include <glog/logging.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "rdkv/client.h"

DEFINE_string(server, "127.0.0.1:7400", "host:port of the kvserver");
DEFINE_int32(server_pid, 0, "The kvserver's pid, for its RSS (0: RSS not measured)");
DEFINE_string(transport, "tcp", "auto, tcp or verbs");
DEFINE_int32(connections, 2000, "Client connections opened in the storm");
DEFINE_int32(base_connections, 16, "Connections of the reference GET phase");
DEFINE_int32(storm_threads, 48,
             "Threads connecting at once (the server closes the oldest unfinished handshake "
             "beyond 64 per source address: keep under it on one host)");
DEFINE_int32(threads, 4, "Threads of the GET phases");
DEFINE_double(seconds, 2.0, "Duration of each GET phase");
DEFINE_int32(keys, 1000, "Keys loaded");
DEFINE_int32(value_size, 64, "Bytes per value");
DEFINE_bool(location_cache, false, "Clients' location cache (see the header)");
DEFINE_string(json, "", "Also write the figures as JSON to this file");
DEFINE_string(memcached, "",
              "host:port of a memcached to measure instead of rdkv (the reference: same phases, "
              "text protocol over one blocking socket per connection)");
DEFINE_string(only, "",
              "For profiling: after the storm run only the GET phase over 'base' or 'all' "
              "connections, once, and print its rate");

using Clock = std::chrono::steady_clock;

namespace {

[[noreturn]] void Die(const rdkv::Status& s, const char* what) {
  std::fprintf(stderr, "conn_bench: %s: %s\n", what, s.ToString().c_str());
  std::exit(2);
}

// The server's resident set in bytes (0 when unknown).
uint64_t ServerRss() {
  if (FLAGS_server_pid <= 0) return 0;
  std::ifstream in("/proc/" + std::to_string(FLAGS_server_pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  return 0;
}

// CPU seconds the process `pid` has used (user + system; 0 when unknown).
double CpuSeconds(int pid) {
  if (pid <= 0) return 0;
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t close = all.rfind(')');  // the name may hold spaces
  if (close == std::string::npos) return 0;
  std::istringstream fields(all.substr(close + 2));
  std::string f;
  unsigned long long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && fields >> f; ++i) {  // fields 14 and 15: utime, stime (ticks)
    if (i == 14) utime = std::stoull(f);
    if (i == 15) stime = std::stoull(f);
  }
  return double(utime + stime) / double(sysconf(_SC_CLK_TCK));
}

std::string Key(int i) { return "conn:key:" + std::to_string(i); }

// One connection of the store measured, used by one thread at a time.
class BenchConn {
 public:
  virtual ~BenchConn() = default;
  // True when the key was found.
  virtual bool Get(const std::string& key) = 0;
};

class RdkvConn final : public BenchConn {
 public:
  explicit RdkvConn(std::unique_ptr<rdkv::Client> c) : c_(std::move(c)) {}
  bool Get(const std::string& key) override { return c_->Get(key).ok(); }

 private:
  std::unique_ptr<rdkv::Client> c_;
};

// memcached's text protocol over one blocking TCP socket.
class McConn final : public BenchConn {
 public:
  // Connects to --memcached; nullptr and *error on failure.
  static std::unique_ptr<McConn> Open(std::string* error) {
    const std::string& a = FLAGS_memcached;
    const size_t colon = a.rfind(':');
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    if (colon == std::string::npos ||
        inet_pton(AF_INET, a.substr(0, colon).c_str(), &sa.sin_addr) != 1) {
      *error = "--memcached must be IPv4:port, not '" + a + "'";
      return nullptr;
    }
    sa.sin_port = htons(static_cast<uint16_t>(std::stoi(a.substr(colon + 1))));
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
      *error = "connect to memcached " + a + ": " + std::strerror(errno);
      if (fd >= 0) close(fd);
      return nullptr;
    }
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return std::unique_ptr<McConn>(new McConn(fd));
  }
  ~McConn() override { close(fd_); }

  bool Get(const std::string& key) override {
    thread_local std::string request;
    request.assign("get ").append(key).append("\r\n");
    std::string_view answer;
    if (!Roundtrip(request, "END\r\n", &answer)) return false;
    return answer.rfind("VALUE ", 0) == 0;
  }
  bool Set(const std::string& key, const std::string& value) {
    std::string request = "set " + key + " 0 0 " + std::to_string(value.size()) + "\r\n";
    request.append(value).append("\r\n");
    std::string_view answer;
    return Roundtrip(request, "\r\n", &answer) && answer == "STORED\r\n";
  }

 private:
  explicit McConn(int fd) : fd_(fd) {}

  // Sends `request` and reads until the answer ends with `end`; *answer views a thread-local
  // buffer until this thread's next call.
  bool Roundtrip(const std::string& request, std::string_view end, std::string_view* answer) {
    if (send(fd_, request.data(), request.size(), MSG_NOSIGNAL) !=
        static_cast<ssize_t>(request.size())) {
      return false;
    }
    thread_local std::string buf;
    buf.clear();
    char chunk[4096];
    for (;;) {
      const ssize_t n = recv(fd_, chunk, sizeof chunk, 0);
      if (n <= 0) return false;
      buf.append(chunk, static_cast<size_t>(n));
      if (buf.size() >= end.size() && buf.compare(buf.size() - end.size(), end.size(), end) == 0) {
        *answer = buf;
        return true;
      }
    }
  }

  const int fd_;
};

rdkv::ClientOptions Options() {
  rdkv::ClientOptions co;
  co.seed = FLAGS_server;
  co.transport = FLAGS_transport;
  if (!FLAGS_location_cache) co.location_cache_entries = 0;
  // One connection per client whichever thread uses it: the connection count is the subject.
  co.connections_per_server = 1;
  return co;
}

// GETs per second over clients[0, n): thread t takes clients t, t + threads, ... in turn.
// *server_us: the server's CPU microseconds per GET meanwhile (0 without --server_pid).
double GetRate(const std::vector<std::unique_ptr<BenchConn>>& clients, size_t n,
               double* server_us) {
  const double cpu0 = CpuSeconds(FLAGS_server_pid);
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> total{0};
  std::atomic<uint64_t> failed{0};
  std::vector<std::thread> ts;
  const size_t threads = static_cast<size_t>(std::max(1, FLAGS_threads));
  for (size_t t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      std::mt19937_64 r(t + 1);
      uint64_t done = 0;
      for (size_t i = t % n; !stop.load(std::memory_order_relaxed); i = (i + threads) % n) {
        if (!clients[i]->Get(Key(static_cast<int>(r() % FLAGS_keys)))) failed.fetch_add(1);
        ++done;
      }
      total += done;
    });
  }
  auto t0 = Clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(FLAGS_seconds));
  stop = true;
  for (auto& th : ts) th.join();
  if (failed.load() > 0) {
    std::fprintf(stderr, "conn_bench: %llu GETs failed over %zu connections\n",
                 static_cast<unsigned long long>(failed.load()), n);
    std::exit(1);
  }
  const double cpu = CpuSeconds(FLAGS_server_pid) - cpu0;
  *server_us = total.load() > 0 ? cpu * 1e6 / double(total.load()) : 0;
  return total.load() / std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage("connection scaling of one rdkv server");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  FLAGS_logtostderr = true;
  FLAGS_minloglevel = 1;
  google::InitGoogleLogging(argv[0]);
  if (FLAGS_connections < FLAGS_base_connections || FLAGS_base_connections < 1 || FLAGS_keys < 1 ||
      FLAGS_storm_threads < 1) {
    std::fprintf(stderr, "conn_bench: need connections >= base_connections >= 1, keys >= 1\n");
    return 2;
  }

  const bool memcached = !FLAGS_memcached.empty();
  const char* const store = memcached ? "memcached" : "rdkv";
  const std::string value(FLAGS_value_size, 'v');
  if (memcached) {
    std::string error;
    std::unique_ptr<McConn> loader = McConn::Open(&error);
    if (loader == nullptr) Die(rdkv::Status::Unavailable(error), "connect");
    for (int i = 0; i < FLAGS_keys; ++i) {
      if (!loader->Set(Key(i), value)) Die(rdkv::Status::Unavailable("set failed"), "load");
    }
  } else {
    auto loader = rdkv::Client::Connect(Options());
    if (!loader.ok()) Die(loader.status(), "connect");
    for (int i = 0; i < FLAGS_keys; ++i) {
      auto r = (*loader)->Put(Key(i), value);
      if (!r.ok()) Die(r.status(), "load");
    }
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the loader's session closes
  const uint64_t rss0 = ServerRss();

  // The storm.
  const size_t n = static_cast<size_t>(FLAGS_connections);
  std::vector<std::unique_ptr<BenchConn>> clients(n);
  std::atomic<size_t> next{0};
  std::atomic<uint64_t> failures{0};
  std::mutex first_error_mu;
  std::string first_error;
  std::atomic<bool> go{false};
  std::vector<std::thread> storm;
  for (int t = 0; t < FLAGS_storm_threads; ++t) {
    storm.emplace_back([&] {
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      for (size_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) {
        std::string error;
        if (memcached) {
          clients[i] = McConn::Open(&error);
        } else {
          auto c = rdkv::Client::Connect(Options());
          if (c.ok()) {
            clients[i] = std::make_unique<RdkvConn>(std::move(*c));
          } else {
            error = c.status().ToString();
          }
        }
        if (clients[i] != nullptr) continue;
        failures.fetch_add(1);
        std::lock_guard<std::mutex> l(first_error_mu);
        if (first_error.empty()) first_error = error;
      }
    });
  }
  const auto storm_start = Clock::now();
  go.store(true, std::memory_order_release);
  for (auto& th : storm) th.join();
  const double storm_s = std::chrono::duration<double>(Clock::now() - storm_start).count();
  if (failures.load() > 0) {
    std::fprintf(stderr, "conn_bench: %llu of %zu connections failed; first: %s\n",
                 static_cast<unsigned long long>(failures.load()), n, first_error.c_str());
    return 1;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const uint64_t rss_open = ServerRss();

  // Every connection serves a GET, then the throughput phases.
  for (auto& c : clients) {
    if (!c->Get(Key(0))) Die(rdkv::Status::NotFound(Key(0) + " not found"), "first GET");
  }
  const size_t base = static_cast<size_t>(FLAGS_base_connections);
  if (!FLAGS_only.empty()) {
    const size_t over = FLAGS_only == "base" ? base : n;
    double us = 0;
    const double rate = GetRate(clients, over, &us);
    std::printf("%s conn_bench only=%s connections=%zu get_ops_per_s=%.0f server_us_per_get=%.1f\n",
                store, FLAGS_only.c_str(), over, rate, us);
    return 0;
  }
  double base_rate = 0, all_rate = 0, base_us = 0, all_us = 0;
  for (int rep = 0; rep < 2; ++rep) {
    double us = 0;
    base_rate += GetRate(clients, base, &us) / 2;
    base_us += us / 2;
    all_rate += GetRate(clients, n, &us) / 2;
    all_us += us / 2;
  }
  const uint64_t rss_used = ServerRss();

  const double per_conn_open = rss0 > 0 ? (double(rss_open) - double(rss0)) / double(n) : 0;
  const double per_conn_used = rss0 > 0 ? (double(rss_used) - double(rss0)) / double(n) : 0;
  std::printf(
      "%s conn_bench transport=%s connections=%zu storm_threads=%d handshakes_per_s=%.0f "
      "storm_s=%.3f rss0_mib=%.1f rss_bytes_per_conn_open=%.0f rss_bytes_per_conn_used=%.0f "
      "threads=%d get_ops_per_s_base=%.0f (%zu conns) get_ops_per_s_all=%.0f ratio=%.3f "
      "server_us_per_get_base=%.1f server_us_per_get_all=%.1f server_cpu_ratio=%.3f\n",
      store, memcached ? "tcp" : FLAGS_transport.c_str(), n, FLAGS_storm_threads,
      double(n) / storm_s, storm_s, double(rss0) / (1 << 20), per_conn_open, per_conn_used,
      FLAGS_threads, base_rate, base, all_rate, all_rate / std::max(base_rate, 1e-9), base_us,
      all_us, all_us / std::max(base_us, 1e-9));
  if (!FLAGS_json.empty()) {
    std::ofstream(FLAGS_json) << "{\"connections\":" << n
                              << ",\"handshakes_per_s\":" << double(n) / storm_s
                              << ",\"rss_bytes_per_conn_open\":" << per_conn_open
                              << ",\"rss_bytes_per_conn_used\":" << per_conn_used
                              << ",\"get_ops_per_s_base\":" << base_rate
                              << ",\"get_ops_per_s_all\":" << all_rate
                              << ",\"ratio\":" << all_rate / std::max(base_rate, 1e-9)
                              << ",\"server_us_per_get_base\":" << base_us
                              << ",\"server_us_per_get_all\":" << all_us << "}\n";
  }
  clients.clear();
  return 0;
}

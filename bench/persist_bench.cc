// persist_bench: what persistence costs. docs/benchmarks.md ("Persistence") has the figures.
//
//   persist_bench                                     both phases, defaults below
//   persist_bench --phase=writes --transport=tcp --clients=64
//   persist_bench --phase=recovery --recovery_items=5000000 --value_size=100
//
// Phase "writes": PUT throughput and latency for each --modes (none, async, sync), --clients
// closed-loop clients each with one PUT outstanding, for --seconds per mode, on a fresh data
// dir. --transport=inproc drives the server's request handler directly (Service + Store +
// Persister, replies through the same deferred ReplyHandle path kvserver uses) with
// --threads handler threads: the persistence cost without the network. --transport=tcp runs
// an embedded kvserver and real clients over the tcp transport.
//
// Phase "recovery": writes --recovery_items items (async mode, through the persister), stops
// the persister (everything written), then starts a fresh store from the data dir and reports
// the load rate: keys/s and MiB/s (key + value bytes), split into reading RocksDB and
// applying to the region.
#include <gflags/gflags.h>
#include <glog/logging.h>
#include <sys/mman.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/kv/layout.h"
#include "common/kv/wire.h"
#include "common/transport/transport.h"
#include "common/util/mutex.h"
#include "common/util/thread_annotations.h"
#include "common/util/units.h"
#include "server/persistence/persister.h"
#include "server/server.h"
#include "server/service.h"
#include "server/store.h"

DEFINE_string(phase, "writes,recovery", "Phases to run: writes, recovery.");
DEFINE_string(modes, "none,async,sync", "Durability modes for the writes phase.");
DEFINE_string(transport, "inproc", "writes phase: inproc (the handler, no network) or tcp.");
DEFINE_int32(clients, 256, "Concurrent closed-loop clients (one PUT outstanding each).");
DEFINE_int32(threads, 2, "inproc: handler threads (kvserver's --worker_threads).");
DEFINE_double(seconds, 5, "Measured seconds per mode (after 0.5 s of warm-up).");
DEFINE_int32(value_size, 100, "Bytes per value.");
DEFINE_int32(key_space, 1000000, "writes phase: keys are drawn uniformly from this many.");
DEFINE_int32(persist_lag_ms, 100, "async: --persist_lag_ms.");
DEFINE_int64(recovery_items, 5000000, "recovery phase: items written, then recovered.");
DEFINE_string(memory, "", "Region size (default: enough for the phase).");
DEFINE_string(dir, "", "Work directory (default: a new one under /tmp, removed at the end).");
DEFINE_string(compression, "lz4", "RocksDB compression.");
DEFINE_bool(reuse, false, "recovery phase: reuse the database a previous run left in --dir.");

namespace {

using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;
namespace kv = rdkv::kv;
namespace transport = rdkv::transport;
namespace persistence = rdkv::server::persistence;
using rdkv::CondVar;
using rdkv::Mutex;
using rdkv::MutexLock;
using rdkv::Status;

[[noreturn]] void Die(const Status& s, const std::string& what) {
  std::fprintf(stderr, "persist_bench: %s: %s\n", what.c_str(), s.ToString().c_str());
  std::exit(2);
}

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string x; std::getline(ss, x, ',');) {
    if (!x.empty()) out.push_back(x);
  }
  return out;
}

// An anonymous mapping for the region (zero pages until touched, transparent huge pages).
struct Region {
  explicit Region(size_t n) : size(n) {
    p = static_cast<uint8_t*>(mmap(nullptr, n, PROT_READ | PROT_WRITE,
                                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0));
    if (p == MAP_FAILED) Die(Status::FromErrno("mmap", errno), "region");
    madvise(p, n, MADV_HUGEPAGE);  // as kvserver's region when it has no reserved huge pages
  }
  ~Region() { munmap(p, size); }
  uint8_t* p;
  size_t size;
};

struct Figures {
  double ops_per_s = 0, p50_us = 0, p99_us = 0, p999_us = 0;
  persistence::PersisterStats ps;
};

double Percentile(std::vector<uint32_t>& v, double q) {
  if (v.empty()) return 0;
  size_t i = std::min(v.size() - 1, static_cast<size_t>(q * v.size()));
  std::nth_element(v.begin(), v.begin() + i, v.end());
  return v[i];
}

persistence::PersistOptions Options(persistence::Durability d, const std::string& dir) {
  persistence::PersistOptions o;
  o.durability = d;
  o.data_dir = dir;
  o.persist_lag = std::chrono::milliseconds(FLAGS_persist_lag_ms);
  o.tuning.compression = FLAGS_compression;
  return o;
}

std::string KeyOf(uint64_t i) { return "user" + std::to_string(i); }

// --- writes, in process ---

// Closed-loop clients over the handler: each worker thread serves its share of clients; a
// deferred (sync) reply puts the client back on its worker's ready queue.
class InprocDriver {
 public:
  InprocDriver(rdkv::server::Service* service, int threads, int clients)
      : service_(service), workers_(threads) {
    session_ = std::make_shared<Session>(this);
    starts_.resize(clients);
    for (int c = 0; c < clients; ++c) workers_[c % threads].ready.push_back(c);
  }

  Figures Run(double seconds) {
    std::vector<std::thread> ts;
    for (size_t w = 0; w < workers_.size(); ++w) ts.emplace_back([this, w] { Loop(w); });
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    measuring_ = true;
    Clock::time_point t0 = Clock::now();
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
    measuring_ = false;
    double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    stop_ = true;
    for (auto& w : workers_) {
      MutexLock l(&w.mu);
      w.cv.SignalAll();
    }
    for (auto& t : ts) t.join();
    std::vector<uint32_t> lat;
    for (auto& w : workers_) {
      MutexLock l(&w.mu);  // (the workers have ended; the analysis wants it anyway)
      lat.insert(lat.end(), w.lat.begin(), w.lat.end());
    }
    Figures f;
    f.ops_per_s = lat.size() / secs;
    f.p50_us = Percentile(lat, 0.5);
    f.p99_us = Percentile(lat, 0.99);
    f.p999_us = Percentile(lat, 0.999);
    return f;
  }

  // Waits until every deferred reply came back (before the service goes away).
  void Drain() {
    while (outstanding_.load() > 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }

 private:
  struct Worker {
    Mutex mu;
    CondVar cv;
    std::deque<int> ready GUARDED_BY(mu);
    std::vector<uint32_t> lat GUARDED_BY(mu);
  };
  class Session : public transport::ServerSession {
   public:
    explicit Session(InprocDriver* d) : d_(d) {}
    Status Reply(uint64_t id, std::span<const uint8_t> response) override {
      d_->Done(static_cast<int>(id), response);
      return Status::Ok();
    }
    std::string peer() const override { return "bench"; }
    uint64_t id() const override { return 1; }

   private:
    InprocDriver* d_;
  };

  void Done(int client, std::span<const uint8_t> response) {
    rdkv::Result<kv::Response> r = kv::DecodeResponse(response);
    if (!r.ok() || !r->status.ok()) Die(r.ok() ? r->status : r.status(), "put");
    uint32_t us = static_cast<uint32_t>(
        std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - starts_[client])
            .count());
    Worker& w = workers_[client % workers_.size()];
    MutexLock l(&w.mu);
    if (measuring_) w.lat.push_back(us);
    w.ready.push_back(client);
    w.cv.Signal();
    outstanding_.fetch_sub(1);
  }

  void Loop(size_t wi) {
    Worker& w = workers_[wi];
    std::mt19937_64 rng(wi + 1);
    std::string value(FLAGS_value_size, 'v');
    std::vector<uint8_t> req, resp;
    for (;;) {
      int c;
      {
        MutexLock lk(&w.mu);
        while (!(stop_ || !w.ready.empty())) w.cv.Wait(&w.mu);
        if (stop_) return;
        c = w.ready.front();
        w.ready.pop_front();
      }
      std::string key = KeyOf(rng() % FLAGS_key_space);
      kv::EncodeRequest({kv::Op::kPut, key, value, 0}, &req);
      starts_[c] = Clock::now();
      outstanding_.fetch_add(1);
      transport::ReplyHandle h{session_, static_cast<uint64_t>(c)};
      if (service_->Handle(req, &resp, &h)) Done(c, resp);
    }
  }

  rdkv::server::Service* service_;
  std::vector<Worker> workers_;
  std::shared_ptr<Session> session_;
  std::vector<Clock::time_point> starts_;
  std::atomic<bool> stop_{false}, measuring_{false};
  std::atomic<int64_t> outstanding_{0};
};

Figures InprocWrites(persistence::Durability d, const std::string& dir, uint64_t memory) {
  Region region(memory);
  rdkv::server::StoreOptions so;
  auto store = rdkv::server::Store::Format(region.p, region.size, so);
  if (!store.ok()) Die(store.status(), "format");
  auto p = persistence::Persister::Start(Options(d, dir), store->get());
  if (!p.ok()) Die(p.status(), "persister");
  Figures f;
  {
    rdkv::server::Service service(store->get(), kv::WireLimits{}, p->get());
    InprocDriver driver(&service, FLAGS_threads, FLAGS_clients);
    f = driver.Run(FLAGS_seconds);
    driver.Drain();
    if (*p) f.ps = (*p)->stats();
    p->reset();
  }
  return f;
}

// --- writes, over tcp ---

Figures TcpWrites(persistence::Durability d, const std::string& dir, uint64_t memory) {
  rdkv::server::ServerOptions so;
  so.port = 0;
  so.memory_bytes = memory;
  so.worker_threads = FLAGS_threads;
  so.huge_pages = false;
  so.persist = Options(d, dir);
  auto server = rdkv::server::Server::Start(so);
  if (!server.ok()) Die(server.status(), "server");
  auto fabric = transport::Fabric::Create({transport::TransportKind::kTcp, "", false});
  if (!fabric.ok()) Die(fabric.status(), "fabric");
  const int conns = std::min(FLAGS_clients, 16);
  std::vector<std::unique_ptr<transport::Connection>> cs;
  for (int i = 0; i < conns; ++i) {
    transport::ConnectOptions co;
    co.host = "127.0.0.1";
    co.port = (*server)->port();
    co.max_outstanding_calls = 1024;
    auto c = (*fabric)->Connect(co);
    if (!c.ok()) Die(c.status(), "connect");
    cs.push_back(std::move(*c));
  }
  std::atomic<bool> stop{false}, measuring{false};
  std::vector<std::vector<uint32_t>> lats(FLAGS_clients);
  std::vector<std::thread> ts;
  for (int i = 0; i < FLAGS_clients; ++i) {
    ts.emplace_back([&, i] {
      std::mt19937_64 rng(i + 1);
      std::string value(FLAGS_value_size, 'v');
      std::vector<uint8_t> req, resp;
      while (!stop) {
        std::string key = KeyOf(rng() % FLAGS_key_space);
        kv::EncodeRequest({kv::Op::kPut, key, value, 0}, &req);
        Clock::time_point t0 = Clock::now();
        Status s = cs[i % conns]->Call(req, &resp, std::chrono::seconds(30));
        if (!s.ok()) Die(s, "call");
        auto r = kv::DecodeResponse(resp);
        if (!r.ok() || !r->status.ok()) Die(r.ok() ? r->status : r.status(), "put");
        if (measuring) {
          lats[i].push_back(static_cast<uint32_t>(
              std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t0).count()));
        }
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  measuring = true;
  Clock::time_point t0 = Clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(FLAGS_seconds));
  measuring = false;
  double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  stop = true;
  for (auto& t : ts) t.join();
  std::vector<uint32_t> lat;
  for (auto& l : lats) lat.insert(lat.end(), l.begin(), l.end());
  Figures f;
  f.ops_per_s = lat.size() / secs;
  f.p50_us = Percentile(lat, 0.5);
  f.p99_us = Percentile(lat, 0.99);
  f.p999_us = Percentile(lat, 0.999);
  cs.clear();
  std::string stats = (*server)->StatsJson();
  size_t at = stats.find("\"groups\":");
  if (at != std::string::npos) f.ps.groups = std::stoull(stats.substr(at + 9));
  at = stats.find("\"records\":");
  if (at != std::string::npos) f.ps.records = std::stoull(stats.substr(at + 10));
  at = stats.find("\"syncs\":");
  if (at != std::string::npos) f.ps.syncs = std::stoull(stats.substr(at + 8));
  return f;
}

void WritesPhase(const std::string& work) {
  uint64_t memory = FLAGS_memory.empty() ? (1ull << 30) : *rdkv::ParseByteSize(FLAGS_memory);
  std::printf("writes: transport=%s clients=%d threads=%d value=%d B keys=%d seconds=%.1f\n",
              FLAGS_transport.c_str(), FLAGS_clients, FLAGS_threads, FLAGS_value_size,
              FLAGS_key_space, FLAGS_seconds);
  std::printf("%-6s %12s %9s %9s %10s %9s %11s\n", "mode", "PUT/s", "p50 us", "p99 us", "p99.9 us",
              "groups", "recs/group");
  double async_rate = 0, sync_rate = 0;
  for (const std::string& m : Split(FLAGS_modes)) {
    auto d = persistence::ParseDurability(m);
    if (!d.ok()) Die(d.status(), "--modes");
    std::string dir = work + "/writes-" + m;
    Figures f =
        FLAGS_transport == "tcp" ? TcpWrites(*d, dir, memory) : InprocWrites(*d, dir, memory);
    std::printf("%-6s %12.0f %9.0f %9.0f %10.0f %9llu %11.1f\n", m.c_str(), f.ops_per_s, f.p50_us,
                f.p99_us, f.p999_us, static_cast<unsigned long long>(f.ps.groups),
                f.ps.groups ? double(f.ps.records) / f.ps.groups : 0.0);
    std::fflush(stdout);
    if (*d == persistence::Durability::kAsync) async_rate = f.ops_per_s;
    if (*d == persistence::Durability::kSync) sync_rate = f.ops_per_s;
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  if (async_rate > 0 && sync_rate > 0) {
    std::printf("sync / async throughput: %.0f%%\n", 100.0 * sync_rate / async_rate);
  }
}

// --- recovery ---

// CPU time of the whole process (user + system): on a shared machine the wall clock also
// counts the time other processes had the cores.
double CpuSeconds() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec +
         (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

void RecoveryPhase(const std::string& work) {
  const uint64_t n = FLAGS_recovery_items;
  // Items of 32 B header + key + value in kUnit units, with slack; an index of 16 slots per
  // item: at millions of keys a 16-slot window overflows (kOutOfSpace) already at a quarter
  // of the slots in use (a Poisson tail), so the index is sized generously.
  uint64_t item = rdkv::kv::UnitsFor(rdkv::kv::ItemBytes(16, FLAGS_value_size)) * rdkv::kv::kUnit;
  uint64_t memory = FLAGS_memory.empty() ? n * item * 5 / 4 + n * 128 + (64ull << 20)
                                         : *rdkv::ParseByteSize(FLAGS_memory);
  rdkv::server::StoreOptions so;
  so.index_fraction = std::min(0.5, double(n * 128) / memory);
  std::string dir = work + "/recovery";
  std::printf("recovery: %llu items, value %d B, region %llu MiB, compression %s\n",
              static_cast<unsigned long long>(n), FLAGS_value_size,
              static_cast<unsigned long long>(memory >> 20), FLAGS_compression.c_str());
  std::fflush(stdout);
  if (!(FLAGS_reuse && fs::exists(dir + "/db/CURRENT"))) {
    std::error_code ec;
    fs::remove_all(dir, ec);
    Region region(memory);
    auto store = rdkv::server::Store::Format(region.p, region.size, so);
    if (!store.ok()) Die(store.status(), "format");
    auto p =
        persistence::Persister::Start(Options(persistence::Durability::kAsync, dir), store->get());
    if (!p.ok()) Die(p.status(), "persister");
    Clock::time_point t0 = Clock::now();
    std::string value(FLAGS_value_size, 'v');
    std::mt19937_64 rng(7);
    for (uint64_t i = 0; i < n; ++i) {
      for (size_t j = 0; j < value.size(); j += 8) value[j] = static_cast<char>('a' + rng() % 26);
      std::string key = KeyOf(i);
      Status a = (*p)->Admit();
      if (!a.ok()) Die(a, "admit");
      auto v = (*store)->Put(key, value);
      if (!v.ok()) Die(v.status(), "load put");
      (*p)->EnqueuePut(key, *v, value, nullptr);
    }
    Status f = (*p)->Flush();
    if (!f.ok()) Die(f, "flush");
    p->reset();
    std::printf("  written in %.1f s\n", std::chrono::duration<double>(Clock::now() - t0).count());
  }
  uint64_t disk = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir + "/db")) {
    if (e.is_regular_file()) disk += e.file_size();
  }
  Region region(memory);
  // The region's first touch is the cost of allocating memory, not of recovery: kvserver pays
  // it when it registers the region with an RDMA NIC (which pins every page) or allocates it
  // on reserved huge pages, before it loads anything. On a VM whose host hands out memory
  // lazily it can take longer than the load itself, so it is done and timed apart.
  {
    Clock::time_point f0 = Clock::now();
    for (size_t off = 0; off < region.size; off += 4096) region.p[off] = 0;
    std::printf("  region first touch (allocation, not recovery): %.2f s for %llu MiB\n",
                std::chrono::duration<double>(Clock::now() - f0).count(),
                static_cast<unsigned long long>(region.size >> 20));
  }
  auto store = rdkv::server::Store::Format(region.p, region.size, so);
  if (!store.ok()) Die(store.status(), "format");
  persistence::RecoveryStats rs;
  persistence::PersistOptions o = Options(persistence::Durability::kAsync, dir);
  Clock::time_point t0 = Clock::now();
  double cpu0 = CpuSeconds();
  auto p = persistence::Persister::Start(o, store->get(), &rs);
  double start_s = std::chrono::duration<double>(Clock::now() - t0).count();
  double cpu_s = CpuSeconds() - cpu0;
  if (!p.ok()) Die(p.status(), "recovery");
  double mib = rs.bytes / 1048576.0;
  std::printf("  database on disk: %.0f MiB\n", disk / 1048576.0);
  std::printf(
      "  recovered %llu keys, %.0f MiB (keys + values) in %.2f s: %.0f keys/s, %.0f MiB/s\n",
      static_cast<unsigned long long>(rs.keys), mib, rs.seconds, rs.keys / rs.seconds,
      mib / rs.seconds);
  std::printf(
      "    %d threads (key ranges) reading RocksDB and writing the region: %.2f s of "
      "CPU (%.0f keys per CPU second)\n",
      rs.threads, rs.cpu_seconds, rs.keys / rs.cpu_seconds);
  std::printf(
      "  whole start (load + reopen for writing): %.2f s wall, %.2f s of CPU (all threads; "
      "%.0f keys per CPU second)\n",
      start_s, cpu_s, rs.keys / cpu_s);
  p->reset();
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage("persist_bench [--phase=writes,recovery] [--modes=none,async,sync]");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  FLAGS_logtostderr = true;
  if (gflags::GetCommandLineFlagInfoOrDie("minloglevel").is_default) FLAGS_minloglevel = 1;
  google::InitGoogleLogging(argv[0]);
  std::string work = FLAGS_dir;
  if (work.empty()) {
    std::string tmpl = "/tmp/persist-bench-XXXXXX";
    if (!mkdtemp(tmpl.data())) Die(Status::FromErrno("mkdtemp", errno), "work dir");
    work = tmpl;
  }
  fs::create_directories(work);
  for (const std::string& ph : Split(FLAGS_phase)) {
    if (ph == "writes") {
      WritesPhase(work);
    } else if (ph == "recovery") {
      RecoveryPhase(work);
    } else {
      Die(Status::InvalidArgument(ph), "--phase");
    }
  }
  if (FLAGS_dir.empty()) {
    std::error_code ec;
    fs::remove_all(work, ec);
  }
  return 0;
}

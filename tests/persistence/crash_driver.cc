// The persistence crash test (in the spirit of RocksDB's db_crashtest): repeatedly starts a
// kvserver process, drives concurrent writes over the wire while logging every acknowledged
// write with its version, kill -9s the server at a random moment, and checks what survived:
//
//   1. right after the kill, the database on disk (read-only, the same code recovery uses):
//      every acknowledged write is there with its version and value, or a newer one;
//   2. after the restart, through the server: each key has exactly the version on disk
//      (recovery loads what is on disk, versions included);
//   3. versions keep growing across restarts: every write acknowledged after a restart has a
//      version above everything acknowledged before it.
//
// Each writer thread owns its keys, so a key's acknowledged history is a sequence and at most
// one write per key is in flight at the kill (its outcome is unknown: either result is fine).
// sync mode: zero lost acknowledged writes allowed. async mode: lost acknowledged writes are
// counted and reported; the test fails only if one was acknowledged more than
// --persist_lag_ms before the kill.
//
// Writes go through the raw two-sided transport (common/kv/wire.h); values are checked on
// disk, versions through the server (a CAS with expected version 0 never applies and answers
// the current version).
#include <gflags/gflags.h>
#include <glog/logging.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/kv/wire.h"
#include "common/transport/transport.h"
#include "server/persistence/recovery.h"

DEFINE_string(kvserver, "", "Path of the kvserver binary.");
DEFINE_string(mode, "sync", "Durability mode under test: sync or async.");
DEFINE_int32(cycles, 20, "Kill cycles.");
DEFINE_int32(threads, 4, "Writer threads (each owns its keys).");
DEFINE_int32(keys_per_thread, 48, "Keys per writer thread.");
DEFINE_int32(min_run_ms, 150, "Shortest time writes run before the kill.");
DEFINE_int32(max_run_ms, 1000, "Longest time writes run before the kill.");
DEFINE_int32(persist_lag_ms, 100, "--persist_lag_ms given to the server (async).");
DEFINE_string(dir, "", "Work directory (default: a new one under $TMPDIR or /tmp).");
DEFINE_uint64(seed, 0, "Random seed (0: from the clock; printed).");
DEFINE_int32(value_pad, 200,
             "Values carry up to this many filler bytes; above a page, a write group can be torn "
             "by the kill (the WAL's last record cut inside).");
DEFINE_int32(start_timeout_s, 120, "How long a server start (with recovery) may take.");

// TSan builds: with TZ unset, glibc's tzset() frees and re-allocates its copy of the zone
// name under a libc-internal lock TSan cannot see, and glog reaches it (through mktime) for
// every log line, so two threads logging look like a race. Not rdkv code (tests/persistence/
// tsan.supp says the same for the kvserver processes the crash test starts).
extern "C" const char* __tsan_default_suppressions() { return "race:tzset_internal\n"; }

namespace {

using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;
namespace kv = rdkv::kv;
namespace transport = rdkv::transport;
using rdkv::Status;
using rdkv::StatusCode;

// The model of one key: its last acknowledged state, its acknowledged history, and the write
// in flight (if any) when the server died.
struct Acked {
  bool exists = false;
  uint64_t version = 0;  // for a delete: the version it removed
  std::string value;
  Clock::time_point at{};
};
struct KeyModel {
  std::string key;
  std::vector<Acked> history;  // acknowledged writes, in order (this cycle and before)
  bool exists = false;
  uint64_t version = 0;  // current version (or, when deleted, the last one it had)
  std::string value;
  std::optional<kv::Op> in_flight;
  std::string in_flight_value;
};

struct Totals {
  std::atomic<uint64_t> acked{0}, lost{0}, lost_too_old{0}, violations{0}, unknown{0};
};

std::mutex g_log_mu;
std::ofstream g_log;  // every acknowledged write and every finding, for post-mortems

void Log(const std::string& line) {
  std::lock_guard<std::mutex> l(g_log_mu);
  g_log << line << "\n";
}

void Violation(Totals& t, const std::string& what) {
  t.violations.fetch_add(1);
  Log("VIOLATION " + what);
  std::fprintf(stderr, "crash_test: VIOLATION: %s\n", what.c_str());
}

class ServerProcess {
 public:
  // Starts kvserver; returns once it serves (its port file exists) or fails.
  bool Start(const std::string& data_dir, const std::string& work, int cycle) {
    std::string port_file = work + "/port";
    fs::remove(port_file);
    log_ = work + "/server-" + std::to_string(cycle) + ".log";
    std::vector<std::string> args = {FLAGS_kvserver,
                                     "--port=0",
                                     "--port_file=" + port_file,
                                     "--transport=tcp",
                                     "--memory=64MiB",
                                     "--worker_threads=2",
                                     "--durability=" + FLAGS_mode,
                                     "--data_dir=" + data_dir,
                                     "--persist_lag_ms=" + std::to_string(FLAGS_persist_lag_ms),
                                     "--rocksdb_write_buffer=4MiB",
                                     "--huge_pages=false"};
    pid_ = fork();
    if (pid_ == 0) {
      FILE* f = std::freopen(log_.c_str(), "w", stderr);
      (void)f;
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      std::perror("execv kvserver");
      _exit(127);
    }
    auto deadline = Clock::now() + std::chrono::seconds(FLAGS_start_timeout_s);
    while (Clock::now() < deadline) {
      int st;
      if (waitpid(pid_, &st, WNOHANG) == pid_) {
        std::fprintf(stderr, "crash_test: kvserver exited during start (status %d); see %s\n", st,
                     log_.c_str());
        pid_ = -1;
        return false;
      }
      std::ifstream in(port_file);
      int p = 0;
      if (in >> p && p > 0) {
        port_ = static_cast<uint16_t>(p);
        return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    std::fprintf(stderr, "crash_test: kvserver did not start in time; see %s\n", log_.c_str());
    Kill();
    return false;
  }
  void Kill() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    int st;
    waitpid(pid_, &st, 0);
    pid_ = -1;
  }
  // SIGTERM; true when it exits 0.
  bool Stop() {
    if (pid_ <= 0) return false;
    kill(pid_, SIGTERM);
    int st = 0;
    waitpid(pid_, &st, 0);
    pid_ = -1;
    return WIFEXITED(st) && WEXITSTATUS(st) == 0;
  }
  uint16_t port() const { return port_; }
  const std::string& log() const { return log_; }

 private:
  pid_t pid_ = -1;
  uint16_t port_ = 0;
  std::string log_;
};

transport::ConnectOptions ConnectTo(uint16_t port) {
  transport::ConnectOptions o;
  o.host = "127.0.0.1";
  o.port = port;
  return o;
}

struct CallResult {
  Status transport;  // not OK: the server did not answer (outcome unknown)
  Status status;
  uint64_t version = 0;
};

CallResult Call(transport::Connection& c, kv::Op op, std::string_view key, std::string_view value,
                uint64_t expected) {
  std::vector<uint8_t> req, resp;
  kv::EncodeRequest({op, key, value, expected}, &req);
  CallResult out;
  out.transport = c.Call(req, &resp, std::chrono::seconds(10));
  if (!out.transport.ok()) return out;
  rdkv::Result<kv::Response> r = kv::DecodeResponse(resp);
  if (!r.ok()) {
    out.transport = r.status();
    return out;
  }
  out.status = r->status;
  out.version = r->version;
  return out;
}

// The server's version of `key`: 0 when absent.
std::optional<uint64_t> ProbeVersion(transport::Connection& c, const std::string& key) {
  CallResult r = Call(c, kv::Op::kCas, key, "", 0);
  if (!r.transport.ok()) return std::nullopt;
  if (r.status.code() == StatusCode::kNotFound) return 0;
  if (r.status.code() == StatusCode::kVersionMismatch) return r.version;
  return std::nullopt;
}

// One writer thread's run until the connection breaks.
void Writer(transport::Connection& c, std::vector<KeyModel>& keys, int cycle, int tid,
            uint64_t seed, uint64_t min_version, Totals& totals) {
  std::mt19937_64 rng(seed);
  uint64_t n = 0;
  for (;;) {
    KeyModel& k = keys[rng() % keys.size()];
    kv::Op op;
    uint64_t r = rng() % 100;
    if (k.exists) {
      op = r < 55 ? kv::Op::kPut : r < 80 ? kv::Op::kCas : kv::Op::kDelete;
    } else {
      op = r < 60 ? kv::Op::kInsert : kv::Op::kPut;
    }
    std::string value;
    if (op != kv::Op::kDelete) {
      value = "c" + std::to_string(cycle) + "t" + std::to_string(tid) + "n" + std::to_string(n++);
      value.append(rng() % (static_cast<uint64_t>(FLAGS_value_pad) + 1),
                   static_cast<char>('a' + rng() % 26));
    }
    k.in_flight = op;
    k.in_flight_value = value;
    CallResult res = Call(c, op, k.key, value, op == kv::Op::kCas ? k.version : 0);
    if (!res.transport.ok()) return;  // the server died: the write stays in flight
    if (!res.status.ok()) {
      Violation(totals, "unexpected answer to " + std::string(kv::OpName(op)) + " of " + k.key +
                            " (model: " + (k.exists ? "v" + std::to_string(k.version) : "absent") +
                            "): " + res.status.ToString());
      k.in_flight.reset();
      return;
    }
    Acked a;
    a.at = Clock::now();
    a.exists = op != kv::Op::kDelete;
    a.version = a.exists ? res.version : k.version;
    a.value = value;
    if (a.exists && (res.version <= k.version || res.version <= min_version)) {
      Violation(totals, "version did not grow: " + k.key + " got v" + std::to_string(res.version) +
                            " after v" + std::to_string(k.version) + " (before this run: v" +
                            std::to_string(min_version) + ")");
    }
    k.history.push_back(a);
    k.exists = a.exists;
    k.version = a.version;
    k.value = value;
    k.in_flight.reset();
    totals.acked.fetch_add(1);
    Log("ACK " + k.key + " " + std::string(kv::OpName(op)) + " v" + std::to_string(a.version));
  }
}

// Checks one key against what survived (`found`: version and value, or absent) and moves the
// model to that state.
void CheckKey(KeyModel& k, std::optional<std::pair<uint64_t, std::string>> found,
              Clock::time_point kill_time, Totals& totals) {
  const bool sync = FLAGS_mode == "sync";
  auto matches_last = [&]() {
    if (!k.exists) return !found.has_value();
    return found && found->first == k.version && found->second == k.value;
  };
  auto adopt = [&]() {
    k.exists = found.has_value();
    if (found) {
      k.version = found->first;
      k.value = found->second;
    }
    k.in_flight.reset();
  };
  if (matches_last()) return adopt();
  // The write in flight at the kill may have applied (and even persisted).
  if (k.in_flight) {
    bool fl_exists = *k.in_flight != kv::Op::kDelete;
    bool ok = fl_exists ? (found && found->first > k.version && found->second == k.in_flight_value)
                        : !found.has_value();
    if (ok) {
      totals.unknown.fetch_add(1);
      Log("INFLIGHT-APPLIED " + k.key);
      return adopt();
    }
  }
  // Lost acknowledged writes: find the acknowledged state that survived, if any.
  size_t survived = k.history.size();  // index of the last acked write that is reflected
  bool found_state = false;
  for (size_t i = k.history.size(); i-- > 0;) {
    const Acked& a = k.history[i];
    bool same = a.exists ? (found && found->first == a.version && found->second == a.value)
                         : !found.has_value();
    if (same) {
      survived = i;
      found_state = true;
      break;
    }
  }
  if (!found_state && !found.has_value()) {
    survived = static_cast<size_t>(-1);  // nothing acked survived: absent as before any write
    found_state = true;
  }
  if (!found_state) {
    Violation(totals, k.key + " holds v" + std::to_string(found->first) +
                          " which matches no acknowledged write of it (last acked: " +
                          (k.exists ? "v" + std::to_string(k.version) : "deleted") + ")");
    return adopt();
  }
  size_t first_lost = survived == static_cast<size_t>(-1) ? 0 : survived + 1;
  for (size_t i = first_lost; i < k.history.size(); ++i) {
    const Acked& a = k.history[i];
    auto age = std::chrono::duration_cast<std::chrono::milliseconds>(kill_time - a.at);
    totals.lost.fetch_add(1);
    std::string what = "lost acknowledged write: " + k.key + " " +
                       (a.exists ? "v" + std::to_string(a.version) : "delete") + ", acked " +
                       std::to_string(age.count()) + " ms before the kill";
    Log("LOST " + what);
    if (sync) {
      Violation(totals, what);
    } else if (age.count() > FLAGS_persist_lag_ms) {
      totals.lost_too_old.fetch_add(1);
      Violation(totals, what + " (more than --persist_lag_ms=" +
                            std::to_string(FLAGS_persist_lag_ms) + ")");
    }
  }
  k.history.resize(first_lost);
  adopt();
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage("crash_driver --kvserver=PATH --mode=sync|async [--cycles=N]");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  FLAGS_logtostderr = true;
  if (gflags::GetCommandLineFlagInfoOrDie("minloglevel").is_default) {
    FLAGS_minloglevel = 2;  // the transport logs every connect and every lost connection
  }
  google::InitGoogleLogging(argv[0]);
  if (FLAGS_kvserver.empty() || (FLAGS_mode != "sync" && FLAGS_mode != "async")) {
    std::fprintf(stderr, "usage: crash_driver --kvserver=PATH --mode=sync|async\n");
    return 2;
  }
  uint64_t seed =
      FLAGS_seed ? FLAGS_seed : static_cast<uint64_t>(Clock::now().time_since_epoch().count());
  std::string work = FLAGS_dir;
  if (work.empty()) {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/rdkv-crash-XXXXXX";
    if (!mkdtemp(tmpl.data())) {
      std::perror("mkdtemp");
      return 2;
    }
    work = tmpl;
  }
  fs::create_directories(work);
  std::string data_dir = work + "/data";
  g_log.open(work + "/crash.log");
  std::printf("crash_test: mode=%s cycles=%d threads=%d keys=%d seed=%llu work=%s\n",
              FLAGS_mode.c_str(), FLAGS_cycles, FLAGS_threads,
              FLAGS_threads * FLAGS_keys_per_thread, static_cast<unsigned long long>(seed),
              work.c_str());
  std::fflush(stdout);

  std::mt19937_64 rng(seed);
  std::vector<std::vector<KeyModel>> keys(FLAGS_threads);
  for (int t = 0; t < FLAGS_threads; ++t) {
    for (int i = 0; i < FLAGS_keys_per_thread; ++i) {
      KeyModel k;
      k.key = "t" + std::to_string(t) + "-k" + std::to_string(i);
      keys[t].push_back(std::move(k));
    }
  }
  auto fabric = transport::Fabric::Create({transport::TransportKind::kTcp, "", false});
  if (!fabric.ok()) {
    std::fprintf(stderr, "crash_test: %s\n", fabric.status().ToString().c_str());
    return 2;
  }
  Totals totals;
  uint64_t max_acked_version = 0;
  uint64_t torn_tails = 0;  // kills that left a torn last WAL record (cut by the next start)
  const auto t_start = Clock::now();
  ServerProcess server;
  for (int cycle = 1; cycle <= FLAGS_cycles + 1; ++cycle) {
    const bool last = cycle == FLAGS_cycles + 1;  // a final start: verify the last kill, stop
    if (!server.Start(data_dir, work, cycle)) return 1;
    // Through the server: every key has the version found on disk after the last kill.
    {
      auto c = (*fabric)->Connect(ConnectTo(server.port()));
      if (!c.ok()) {
        std::fprintf(stderr, "crash_test: connect: %s\n", c.status().ToString().c_str());
        return 1;
      }
      for (auto& tk : keys) {
        for (KeyModel& k : tk) {
          std::optional<uint64_t> v = ProbeVersion(**c, k.key);
          uint64_t want = k.exists ? k.version : 0;
          if (!v) {
            Violation(totals, "cannot probe " + k.key + " after restart");
          } else if (*v != want) {
            Violation(totals, "after restart " + k.key + " is at v" + std::to_string(*v) +
                                  ", the disk had " +
                                  (k.exists ? "v" + std::to_string(want) : "nothing"));
          }
        }
      }
    }
    if (last) {
      bool clean = server.Stop();
      if (!clean) Violation(totals, "kvserver did not exit 0 on SIGTERM; see " + server.log());
      break;
    }
    // Writes until the kill.
    std::vector<std::unique_ptr<transport::Connection>> conns;
    for (int t = 0; t < FLAGS_threads; ++t) {
      auto c = (*fabric)->Connect(ConnectTo(server.port()));
      if (!c.ok()) {
        std::fprintf(stderr, "crash_test: connect: %s\n", c.status().ToString().c_str());
        return 1;
      }
      conns.push_back(std::move(*c));
    }
    std::vector<std::thread> writers;
    for (int t = 0; t < FLAGS_threads; ++t) {
      writers.emplace_back(Writer, std::ref(*conns[t]), std::ref(keys[t]), cycle, t, rng(),
                           max_acked_version, std::ref(totals));
    }
    int run_ms =
        FLAGS_min_run_ms + static_cast<int>(rng() % (FLAGS_max_run_ms - FLAGS_min_run_ms + 1));
    std::this_thread::sleep_for(std::chrono::milliseconds(run_ms));
    const Clock::time_point kill_time = Clock::now();
    server.Kill();
    for (auto& w : writers) w.join();
    conns.clear();
    uint64_t before = totals.acked.load();
    // On disk, read-only, before anything restarts: what the next start recovers. The one WAL
    // damage a kill may leave is a torn last record (WalScan::crash_torn_tail), which the
    // start cuts (--wal_recovery=torn_tail): then read what precedes it. Any other damage
    // fails the read, and the test. The restart below must serve exactly what was read.
    namespace persistence = rdkv::server::persistence;
    rdkv::Result<persistence::WalScan> wal = persistence::ScanWalFiles(data_dir + "/db");
    if (!wal.ok()) {
      Violation(totals, "cannot scan the WAL after the kill: " + wal.status().ToString());
      return 1;
    }
    persistence::WalRecovery read_mode = persistence::WalRecovery::kRefuse;
    if (wal->crash_torn_tail()) {
      ++torn_tails;
      Log("cycle " + std::to_string(cycle) + ": torn WAL tail " + wal->Describe());
      read_mode = persistence::WalRecovery::kPointInTime;
    }
    std::map<std::string, std::pair<uint64_t, std::string>> disk;
    Status s = persistence::ScanDatabase(
        data_dir + "/db", nullptr,
        [&](std::string_view k, uint64_t v, std::string_view val) {
          disk[std::string(k)] = {v, std::string(val)};
        },
        nullptr, read_mode);
    if (!s.ok()) {
      Violation(totals, "cannot read the database after the kill: " + s.ToString());
      return 1;
    }
    uint64_t lost_before = totals.lost.load();
    for (auto& tk : keys) {
      for (KeyModel& k : tk) {
        for (const Acked& a : k.history) max_acked_version = std::max(max_acked_version, a.version);
        auto it = disk.find(k.key);
        std::optional<std::pair<uint64_t, std::string>> found;
        if (it != disk.end()) found = it->second;
        CheckKey(k, found, kill_time, totals);
        k.history.clear();  // verified: the next cycle's history starts from the disk state
        if (k.exists) k.history.push_back(Acked{true, k.version, k.value, kill_time});
      }
    }
    std::printf(
        "crash_test: cycle %d: killed after %d ms; %llu writes acknowledged so far; "
        "%llu lost this cycle; %llu violations\n",
        cycle, run_ms, static_cast<unsigned long long>(before),
        static_cast<unsigned long long>(totals.lost.load() - lost_before),
        static_cast<unsigned long long>(totals.violations.load()));
    std::fflush(stdout);
  }
  double secs = std::chrono::duration<double>(Clock::now() - t_start).count();
  std::printf(
      "crash_test: mode=%s: %d kill cycles in %.1f s, %llu acknowledged writes, %llu lost "
      "(%llu acked more than %d ms before a kill), %llu in-flight writes applied, "
      "%llu torn WAL tails cut at restart, %llu violations\n",
      FLAGS_mode.c_str(), FLAGS_cycles, secs, static_cast<unsigned long long>(totals.acked.load()),
      static_cast<unsigned long long>(totals.lost.load()),
      static_cast<unsigned long long>(totals.lost_too_old.load()), FLAGS_persist_lag_ms,
      static_cast<unsigned long long>(totals.unknown.load()),
      static_cast<unsigned long long>(torn_tails),
      static_cast<unsigned long long>(totals.violations.load()));
  if (totals.violations.load() == 0) {
    g_log.close();
    std::error_code ec;
    if (FLAGS_dir.empty()) fs::remove_all(work, ec);
    std::printf("crash_test: PASS\n");
    return 0;
  }
  std::printf("crash_test: FAIL (details in %s/crash.log)\n", work.c_str());
  return 1;
}

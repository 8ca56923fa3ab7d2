// history_load: N client threads run a mix of get/put/insert/cas/delete on K hot keys against
// an rdkv server or cluster (tcp) and record every operation into a history (history.h) for
// lincheck. Every value is unique (client id + sequence). Errors are recorded as they are:
// kTimedOut, kConnectionLost, kUnavailable (and any other unexpected error of a write) as
// `unknown`; nothing is retried here, so no retry hides an outcome.
//
//   history_load --seed=127.0.0.1:7400 --threads=8 --keys=8 --seconds=5 --out=h.jsonl
//   lincheck h.jsonl
//
// --inject=stale_read (for testing the checker end to end): one GET's recorded answer is
// replaced by an older value of its key that the same thread had seen before a newer one; the
// history is then not linearizable. Exit 0 after the run; 2 on a setup error, or when the
// injection was asked for and did not happen.
#include <gflags/gflags.h>
#include <glog/logging.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/kv/layout.h"
#include "rdkv/client.h"
#include "tests/history/history.h"

DEFINE_string(seed, "127.0.0.1:7400", "A server of the cluster, host:port.");
DEFINE_string(transport, "tcp", "Client transport: tcp, verbs or auto.");
DEFINE_int32(threads, 8, "Client threads (each with its own rdkv::Client).");
DEFINE_int32(keys, 8, "Hot keys.");
DEFINE_double(seconds, 5, "Duration of the run.");
DEFINE_string(mix, "get:50,put:15,insert:10,cas:15,delete:10",
              "Weights of the operations: get, put, insert, cas, delete.");
DEFINE_string(out, "history.jsonl", "The history file to write.");
DEFINE_string(key_prefix, "",
              "Prefix of the keys (they must be absent at the start); empty = a fresh one per run "
              "(h<pid>-<time>-).");
DEFINE_uint64(client_base, 0,
              "First client id: give each history_load process of one history its own range.");
DEFINE_int32(op_timeout_ms, 2000, "ClientOptions::op_timeout.");
DEFINE_string(stop_file, "",
              "End the run early once this file exists (checked every 100 ms); --seconds is "
              "then the longest it runs.");
DEFINE_uint64(rng_seed, 0, "Random seed (0 = from the clock).");
DEFINE_bool(pin_keys, false,
            "Thread i uses only key i % keys (run threads >= keys; a multiple gives each key "
            "several contending threads): a thread waiting on one shard's failover then holds "
            "up no other key's operations (bench/failover-bench.sh, unaffected shards).");
DEFINE_int32(get_only_threads, 0,
             "The first N threads issue only GETs (with --pin_keys: a reader per key whose GETs "
             "no write of its own thread holds up).");
DEFINE_int32(get_only_pause_us, 0,
             "Those threads pause this long after each GET (0: none), so that readers do not "
             "take the CPU from everything else on a small host.");
DEFINE_int32(pause_us, 0,
             "Every other thread pauses this long after each operation (0: none): a lighter "
             "load, and a shorter history, for a slow host such as the emulated Soft-RoCE VM.");
DEFINE_string(keys_out, "",
              "Also write the hot keys, one line each: the key and its KeyHash in decimal (the "
              "shard is ShardOf(hash, shards), common/kv/limits.h), for analyses by shard.");
DEFINE_string(inject, "", "Test only: 'stale_read' records one GET with a stale answer.");

namespace {

using rdkv::history::ClientLog;
using rdkv::history::MonotonicNowNs;
using rdkv::history::Op;
using rdkv::history::OpType;
using rdkv::history::Outcome;
using rdkv::history::OutcomeOfStatus;

struct Mix {
  int w[5] = {0, 0, 0, 0, 0};  // by OpType
  int total = 0;
};

bool ParseMix(const std::string& s, Mix* mix) {
  size_t pos = 0;
  while (pos < s.size()) {
    size_t comma = s.find(',', pos);
    std::string item = s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    pos = comma == std::string::npos ? s.size() : comma + 1;
    size_t colon = item.find(':');
    if (colon == std::string::npos) return false;
    auto t = rdkv::history::ParseOpType(item.substr(0, colon));
    if (!t.ok()) return false;
    int weight = std::atoi(item.c_str() + colon + 1);
    if (weight < 0) return false;
    mix->w[static_cast<int>(*t)] = weight;
  }
  for (int x : mix->w) mix->total += x;
  return mix->total > 0;
}

struct Seen {
  std::string value;
  uint64_t version = 0;
};

struct Shared {
  std::vector<std::string> keys;
  Mix mix;
  std::atomic<int64_t> end_ns{0};
  int64_t inject_after_ns = 0;  // the injection happens after this time
  std::atomic<bool> injected{false};
  std::atomic<uint64_t> outcomes[6] = {};
  std::atomic<int> connect_failures{0};
  // The errors the clients saw, by code, with the first message of each (printed at the end:
  // what made an outcome unknown).
  std::mutex errors_mu;
  std::map<std::string, std::pair<uint64_t, std::string>> errors;
};

void RunClient(int index, rdkv::history::HistoryRecorder* recorder, Shared* sh, uint64_t seed) {
  rdkv::ClientOptions o;
  o.seed = FLAGS_seed;
  o.transport = FLAGS_transport;
  o.op_timeout = std::chrono::milliseconds(FLAGS_op_timeout_ms);
  auto client = rdkv::Client::Connect(o);
  if (!client.ok()) {
    std::fprintf(stderr, "history_load: client %d: %s\n", index,
                 client.status().ToString().c_str());
    ++sh->connect_failures;
    return;
  }
  ClientLog log(recorder, FLAGS_client_base + static_cast<uint64_t>(index));
  std::mt19937_64 rng(seed);
  // What this thread saw of each key: the first observation, and the latest.
  std::map<std::string, Seen> first, last;
  bool may_inject = FLAGS_inject == "stale_read" && index == 0;
  while (MonotonicNowNs() < sh->end_ns.load(std::memory_order_relaxed)) {
    Op op;
    op.key = FLAGS_pin_keys ? sh->keys[static_cast<size_t>(index) % sh->keys.size()]
                            : sh->keys[rng() % sh->keys.size()];
    int pick = static_cast<int>(rng() % static_cast<uint64_t>(sh->mix.total));
    int t = 0;
    while (pick >= sh->mix.w[t]) pick -= sh->mix.w[t++];
    op.type = index < FLAGS_get_only_threads ? OpType::kGet : static_cast<OpType>(t);
    rdkv::Client& c = **client;
    rdkv::Status st;
    op.invoke_ns = MonotonicNowNs();
    switch (op.type) {
      case OpType::kGet: {
        auto r = c.Get(op.key);
        st = r.status();
        if (r.ok()) {
          op.value = std::move(r->value);
          op.version = r->version;
        }
        break;
      }
      case OpType::kPut: {
        op.value = log.NextValue();
        auto r = c.Put(op.key, op.value);
        st = r.status();
        if (r.ok()) op.version = *r;
        break;
      }
      case OpType::kInsert: {
        op.value = log.NextValue();
        auto r = c.Insert(op.key, op.value);
        st = r.status();
        if (r.ok()) op.version = *r;
        break;
      }
      case OpType::kCas: {
        op.value = log.NextValue();
        auto it = last.find(op.key);
        // Mostly the version last seen (often current), sometimes an old one.
        op.expected = it == last.end() ? 1 : it->second.version - (rng() % 4 == 0 ? 1 : 0);
        auto r = c.Cas(op.key, op.expected, op.value);
        st = r.status();
        if (r.ok()) op.version = *r;
        break;
      }
      case OpType::kDelete:
        st = c.Delete(op.key);
        break;
    }
    op.complete_ns = MonotonicNowNs();
    op.outcome = OutcomeOfStatus(st);
    if (op.outcome == Outcome::kUnknown || op.outcome == Outcome::kFail) {
      std::lock_guard<std::mutex> lock(sh->errors_mu);
      auto& e = sh->errors[std::string(rdkv::StatusCodeName(st.code()))];
      if (e.first++ == 0) e.second = st.message();
    }
    // A GET that failed is recorded as unknown too: it had no effect and lincheck ignores it.
    if (op.outcome == Outcome::kOk && op.type != OpType::kDelete) {
      Seen s{op.value, op.version};
      first.emplace(op.key, s);
      // Inject: a GET returns this thread's first observation although it has since seen
      // a different value with a higher version (so the first was overwritten before).
      auto f = first.find(op.key);
      auto l = last.find(op.key);
      if (may_inject && op.type == OpType::kGet && !sh->injected &&
          op.invoke_ns > sh->inject_after_ns && l != last.end() &&
          l->second.version > f->second.version && l->second.value != f->second.value) {
        std::fprintf(stderr,
                     "history_load: injected stale read: key %s got \"%s\" v%llu, recorded as "
                     "\"%s\" v%llu\n",
                     op.key.c_str(), op.value.c_str(), static_cast<unsigned long long>(op.version),
                     f->second.value.c_str(), static_cast<unsigned long long>(f->second.version));
        op.value = f->second.value;
        op.version = f->second.version;
        sh->injected = true;
      } else {
        last[op.key] = s;
      }
    }
    ++sh->outcomes[static_cast<int>(op.outcome)];
    log.Record(std::move(op));
    if (index < FLAGS_get_only_threads && FLAGS_get_only_pause_us > 0) {
      std::this_thread::sleep_for(std::chrono::microseconds(FLAGS_get_only_pause_us));
    } else if (index >= FLAGS_get_only_threads && FLAGS_pause_us > 0) {
      std::this_thread::sleep_for(std::chrono::microseconds(FLAGS_pause_us));
    }
  }
  log.Flush();
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage("history_load --seed=HOST:PORT --out=history.jsonl [...]");
  FLAGS_minloglevel = 1;  // the client's connection lines: warnings and up only
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;
  Shared sh;
  if (!ParseMix(FLAGS_mix, &sh.mix)) {
    std::fprintf(stderr, "history_load: bad --mix '%s' (e.g. get:50,put:20,cas:30)\n",
                 FLAGS_mix.c_str());
    return 2;
  }
  if (FLAGS_threads < 1 || FLAGS_keys < 1 || FLAGS_seconds <= 0) {
    std::fprintf(stderr, "history_load: --threads, --keys and --seconds must be positive\n");
    return 2;
  }
  if (!FLAGS_inject.empty() && FLAGS_inject != "stale_read") {
    std::fprintf(stderr, "history_load: unknown --inject '%s' (stale_read)\n",
                 FLAGS_inject.c_str());
    return 2;
  }
  std::string prefix = FLAGS_key_prefix;
  if (prefix.empty()) {
    prefix = "h" + std::to_string(getpid()) + "-" + std::to_string(MonotonicNowNs()) + "-";
  }
  for (int k = 0; k < FLAGS_keys; ++k) sh.keys.push_back(prefix + std::to_string(k));
  if (!FLAGS_keys_out.empty()) {
    std::ofstream f(FLAGS_keys_out);
    for (const std::string& k : sh.keys) f << k << ' ' << rdkv::kv::KeyHash(k) << '\n';
    if (!f.good()) {
      std::fprintf(stderr, "history_load: cannot write %s\n", FLAGS_keys_out.c_str());
      return 2;
    }
  }
  auto recorder = rdkv::history::HistoryRecorder::Create(FLAGS_out);
  if (!recorder.ok()) {
    std::fprintf(stderr, "history_load: %s\n", recorder.status().ToString().c_str());
    return 2;
  }
  uint64_t seed = FLAGS_rng_seed != 0 ? FLAGS_rng_seed : static_cast<uint64_t>(MonotonicNowNs());
  int64_t start = MonotonicNowNs();
  sh.end_ns = start + static_cast<int64_t>(FLAGS_seconds * 1e9);
  sh.inject_after_ns = start + static_cast<int64_t>(FLAGS_seconds * 0.5e9);
  std::vector<std::thread> threads;
  for (int i = 0; i < FLAGS_threads; ++i) {
    threads.emplace_back(RunClient, i, recorder->get(), &sh, seed + static_cast<uint64_t>(i));
  }
  if (!FLAGS_stop_file.empty()) {
    while (MonotonicNowNs() < sh.end_ns.load()) {
      if (access(FLAGS_stop_file.c_str(), F_OK) == 0) {
        sh.end_ns.store(MonotonicNowNs());
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  for (auto& t : threads) t.join();
  double secs = (MonotonicNowNs() - start) / 1e9;
  rdkv::Status closed = (*recorder)->Close();
  uint64_t n = (*recorder)->ops_written();
  std::printf("history_load: %llu ops in %.2f s (%.0f ops/s), %d threads, %d keys -> %s\n",
              static_cast<unsigned long long>(n), secs, n / secs, FLAGS_threads, FLAGS_keys,
              FLAGS_out.c_str());
  std::printf("outcomes:");
  for (int o = 0; o < 6; ++o) {
    std::printf(" %s=%llu",
                std::string(rdkv::history::OutcomeName(static_cast<Outcome>(o))).c_str(),
                static_cast<unsigned long long>(sh.outcomes[o].load()));
  }
  std::printf("\n");
  for (const auto& [code, e] : sh.errors) {
    std::printf("errors: %s x%llu, the first: %s\n", code.c_str(),
                static_cast<unsigned long long>(e.first), e.second.c_str());
  }
  if (!closed.ok()) {
    std::fprintf(stderr, "history_load: %s\n", closed.ToString().c_str());
    return 2;
  }
  if (sh.connect_failures > 0) return 2;
  if (FLAGS_inject == "stale_read" && !sh.injected) {
    std::fprintf(stderr, "history_load: --inject=stale_read: no GET could be made stale\n");
    return 2;
  }
  return 0;
}

// mem_load: the same N items for rdkv, Redis and memcached (bench/memory-per-item.sh).
//
//   mem_load --count=N --key_bytes=16 --value_bytes=32 --emit=resp       RESP SETs on stdout
//   mem_load --count=N ... --emit=memcached                              "set ... noreply"
//   mem_load --count=N ... --server=127.0.0.1:7400 --threads=4           PUTs to a kvserver,
//                                                                        then its STATS JSON
//
// Item i has the key "k" followed by i in decimal, zero-padded to --key_bytes bytes, and a
// value of --value_bytes printable bytes derived from i (so no two values are alike and no
// store can share them). Exit status: 0 every item stored; 1 some write failed; 2 bad usage.
#include <gflags/gflags.h>
#include <glog/logging.h>

#include <atomic>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "rdkv/client.h"

DEFINE_uint64(count, 1000000, "Items");
DEFINE_int32(key_bytes, 16, "Bytes per key (at least 2, room for the item number)");
DEFINE_int32(value_bytes, 32, "Bytes per value");
DEFINE_string(emit, "", "resp or memcached: write the protocol to stdout instead of loading");
DEFINE_string(server, "", "host:port of a kvserver to load (tcp)");
DEFINE_int32(threads, 4, "Client threads loading the kvserver");

namespace {

bool MakeKey(uint64_t i, std::string* key) {
  std::string digits = std::to_string(i);
  if (digits.size() + 1 > static_cast<size_t>(FLAGS_key_bytes)) return false;
  key->assign("k");
  key->append(FLAGS_key_bytes - 1 - digits.size(), '0');
  key->append(digits);
  return true;
}

void MakeValue(uint64_t i, std::string* value) {
  value->resize(FLAGS_value_bytes);
  uint64_t x = i * 0x9e3779b97f4a7c15ull + 1;
  for (char& c : *value) {
    x ^= x >> 29;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 32;
    c = static_cast<char>('A' + x % 58);  // letters and a few punctuation marks, no spaces
  }
}

int Emit(bool resp) {
  std::string key, value, out;
  out.reserve(1 << 20);
  for (uint64_t i = 0; i < FLAGS_count; ++i) {
    if (!MakeKey(i, &key)) return 2;
    MakeValue(i, &value);
    if (resp) {
      out += "*3\r\n$3\r\nSET\r\n$" + std::to_string(key.size()) + "\r\n" + key + "\r\n$" +
             std::to_string(value.size()) + "\r\n" + value + "\r\n";
    } else {
      out +=
          "set " + key + " 0 0 " + std::to_string(value.size()) + " noreply\r\n" + value + "\r\n";
    }
    if (out.size() > (1 << 20) - 4096) {
      if (std::fwrite(out.data(), 1, out.size(), stdout) != out.size()) return 1;
      out.clear();
    }
  }
  if (std::fwrite(out.data(), 1, out.size(), stdout) != out.size()) return 1;
  return std::fflush(stdout) == 0 ? 0 : 1;
}

int Load() {
  rdkv::ClientOptions co;
  co.seed = FLAGS_server;
  co.transport = "tcp";
  co.location_cache_entries = 0;
  std::atomic<uint64_t> next{0}, failed{0};
  std::atomic<bool> connect_failed{false};
  auto worker = [&] {
    auto c = rdkv::Client::Connect(co);
    if (!c.ok()) {
      std::fprintf(stderr, "mem_load: connect: %s\n", c.status().ToString().c_str());
      connect_failed = true;
      return;
    }
    std::string key, value;
    for (;;) {
      uint64_t i = next.fetch_add(1);
      if (i >= FLAGS_count) return;
      MakeKey(i, &key);
      MakeValue(i, &value);
      auto r = (*c)->Put(key, value);
      if (!r.ok() && failed.fetch_add(1) < 5) {
        std::fprintf(stderr, "mem_load: put %s: %s\n", key.c_str(), r.status().ToString().c_str());
      }
    }
  };
  std::vector<std::thread> ts;
  for (int t = 0; t < FLAGS_threads; ++t) ts.emplace_back(worker);
  for (auto& t : ts) t.join();
  if (connect_failed) return 2;
  auto c = rdkv::Client::Connect(co);
  if (!c.ok()) return 2;
  auto stats = (*c)->Stats();
  if (!stats.ok()) {
    std::fprintf(stderr, "mem_load: stats: %s\n", stats.status().ToString().c_str());
    return 2;
  }
  std::printf("%s\n", stats->c_str());
  if (failed > 0) std::fprintf(stderr, "mem_load: %llu puts failed\n", (unsigned long long)failed);
  return failed > 0 ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage("load the same items into rdkv, or emit them for Redis / memcached");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);
  std::string probe;
  if (FLAGS_count == 0 || FLAGS_value_bytes < 0 || FLAGS_threads < 1 ||
      !MakeKey(FLAGS_count - 1, &probe)) {
    std::fprintf(stderr,
                 "mem_load: --count, --key_bytes (room for the item number), "
                 "--value_bytes and --threads must be positive\n");
    return 2;
  }
  if (FLAGS_emit == "resp" || FLAGS_emit == "memcached") return Emit(FLAGS_emit == "resp");
  if (!FLAGS_emit.empty() || FLAGS_server.empty()) {
    std::fprintf(stderr, "mem_load: give --emit=resp|memcached or --server=HOST:PORT\n");
    return 2;
  }
  return Load();
}

// The in-process cluster the cluster tests run: kvservers (server::Server) on 127.0.0.1 over
// tcp, a uniform cluster map over free ports, raw requests as an operator's tool sends them.
//
//   FreePort, KeyIn, MakeTempDir, StartServerRetrying, CallRaw   free helpers
//   ClusterTest                                                 a GoogleTest fixture built on them
//
// Header-only; a test that includes it links rdkv_server_lib (and rdkv_client for NewClient).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common/cluster/cluster_map.h"
#include "common/kv/admin_wire.h"
#include "common/kv/layout.h"
#include "common/kv/wire.h"
#include "common/transport/transport.h"
#include "rdkv/client.h"
#include "server/server.h"
#include "tests/support/free_port.h"

namespace rdkv::testing {

// What a server holds of a shard (SHARD_SCAN): key -> value and version.
struct ScannedItem {
  std::string value;
  uint64_t version = 0;
  bool operator==(const ScannedItem&) const = default;
};
using ScannedShard = std::map<std::string, ScannedItem>;

// The shard of `key` among `shard_count` shards.
inline uint32_t ShardOfKey(std::string_view key, uint32_t shard_count) {
  return cluster::ShardOf(kv::KeyHash(key), shard_count);
}

// A key whose shard (of `shard_count`) is `shard`: the first of "<prefix><n>-0", "-1", ...
// that falls there (the same key for the same arguments).
inline std::string KeyIn(uint32_t shard, int n, uint32_t shard_count,
                         std::string_view prefix = "key") {
  for (int i = 0;; ++i) {
    std::string k = std::string(prefix) + std::to_string(n) + "-" + std::to_string(i);
    if (ShardOfKey(k, shard_count) == shard) return k;
  }
}

// A new directory /tmp/rdkv-<name>-XXXXXX; "" (and a test failure) when it cannot be made.
inline std::string MakeTempDir(std::string_view name) {
  std::string tmpl = "/tmp/rdkv-" + std::string(name) + "-XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr) {
    ADD_FAILURE() << "mkdtemp " << tmpl << " failed";
    return "";
  }
  return tmpl;
}

// Starts a server, retrying for up to 5 s while it cannot (a just-closed listener may hold its
// port briefly); nullptr and a test failure when it never starts.
inline std::unique_ptr<server::Server> StartServerRetrying(const server::ServerOptions& o) {
  for (int i = 0;; ++i) {
    auto s = server::Server::Start(o);
    if (s.ok()) return std::move(s).value();
    if (i == 50) {
      ADD_FAILURE() << "server " << o.server_id << " did not start: " << s.status().ToString();
      return nullptr;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

// One raw request/response on `c`. The response's body views `*buf`, which the next call
// overwrites. A failed call is a test failure and comes back as the response's status.
inline kv::Response CallRaw(transport::Connection& c, const kv::Request& r,
                            std::vector<uint8_t>* buf) {
  std::vector<uint8_t> req;
  kv::EncodeRequest(r, &req);
  Status s = c.Call(req, buf, std::chrono::seconds(5));
  EXPECT_TRUE(s.ok()) << s.ToString();
  if (!s.ok()) return kv::Response{s, 0, {}};
  auto d = kv::DecodeResponse(*buf);
  EXPECT_TRUE(d.ok());
  return d.ok() ? *d : kv::Response{Status::Internal("undecodable"), 0, {}};
}

// A fixture with a temp dir (root_, removed at the end), a tcp fabric for raw requests, and up
// to kMaxServers in-process servers (servers_, stopped at the end). A test picks ports and a
// uniform map with PickPorts, starts servers with StartServer (options from Options, which a
// fixture may override), talks to them with NewClient, Raw and Call.
class ClusterTest : public ::testing::Test {
 protected:
  static constexpr int kMaxServers = 3;

  // `name` names the temp dir; `shard_count` is the map's (PickPorts) and KeyIn's.
  ClusterTest(std::string name, uint32_t shard_count)
      : name_(std::move(name)), shard_count_(shard_count) {}

  void SetUp() override {
    root_ = MakeTempDir(name_);
    ASSERT_FALSE(root_.empty());
    auto f = transport::Fabric::Create({});
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    fabric_ = std::move(*f);
  }
  void TearDown() override {
    for (auto& s : servers_) s.reset();
    std::error_code ec;
    if (!root_.empty()) std::filesystem::remove_all(root_, ec);
  }

  // Free ports for servers 0..n-1 and map_: epoch 1, shard s on server s % n.
  void PickPorts(int n = kMaxServers) {
    std::vector<std::string> addrs;
    for (int i = 0; i < n; ++i) {
      ports_[i] = FreePort();
      addrs.push_back("127.0.0.1:" + std::to_string(ports_[i]));
    }
    map_ = cluster::MakeUniformMap(addrs, shard_count_);
  }

  // Server `id`'s data dir (a cluster server needs one for its newest map; with durability
  // none it holds only that). It survives the server's restarts.
  std::string DataDir(uint32_t id) const { return root_ + "/server-" + std::to_string(id); }

  // Server `id` of map_: tcp on ports_[id], 16 MiB without huge pages, its data dir.
  virtual server::ServerOptions Options(uint32_t id) const {
    server::ServerOptions o;
    o.port = ports_[id];
    o.transport = transport::TransportKind::kTcp;
    o.memory_bytes = 16ull << 20;
    o.huge_pages = false;
    o.cluster_map = map_;
    o.server_id = id;
    o.persist.data_dir = DataDir(id);
    return o;
  }
  std::unique_ptr<server::Server> StartServer(uint32_t id) {
    return StartServerRetrying(Options(id));
  }
  // Starts servers 0..n-1 into servers_.
  void StartServers(int n = kMaxServers) {
    for (int i = 0; i < n; ++i) {
      servers_[i] = StartServer(static_cast<uint32_t>(i));
      ASSERT_NE(servers_[i], nullptr);
    }
  }

  // A client (tcp) seeded with server `seed`.
  std::unique_ptr<Client> NewClient(int seed, ClientOptions o = {}) {
    o.seed = "127.0.0.1:" + std::to_string(ports_[seed]);
    o.transport = "tcp";
    auto c = Client::Connect(o);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::move(c).value() : nullptr;
  }

  // A raw connection to 127.0.0.1:`port`, for requests as an operator's tool sends them.
  std::unique_ptr<transport::Connection> ConnectTo(uint16_t port) {
    transport::ConnectOptions co;
    co.host = "127.0.0.1";
    co.port = port;
    auto c = fabric_->Connect(co);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::move(*c) : nullptr;
  }
  std::unique_ptr<transport::Connection> Raw(int id) { return ConnectTo(ports_[id]); }

  // A raw request on `c`; the response's body views buf_ until the next Call.
  kv::Response Call(transport::Connection& c, const kv::Request& r) { return CallRaw(c, r, &buf_); }
  // The same on a new connection to server `id`.
  kv::Response Call(int id, const kv::Request& r) {
    auto c = Raw(id);
    if (c == nullptr) return kv::Response{Status::Unavailable("no connection"), 0, {}};
    return Call(*c, r);
  }

  // Servers 0..2 with every shard on `r` of them (shard s: primary s % 3, then the next ones).
  void StartReplicated(uint32_t r) {
    PickPorts(3);
    std::vector<std::string> addrs;
    for (int i = 0; i < 3; ++i) addrs.push_back("127.0.0.1:" + std::to_string(ports_[i]));
    map_ = cluster::MakeUniformMap(addrs, shard_count_, r);
    StartServers(3);
  }

  // A raw request to server `id` from a thread of its own: its own connection and buffer (Call
  // shares buf_); the answer's body is dropped.
  kv::Response CallAlone(int id, const kv::Request& r) {
    auto c = Raw(id);
    if (c == nullptr) return kv::Response{Status::Unavailable("no connection"), 0, {}};
    std::vector<uint8_t> buf;
    kv::Response answer = CallRaw(*c, r, &buf);
    answer.body = {};
    return answer;
  }

  // What server `id` holds of `shard` (SHARD_SCAN), key -> value and version.
  ScannedShard ScanOf(int id, uint32_t shard) {
    ScannedShard out;
    auto c = Raw(id);
    if (c == nullptr) return out;
    std::string scratch;
    uint64_t cursor = 0;
    while (cursor != kv::kScanDone) {
      kv::Response r = Call(*c, kv::EncodeShardScan({shard, cursor}, &scratch));
      EXPECT_TRUE(r.status.ok()) << r.status.ToString();
      if (!r.status.ok()) break;
      auto a = kv::DecodeShardScanAnswer(cursor, r.version, r.body, kv::WireLimits{});
      EXPECT_TRUE(a.ok()) << a.status().ToString();
      if (!a.ok()) break;
      for (const auto& e : a->entries) {
        out[std::string(e.key)] = ScannedItem{std::string(e.value), e.version};
      }
      cursor = a->next_cursor;
    }
    return out;
  }

  // A key of shard `shard` (of this fixture's shard count).
  std::string KeyIn(uint32_t shard, int n, std::string_view prefix = "key") const {
    return testing::KeyIn(shard, n, shard_count_, prefix);
  }
  uint32_t ShardOfKey(std::string_view key) const { return testing::ShardOfKey(key, shard_count_); }

  const std::string name_;
  const uint32_t shard_count_;
  std::string root_;  // the servers' data dirs
  uint16_t ports_[kMaxServers] = {};
  cluster::ClusterMap map_;
  std::unique_ptr<server::Server> servers_[kMaxServers];
  std::unique_ptr<transport::Fabric> fabric_;
  std::vector<uint8_t> buf_;
};

}  // namespace rdkv::testing

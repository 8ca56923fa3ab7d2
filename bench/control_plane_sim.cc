// control_plane_sim: the control plane of a few hundred kvservers against one etcd, as threads in
// one process, with the real failover coordinator in-process (issue 12, "toward many machines";
// docs/benchmarks.md "Control plane at scale"). bench/control-plane-scale.sh runs it per server
// count against a fresh etcd and prints a table.
//
// Each simulated server does what server/control_plane.cc does against etcd, through the same
// library calls and value format (common/cluster/etcd_map.h RegistrationJson):
//   * registers at /rdkv/<cluster>/servers/<id> under its own lease (LeaseKeeper, TTL
//     --lease_ttl_s, a keepalive every TTL/3, revoke_on_close off), with its own EtcdClient;
//   * watches the map key (its own Watch, one stream) and, for every new epoch, publishes
//     `released` (one Put), waits like the gain gate when it becomes primary of a shard another
//     server held (GetPrefix of every registration every 20 ms until NotReleased is empty), then
//     publishes `epoch` (a second Put).
// Parsing a map is shared by the threads (one parse per map revision): the simulation's CPU is
// not the servers'. A "kill" stops a server's keepalives and watch (its lease then expires at etcd
// after the TTL, as after a SIGKILL); nothing is revoked.
//
// The coordinator (coordinator/coordinator.h) runs in-process, one per cluster, with probes off
// (the simulated addresses have no process: detection is lease expiry only). Re-replication is
// off by default (--rereplicate): the catch-up copies need real servers. With it on, each
// AddReplica fails at Client::Connect (the addresses, 127.x.y.z:1, refuse connections) before
// anything is written to etcd; the coordinator counts a replica error, waits 0.5 s and tries
// again, so the failover decisions are unaffected (the summary prints the error count).
//
// A cluster map holds at most cluster::kMaxServers (256) servers: --clusters splits the servers
// over several clusters (their own maps and coordinators) in the same etcd; kills are in cluster 0.
//
// Measures, from the etcd side (its /metrics, and /proc/<--etcd_pid>/stat for CPU): request rate
// (grpc_server_started_total), keepalive rate, watchers, db size, CPU, bytes sent to clients, in
// the steady state and in each kill round's window. Per round: kill -> each victim's registration
// deleted (lease expiry, seen by a watch), the coordinator's decision time (registrations read ->
// map committed; DecisionTiming), last expiry seen -> map without the victims seen, and that map
// -> installed and republished by every live server of the cluster.
#include <curl/curl.h>
#include <gflags/gflags.h>
#include <glog/logging.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/cluster/cluster_map.h"
#include "common/cluster/etcd_map.h"
#include "common/etcd/etcd_client.h"
#include "common/etcd/lease_keeper.h"
#include "common/etcd/watch.h"
#include "common/util/mutex.h"
#include "coordinator/coordinator.h"

DEFINE_string(etcd, "", "etcd endpoint(s) (required)");
DEFINE_string(cluster_name, "sim", "cluster name; with --clusters > 1: NAME0, NAME1, ...");
DEFINE_int32(servers, 100, "simulated servers in all");
DEFINE_int32(clusters, 1, "clusters the servers are split over (a map holds at most 256)");
DEFINE_int32(shards_per_server, 4, "shards per server (capped at 4096 per cluster)");
DEFINE_int32(replication, 3, "replicas per shard");
DEFINE_int32(lease_ttl_s, 2, "etcd lease TTL of the servers and coordinators (kvserver's default)");
DEFINE_int32(poll_ms, 50, "the coordinator's --poll_ms");
DEFINE_bool(rereplicate, false,
            "let the coordinator try catch-up copies (they fail: no server listens; see above)");
DEFINE_int32(steady_s, 10, "seconds of steady state measured before the kills");
DEFINE_string(kills, "1,1,1", "per round, how many servers of cluster 0 are killed at once");
DEFINE_int32(etcd_pid, 0, "etcd's pid, for its CPU time from /proc (0: its process_cpu metric)");
DEFINE_string(metrics_url, "", "etcd's /metrics (default: the first endpoint's)");

namespace {

using rdkv::Mutex;
using rdkv::MutexLock;
using rdkv::Result;
using rdkv::Status;
using Clock = std::chrono::steady_clock;
namespace cluster = rdkv::cluster;
namespace etcd = rdkv::etcd;
namespace coord = rdkv::coordinator;

std::atomic<uint64_t> g_leases_lost{0};  // by servers not killed

double MsSince(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// --- etcd's /metrics and /proc ----------------------------------------------------------------

size_t AppendBody(char* data, size_t size, size_t n, void* out) {
  static_cast<std::string*>(out)->append(data, size * n);
  return size * n;
}

std::string HttpGet(const std::string& url) {
  std::string body;
  CURL* c = curl_easy_init();
  if (c == nullptr) return body;
  curl_easy_setopt(c, CURLOPT_URL, url.c_str());
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, AppendBody);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &body);
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 5000L);
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  if (curl_easy_perform(c) != CURLE_OK) body.clear();
  curl_easy_cleanup(c);
  return body;
}

// Sum of the samples of metric `name` (exact name) whose labels contain `label` ("" = all).
double MetricSum(const std::string& text, const std::string& name, const std::string& label = "") {
  double sum = 0;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#' || line.compare(0, name.size(), name) != 0) continue;
    const char next = line.size() > name.size() ? line[name.size()] : '\0';
    if (next != ' ' && next != '{') continue;
    if (!label.empty() && line.find(label) == std::string::npos) continue;
    const size_t sp = line.rfind(' ');
    if (sp != std::string::npos) sum += std::strtod(line.c_str() + sp + 1, nullptr);
  }
  return sum;
}

struct EtcdSample {
  Clock::time_point at;
  double requests = 0;    // grpc calls and streams started
  double keepalives = 0;  // LeaseKeepAlive messages received
  double puts = 0;        // Put and Txn calls
  double ranges = 0;
  double watchers = 0;
  double watch_streams = 0;
  double db_bytes = 0;
  double sent_bytes = 0;  // to clients
  double cpu_s = 0;
};

EtcdSample Sample(const std::string& url) {
  EtcdSample s;
  s.at = Clock::now();
  const std::string m = HttpGet(url);
  s.requests = MetricSum(m, "grpc_server_started_total");
  s.keepalives = MetricSum(m, "grpc_server_msg_received_total", "\"LeaseKeepAlive\"");
  s.puts = MetricSum(m, "grpc_server_started_total", "\"Put\"") +
           MetricSum(m, "grpc_server_started_total", "\"Txn\"");
  s.ranges = MetricSum(m, "grpc_server_started_total", "\"Range\"");
  s.watchers = MetricSum(m, "etcd_debugging_mvcc_watcher_total");
  s.watch_streams = MetricSum(m, "etcd_debugging_mvcc_watch_stream_total");
  s.db_bytes = MetricSum(m, "etcd_mvcc_db_total_size_in_bytes");
  s.sent_bytes = MetricSum(m, "etcd_network_client_grpc_sent_bytes_total");
  s.cpu_s = MetricSum(m, "process_cpu_seconds_total");
  if (FLAGS_etcd_pid > 0) {
    std::ifstream stat("/proc/" + std::to_string(FLAGS_etcd_pid) + "/stat");
    std::string all((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    const size_t rp = all.rfind(')');
    if (rp != std::string::npos) {
      std::istringstream f(all.substr(rp + 2));
      std::string field;
      unsigned long long utime = 0, stime = 0;
      for (int i = 3; i <= 15 && f >> field; ++i) {
        if (i == 14) utime = std::stoull(field);
        if (i == 15) stime = std::stoull(field);
      }
      s.cpu_s = static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
    }
  }
  return s;
}

struct Rates {
  double seconds = 0, req_per_s = 0, keepalive_per_s = 0, put_per_s = 0, range_per_s = 0;
  double cpu_pct = 0, sent_kib_per_s = 0;
};

Rates RatesBetween(const EtcdSample& a, const EtcdSample& b) {
  Rates r;
  r.seconds = std::max(1e-3, MsSince(a.at, b.at) / 1000);
  r.req_per_s = (b.requests - a.requests) / r.seconds;
  r.keepalive_per_s = (b.keepalives - a.keepalives) / r.seconds;
  r.put_per_s = (b.puts - a.puts) / r.seconds;
  r.range_per_s = (b.ranges - a.ranges) / r.seconds;
  r.cpu_pct = 100 * (b.cpu_s - a.cpu_s) / r.seconds;
  r.sent_kib_per_s = (b.sent_bytes - a.sent_bytes) / 1024 / r.seconds;
  return r;
}

// --- one parse per map revision, shared by the simulated servers -------------------------------

class MapCache {
 public:
  std::shared_ptr<const cluster::ClusterMap> Get(int cluster, int64_t revision,
                                                 const std::string& json) {
    MutexLock lock(&mu_);
    auto key = std::make_pair(cluster, revision);
    auto it = maps_.find(key);
    if (it != maps_.end()) return it->second;
    Result<cluster::ClusterMap> m = cluster::ParseClusterMap(json);
    if (!m.ok()) {
      LOG(ERROR) << "map revision " << revision << " does not parse: " << m.status().ToString();
      return nullptr;
    }
    m->NormalizeReplicas();
    auto p = std::make_shared<const cluster::ClusterMap>(std::move(m).value());
    maps_[key] = p;
    while (maps_.size() > 64) maps_.erase(maps_.begin());
    return p;
  }

 private:
  Mutex mu_;
  std::map<std::pair<int, int64_t>, std::shared_ptr<const cluster::ClusterMap>> maps_
      GUARDED_BY(mu_);
};

// --- a simulated server ------------------------------------------------------------------------

class SimServer {
 public:
  SimServer(etcd::EtcdOptions eo, MapCache* cache, int cluster, std::string cluster_name,
            uint32_t id, std::string address, uint64_t incarnation)
      : eo_(std::move(eo)),
        cache_(cache),
        cluster_(cluster),
        name_(std::move(cluster_name)),
        id_(id),
        address_(std::move(address)),
        incarnation_(incarnation) {}
  ~SimServer() { Kill(); }

  // Registers like ControlPlane::Register and watches the map from `map_revision` + 1.
  Status Start(std::shared_ptr<const cluster::ClusterMap> map, int64_t map_revision) {
    RDKV_ASSIGN_OR_RETURN(client_, etcd::EtcdClient::Create(eo_));
    map_ = std::move(map);
    installed_.store(map_->epoch);
    released_ = map_->epoch;
    etcd::LeaseKeeperOptions lo;
    lo.ttl_seconds = FLAGS_lease_ttl_s;
    lo.revoke_on_close = false;
    // A real server would fence and register again; the simulation counts it (etcd too slow to
    // confirm a keepalive within the TTL is a capacity limit).
    RDKV_ASSIGN_OR_RETURN(lease_, etcd::LeaseKeeper::Start(eo_, lo, [](const Status& why) {
                            g_leases_lost.fetch_add(1);
                            LOG(WARNING) << "a live server lost its lease: " << why.ToString();
                          }));
    lease_id_ = lease_->lease_id();
    RDKV_RETURN_IF_ERROR(Publish(released_, map_->epoch));
    etcd::WatchOptions wo;
    wo.key = cluster::MapKey(name_);
    wo.start_revision = map_revision + 1;
    RDKV_ASSIGN_OR_RETURN(watch_, etcd::Watch::Start(eo_, wo, [this](const auto& e) { OnMap(e); }));
    return Status::Ok();
  }

  // As after a SIGKILL: no more keepalives (the lease expires at etcd), no watch, no puts.
  void StopKeepalives() {
    dead_.store(true);
    lease_.reset();
  }
  void Kill() {
    StopKeepalives();
    watch_.reset();
  }

  uint32_t id() const { return id_; }
  bool dead() const { return dead_.load(); }
  uint64_t installed() const { return installed_.load(); }

 private:
  Status Publish(uint64_t released, uint64_t installed) {
    return client_
        ->Put(cluster::ServerKey(name_, id_),
              cluster::RegistrationJson({.address = address_,
                                         .released = released,
                                         .epoch = installed,
                                         .incarnation = incarnation_,
                                         .durable = false}),
              lease_id_)
        .status();
  }

  // On the watch's thread: what ControlPlane's apply thread and ClusterState::Install's hooks
  // send to etcd for one new epoch.
  void OnMap(const Result<etcd::WatchEvent>& e) {
    if (dead_.load() || !e.ok() || e->type != etcd::WatchEvent::Type::kPut) return;
    std::shared_ptr<const cluster::ClusterMap> next =
        cache_->Get(cluster_, e->kv.mod_revision, e->kv.value);
    if (next == nullptr || next->epoch <= installed_.load()) return;
    released_ = next->epoch;
    Status s = Publish(released_, installed_.load());
    bool gains = false;
    for (uint32_t sh = 0; sh < next->shards && sh < map_->shards; ++sh) {
      if (next->OwnerOf(sh) == id_ && map_->OwnerOf(sh) != id_) gains = true;
    }
    const std::string self = cluster::ServerKey(name_, id_);
    while (gains && !dead_.load()) {
      Result<etcd::RangeResult> got = client_->GetPrefix(cluster::ServersPrefix(name_));
      if (got.ok() && cluster::NotReleased(got->kvs, self, next->epoch).empty()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (dead_.load()) return;
    map_ = next;
    Status s2 = Publish(released_, next->epoch);
    if (s.ok()) s = s2;
    if (!s.ok()) {
      LOG_EVERY_N(WARNING, 100) << "server " << id_ << ": publish: " << s.ToString();
    }
    installed_.store(next->epoch);
  }

  const etcd::EtcdOptions eo_;
  MapCache* const cache_;
  const int cluster_;
  const std::string name_;
  const uint32_t id_;
  const std::string address_;
  const uint64_t incarnation_;
  std::atomic<bool> dead_{false};
  std::atomic<uint64_t> installed_{0};
  std::unique_ptr<etcd::EtcdClient> client_;
  std::unique_ptr<etcd::LeaseKeeper> lease_;
  int64_t lease_id_ = 0;
  std::unique_ptr<etcd::Watch> watch_;
  // The watch thread's (Start happens before the watch exists).
  std::shared_ptr<const cluster::ClusterMap> map_;
  uint64_t released_ = 0;
};

// --- what a watcher of cluster 0 sees ------------------------------------------------------------

class Observer {
 public:
  Status Start(const etcd::EtcdOptions& eo, const std::string& name, MapCache* cache,
               int64_t from_revision) {
    etcd::WatchOptions ws;
    ws.key = cluster::ServersPrefix(name);
    ws.prefix = true;
    ws.start_revision = from_revision;
    RDKV_ASSIGN_OR_RETURN(servers_, etcd::Watch::Start(eo, ws, [this](const auto& e) {
                            if (!e.ok() || e->type != etcd::WatchEvent::Type::kDelete) return;
                            MutexLock lock(&mu_);
                            expired_[e->kv.key] = Clock::now();
                          }));
    etcd::WatchOptions wm;
    wm.key = cluster::MapKey(name);
    wm.start_revision = from_revision;
    RDKV_ASSIGN_OR_RETURN(map_, etcd::Watch::Start(eo, wm, [this, cache](const auto& e) {
                            if (!e.ok() || e->type != etcd::WatchEvent::Type::kPut) return;
                            auto m = cache->Get(0, e->kv.mod_revision, e->kv.value);
                            if (m == nullptr) return;
                            MutexLock lock(&mu_);
                            maps_.push_back({Clock::now(), m});
                          }));
    return Status::Ok();
  }
  // When the registration `key` was seen deleted (nullopt: not yet).
  std::optional<Clock::time_point> Expired(const std::string& key) {
    MutexLock lock(&mu_);
    auto it = expired_.find(key);
    if (it == expired_.end()) return std::nullopt;
    return it->second;
  }
  struct SeenMap {
    Clock::time_point at;
    std::shared_ptr<const cluster::ClusterMap> map;
  };
  // The first map seen after `since` that names none of `victims`.
  std::optional<SeenMap> MapWithout(const std::vector<uint32_t>& victims, Clock::time_point since) {
    MutexLock lock(&mu_);
    for (const SeenMap& s : maps_) {
      if (s.at < since) continue;
      bool named = false;
      for (uint32_t v : victims) {
        for (uint32_t sh = 0; sh < s.map->shards && !named; ++sh) {
          for (uint32_t r : s.map->ReplicasOf(sh)) named = named || r == v;
          named = named || s.map->IsJoining(sh, v);
        }
      }
      if (!named) return s;
    }
    return std::nullopt;
  }
  std::shared_ptr<const cluster::ClusterMap> Newest() {
    MutexLock lock(&mu_);
    return maps_.empty() ? nullptr : maps_.back().map;
  }

 private:
  Mutex mu_;
  std::map<std::string, Clock::time_point> expired_ GUARDED_BY(mu_);
  std::vector<SeenMap> maps_ GUARDED_BY(mu_);
  std::unique_ptr<etcd::Watch> servers_;
  std::unique_ptr<etcd::Watch> map_;
};

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
double Max(const std::vector<double>& v) {
  return v.empty() ? 0 : *std::max_element(v.begin(), v.end());
}

int Fail(const std::string& why) {
  std::fprintf(stderr, "control_plane_sim: %s\n", why.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage("control_plane_sim --etcd=HOST:PORT --servers=N [--kills=1,1,1]");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);
  curl_global_init(CURL_GLOBAL_DEFAULT);
  if (FLAGS_etcd.empty()) return Fail("--etcd is required");
  auto endpoints = etcd::ParseEndpoints(FLAGS_etcd);
  if (!endpoints.ok()) return Fail("--etcd: " + endpoints.status().message());
  if (FLAGS_clusters < 1 || FLAGS_servers < FLAGS_clusters * 3) {
    return Fail("need --clusters >= 1 and at least 3 servers per cluster");
  }
  const int per_cluster = FLAGS_servers / FLAGS_clusters;
  if (per_cluster > static_cast<int>(cluster::kMaxServers)) {
    return Fail("a cluster map holds at most " + std::to_string(cluster::kMaxServers) +
                " servers: use --clusters");
  }
  std::vector<int> kills;
  for (std::string_view rest = FLAGS_kills; !rest.empty();) {
    const size_t comma = rest.find(',');
    kills.push_back(std::atoi(std::string(rest.substr(0, comma)).c_str()));
    if (kills.back() < 1) return Fail("--kills: positive counts, comma-separated");
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
  }
  // Every simulated server holds a few connections: raise the descriptor limit to the hard one.
  rlimit nofile{};
  getrlimit(RLIMIT_NOFILE, &nofile);
  nofile.rlim_cur = nofile.rlim_max;
  setrlimit(RLIMIT_NOFILE, &nofile);

  etcd::EtcdOptions eo;
  eo.endpoints = *endpoints;
  eo.request_timeout = std::chrono::milliseconds(5000);
  const std::string metrics_url =
      FLAGS_metrics_url.empty() ? eo.endpoints[0] + "/metrics" : FLAGS_metrics_url;
  auto client = etcd::EtcdClient::Create(eo);
  if (!client.ok()) return Fail(client.status().ToString());
  MapCache cache;
  std::mt19937_64 rng(std::random_device{}());

  // Maps: per cluster, servers 127.<77+c>.<i/250>.<i%250+1>:1 (nothing listens there).
  const uint32_t shards =
      std::min<uint32_t>(cluster::kMaxShards, per_cluster * FLAGS_shards_per_server);
  std::vector<std::string> names;
  std::vector<std::vector<std::unique_ptr<SimServer>>> servers(FLAGS_clusters);
  std::vector<std::pair<std::shared_ptr<const cluster::ClusterMap>, int64_t>> first_maps;
  int64_t start_revision = 0;
  for (int c = 0; c < FLAGS_clusters; ++c) {
    names.push_back(FLAGS_clusters == 1 ? FLAGS_cluster_name
                                        : FLAGS_cluster_name + std::to_string(c));
    std::vector<std::string> addresses;
    for (int i = 0; i < per_cluster; ++i) {
      addresses.push_back("127." + std::to_string(77 + c) + "." + std::to_string(i / 250) + "." +
                          std::to_string(i % 250 + 1) + ":1");
    }
    cluster::ClusterMap m = cluster::MakeUniformMap(addresses, shards, FLAGS_replication);
    Status imported = cluster::ImportMap(**client, names[c], m);
    if (!imported.ok())
      return Fail("importing the map of " + names[c] + ": " + imported.ToString());
    auto loaded = cluster::LoadMap(**client, names[c]);
    if (!loaded.ok()) return Fail(loaded.status().ToString());
    if (c == 0) start_revision = loaded->revision + 1;
    first_maps.push_back(
        {std::make_shared<const cluster::ClusterMap>(loaded->map), loaded->revision});
  }
  Observer observer;
  if (Status s = observer.Start(eo, names[0], &cache, start_revision); !s.ok()) {
    return Fail("observer: " + s.ToString());
  }
  const EtcdSample empty = Sample(metrics_url);

  // Registration: every server, one after the other (their keepalive phases spread out).
  const Clock::time_point t_reg = Clock::now();
  for (int c = 0; c < FLAGS_clusters; ++c) {
    for (int i = 0; i < per_cluster; ++i) {
      auto s = std::make_unique<SimServer>(eo, &cache, c, names[c], i,
                                           first_maps[c].first->servers[i].address, rng() | 1);
      if (Status st = s->Start(first_maps[c].first, first_maps[c].second); !st.ok()) {
        return Fail("server " + std::to_string(i) + " of " + names[c] + ": " + st.ToString());
      }
      servers[c].push_back(std::move(s));
    }
  }
  const double register_ms = MsSince(t_reg, Clock::now());

  // Coordinators, one per cluster; cluster 0's decisions are recorded.
  Mutex dmu;
  std::vector<std::pair<Clock::time_point, coord::DecisionTiming>> decisions;
  std::vector<std::unique_ptr<coord::Coordinator>> coordinators;
  const Clock::time_point t_coord = Clock::now();
  for (int c = 0; c < FLAGS_clusters; ++c) {
    coord::CoordinatorOptions co;
    co.etcd = eo;
    co.cluster_name = names[c];
    co.name = "sim-coordinator-" + std::to_string(c);
    co.lease_ttl_seconds = FLAGS_lease_ttl_s;
    co.poll_interval = std::chrono::milliseconds(FLAGS_poll_ms);
    co.probe_interval = std::chrono::milliseconds(0);
    co.rereplicate = FLAGS_rereplicate;
    if (c == 0) {
      co.on_decision = [&dmu, &decisions](const coord::DecisionTiming& t) {
        MutexLock lock(&dmu);
        decisions.push_back({Clock::now(), t});
      };
    }
    auto started = coord::Coordinator::Start(std::move(co));
    if (!started.ok()) return Fail(started.status().ToString());
    coordinators.push_back(std::move(started).value());
  }
  // Admission: every server's incarnation in its map, installed by every server.
  auto all_installed = [&](int c, uint64_t epoch) {
    for (const auto& s : servers[c]) {
      if (!s->dead() && s->installed() < epoch) return false;
    }
    return true;
  };
  uint64_t admitted_epoch = 0;
  for (const Clock::time_point deadline = Clock::now() + std::chrono::seconds(120);;) {
    bool done = true;
    for (int c = 0; c < FLAGS_clusters && done; ++c) {
      auto m = cluster::LoadMap(**client, names[c]);
      done = m.ok() && m->map.coordinated &&
             std::all_of(m->map.servers.begin(), m->map.servers.end(),
                         [](const cluster::ServerEntry& e) { return e.incarnation != 0; }) &&
             all_installed(c, m->map.epoch);
      if (done && c == 0) admitted_epoch = m->map.epoch;
    }
    if (done) break;
    if (Clock::now() > deadline)
      return Fail("the coordinators did not admit every server in 120 s");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const double admit_ms = MsSince(t_coord, Clock::now());
  std::printf(
      "setup: %d servers in %d cluster(s), %u shards each, R=%d, lease TTL %d s; "
      "registered in %.0f ms; admitted (map epoch %" PRIu64
      ") and installed by all "
      "%.0f ms after the coordinators started\n",
      FLAGS_servers, FLAGS_clusters, shards, FLAGS_replication, FLAGS_lease_ttl_s, register_ms,
      admitted_epoch, admit_ms);

  // Steady state.
  std::this_thread::sleep_for(std::chrono::seconds(2));
  const EtcdSample s0 = Sample(metrics_url);
  std::this_thread::sleep_for(std::chrono::seconds(FLAGS_steady_s));
  const EtcdSample s1 = Sample(metrics_url);
  const Rates steady = RatesBetween(s0, s1);
  std::printf(
      "steady (%.1f s): etcd %.0f req/s (%.0f keepalives/s, %.1f puts/s, %.1f ranges/s), "
      "CPU %.1f %%, sent %.1f KiB/s; %.0f watchers on %.0f streams; db %.0f KiB "
      "(empty etcd: %.0f KiB)\n",
      steady.seconds, steady.req_per_s, steady.keepalive_per_s, steady.put_per_s,
      steady.range_per_s, steady.cpu_pct, steady.sent_kib_per_s, s1.watchers, s1.watch_streams,
      s1.db_bytes / 1024, empty.db_bytes / 1024);

  // Kill rounds in cluster 0.
  std::vector<double> expiry_ms, decision_ms, decide_seen_ms, fanout_ms, kill_to_map_ms;
  std::vector<double> window_req, window_cpu;
  size_t decisions_seen = 0;
  {
    MutexLock lock(&dmu);
    decisions_seen = decisions.size();
  }
  int failed_rounds = 0;
  for (size_t round = 0; round < kills.size(); ++round) {
    std::vector<SimServer*> live;
    for (const auto& s : servers[0]) {
      if (!s->dead()) live.push_back(s.get());
    }
    // Victims spread out (at least R apart in map order), so every shard keeps a replica.
    const size_t k = std::min<size_t>(kills[round], live.size() / (FLAGS_replication + 1));
    if (k == 0) {
      std::printf("round %zu: too few live servers left\n", round + 1);
      break;
    }
    const size_t stride = live.size() / k;
    const size_t offset = rng() % stride;
    std::vector<SimServer*> victims;
    std::vector<uint32_t> victim_ids;
    for (size_t j = 0; j < k; ++j) {
      victims.push_back(live[offset + j * stride]);
      victim_ids.push_back(victims.back()->id());
    }
    const EtcdSample a = Sample(metrics_url);
    const Clock::time_point t_kill = Clock::now();
    for (SimServer* v : victims) v->StopKeepalives();
    for (SimServer* v : victims) v->Kill();
    // Wait: every victim's registration gone, a map without the victims, installed by all.
    std::optional<Observer::SeenMap> done;
    Clock::time_point last_expiry = t_kill, first_expiry = Clock::time_point::max();
    bool ok = false;
    for (const Clock::time_point deadline = t_kill + std::chrono::seconds(60);
         Clock::now() < deadline; std::this_thread::sleep_for(std::chrono::milliseconds(5))) {
      bool expired = true;
      last_expiry = t_kill;
      first_expiry = Clock::time_point::max();
      for (uint32_t id : victim_ids) {
        auto t = observer.Expired(cluster::ServerKey(names[0], id));
        if (!t) {
          expired = false;
          break;
        }
        last_expiry = std::max(last_expiry, *t);
        first_expiry = std::min(first_expiry, *t);
      }
      if (!expired) continue;
      if (!done) done = observer.MapWithout(victim_ids, t_kill);
      if (done && all_installed(0, done->map->epoch)) {
        ok = true;
        break;
      }
    }
    const Clock::time_point t_installed = Clock::now();
    const EtcdSample b = Sample(metrics_url);
    if (!ok) {
      std::printf("round %zu: killed %zu; NOT COMPLETE within 60 s (%s)\n", round + 1, k,
                  done ? "installs missing" : "no map without the victims");
      ++failed_rounds;
      continue;
    }
    std::vector<double> round_decisions;
    size_t round_maps = 0;
    {
      MutexLock lock(&dmu);
      for (size_t i = decisions_seen; i < decisions.size(); ++i) {
        if (decisions[i].second.failed.empty()) continue;
        round_decisions.push_back(decisions[i].second.total_ms());
        ++round_maps;
      }
      decisions_seen = decisions.size();
    }
    const Rates w = RatesBetween(a, b);
    expiry_ms.push_back(MsSince(t_kill, last_expiry));
    for (double d : round_decisions) decision_ms.push_back(d);
    decide_seen_ms.push_back(MsSince(last_expiry, done->at));
    kill_to_map_ms.push_back(MsSince(t_kill, done->at));
    fanout_ms.push_back(MsSince(done->at, t_installed));
    window_req.push_back(w.req_per_s);
    window_cpu.push_back(w.cpu_pct);
    std::printf("round %zu: killed %zu of %zu (servers", round + 1, k, live.size());
    for (uint32_t id : victim_ids) std::printf(" %u", id);
    std::printf(
        "): leases expired %.0f-%.0f ms after the kill; %zu map(s) committed, decision "
        "(registrations read -> committed) max %.1f ms; last expiry seen -> map without "
        "them seen %.1f ms; -> installed and republished by all %zu live %.0f ms; window "
        "%.1f s: etcd %.0f req/s, CPU %.1f %%\n",
        MsSince(t_kill, first_expiry), expiry_ms.back(), round_maps, Max(round_decisions),
        decide_seen_ms.back(), live.size() - k, fanout_ms.back(), w.seconds, w.req_per_s,
        w.cpu_pct);
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  const EtcdSample end = Sample(metrics_url);
  coord::CoordinatorStats cs = coordinators[0]->stats();
  // One line for bench/control-plane-scale.sh's table.
  std::printf(
      "RESULT servers=%d clusters=%d shards=%u rounds=%zu failed_rounds=%d register_ms=%.0f "
      "admit_ms=%.0f steady_req_s=%.0f steady_keepalive_s=%.0f steady_cpu_pct=%.1f "
      "steady_sent_kib_s=%.1f watchers=%.0f db_kib=%.0f expiry_p50_ms=%.0f decision_p50_ms=%.1f "
      "decision_max_ms=%.1f seen_p50_ms=%.1f seen_max_ms=%.1f kill_to_map_p50_ms=%.0f "
      "fanout_p50_ms=%.0f fanout_max_ms=%.0f window_req_s=%.0f window_cpu_pct=%.1f "
      "replica_errors=%" PRIu64 " leases_lost=%" PRIu64 "\n",
      FLAGS_servers, FLAGS_clusters, shards, kills.size(), failed_rounds, register_ms, admit_ms,
      steady.req_per_s, steady.keepalive_per_s, steady.cpu_pct, steady.sent_kib_per_s, s1.watchers,
      end.db_bytes / 1024, Median(expiry_ms), Median(decision_ms), Max(decision_ms),
      Median(decide_seen_ms), Max(decide_seen_ms), Median(kill_to_map_ms), Median(fanout_ms),
      Max(fanout_ms), Median(window_req), Median(window_cpu), cs.replica_errors,
      g_leases_lost.load());
  std::fflush(stdout);
  for (auto& c : coordinators) c->Stop();
  // The servers are not torn down one by one (each watch takes up to 100 ms to stop); the
  // script discards this etcd.
  std::_Exit(failed_rounds == 0 ? 0 : 1);
}

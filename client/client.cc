// The rdkv client: GET by one-sided READs as docs/design.md ("GET: resolution and why it is
// linearizable") describes, writes by two-sided requests.
#include <glog/logging.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "client/client_internal.h"
#include "client/location_cache.h"
#include "client/read_buffers.h"
#include "client/seed.h"
#include "client/session.h"
#include "client/shard_move.h"
#include "common/cluster/cluster_map.h"
#include "common/kv/layout.h"
#include "common/kv/limits.h"
#include "common/kv/ops.h"
#include "common/kv/wire.h"
#include "rdkv/client.h"

namespace rdkv::client {

using Clock = std::chrono::steady_clock;

std::string DescribeKey(std::string_view key) {
  static constexpr size_t kShown = 64;
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "key '";
  for (size_t i = 0; i < key.size() && i < kShown; ++i) {
    auto c = static_cast<unsigned char>(key[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\' && c != '\'') {
      out += static_cast<char>(c);
    } else {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  if (key.size() > kShown) out += "...(" + std::to_string(key.size()) + " bytes)";
  out += "'";
  return out;
}

namespace {

// True when `bytes` hold a complete, intact item (its own checksum matches) whatever its key
// and state: then the slot that pointed here belonged to that item's key.
bool IntactItem(const uint8_t* bytes, size_t n) {
  if (n < sizeof(kv::ItemHeader)) return false;
  kv::ItemHeader h;
  std::memcpy(&h, bytes, sizeof(h));
  if (h.key_bytes == 0 || h.key_bytes > kv::kMaxKeyBytes) return false;
  uint64_t need = uint64_t{sizeof(h)} + h.key_bytes + h.value_bytes;
  if (need > n || h.units == 0 || uint64_t{h.units} * kv::kUnit < need) return false;
  const char* k = reinterpret_cast<const char*>(bytes + sizeof(h));
  return kv::ItemChecksum(h, std::string_view(k, h.key_bytes),
                          std::string_view(k + h.key_bytes, h.value_bytes)) == h.checksum;
}

}  // namespace

Verdict ClassifyItem(const uint8_t* bytes, size_t n, std::string_view key, std::string_view* value,
                     uint64_t* version, bool* torn) {
  *torn = false;
  switch (kv::CheckItem(bytes, n, key, value, version)) {
    case kv::ItemCheck::kOk:
      return Verdict::kAccept;
    case kv::ItemCheck::kDead:
      return Verdict::kRetry;  // the key's item, retired: the key was replaced or deleted
    case kv::ItemCheck::kBadChecksum:
      *torn = true;
      return Verdict::kRetry;
    case kv::ItemCheck::kWrongKey:
    case kv::ItemCheck::kBadLengths:
    case kv::ItemCheck::kTooShort:
      // Another key's intact item (a fingerprint collision), or bytes that are no item at all
      // (torn or reused): only the former proves this slot is not ours.
      if (IntactItem(bytes, n)) return Verdict::kForeign;
      *torn = true;
      return Verdict::kRetry;
  }
  return Verdict::kRetry;
}

namespace {

constexpr size_t kMaxCandidates = kv::kSlotsPerBucket * kv::kWindowBuckets;
// The least a shard move's request may take (a map install waits a lease and fsyncs; a
// DROP_SHARD deletes a whole shard and syncs): ClientOptions::op_timeout when longer.
constexpr std::chrono::milliseconds kAdminCallTimeout{30000};

struct Counters {
  std::atomic<uint64_t> gets{0}, get_reads{0}, get_retries{0}, cache_hits{0}, torn_reads{0},
      writes{0}, errors{0}, cache_misses{0}, slow_reads{0}, reconnects{0};
};

void Add(std::atomic<uint64_t>& c, uint64_t n = 1) {
  if (n != 0) c.fetch_add(n, std::memory_order_relaxed);
}

enum class Problem : uint8_t { kNone, kSlow, kTorn, kRetired, kBadSlot, kLease };

const char* ProblemText(Problem p) {
  switch (p) {
    case Problem::kNone: return "unknown";
    case Problem::kSlow: return "READs slower than read_deadline";
    case Problem::kTorn: return "item failed its checksum";
    case Problem::kRetired: return "item retired while being read";
    case Problem::kBadSlot: return "slot points outside the heap or past the largest item";
    case Problem::kLease: return "the ownership lease expired before the READ completed";
  }
  return "unknown";
}

// One server: its connection (replaced after a failure), its location cache, and when it was
// last found unreachable.
struct Link {
  Link(uint32_t server_id, ServerAddress a, size_t cache_entries)
      : id(server_id), address(std::move(a)), cache(cache_entries) {}
  const uint32_t id;
  const ServerAddress address;
  LocationCache cache;  // offsets in this server's region
  std::mutex mu;
  std::shared_ptr<Session> session;  // guarded by mu
  bool connected_once = false;       // guarded by mu
  uint64_t incarnation = 0;          // guarded by mu
  bool down = false;                 // guarded by mu: the last connection attempt failed
  Clock::time_point last_try;        // guarded by mu
  Status last_error;                 // guarded by mu
};

// A cluster map with the link of each shard's owner, built once per map.
struct Routing {
  std::shared_ptr<const cluster::ClusterMap> map;
  std::vector<Link*> owners;  // per shard
};

// One key being looked up by Get or MultiGet.
struct KeyJob {
  Link* link = nullptr;         // the server it is read from
  uint32_t shard = 0;           // cluster: the key's shard
  bool wrong_owner = false;     // cluster: the server does not serve the shard (re-route)
  std::string_view key;
  uint64_t hash = 0;
  uint64_t window_offset = 0;   // region offset of the key's 128-byte window
  uint16_t fingerprint = 0;
  std::optional<Result<GetResult>>* out = nullptr;
  bool done = false;
  int attempts = 0;             // index attempts (window READs) so far
  Clock::time_point deadline;   // op_timeout from the start of the call
  std::optional<CachedLocation> cached;
  // The current index attempt.
  Clock::time_point t0;
  uint8_t ncand = 0;            // candidates found in the window
  uint8_t unresolved = 0;       // candidates not yet read and judged
  bool retry = false;           // a candidate said "changed under us"
  bool slow = false;            // the attempt exceeded read_deadline
  int slow_attempts = 0;        // attempts that exceeded read_deadline
  Problem problem = Problem::kNone;  // the last reason for a retry, for the final error
  kv::SlotFields cand[kMaxCandidates];
};

class ClientImpl final : public Client {
 public:
  ClientImpl(const ClientOptions& options, ServerAddress address,
             std::unique_ptr<transport::Fabric> fabric)
      : options_(options),
        fabric_(std::move(fabric)),
        pool_(fabric_.get()),
        batch_limit_(std::max<uint32_t>(
            1, std::min(options.max_batch_reads, options.max_outstanding_reads))),
        lease_(options.ownership_lease) {
    seed_ = std::make_unique<Link>(0, std::move(address), options.location_cache_entries);
  }

  ~ClientImpl() override {
    // Sessions (connections) go before the pool and the fabric: see member order.
    std::lock_guard<std::mutex> l(map_mu_);
    for (auto& [name, link] : links_) {
      std::lock_guard<std::mutex> ll(link->mu);
      link->session.reset();
    }
    std::lock_guard<std::mutex> ls(seed_->mu);
    seed_->session.reset();
  }

  // Connects to the seed and asks it for the cluster map: none (an empty body) is a
  // standalone server, used exactly as before clusters existed.
  Status Init() {
    RDKV_RETURN_IF_ERROR(LinkSession(*seed_).status());
    std::string body;
    uint64_t epoch = 0;
    Status s = CallOn(*seed_, kv::Op::kClusterMap, {}, {}, 0, &epoch, &body);
    if (!s.ok()) {
      // A server older than clusters does not know the op: standalone.
      if (s.Is(StatusCode::kInvalidArgument) || s.Is(StatusCode::kNotSupported)) return Status::Ok();
      return s;
    }
    if (body.empty()) return Status::Ok();
    auto map = cluster::ParseClusterMap(body);
    if (!map.ok()) {
      return Status::ProtocolError("server " + seed_->address.ToString() +
                                   " sent a cluster map that does not parse: " +
                                   map.status().message());
    }
    cluster_ = true;
    std::lock_guard<std::mutex> l(map_mu_);
    InstallMapLocked(std::move(map).value());
    return Status::Ok();
  }

  Result<GetResult> Get(std::string_view key) override {
    Status bad = kv::CheckKey(key);
    if (!bad.ok()) return Fail(bad);
    std::optional<Result<GetResult>> out;
    KeyJob job;
    job.key = key;
    job.out = &out;
    Status s = RunJobs(std::span<KeyJob>(&job, 1));
    if (!s.ok()) return Fail(s);
    if (!out.has_value()) return Fail(Status::Internal("GET of " + DescribeKey(key) + " unresolved"));
    if (!out->ok() && !out->status().Is(StatusCode::kNotFound)) Add(stats_.errors);
    return std::move(*out);
  }

  std::vector<Result<GetResult>> MultiGet(std::span<const std::string_view> keys) override {
    std::vector<std::optional<Result<GetResult>>> outs(keys.size());
    std::vector<KeyJob> jobs;
    jobs.reserve(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      Status bad = kv::CheckKey(keys[i]);
      if (!bad.ok()) {
        outs[i] = bad;
        continue;
      }
      KeyJob& job = jobs.emplace_back();
      job.key = keys[i];
      job.out = &outs[i];
    }
    Status s = jobs.empty() ? Status::Ok() : RunJobs(jobs);
    std::vector<Result<GetResult>> results;
    results.reserve(keys.size());
    for (auto& o : outs) {
      if (!o.has_value()) o = s.ok() ? Status::Internal("GET unresolved") : s;
      if (!o->ok() && !o->status().Is(StatusCode::kNotFound)) Add(stats_.errors);
      results.push_back(std::move(*o));
    }
    return results;
  }

  Result<uint64_t> Put(std::string_view key, std::string_view value) override {
    return Write(kv::Op::kPut, key, value, 0);
  }
  Result<uint64_t> Insert(std::string_view key, std::string_view value) override {
    return Write(kv::Op::kInsert, key, value, 0);
  }
  Status Delete(std::string_view key) override {
    return Write(kv::Op::kDelete, key, {}, 0).status();
  }
  Result<uint64_t> Cas(std::string_view key, uint64_t expected_version,
                       std::string_view value) override {
    return Write(kv::Op::kCas, key, value, expected_version);
  }

  Result<std::string> Stats() override {
    if (!cluster_) {
      std::string body;
      Status s = CallOn(*seed_, kv::Op::kStats, {}, {}, 0, nullptr, &body);
      if (!s.ok()) return s;
      return body;
    }
    std::vector<ServerInfo> servers = Servers(true);
    return AggregateStats(servers);
  }

  Result<std::string> Snapshot(std::string_view name) override {
    std::vector<std::pair<Link*, std::string>> targets;
    std::shared_ptr<const cluster::ClusterMap> map = cluster_ ? CurrentMap() : nullptr;
    if (map == nullptr) {
      targets.push_back({seed_.get(), seed_->address.ToString()});
    } else {
      for (const cluster::ServerEntry& e : map->servers) {
        targets.push_back({LinkFor(e.id, e.address), e.address});
      }
    }
    std::string out;
    Status first;
    for (auto& [link, address] : targets) {
      std::string path;
      Status s = CallOn(*link, kv::Op::kSnapshot, name, {}, 0, nullptr, &path);
      if (!s.ok()) {
        if (first.ok()) first = Status(s.code(), address + ": " + s.message());
        continue;
      }
      out += address + " " + path + "\n";
    }
    if (!first.ok()) return first;
    return out;
  }

  std::vector<ServerInfo> Servers(bool with_stats) override {
    std::vector<ServerInfo> out;
    std::shared_ptr<const cluster::ClusterMap> map = CurrentMap();
    std::vector<std::pair<Link*, std::vector<uint32_t>>> targets;
    if (map == nullptr) {
      targets.push_back({seed_.get(), {0}});
    } else {
      for (const cluster::ServerEntry& e : map->servers) {
        targets.push_back({LinkFor(e.id, e.address), map->ShardsOf(e.id)});
      }
    }
    uint64_t newest = 0;
    Link* newest_link = nullptr;
    for (auto& [link, shards] : targets) {
      ServerInfo info;
      info.id = link->id;
      info.address = link->address.ToString();
      info.shards = shards;
      std::string body;
      uint64_t epoch = 0;
      Status s = CallOn(*link, kv::Op::kClusterMap, {}, {}, 0, &epoch, &body);
      if (s.ok() && with_stats) s = CallOn(*link, kv::Op::kStats, {}, {}, 0, nullptr, &info.stats);
      info.reachable = s.ok();
      if (!s.ok()) info.error = s.ToString();
      info.map_epoch = epoch;
      if (s.ok() && epoch > newest) {
        newest = epoch;
        newest_link = link;
      }
      out.push_back(std::move(info));
    }
    if (map != nullptr && newest > map->epoch) {
      Status r = RefreshMap(newest_link);
      if (!r.ok()) LOG(WARNING) << "rdkv client: refreshing the cluster map: " << r.ToString();
    }
    return out;
  }

  uint64_t map_epoch() const override {
    std::lock_guard<std::mutex> l(map_mu_);
    return map_ == nullptr ? 0 : map_->epoch;
  }

  Status Ping() override { return CallOn(*seed_, kv::Op::kPing, {}, {}, 0, nullptr, nullptr); }

  Result<MoveReport> MoveShards(std::span<const uint32_t> shards, uint32_t to_server,
                                const MoveProgressFn& progress) override {
    std::shared_ptr<const cluster::ClusterMap> map = cluster_ ? CurrentMap() : nullptr;
    if (map == nullptr) {
      return Status::NotSupported("the seed " + seed_->address.ToString() +
                                  " is a standalone server: there is no cluster map to change");
    }
    // Admin requests over this client's own links (one connection per server).
    class LinkChannel final : public AdminChannel {
     public:
      explicit LinkChannel(ClientImpl* client) : client_(client) {}
      Status Call(const cluster::ServerEntry& server, const kv::Request& r, uint64_t* version,
                  std::string* body) override {
        Link* link = client_->LinkFor(server.id, server.address);
        // A step's request may wait for a lease, fsyncs or a whole shard's deletes.
        return client_->CallOn(*link, r.op, r.key, r.value, r.expected_version, version, body,
                               std::max(client_->options_.op_timeout, kAdminCallTimeout));
      }

     private:
      ClientImpl* client_;
    };
    LinkChannel channel(this);
    Result<MoveReport> report = RunShardMove(channel, *map, shards, to_server, progress);
    // Route by the newest map from now on (also after a failure: some servers may have it).
    Status refreshed = RefreshMap(nullptr);
    if (!refreshed.ok()) {
      LOG(WARNING) << "rdkv client: refreshing the cluster map after a move: "
                   << refreshed.ToString();
    }
    return report;
  }

  ClientStats stats() const override {
    ClientStats s;
    s.gets = stats_.gets.load(std::memory_order_relaxed);
    s.get_reads = stats_.get_reads.load(std::memory_order_relaxed);
    s.get_retries = stats_.get_retries.load(std::memory_order_relaxed);
    s.cache_hits = stats_.cache_hits.load(std::memory_order_relaxed);
    s.torn_reads = stats_.torn_reads.load(std::memory_order_relaxed);
    s.writes = stats_.writes.load(std::memory_order_relaxed);
    s.errors = stats_.errors.load(std::memory_order_relaxed);
    s.cache_misses = stats_.cache_misses.load(std::memory_order_relaxed);
    s.slow_reads = stats_.slow_reads.load(std::memory_order_relaxed);
    s.reconnects = stats_.reconnects.load(std::memory_order_relaxed);
    return s;
  }

  uint64_t max_value_bytes() const override {
    return max_value_bytes_.load(std::memory_order_relaxed);
  }

 private:
  template <typename T>
  T Fail(T error) {
    Add(stats_.errors);
    return error;
  }

  // "server 10.0.0.1:7400", or in a cluster "server 2 (10.0.0.1:7400)".
  std::string Name(const Link& link) const {
    if (!cluster_ || &link == seed_.get()) return "server " + link.address.ToString();
    return "server " + std::to_string(link.id) + " (" + link.address.ToString() + ")";
  }

  // The live session of `link`, reconnecting when the current one is broken. In a cluster a
  // server that could not be reached is tried again at most every 500 ms; meanwhile its
  // calls fail fast with the last error.
  Result<std::shared_ptr<Session>> LinkSession(Link& link) {
    std::lock_guard<std::mutex> l(link.mu);
    if (link.session != nullptr && link.session->usable()) return link.session;
    Clock::time_point now = Clock::now();
    if (cluster_ && link.down && now - link.last_try < std::chrono::milliseconds(500)) {
      return link.last_error;
    }
    link.last_try = now;
    bool reconnect = link.connected_once;
    link.session.reset();  // the old connection closes once its last user is done
    auto opened = OpenSession(fabric_.get(), link.address, options_, &pool_);
    if (!opened.ok()) {
      Status s = opened.status();
      // The server's own refusals keep their code; anything about reaching it is kUnavailable.
      bool keep = s.Is(StatusCode::kPermissionDenied) || s.Is(StatusCode::kProtocolError) ||
                  s.Is(StatusCode::kInvalidArgument) || s.Is(StatusCode::kNotSupported);
      std::string msg = s.message();
      std::string name = Name(link);
      if (cluster_) {
        std::string dup = "server " + link.address.ToString() + ": ";
        if (msg.rfind(dup, 0) == 0) msg = msg.substr(dup.size());
        msg = name + ": " + msg;
      } else if (msg.find(link.address.ToString()) == std::string::npos) {
        msg = name + ": " + msg;
      }
      if (reconnect) msg = "reconnecting: " + msg;
      if (!keep && !s.Is(StatusCode::kUnavailable)) {
        msg += " (" + std::string(StatusCodeName(s.code())) + ")";
      }
      link.down = true;
      link.last_error = Status(keep ? s.code() : StatusCode::kUnavailable, std::move(msg));
      return link.last_error;
    }
    link.down = false;
    std::shared_ptr<Session> session = std::move(opened).value();
    const kv::RegionHeader& h = session->header();
    link.connected_once = true;
    if (reconnect) {
      Add(stats_.reconnects);
      LOG(INFO) << "rdkv client: reconnected to " << session->conn().peer()
                << (h.incarnation != link.incarnation ? " (new server incarnation)" : "");
    }
    if (h.incarnation != link.incarnation) {
      link.cache.Clear();  // every cached offset belongs to the old table
      link.incarnation = h.incarnation;
    }
    max_value_bytes_.store(h.max_value_bytes, std::memory_order_relaxed);
    ScratchShape shape;
    shape.window_capacity = batch_limit_;
    size_t max_item = kv::UnitsFor(kv::ItemBytes(kv::kMaxKeyBytes, h.max_value_bytes)) * kv::kUnit;
    shape.item_capacity = max_item + (64u << 10);
    shape.op_capacity = std::max<size_t>(batch_limit_, kMaxCandidates + 1);
    // In a cluster the scratches fit the largest items of every server.
    if (!cluster_ || shape.item_capacity > pool_.shape().item_capacity) pool_.SetShape(shape);
    link.session = session;
    return session;
  }

  // --- cluster: the map and the links ---

  std::shared_ptr<const cluster::ClusterMap> CurrentMap() const {
    std::lock_guard<std::mutex> l(map_mu_);
    return map_;
  }

  std::shared_ptr<const Routing> CurrentRouting() const {
    std::lock_guard<std::mutex> l(map_mu_);
    return routing_;
  }

  // Requires map_mu_.
  void InstallMapLocked(cluster::ClusterMap map) {
    auto rt = std::make_shared<Routing>();
    rt->map = std::make_shared<const cluster::ClusterMap>(std::move(map));
    rt->owners.reserve(rt->map->shards);
    for (uint32_t s = 0; s < rt->map->shards; ++s) {
      uint32_t id = rt->map->OwnerOf(s);
      const cluster::ServerEntry* e = rt->map->FindServer(id);
      rt->owners.push_back(LinkForLocked(id, e != nullptr ? e->address : std::string("?")));
    }
    map_ = rt->map;
    routing_ = std::move(rt);
  }

  // The link of server `id` at `address` (created on first use; links live as long as the
  // client).
  Link* LinkFor(uint32_t id, const std::string& address) {
    std::lock_guard<std::mutex> l(map_mu_);
    return LinkForLocked(id, address);
  }
  // Requires map_mu_.
  Link* LinkForLocked(uint32_t id, const std::string& address) {
    std::string name = std::to_string(id) + "@" + address;
    auto it = links_.find(name);
    if (it != links_.end()) return it->second.get();
    auto parsed = ParseServerAddress(address);
    ServerAddress a = parsed.ok() ? parsed.value() : ServerAddress{address, 0};
    auto link = std::make_unique<Link>(id, std::move(a), options_.location_cache_entries);
    Link* raw = link.get();
    links_.emplace(name, std::move(link));
    return raw;
  }

  // Fetches the map from `from` (the server that redirected), else the seed, else any server
  // of the map, and keeps it when its epoch is newer. OK when some server answered.
  Status RefreshMap(Link* from) {
    std::vector<Link*> order;
    if (from != nullptr) order.push_back(from);
    order.push_back(seed_.get());
    if (auto map = CurrentMap(); map != nullptr) {
      for (const auto& e : map->servers) order.push_back(LinkFor(e.id, e.address));
    }
    Status last = Status::Unavailable("no server to ask for the cluster map");
    for (Link* link : order) {
      std::string body;
      uint64_t epoch = 0;
      Status s = CallOn(*link, kv::Op::kClusterMap, {}, {}, 0, &epoch, &body);
      if (!s.ok()) {
        last = s;
        continue;
      }
      auto parsed = cluster::ParseClusterMap(body);
      if (!parsed.ok()) {
        last = Status::ProtocolError(Name(*link) + " sent a cluster map that does not parse: " +
                                     parsed.status().message());
        continue;
      }
      std::lock_guard<std::mutex> l(map_mu_);
      if (map_ == nullptr || parsed->epoch > map_->epoch) {
        InstallMapLocked(std::move(parsed).value());
      }
      return Status::Ok();
    }
    return last;
  }

  // Adds every numeric field of `from` (nested objects too) into `total`.
  static void SumInto(nlohmann::json* total, const nlohmann::json& from) {
    for (auto& [k, v] : from.items()) {
      if (v.is_object()) {
        if (!total->contains(k)) (*total)[k] = nlohmann::json::object();
        SumInto(&(*total)[k], v);
      } else if (v.is_number_integer()) {
        (*total)[k] = (total->contains(k) ? (*total)[k].get<int64_t>() : 0) + v.get<int64_t>();
      } else if (v.is_number_float()) {
        (*total)[k] = (total->contains(k) ? (*total)[k].get<double>() : 0.0) + v.get<double>();
      }
    }
  }

  // Stats() in a cluster: numeric fields summed over the reachable servers.
  static Result<std::string> AggregateStats(const std::vector<ServerInfo>& servers) {
    nlohmann::json total = nlohmann::json::object();
    nlohmann::json per = nlohmann::json::array();
    size_t reachable = 0;
    std::string first_error;
    for (const ServerInfo& info : servers) {
      nlohmann::json one = {{"id", info.id}, {"address", info.address}};
      if (!info.reachable) {
        one["error"] = info.error;
        if (first_error.empty()) first_error = info.error;
        per.push_back(std::move(one));
        continue;
      }
      nlohmann::json st = nlohmann::json::parse(info.stats, nullptr, false);
      if (st.is_object()) {
        ++reachable;
        SumInto(&total, st);
      }
      one["stats"] = std::move(st);
      per.push_back(std::move(one));
    }
    if (reachable == 0) return Status::Unavailable("no server of the cluster is reachable: " + first_error);
    nlohmann::json out = {{"servers", servers.size()}, {"reachable", reachable},
                          {"total", std::move(total)}, {"per_server", std::move(per)}};
    return out.dump();
  }

  // Posts scratch->batch and waits. OK when every READ completed OK; otherwise the error for
  // the call (the session is marked for reconnect).
  Status RunReads(Session& session, ScratchLease& scratch) {
    Add(stats_.get_reads, scratch->batch.size());
    Status s = session.conn().ReadAndWait(scratch->batch, Clock::now() + options_.op_timeout);
    if (!s.ok()) {
      session.MarkBroken();
      if (!scratch->Idle()) session.Quarantine(scratch.Take());  // the transport still owns it
      if (s.Is(StatusCode::kTimedOut)) {
        return Status::TimedOut("READ from " + session.conn().peer() + " did not complete within " +
                                std::to_string(options_.op_timeout.count()) + " ms");
      }
      return Status(s.code(), "READ from " + session.conn().peer() + ": " + s.message());
    }
    for (transport::ReadOp* op : scratch->batch) {
      transport::ReadStatus rs = op->status.load(std::memory_order_acquire);
      if (rs == transport::ReadStatus::kOk) continue;
      session.MarkBroken();
      switch (rs) {
        case transport::ReadStatus::kRemoteAccessError:
          return Status::RemoteAccessError("server " + session.conn().peer() +
                                           " refused a READ of its region (restarted?)");
        case transport::ReadStatus::kConnectionLost:
          return Status::ConnectionLost("connection to " + session.conn().peer() +
                                        " broke during a READ");
        default:
          return Status::Internal("READ from " + session.conn().peer() + " failed locally");
      }
    }
    return Status::Ok();
  }

  static void AddRead(Session& session, ReadScratch& x, uint8_t* dest, uint64_t region_offset,
                      uint32_t length, uint64_t tag) {
    transport::ReadOp& op = x.ops[x.batch.size()];
    op.Reset();
    op.local = dest;
    op.lkey = x.lkey();
    op.remote_addr = session.RemoteAddr(region_offset);
    op.rkey = session.region().rkey;
    op.length = length;
    x.batch.push_back(&op);
    x.tags.push_back(tag);
  }

  // Where an item of `units` at `offset_units` lies, or nullopt when it is outside the heap.
  static std::optional<uint64_t> ItemOffset(const kv::RegionHeader& h, uint32_t offset_units,
                                            uint32_t units) {
    uint64_t start = uint64_t{offset_units} * kv::kUnit;
    uint64_t len = uint64_t{units} * kv::kUnit;
    if (units == 0 || start > h.heap_bytes || len > h.heap_bytes - start) return std::nullopt;
    return h.heap_offset + start;
  }

  // The job's final error (constructed in place).
  static void Finish(KeyJob& job, Status error) {
    job.done = true;
    job.out->emplace(std::move(error));
  }

  static void Accept(KeyJob& job, std::string_view value, uint64_t version) {
    job.done = true;
    job.out->emplace(GetResult{std::string(value), version});
  }

  // Ends an attempt that did not resolve the key: the next round retries it, or it fails.
  void Retry(KeyJob& job, bool* any_retry) {
    if (job.attempts >= options_.max_get_attempts) {
      bool slow = job.slow_attempts == job.attempts;
      std::string what = "GET of " + DescribeKey(job.key) + " from " + Name(*job.link) +
                         " failed " + std::to_string(job.attempts) + " attempts";
      if (slow) {
        Finish(job, Status::TimedOut(what + ": every attempt took longer than read_deadline (" +
                                     std::to_string(options_.read_deadline.count()) +
                                     " ms); no value was returned"));
      } else {
        Finish(job, Status::Corruption(what + " (last: " +
                                       ProblemText(job.problem) +
                                       "); no value was returned"));
      }
      return;
    }
    Add(stats_.get_retries);
    *any_retry = true;
  }

  // Resolves every job (each ends done, with its result in *out). Standalone: or returns the
  // error that stopped them all (a READ failure, no connection). In a cluster the jobs are
  // grouped by owner; a server's failure ends only its own jobs (with the error naming it),
  // and jobs whose server no longer serves their shard are re-routed after a map refresh
  // until op_timeout.
  Status RunJobs(std::span<KeyJob> jobs) {
    if (!cluster_) {
      for (KeyJob& job : jobs) job.link = seed_.get();
      return RunJobsOn(*seed_, jobs);
    }
    Clock::time_point deadline = Clock::now() + options_.op_timeout;
    for (KeyJob& job : jobs) job.shard = 0;
    for (int round = 0;; ++round) {
      std::shared_ptr<const Routing> rt = CurrentRouting();
      std::map<Link*, std::vector<size_t>> groups;
      for (size_t i = 0; i < jobs.size(); ++i) {
        KeyJob& job = jobs[i];
        if (job.done) continue;
        job.shard = cluster::ShardOf(kv::KeyHash(job.key), rt->map->shards);
        job.link = rt->owners[job.shard];
        groups[job.link].push_back(i);
      }
      if (groups.empty()) return Status::Ok();
      Link* redirected = nullptr;
      for (auto& [link, idx] : groups) {
        std::vector<KeyJob> sub;
        sub.reserve(idx.size());
        for (size_t i : idx) sub.push_back(jobs[i]);
        Status s = RunJobsOn(*link, sub);
        for (size_t n = 0; n < idx.size(); ++n) {
          KeyJob& job = sub[n];
          if (!job.done && !s.ok()) Finish(job, s);
          if (job.wrong_owner) {
            redirected = link;
            if (Clock::now() < deadline) {
              // Not done: re-routed with the refreshed map.
              job.out->reset();
              job.done = false;
              job.wrong_owner = false;
              job.attempts = 0;
              job.cached.reset();
            }
          }
          jobs[idx[n]] = job;
        }
      }
      if (redirected == nullptr) return Status::Ok();
      Status r = RefreshMap(redirected);
      if (!r.ok()) LOG(WARNING) << "rdkv client: refreshing the cluster map: " << r.ToString();
      RerouteBackoff(round);
    }
  }

  // The jobs of one server.
  Status RunJobsOn(Link& link, std::span<KeyJob> jobs) {
    RDKV_ASSIGN_OR_RETURN(std::shared_ptr<Session> session, LinkSession(link));
    RDKV_ASSIGN_OR_RETURN(std::unique_ptr<ReadScratch> raw, pool_.Acquire());
    ScratchLease scratch(&pool_, std::move(raw));
    const kv::RegionHeader& h = session->header();
    Clock::time_point start = Clock::now();
    for (KeyJob& job : jobs) {
      job.hash = kv::KeyHash(job.key);
      job.window_offset = h.index_offset + kv::BucketOf(job.hash, h.bucket_count) * kv::kBucketBytes;
      job.fingerprint = kv::FingerprintOf(job.hash);
      job.deadline = start + options_.op_timeout;
    }
    Add(stats_.gets, jobs.size());
    if (link.cache.entries() > 0) RDKV_RETURN_IF_ERROR(CachePass(*session, scratch, jobs));
    for (int round = 0;; ++round) {
      bool any_retry = false;
      bool any_work = false;
      for (size_t i = 0; i < jobs.size();) {
        size_t end = i;
        RDKV_RETURN_IF_ERROR(IndexChunk(*session, scratch, jobs, i, &end, &any_work, &any_retry));
        i = end;
      }
      if (!any_work) break;
      if (any_retry) Backoff(round);
    }
    return Status::Ok();
  }

  // Between re-routes of a moving shard (the new owner may still be installing the map):
  // 0.5 ms, doubling up to 20 ms.
  static void RerouteBackoff(int round) {
    std::this_thread::sleep_for(std::chrono::microseconds(std::min(500 << std::min(round, 6), 20000)));
  }

  static void Backoff(int round) {
    if (round == 0) {
      std::this_thread::yield();  // a torn read usually clears within microseconds
      return;
    }
    int shift = std::min(round - 1, 8);
    std::this_thread::sleep_for(std::chrono::microseconds(std::min(10 << shift, 2000)));
  }

  // --- the ownership lease (cluster) ---

  // Where an ownership READ lands in a scratch: the tail of the item buffer, which the cache
  // pass leaves free in a cluster (the index pass reads candidates only after it completed).
  static size_t OwnershipOffset(const ReadScratch& x) {
    return (x.item_capacity - kv::kOwnershipBytes) & ~size_t{63};
  }
  size_t CacheItemLimit(const ReadScratch& x) const {
    return cluster_ ? OwnershipOffset(x) : x.item_capacity;
  }

  // Whether a result of `job` read from `session` (completed at `completed`) may be returned.
  Session::LeaseVerdict LeaseOf(const Session& session, const KeyJob& job,
                                Clock::time_point completed) const {
    if (!cluster_) return Session::LeaseVerdict::kOk;
    return session.CheckLease(job.shard, completed, lease_);
  }

  // The server does not serve the job's shard: done here, re-routed by RunJobs.
  void WrongOwner(KeyJob& job) {
    job.wrong_owner = true;
    Finish(job, Status::WrongOwner(Name(*job.link) + " does not serve shard " +
                                   std::to_string(job.shard) + " of " + DescribeKey(job.key) +
                                   " (the shard moved, or is moving: a move serves no GET of "
                                   "it from its step 1 to its step 3)"));
  }

  // A result (a value or NotFound) read at `completed`: true when it may be returned;
  // otherwise the job is re-routed (kNotOwned) or retried (kExpired).
  bool LeaseGate(const Session& session, KeyJob& job, Clock::time_point completed,
                 bool* any_retry) {
    switch (LeaseOf(session, job, completed)) {
      case Session::LeaseVerdict::kOk:
        return true;
      case Session::LeaseVerdict::kNotOwned:
        WrongOwner(job);
        return false;
      case Session::LeaseVerdict::kExpired:
        job.problem = Problem::kLease;
        Retry(job, any_retry);
        return false;
    }
    return false;
  }

  // One READ per job with a cached location, in batches (with cache_checks_slot, also the
  // key's window in the same batch). Accepted jobs are done; the rest forget the stale
  // location and go through the index.
  Status CachePass(Session& session, ScratchLease& x, std::span<KeyJob> jobs) {
    const kv::RegionHeader& h = session.header();
    const bool check_slot = options_.cache_checks_slot;
    const size_t per_job = check_slot ? 2 : 1;
    const size_t max_ops = std::min(x->op_capacity, batch_limit_);
    for (size_t i = 0; i < jobs.size();) {
      x->batch.clear();
      x->tags.clear();
      size_t bytes = 0;
      size_t windows = 0;
      size_t j = i;
      for (; j < jobs.size(); ++j) {
        KeyJob& job = jobs[j];
        job.cached = job.link->cache.Lookup(job.hash);
        if (!job.cached.has_value()) continue;
        uint32_t len = uint32_t{job.cached->units} * kv::kUnit;
        auto off = ItemOffset(h, job.cached->offset_units, job.cached->units);
        if (!off.has_value() || len > x->item_capacity) {
          job.link->cache.Erase(job.hash, job.cached);
          job.cached.reset();
          continue;
        }
        if (x->batch.size() + per_job > max_ops || bytes + len > CacheItemLimit(*x) ||
            (check_slot && windows == x->window_capacity)) {
          break;
        }
        AddRead(session, *x, x->items + bytes, *off, len, (uint64_t{j} << 32) | bytes);
        bytes += len;
        if (check_slot) {  // right after its item: batch[k + 1]
          AddRead(session, *x, x->windows + windows * kv::kWindowBytes, job.window_offset,
                  kv::kWindowBytes, windows);
          ++windows;
        }
      }
      if (!x->batch.empty()) {
        const size_t job_ops = x->batch.size();
        Clock::time_point t0 = Clock::now();
        // Cluster: the ownership READ rides along when the lease is older than lease / 2 (one
        // batch per connection at a time while the lease is still valid).
        const bool probe = cluster_ && session.ClaimLeaseRefresh(t0, lease_ / 2);
        uint8_t* own = x->items + OwnershipOffset(*x);
        if (probe) {
          AddRead(session, *x, own, kv::kOwnershipOffset, kv::kOwnershipBytes, ~uint64_t{0});
        }
        RDKV_RETURN_IF_ERROR(RunReads(session, x));
        Clock::time_point completed = Clock::now();
        if (probe) session.UpdateLease(t0, own);
        bool in_time = !check_slot || completed - t0 <= options_.read_deadline;
        for (size_t k = 0; k < job_ops; k += per_job) {
          KeyJob& job = jobs[x->tags[k] >> 32];
          const uint8_t* item = x->items + static_cast<uint32_t>(x->tags[k]);
          std::string_view value;
          uint64_t version = 0;
          bool torn = false;
          Verdict v = ClassifyItem(item, x->batch[k]->length, job.key, &value, &version, &torn);
          if (torn) Add(stats_.torn_reads);
          bool linked = !check_slot ||
                        (in_time && WindowHolds(x->windows + x->tags[k + 1] * kv::kWindowBytes,
                                                job.fingerprint, *job.cached));
          if (v == Verdict::kAccept && linked) {
            Session::LeaseVerdict lv = LeaseOf(session, job, completed);
            if (lv == Session::LeaseVerdict::kOk) {
              Add(stats_.cache_hits);
              Accept(job, value, version);
            } else if (lv == Session::LeaseVerdict::kNotOwned) {
              WrongOwner(job);
            }
            // kExpired: the index pass reads it again with a fresh lease.
          } else {
            Add(stats_.cache_misses);
            job.link->cache.Erase(job.hash, job.cached);
          }
        }
      }
      i = j;
    }
    return Status::Ok();
  }

  // True when a slot of the window points at `loc` under `fingerprint`.
  static bool WindowHolds(const uint8_t* window, uint16_t fingerprint, CachedLocation loc) {
    for (size_t s = 0; s < kMaxCandidates; ++s) {
      uint64_t word;
      std::memcpy(&word, window + s * 8, 8);
      kv::SlotFields f = kv::UnpackSlot(word);
      if (word != 0 && f.fingerprint == fingerprint && f.offset_units == loc.offset_units &&
          f.units == loc.units) {
        return true;
      }
    }
    return false;
  }

  // One index attempt for up to batch_limit_ unresolved jobs from jobs[i...]: their windows
  // in one batch, then their candidates in as few batches as the scratch allows.
  Status IndexChunk(Session& session, ScratchLease& x, std::span<KeyJob> jobs, size_t i,
                    size_t* end, bool* any_work, bool* any_retry) {
    const kv::RegionHeader& h = session.header();
    size_t max_windows = std::min({x->window_capacity, x->op_capacity, batch_limit_});
    x->batch.clear();
    x->tags.clear();
    Clock::time_point t0 = Clock::now();
    // Cluster: the ownership READ rides in the window batch when the lease is older than
    // lease / 2 (t0, taken before posting, is its time; one batch per connection at a time
    // while the lease is still valid).
    const bool probe = cluster_ && session.ClaimLeaseRefresh(t0, lease_ / 2);
    if (probe && max_windows > 1) --max_windows;
    size_t j = i;
    for (; j < jobs.size() && x->batch.size() < max_windows; ++j) {
      KeyJob& job = jobs[j];
      if (job.done) continue;
      if (job.attempts > 0 && t0 > job.deadline) {
        Finish(job, Status::TimedOut("GET of " + DescribeKey(job.key) + " from " +
                                     Name(*job.link) + " did not succeed within " +
                                     std::to_string(options_.op_timeout.count()) + " ms (" +
                                     std::to_string(job.attempts) + " attempts)"));
        continue;
      }
      size_t slot = x->batch.size();
      AddRead(session, *x, x->windows + slot * kv::kWindowBytes, job.window_offset,
              kv::kWindowBytes, j);
      job.t0 = t0;
      ++job.attempts;
    }
    *end = j;
    if (x->batch.empty()) return Status::Ok();
    *any_work = true;
    const size_t nwindows = x->batch.size();
    uint8_t* own = x->items + OwnershipOffset(*x);
    if (probe) AddRead(session, *x, own, kv::kOwnershipOffset, kv::kOwnershipBytes, ~uint64_t{0});
    RDKV_RETURN_IF_ERROR(RunReads(session, x));
    const Clock::time_point windows_done = Clock::now();
    if (probe) session.UpdateLease(t0, own);

    // Candidates: the slots whose fingerprint matches.
    for (size_t k = 0; k < nwindows; ++k) {
      KeyJob& job = jobs[x->tags[k]];
      const uint8_t* w = x->windows + k * kv::kWindowBytes;
      job.ncand = 0;
      job.retry = false;
      job.slow = false;
      for (size_t s = 0; s < kMaxCandidates; ++s) {
        uint64_t word;
        std::memcpy(&word, w + s * 8, 8);
        if (word == 0) continue;
        kv::SlotFields f = kv::UnpackSlot(word);
        if (f.fingerprint == job.fingerprint) job.cand[job.ncand++] = f;
      }
      job.unresolved = job.ncand;
      if (job.ncand == 0) {
        // No slot of the window held the key's fingerprint when it was read: absent then.
        job.link->cache.Erase(job.hash);
        if (LeaseGate(session, job, windows_done, any_retry)) {
          Finish(job, Status::NotFound("key not found"));  // short: no allocation
        }
      }
    }

    // Candidate items, streamed through the item buffer in job order.
    const size_t max_ops = std::min(x->op_capacity, batch_limit_);
    x->batch.clear();
    x->tags.clear();
    size_t bytes = 0;
    for (size_t k = i; k < j; ++k) {
      KeyJob& job = jobs[k];
      if (job.done || job.t0 != t0 || job.unresolved == 0) continue;
      for (uint8_t c = 0; c < job.ncand; ++c) {
        const kv::SlotFields& f = job.cand[c];
        uint32_t len = uint32_t{f.units} * kv::kUnit;
        auto off = ItemOffset(h, f.offset_units, f.units);
        if (!off.has_value() || len > x->item_capacity) {
          // Not a readable item: the server broke the layout contract. Never trust it.
          job.problem = Problem::kBadSlot;
          job.retry = true;
          --job.unresolved;
          continue;
        }
        if (x->batch.size() == max_ops || bytes + len > x->item_capacity) {
          RDKV_RETURN_IF_ERROR(JudgeCandidates(session, x, jobs, any_retry));
          x->batch.clear();
          x->tags.clear();
          bytes = 0;
          if (job.done) break;
        }
        AddRead(session, *x, x->items + bytes, *off, len,
                (uint64_t{k} << 40) | (uint64_t{c} << 32) | bytes);
        bytes += len;
      }
      if (!job.done && job.unresolved == 0) {
        EndAttempt(session, job, Clock::now(), any_retry);  // all unreadable
      }
    }
    if (!x->batch.empty()) RDKV_RETURN_IF_ERROR(JudgeCandidates(session, x, jobs, any_retry));
    return Status::Ok();
  }

  // Nothing accepted and no candidate left: NotFound if every candidate was another key's,
  // else retry.
  void EndAttempt(const Session& session, KeyJob& job, Clock::time_point completed,
                  bool* any_retry) {
    if (job.retry) {
      Retry(job, any_retry);
    } else {
      job.link->cache.Erase(job.hash);
      if (LeaseGate(session, job, completed, any_retry)) {
        Finish(job, Status::NotFound("key not found"));
      }
    }
  }

  // READs the batched candidates and judges them, in slot order per job.
  Status JudgeCandidates(Session& session, ScratchLease& x, std::span<KeyJob> jobs,
                         bool* any_retry) {
    RDKV_RETURN_IF_ERROR(RunReads(session, x));
    Clock::time_point now = Clock::now();
    for (size_t n = 0; n < x->batch.size(); ++n) {
      uint64_t tag = x->tags[n];
      KeyJob& job = jobs[tag >> 40];
      if (job.done) continue;  // an earlier candidate was accepted
      uint8_t c = static_cast<uint8_t>(tag >> 32);
      const uint8_t* item = x->items + static_cast<uint32_t>(tag);
      --job.unresolved;
      if (now - job.t0 > options_.read_deadline) {
        // Too slow: the block may have been reused since the window was read.
        if (!job.slow) {
          Add(stats_.slow_reads);
          ++job.slow_attempts;
        }
        job.slow = true;
        job.problem = Problem::kSlow;
        job.retry = true;
      } else {
        std::string_view value;
        uint64_t version = 0;
        bool torn = false;
        Verdict v = ClassifyItem(item, x->batch[n]->length, job.key, &value, &version, &torn);
        if (torn) {
          Add(stats_.torn_reads);
          job.problem = Problem::kTorn;
        }
        if (v == Verdict::kAccept) {
          Session::LeaseVerdict lv = LeaseOf(session, job, now);
          if (lv == Session::LeaseVerdict::kOk) {
            const kv::SlotFields& f = job.cand[c];
            job.link->cache.Store(job.hash, CachedLocation{f.offset_units, f.units});
            Accept(job, value, version);
            continue;
          }
          if (lv == Session::LeaseVerdict::kNotOwned) {
            WrongOwner(job);
            continue;
          }
          job.problem = Problem::kLease;  // retried with a fresh lease
          job.retry = true;
        }
        if (v == Verdict::kRetry) {
          if (!torn) job.problem = Problem::kRetired;
          job.retry = true;
        }
      }
      if (job.unresolved == 0) EndAttempt(session, job, now, any_retry);
    }
    return Status::Ok();
  }

  // --- writes and control ---

  Result<uint64_t> Write(kv::Op op, std::string_view key, std::string_view value,
                         uint64_t expected) {
    Status bad = kv::CheckKey(key);
    if (!bad.ok()) return Fail(bad);
    uint64_t version = 0;
    if (!cluster_) {
      Status s = CallOn(*seed_, op, key, value, expected, &version, nullptr);
      if (!s.ok()) return s;
      return version;
    }
    // Cluster: to the key's owner; a redirect (kWrongOwner) refreshes the map (from the
    // server that redirected) and retries, until op_timeout.
    Clock::time_point deadline = Clock::now() + options_.op_timeout;
    uint64_t hash = kv::KeyHash(key);
    for (int round = 0;; ++round) {
      std::shared_ptr<const Routing> rt = CurrentRouting();
      Link* link = rt->owners[cluster::ShardOf(hash, rt->map->shards)];
      Status s = CallOn(*link, op, key, value, expected, &version, nullptr);
      if (s.ok()) return version;
      if (!s.Is(StatusCode::kWrongOwner) || Clock::now() >= deadline) {
        if (s.Is(StatusCode::kWrongOwner)) Add(stats_.errors);
        return s;
      }
      Status r = RefreshMap(link);
      if (!r.ok()) LOG(WARNING) << "rdkv client: refreshing the cluster map: " << r.ToString();
      RerouteBackoff(round);
    }
  }

  // One request/response to `link`'s server. Counts errors (not kNotFound / kAlreadyExists
  // / kVersionMismatch, which are answers, nor kWrongOwner, which the caller follows).
  // `timeout` zero: options_.op_timeout.
  Status CallOn(Link& link, kv::Op op, std::string_view key, std::string_view value,
                uint64_t expected, uint64_t* version, std::string* body,
                std::chrono::milliseconds timeout = std::chrono::milliseconds::zero()) {
    if (timeout == std::chrono::milliseconds::zero()) timeout = options_.op_timeout;
    auto session_or = LinkSession(link);
    if (!session_or.ok()) return Fail(session_or.status());
    std::shared_ptr<Session> session = std::move(session_or).value();
    // The op table decides: a snapshot's name or a shard move's request is no keyed write.
    const bool keyed = kv::InfoOf(op).keyed;
    const bool write = kv::IsWrite(op);
    if (kv::InfoOf(op).has_value && value.size() > session->header().max_value_bytes) {
      return Fail(Status::InvalidArgument(
          "value of " + std::to_string(value.size()) + " bytes is larger than the server's limit of " +
          std::to_string(session->header().max_value_bytes) + " bytes"));
    }
    kv::Request req;
    req.op = op;
    req.key = key;
    req.value = value;
    req.expected_version = expected;
    std::vector<uint8_t> request, response;
    kv::EncodeRequest(req, &request);
    if (write) Add(stats_.writes);
    Status s = session->conn().Call(request, &response, timeout);
    if (write) {
      // This client's cached location of the key is (or is about to be) stale.
      link.cache.Erase(kv::KeyHash(key));
    }
    auto what = [&] {
      return std::string(kv::OpName(op)) + (keyed ? " of " + DescribeKey(key) : "") + " to " +
             session->conn().peer();
    };
    if (!s.ok()) {
      if (s.Is(StatusCode::kConnectionLost)) session->MarkBroken();
      return Fail(Status(s.code(), what() + ": " + s.message()));
    }
    auto decoded = kv::DecodeResponse(response);
    if (!decoded.ok()) {
      return Fail(Status(decoded.status().code(), what() + ": " + decoded.status().message()));
    }
    const kv::Response& r = decoded.value();
    if (!r.status.ok()) {
      std::string msg = r.status.message();
      if (msg.empty()) msg = what() + ": " + std::string(StatusCodeName(r.status.code()));
      if (r.status.Is(StatusCode::kVersionMismatch) &&
          msg.find(std::to_string(r.version)) == std::string::npos) {
        msg += " (current version " + std::to_string(r.version) + ")";
      }
      Status out(r.status.code(), std::move(msg));
      if (out.Is(StatusCode::kWrongOwner) && version != nullptr) *version = r.version;
      bool answer = out.Is(StatusCode::kNotFound) || out.Is(StatusCode::kAlreadyExists) ||
                    out.Is(StatusCode::kVersionMismatch) || out.Is(StatusCode::kWrongOwner);
      return answer ? out : Fail(out);
    }
    if (version != nullptr) *version = r.version;
    if (body != nullptr) body->assign(r.body.data(), r.body.size());
    return Status::Ok();
  }

  // Members are destroyed bottom-up: the links (connections) first, the fabric last.
  const ClientOptions options_;
  std::unique_ptr<transport::Fabric> fabric_;
  ScratchPool pool_;
  const size_t batch_limit_;
  const Clock::duration lease_;
  Counters stats_;
  std::atomic<uint64_t> max_value_bytes_{0};
  bool cluster_ = false;  // set by Init (the seed served a map), constant afterwards
  mutable std::mutex map_mu_;
  std::shared_ptr<const cluster::ClusterMap> map_;           // guarded by map_mu_
  std::shared_ptr<const Routing> routing_;                   // guarded by map_mu_
  std::map<std::string, std::unique_ptr<Link>> links_;        // guarded by map_mu_; "id@address"
  std::unique_ptr<Link> seed_;  // the seed (standalone: the only server)
};

Status ValidateOptions(const ClientOptions& o) {
  if (o.op_timeout.count() <= 0) return Status::InvalidArgument("op_timeout must be positive");
  if (o.connect_timeout.count() <= 0) {
    return Status::InvalidArgument("connect_timeout must be positive");
  }
  if (o.read_deadline.count() <= 0) return Status::InvalidArgument("read_deadline must be positive");
  if (o.ownership_lease.count() <= 0) {
    return Status::InvalidArgument("ownership_lease must be positive");
  }
  if (o.max_get_attempts < 1) return Status::InvalidArgument("max_get_attempts must be at least 1");
  if (o.max_batch_reads < 1) return Status::InvalidArgument("max_batch_reads must be at least 1");
  if (o.max_outstanding_reads < kMaxCandidates + 1) {
    return Status::InvalidArgument("max_outstanding_reads must be at least " +
                                   std::to_string(kMaxCandidates + 1));
  }
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<Client>> ConnectWithFabric(const ClientOptions& options,
                                                  std::unique_ptr<transport::Fabric> fabric) {
  RDKV_RETURN_IF_ERROR(ValidateOptions(options));
  RDKV_ASSIGN_OR_RETURN(ServerAddress address, ParseServerAddress(options.seed));
  auto client = std::make_unique<ClientImpl>(options, std::move(address), std::move(fabric));
  RDKV_RETURN_IF_ERROR(client->Init());
  return std::unique_ptr<Client>(std::move(client));
}

}  // namespace rdkv::client

namespace rdkv {

Result<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  RDKV_RETURN_IF_ERROR(client::ValidateOptions(options));
  if (options.seed.empty()) {
    return Status::InvalidArgument("ClientOptions.seed is empty: give a server as host:port");
  }
  RDKV_RETURN_IF_ERROR(client::ParseServerAddress(options.seed).status());
  RDKV_ASSIGN_OR_RETURN(transport::TransportKind kind, transport::ChooseTransport(options.transport));
  transport::FabricOptions fo;
  fo.kind = kind;
  fo.device = options.device;
  auto fabric = transport::Fabric::Create(fo);
  if (!fabric.ok()) {
    return Status(fabric.status().code(), "cannot open the " +
                                              std::string(transport::TransportKindName(kind)) +
                                              " transport: " + fabric.status().message());
  }
  return client::ConnectWithFabric(options, std::move(fabric).value());
}

}  // namespace rdkv

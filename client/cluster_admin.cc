#include "client/cluster_admin.h"

#include <glog/logging.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <utility>

#include "client/replica_admin.h"

#include "client/shard_move.h"
#include "common/kv/wire.h"
#include "common/util/json_bounded.h"
#include "common/util/latency_json.h"

namespace rdkv::client {

namespace {

// The least a shard move's request may take (a map install waits a lease and fsyncs; a
// DROP_SHARD deletes a whole shard and syncs): ClientOptions::op_timeout when longer.
constexpr std::chrono::milliseconds kAdminCallTimeout{30000};

// A request of one op without key or value.
kv::Request Plain(kv::Op op) {
  kv::Request r;
  r.op = op;
  return r;
}

// Admin requests over the client's own links (one connection per server).
class LinkChannel final : public AdminChannel {
 public:
  LinkChannel(const ClientOptions& options, Links* links, Caller* caller)
      : options_(options), links_(links), caller_(caller) {}
  Status Call(const cluster::ServerEntry& server, const kv::Request& r, uint64_t* version,
              std::string* body) override {
    Link* link = links_->LinkFor(server.id, server.address);
    // A step's request may wait for a lease, fsyncs or a whole shard's deletes.
    return caller_->Call(*link, r, version, body, std::max(options_.op_timeout, kAdminCallTimeout));
  }

 private:
  const ClientOptions& options_;
  Links* const links_;
  Caller* const caller_;
};

}  // namespace

Result<std::string> AggregateStats(const std::vector<ServerInfo>& servers) {
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
    nlohmann::json st = ParseJsonBounded(info.stats);
    if (!st.is_object()) {
      // Not JSON, or nested deeper than any STATS (ParseJsonBounded): left out of the sum.
      one["error"] = "its STATS answer is not a JSON object of the expected shape";
      if (first_error.empty()) {
        first_error = "server " + std::to_string(info.id) + ": " + one["error"].get<std::string>();
      }
      per.push_back(std::move(one));
      continue;
    }
    ++reachable;
    SumStats(&total, st);
    one["stats"] = std::move(st);
    per.push_back(std::move(one));
  }
  if (reachable == 0) {
    return Status::Unavailable("no server of the cluster is reachable: " + first_error);
  }
  nlohmann::json out = {{"servers", servers.size()},
                        {"reachable", reachable},
                        {"total", std::move(total)},
                        {"per_server", std::move(per)}};
  // Servers' texts (an error's reason, a path) need not be UTF-8.
  return out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

Result<std::string> ClusterAdmin::Stats() {
  if (!router_->cluster()) {
    std::string body;
    RDKV_RETURN_IF_ERROR(caller_->Call(links_->seed(), Plain(kv::Op::kStats), nullptr, &body));
    return body;
  }
  return AggregateStats(Servers(true));
}

Result<std::string> ClusterAdmin::Snapshot(std::string_view name) {
  std::vector<Link*> targets;
  std::shared_ptr<const cluster::ClusterMap> map = router_->map();
  if (map == nullptr) {
    targets.push_back(&links_->seed());
  } else {
    for (const cluster::ServerEntry& e : map->servers) {
      targets.push_back(links_->LinkFor(e.id, e.address));
    }
  }
  kv::Request req = Plain(kv::Op::kSnapshot);
  req.key = name;  // the snapshot's name travels in the key field
  std::string out;
  Status first;
  for (Link* link : targets) {
    const std::string address = link->address.ToString();
    std::string path;
    Status s = caller_->Call(*link, req, nullptr, &path);
    if (!s.ok()) {
      if (first.ok()) first = Status(s.code(), address + ": " + s.message());
      continue;
    }
    out += address + " " + path + "\n";
  }
  if (!first.ok()) return first;
  return out;
}

std::vector<ServerInfo> ClusterAdmin::Servers(bool with_stats) {
  std::vector<ServerInfo> out;
  std::shared_ptr<const cluster::ClusterMap> map = router_->map();
  std::vector<std::pair<Link*, std::vector<uint32_t>>> targets;
  if (map == nullptr) {
    targets.push_back({&links_->seed(), {0}});
  } else {
    for (const cluster::ServerEntry& e : map->servers) {
      targets.push_back({links_->LinkFor(e.id, e.address), map->ShardsOf(e.id)});
    }
  }
  uint64_t newest = 0;
  Link* newest_link = nullptr;
  for (auto& [link, shards] : targets) {
    ServerInfo info;
    info.id = link->id;
    info.address = link->address.ToString();
    info.shards = shards;
    if (map != nullptr) {
      for (uint32_t s = 0; s < map->shards; ++s) {
        if (map->IsBackup(s, link->id)) info.backup_shards.push_back(s);
        if (map->IsJoining(s, link->id)) info.joining_shards.push_back(s);
      }
    }
    std::string body;
    uint64_t epoch = 0;
    Status s = caller_->Call(*link, Plain(kv::Op::kClusterMap), &epoch, &body);
    if (s.ok() && with_stats) {
      s = caller_->Call(*link, Plain(kv::Op::kStats), nullptr, &info.stats);
    }
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
    Status r = router_->Refresh(newest_link);
    if (!r.ok()) LOG(WARNING) << "rdkv client: refreshing the cluster map: " << r.ToString();
  }
  return out;
}

Result<MoveReport> ClusterAdmin::MoveShards(std::span<const uint32_t> shards, uint32_t to_server,
                                            const MoveProgressFn& progress) {
  std::shared_ptr<const cluster::ClusterMap> map = router_->cluster() ? router_->map() : nullptr;
  if (map == nullptr) {
    return Status::NotSupported("the seed " + links_->seed().address.ToString() +
                                " is a standalone server: there is no cluster map to change");
  }
  LinkChannel channel(options_, links_, caller_);
  // A replicated cluster moves shards as replica changes: they keep serving throughout.
  bool replicated = map->MaxReplicas() > 1;
  Result<MoveReport> report = replicated
                                  ? RunReplicaMove(channel, *map, shards, to_server, progress)
                                  : RunShardMove(channel, *map, shards, to_server, progress);
  // Route by the newest map from now on (also after a failure: some servers may have it).
  Status refreshed = router_->Refresh(nullptr);
  if (!refreshed.ok()) {
    LOG(WARNING) << "rdkv client: refreshing the cluster map after a move: "
                 << refreshed.ToString();
  }
  return report;
}

Result<ReplicaReport> ClusterAdmin::AddReplicas(std::span<const ReplicaAddition> additions,
                                                const MoveProgressFn& progress) {
  return ChangeReplicaSets(
      [&](AdminChannel& channel, const cluster::ClusterMap& map) -> Result<ReplicaReport> {
        return RunAddReplicas(channel, map, additions, progress);
      });
}

Result<ReplicaReport> ClusterAdmin::ChangeReplicaSets(
    const std::function<Result<ReplicaReport>(AdminChannel&, const cluster::ClusterMap&)>& run) {
  std::shared_ptr<const cluster::ClusterMap> map = router_->cluster() ? router_->map() : nullptr;
  if (map == nullptr) {
    return Status::NotSupported("the seed " + links_->seed().address.ToString() +
                                " is a standalone server: it has no replicas");
  }
  LinkChannel channel(options_, links_, caller_);
  Result<ReplicaReport> report = run(channel, *map);
  Status refreshed = router_->Refresh(nullptr);
  if (!refreshed.ok()) {
    LOG(WARNING) << "rdkv client: refreshing the cluster map after a replica change: "
                 << refreshed.ToString();
  }
  return report;
}

Result<ReplicaReport> ClusterAdmin::ChangeReplicas(ReplicaChange change, uint32_t shard,
                                                   uint32_t server,
                                                   const MoveProgressFn& progress) {
  return ChangeReplicaSets(
      [&](AdminChannel& channel, const cluster::ClusterMap& map) -> Result<ReplicaReport> {
        switch (change) {
          case ReplicaChange::kPromote:
            return RunPromote(channel, map, shard, server, progress);
          case ReplicaChange::kAdd:
            return RunAddReplica(channel, map, shard, server, progress);
          case ReplicaChange::kRemove:
            return RunRemoveReplica(channel, map, shard, server, progress);
        }
        return Status::Internal("unknown replica change");
      });
}

}  // namespace rdkv::client

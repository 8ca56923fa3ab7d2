// The client's operator calls: Snapshot on every server, the survey of the servers (Servers),
// the statistics of a whole cluster summed (Stats), and MoveShards run over the client's own
// links (an AdminChannel for client/shard_move.h). rdkv/admin.h is their public face.
//
// Ownership: borrows the options, links, router and caller (they outlive it).
// Thread-safety: every method is safe from any thread (MoveShards: one move at a time across
// all clients, see rdkv/admin.h).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "client/call.h"
#include "client/links.h"
#include "client/router.h"
#include "client/shard_move.h"
#include "rdkv/admin.h"
#include "rdkv/client.h"

namespace rdkv::client {

class ClusterAdmin {
 public:
  ClusterAdmin(const ClientOptions& options, Links* links, Router* router, Caller* caller)
      : options_(options), links_(links), router_(router), caller_(caller) {}

  // The contracts are rdkv::Admin's and Client::Stats's.
  Result<std::string> Snapshot(std::string_view name);
  std::vector<ServerInfo> Servers(bool with_stats);
  Result<std::string> Stats();
  Result<MoveReport> MoveShards(std::span<const uint32_t> shards, uint32_t to_server,
                                const MoveProgressFn& progress);
  enum class ReplicaChange { kPromote, kAdd, kRemove };
  // Admin::AddReplicas.
  Result<ReplicaReport> AddReplicas(std::span<const ReplicaAddition> additions,
                                    const MoveProgressFn& progress);
  Result<ReplicaReport> ChangeReplicas(ReplicaChange change, uint32_t shard, uint32_t server,
                                       const MoveProgressFn& progress);

 private:
  // A replica-set change of the cluster map this client routes by: `run` with a channel to the
  // servers, then the route refreshed (also after a failure: some servers may have the new
  // map). kNotSupported for a standalone seed.
  Result<ReplicaReport> ChangeReplicaSets(
      const std::function<Result<ReplicaReport>(AdminChannel&, const cluster::ClusterMap&)>& run);

  const ClientOptions& options_;
  Links* const links_;
  Router* const router_;
  Caller* const caller_;
};

// Stats of a cluster: {"servers", "reachable", "total" (every numeric field summed over the
// reachable servers, nested objects too), "per_server"}; kUnavailable when none is reachable.
Result<std::string> AggregateStats(const std::vector<ServerInfo>& servers);

}  // namespace rdkv::client

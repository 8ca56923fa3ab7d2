// Replica-set changes of a replicated cluster as functions of an admin channel (internal;
// docs/design.md "Replication"): promote an in-sync backup, add a replica (join, catch up,
// in sync), remove a replica. rdkv::Admin::Promote / AddReplica / RemoveReplica are their
// public face; each installs the new map on the servers in the order that keeps the history
// linearizable.
#pragma once

#include <cstdint>
#include <functional>
#include <span>

#include "client/shard_move.h"
#include "common/cluster/cluster_map.h"
#include "rdkv/admin.h"
#include "rdkv/status.h"

namespace rdkv::client {

// The contracts are rdkv::Admin's.
Result<ReplicaReport> RunPromote(AdminChannel& channel, const cluster::ClusterMap& known,
                                 uint32_t shard, uint32_t server, const MoveProgressFn& progress);
Result<ReplicaReport> RunAddReplica(AdminChannel& channel, const cluster::ClusterMap& known,
                                    uint32_t shard, uint32_t server,
                                    const MoveProgressFn& progress);
Result<ReplicaReport> RunAddReplicas(AdminChannel& channel, const cluster::ClusterMap& known,
                                     std::span<const ReplicaAddition> additions,
                                     const MoveProgressFn& progress);
// MoveShards of a replicated cluster: each shard moves as replica changes, so it keeps serving
// GETs and writes throughout (only the promotion pauses writes, about one lease): `to_server`
// is added as a replica (when it is not one), promoted, and the old primary removed.
Result<MoveReport> RunReplicaMove(AdminChannel& channel, const cluster::ClusterMap& known,
                                  std::span<const uint32_t> shards, uint32_t to_server,
                                  const MoveProgressFn& progress);
Result<ReplicaReport> RunRemoveReplica(AdminChannel& channel, const cluster::ClusterMap& known,
                                       uint32_t shard, uint32_t server,
                                       const MoveProgressFn& progress);

// Attempts a replica-set change made with `attempt` at most this many times in all.
inline constexpr int kMapRaceAttempts = 5;

// Runs `attempt` (one of the changes above) and runs it again, up to kMapRaceAttempts times in
// all with a growing pause between, while it fails with kBusy: another writer (the coordinator,
// another admin command) changed the cluster map between this change's read of it and its
// commit, or a server was still busy with an earlier change. Each change starts from the
// newest map the servers report and finishes what an interrupted run began, so running it
// again is safe. Each new attempt is said on `progress`. The last attempt's result otherwise.
Result<ReplicaReport> AgainWhileTheMapMoves(const std::function<Result<ReplicaReport>()>& attempt,
                                            const MoveProgressFn& progress);

}  // namespace rdkv::client

// Replica-set changes of a replicated cluster as functions of an admin channel (internal;
// docs/design.md "Replication"): promote an in-sync backup, add a replica (join, catch up,
// in sync), remove a replica. rdkv::Admin::Promote / AddReplica / RemoveReplica are their
// public face; each installs the new map on the servers in the order that keeps the history
// linearizable.
#pragma once

#include <cstdint>
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

// A promotion whose map loses to another writer's (the old primary's commit answers kBusy:
// the coordinator or another command changed the map since it was read; nothing of that
// attempt was installed) starts again from the newest map, at most this many attempts in all.
inline constexpr int kMapRaceAttempts = 5;

}  // namespace rdkv::client

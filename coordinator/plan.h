// The failover coordinator's decision, as a pure function of the cluster map and the servers'
// registrations in etcd (docs/design.md "Failover"). No I/O: the coordinator commits what it
// returns; tests feed it maps and registrations directly.
//
// A server is *unavailable* when the map admitted it once (its entry has an incarnation) and
// either it has no registration (its etcd lease expired: it has fenced itself) or it registered
// again as another process (it restarted) without durable data. For every shard an unavailable
// server leaves the in-sync set and the joining list; when it was the primary, the first
// remaining in-sync backup becomes the primary. A server that restarted with durable data
// leaves the in-sync sets where another in-sync replica remains (what it held only in memory,
// request ids and writes published before its own sync, is gone) and keeps the rest. A shard whose
// every in-sync replica is unavailable keeps its primary (nothing else holds its acknowledged
// writes) and says so
// (`stranded`); that alone is no change: a plan applied to its own result changes nothing.
// Every registered incarnation is admitted (written into its server entry), and the map is
// marked `coordinated`.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/cluster/cluster_map.h"
#include "rdkv/admin.h"
#include "rdkv/status.h"

namespace rdkv::coordinator {

// One server's registration (/rdkv/<cluster>/servers/<id>, written by the server under its
// lease; server/control_plane.h).
struct Registration {
  uint32_t id = 0;
  std::string address;
  uint64_t incarnation = 0;  // 0: a server too old to send one
  bool durable = false;      // durability=sync: a restart keeps every acknowledged write
  uint64_t released = 0;
  uint64_t epoch = 0;
};

// Parses a registration's JSON value; kInvalidArgument naming the key when it is malformed.
Result<Registration> ParseRegistration(uint32_t id, const std::string& json);

struct FailoverPlan {
  cluster::ClusterMap next;          // epoch + 1 when changed
  bool changed = false;              // anything to commit
  std::vector<uint32_t> failed;      // servers found unavailable (ascending)
  std::vector<uint32_t> admitted;    // incarnations newly admitted (server ids)
  std::vector<uint32_t> promoted;    // shards with a new primary
  std::vector<uint32_t> stranded;    // shards left with no available in-sync replica
  std::vector<std::string> reasons;  // one line per decision, for the log and the events
};

FailoverPlan PlanFailover(const cluster::ClusterMap& map,
                          const std::map<uint32_t, Registration>& registrations);

// The next re-replication: every replica to add now, done as one Admin::AddReplicas (two map
// changes in all, the copies side by side). Interrupted copies: every joining replica nobody
// copies to any more (the coordinator runs one task at a time), whose server and primary are
// available. Then the shards below the map's replication_factor, each given the available,
// admitted server holding the fewest replicas (counting the ones given so far, so that
// several servers share the work), not already a replica of the shard. nullopt when every
// shard has its replicas or none can be added. Joining replicas count as replicas; a shard
// without an available primary waits.
struct ReplicaTask {
  std::vector<ReplicaAddition> additions;  // the resumed ones first, then by shard
  size_t resumed = 0;                      // how many of `additions` start an interrupted copy over
};
std::optional<ReplicaTask> NextReplicaTask(const cluster::ClusterMap& map,
                                           const std::map<uint32_t, Registration>& registrations);

}  // namespace rdkv::coordinator

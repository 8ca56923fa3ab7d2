// Client::MoveShards as a function of an admin channel (internal; docs/design.md "Moving a
// shard"). Kept apart from ClientImpl so the plan (survey, resume, the four steps) reads in
// one place.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "common/cluster/cluster_map.h"
#include "common/kv/admin_wire.h"
#include "common/kv/wire.h"
#include "rdkv/admin.h"
#include "rdkv/status.h"

namespace rdkv::client {

// Sends one request to one server of the map and waits for the answer.
// Thread-safety: Call must be safe from several threads at once (imports run in parallel).
class AdminChannel {
 public:
  virtual ~AdminChannel() = default;
  // The server's status; on OK *version and *body (either may be null) hold the answer's.
  virtual Status Call(const cluster::ServerEntry& server, const kv::Request& request,
                      uint64_t* version, std::string* body) = 0;
};

// Imports in flight at once into the new owner during a copy.
inline constexpr size_t kImportsInFlight = 8;

// Runs job(first), ..., job(count - 1) on up to kImportsInFlight threads, lane k taking jobs
// first + k, first + k + lanes, ...; a lane stops at its first failure. Returns OK, or the
// failure of the lowest-numbered lane that failed. `job` must be safe from several threads.
Status RunInLanes(size_t first, size_t count, const std::function<Status(size_t)>& job);

// The request ids `from` keeps for `shard`, recorded into `to` (docs/design.md "Ids travel with
// copies"): each SHARD_IDS page of `from` goes to `to` as one RECORD_IDS. A copy (a catch-up
// copy's, a shard move's) calls it after its last page of items and before the target takes
// its new role. Adds the ids recorded to *ids. Errors name the step and the server.
// A server from before these ops answers "unknown operation": then nothing is copied, the
// copy goes on without ids (their retries may apply again, as before) and *warning says so.
Status CopyRetryIds(AdminChannel& channel, const cluster::ServerEntry& from,
                    const cluster::ServerEntry& to, uint32_t shard, uint64_t* ids,
                    std::string* warning);

// The whole move (see Admin::MoveShards for the contract). `known` is the caller's map: the
// servers to ask first (every server any answer names is asked too).
Result<MoveReport> RunShardMove(AdminChannel& channel, const cluster::ClusterMap& known,
                                std::span<const uint32_t> shards, uint32_t to_server,
                                const MoveProgressFn& progress);

}  // namespace rdkv::client

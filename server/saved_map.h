// The cluster map a server was last sent, kept in its data directory so a restart does not
// fall back to the (older) --cluster_map file (docs/design.md "Moving a shard").
//
// <data_dir>/cluster_map.json is written atomically (a temporary file, fsync, rename, fsync of
// the directory) before a map install is acknowledged. At start the saved map wins over the
// --cluster_map file when its epoch is higher.
//
// Thread-safety: free functions without shared state; callers serialize writes to one path.
#pragma once

#include <string>

#include "common/cluster/cluster_map.h"
#include "rdkv/status.h"

namespace rdkv::server {

// "<data_dir>/cluster_map.json".
std::string SavedMapPath(const std::string& data_dir);

// Writes `map` to `path` atomically and durably (creating its directory if needed): after OK
// the file holds `map` even across a crash; on error it holds the previous map or nothing.
// kIoError naming the step that failed.
Status SaveClusterMap(const cluster::ClusterMap& map, const std::string& path);

// The map a server starts with: `from_flag` (its --cluster_map file, named `flag_path` in
// messages), or the map saved in `data_dir` when that one's epoch is higher. `data_dir` may be
// empty (nothing saved). `*why` says which map was chosen and why, for the log.
// kInvalidArgument when the saved file exists but cannot be read or parsed, or does not fit
// (another shard count): the server must not start on a guess.
Result<cluster::ClusterMap> ChooseStartupMap(cluster::ClusterMap from_flag,
                                             const std::string& flag_path,
                                             const std::string& data_dir, std::string* why);

}  // namespace rdkv::server

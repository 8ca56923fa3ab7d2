// The cluster map: which server owns which shard, under which epoch.
//
// File format (JSON, documented in docs/design.md "Cluster"):
//   {
//     "epoch": 7,                      // > 0; every change of the map increments it
//     "shards": 64,                    // fixed for the cluster's life; 1..4096
//     "servers": [ {"id": 0, "address": "10.0.0.1:7400"}, ... ],   // ids unique, 0..255;
//                                      // address: host:port, printable ASCII without '"' and
//                                      // '\\', at most kMaxAddressBytes
//     "owners": [0, 1, 2, 0, ...]      // optional: owner id per shard (length == shards);
//   }                                  // absent: shard s belongs to servers[s % n]
//
// A key's shard is ShardOf(KeyHash(key), shards): bits 0..19 of the hash, which the index
// does not use (it uses bits 20 and up), modulo the shard count.
//
// Thread-safety: a ClusterMap is an immutable value once parsed; share it as
// std::shared_ptr<const ClusterMap>.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/kv/limits.h"
#include "rdkv/status.h"

namespace rdkv::cluster {

using kv::kMaxShards;
inline constexpr uint32_t kMaxServers = 256;
// "host:port" with a 253-byte DNS name and a 5-digit port, with room to spare.
inline constexpr size_t kMaxAddressBytes = 261;
// An upper bound on ToJson().size() of every map ParseClusterMap accepts: a 20-digit epoch,
// kMaxShards owners of 3 digits and a comma, kMaxServers entries
// {"address":"<kMaxAddressBytes>","id":255}, and the field names (about 90 KiB). Servers size
// their message limit with it: the map travels in one message (CLUSTER_MAP).
inline constexpr size_t kMaxMapJsonBytes =
    128 + size_t{kMaxShards} * 4 + size_t{kMaxServers} * (32 + kMaxAddressBytes);

struct ServerEntry {
  uint32_t id = 0;
  std::string address;  // host:port
};

struct ClusterMap {
  uint64_t epoch = 0;
  uint32_t shards = 0;
  std::vector<ServerEntry> servers;
  std::vector<uint32_t> owners;  // owner server id per shard

  // nullptr when the id is not in the map.
  const ServerEntry* FindServer(uint32_t id) const;
  uint32_t OwnerOf(uint32_t shard) const { return owners[shard]; }
  // Shards owned by `id`, ascending.
  std::vector<uint32_t> ShardsOf(uint32_t id) const;

  // Compact JSON (one line, no spaces): what travels in messages. ToPrettyJson: indented, for
  // files people read (the saved map). Both parse back with ParseClusterMap.
  std::string ToJson() const;
  std::string ToPrettyJson() const;
};

using kv::ShardOf;

// Parses and validates a map. Every problem is kInvalidArgument naming the field.
Result<ClusterMap> ParseClusterMap(std::string_view json);
Result<ClusterMap> LoadClusterMap(const std::string& path);

// A map for n servers at the given addresses, shards round-robin, epoch 1.
ClusterMap MakeUniformMap(const std::vector<std::string>& addresses, uint32_t shards);

}  // namespace rdkv::cluster

// The cluster map: which server owns which shard, under which epoch.
//
// File format (JSON, documented in docs/design.md "Cluster"):
//   {
//     "epoch": 7,                      // > 0; every change of the map increments it
//     "shards": 64,                    // fixed for the cluster's life; 1..4096
//     "servers": [ {"id": 0, "address": "10.0.0.1:7400"}, ... ],   // ids unique, 0..255;
//                                      // address: host:port, printable ASCII without '"' and
//                                      // '\\', at most kMaxAddressBytes
//     "owners": [0, 1, 2, 0, ...],     // optional: owner id per shard (length == shards);
//                                      // absent: shard s belongs to servers[s % n]
//     "replicas": [[0, 1], [1, 2], ...], // optional: per shard the primary (== owners[s])
//                                      // then its in-sync backups; absent: the owner alone
//     "joining": {"3": [2]},           // optional: backups still catching up, per shard
//     "joined_at": {"3": {"2": 6}}     // optional: per joining pair, the epoch of the map in
//                                      // which it started joining (1..epoch)
//   }
// A server is at most once in a shard's replicas and joining together, and a shard has at
// most kMaxReplicas of them (docs/design.md "Replication").
//
// A key's shard is ShardOf(KeyHash(key), shards): bits 0..19 of the hash, which the index
// does not use (it uses bits 20 and up), modulo the shard count.
//
// Thread-safety: a ClusterMap is an immutable value once parsed; share it as
// std::shared_ptr<const ClusterMap>.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
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
// Replicas of one shard (primary, in-sync backups and joining backups together).
inline constexpr size_t kMaxReplicas = 5;
// An upper bound on ToJson().size() of every map ParseClusterMap accepts: a 20-digit epoch,
// kMaxShards owners of 3 digits and a comma, kMaxServers entries
// {"address":"<kMaxAddressBytes>","id":255}, and the field names (about 90 KiB). Servers size
// their message limit with it: the map travels in one message (CLUSTER_MAP).
// The replica lists add, per shard, "[a,b,c,d,e]," (4 bytes an id) and the joining entries
// "\"4095\":[a,...]," once more. A server entry's ,"incarnation":<20 digits> adds 36. The
// join epochs add, per shard, "\"4095\":{}," and per joining pair "\"255\":<20 digits>,".
inline constexpr size_t kMaxMapJsonBytes = 128 + size_t{kMaxShards} * 4 +
                                           size_t{kMaxServers} * (32 + 36 + kMaxAddressBytes) +
                                           size_t{kMaxShards} * (8 + 4 * kMaxReplicas) * 2 + 16 +
                                           size_t{kMaxShards} * (10 + 27 * kMaxReplicas);

struct ServerEntry {
  uint32_t id = 0;
  std::string address;  // host:port
  // The server process the failover coordinator last admitted under this id (its registration's
  // incarnation, docs/design.md "Failover"); 0: none yet. A server of a coordinated map that
  // starts with another incarnation serves nothing until a map admits it.
  uint64_t incarnation = 0;
};

struct ClusterMap {
  uint64_t epoch = 0;
  uint32_t shards = 0;
  std::vector<ServerEntry> servers;
  std::vector<uint32_t> owners;  // owner (primary) server id per shard
  // Per shard: the in-sync backups (not the owner), in order; empty vectors when unreplicated.
  std::vector<std::vector<uint32_t>> backups;
  // Per shard: backups that are catching up (receive forwards, not yet counted in sync).
  std::vector<std::vector<uint32_t>> joining;
  // (shard, server id) -> the epoch of the map in which that pair started joining: what tells
  // one catch-up copy from the next (a pair removed and added again joins at a later epoch).
  // Entries of pairs that are not joining mean nothing (JoinedAt ignores them, ToJson drops
  // them); SetJoining keeps the two together.
  std::map<std::pair<uint32_t, uint32_t>, uint64_t> joined_at;
  // The replica count the cluster is meant to have (0: not said). The failover coordinator adds
  // replicas to shards below it.
  uint32_t replication_factor = 0;
  // Set by the failover coordinator's first map change: servers then wait to be admitted
  // (ServerEntry::incarnation) before they serve after a start.
  bool coordinated = false;

  // nullptr when the id is not in the map.
  const ServerEntry* FindServer(uint32_t id) const;
  uint32_t OwnerOf(uint32_t shard) const { return owners[shard]; }
  // Shards owned by `id`, ascending.
  std::vector<uint32_t> ShardsOf(uint32_t id) const;
  // The primary, then the in-sync backups.
  std::vector<uint32_t> ReplicasOf(uint32_t shard) const;
  bool IsBackup(uint32_t shard, uint32_t id) const;   // in sync
  bool IsJoining(uint32_t shard, uint32_t id) const;  // catching up
  // The epoch at which joining pair (shard, id) started joining; 0 when it is not joining or
  // its map did not say (a map written before join epochs existed).
  uint64_t JoinedAt(uint32_t shard, uint32_t id) const;
  // Adds `id` to shard's joining backups, starting to join at `epoch` (the epoch of the map
  // being built, which the caller sets). A pair already joining keeps its join epoch: a new
  // join (an emptied replica, a new copy) takes it out of joining in one map first.
  void SetJoining(uint32_t shard, uint32_t id, uint64_t epoch);
  // The largest replica count (primary and in-sync backups) of any shard; 1 unreplicated.
  size_t MaxReplicas() const;
  // Makes backups/joining one (empty) vector per shard when they are shorter (maps built in
  // code with only owners).
  void NormalizeReplicas();
  // Gives every shard the next r-1 servers after its owner (in `servers` order, wrapping) as
  // its in-sync backups, replacing any; r is clamped to 1..min(servers, kMaxReplicas). Sets
  // replication_factor to that r.
  void AssignBackups(uint32_t r);

  // Compact JSON (one line, no spaces): what travels in messages. ToPrettyJson: indented, for
  // files people read (the saved map). Both parse back with ParseClusterMap.
  std::string ToJson() const;
  std::string ToPrettyJson() const;
};

using kv::ShardOf;

// The lowest version a primary of a replicated map at `epoch` hands out: versions carry the
// epoch in their top bits, so a promoted backup never repeats a version an old primary gave
// (docs/design.md "Replication", versions carry the epoch). One epoch has 2^40 versions.
inline constexpr int kEpochVersionShift = 40;
inline constexpr uint64_t EpochVersionFloor(uint64_t epoch) { return epoch << kEpochVersionShift; }

// The largest epoch a map may have: the next map's epoch (+1) and a join stamp never overflow.
inline constexpr uint64_t kMaxMapEpoch = uint64_t{1} << 62;

// Parses and validates a map. Every problem is kInvalidArgument naming the field.
Result<ClusterMap> ParseClusterMap(std::string_view json);
Result<ClusterMap> LoadClusterMap(const std::string& path);

// A map for n servers at the given addresses, shards round-robin, epoch 1; with
// `replication_factor` R > 1 shard s's backups are the next R-1 servers after its owner
// (kInvalidArgument-free: R is clamped to 1..min(n, kMaxReplicas)).
ClusterMap MakeUniformMap(const std::vector<std::string>& addresses, uint32_t shards,
                          uint32_t replication_factor = 1);
// Checks the replica fields against the rest of the map (kInvalidArgument naming the shard).
Status ValidateReplicas(const ClusterMap& m);

}  // namespace rdkv::cluster

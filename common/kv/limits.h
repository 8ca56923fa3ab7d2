// The protocol's limits and the shard function: the one definition of each, used by the
// server, the client, the tools and the decoders. docs/design.md ("Wire protocol", "Cluster")
// states the same rules in prose.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "rdkv/status.h"

namespace rdkv::kv {

// Keys are 1..kMaxKeyBytes bytes.
inline constexpr size_t kMaxKeyBytes = 1024;
// The largest --max_value_size a server accepts, and its default.
inline constexpr uint64_t kMaxValueBytes = uint64_t{1} << 20;
inline constexpr uint64_t kDefaultMaxValueBytes = kMaxValueBytes;
// The smallest --max_value_size: a replication answers message (admin_wire.h) must fit.
inline constexpr uint64_t kMinMaxValueBytes = 64;
// Shards a cluster may have (the region header has one ownership bit per shard).
inline constexpr uint32_t kMaxShards = 4096;
// The largest version an item may have: 2^63 - 1. Versions are handed out by one counter per
// server and never wrap: a store whose counter reaches it refuses writes (kOutOfSpace), and the
// decoders refuse IMPORT versions and DROP_SHARD version floors above it (a peer could otherwise
// push the counter to 2^64 - 1 so that the next write wraps to 0 and versions repeat, which
// makes a stale CAS succeed). Half the 64-bit space stays unused as a margin: a counter at the
// maximum cannot wrap even when raised by the recovery gap (server/persistence/format.h).
inline constexpr uint64_t kMaxItemVersion = (uint64_t{1} << 63) - 1;
// Room in a message for its header and framing beyond key and value.
inline constexpr size_t kMessageSlack = 4096;

// A key's shard among `shards`: bits 0..19 of its KeyHash (the index uses bits 20 and up),
// modulo the shard count. `shards` is 1..kMaxShards.
inline uint32_t ShardOf(uint64_t key_hash, uint32_t shards) {
  return static_cast<uint32_t>((key_hash & 0xfffff) % shards);
}

// The largest request or response of a peer whose values are at most `max_value_bytes`: a
// header, the largest key, the largest value and kMessageSlack. Both sides size their
// transport's message limit with it (a server raises it for the cluster map).
inline constexpr size_t MaxMessageBytes(uint64_t max_value_bytes) {
  return kMessageSlack + kMaxKeyBytes + static_cast<size_t>(max_value_bytes);
}

// OK for a key of 1..kMaxKeyBytes bytes; else kInvalidArgument saying which limit it breaks.
Status CheckKey(std::string_view key);
// OK when `value_bytes` is at most `max_value_bytes` (the server's limit); else
// kInvalidArgument with both sizes.
Status CheckValueSize(size_t value_bytes, uint64_t max_value_bytes);
// OK when `version` is 1..kMaxItemVersion; else kInvalidArgument naming `what` (e.g. "IMPORT
// version") and the bound.
Status CheckItemVersion(uint64_t version, std::string_view what);

}  // namespace rdkv::kv

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
// Shards a cluster may have (the region header has one ownership bit per shard).
inline constexpr uint32_t kMaxShards = 4096;
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

}  // namespace rdkv::kv

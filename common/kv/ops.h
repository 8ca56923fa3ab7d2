// The operations of the wire protocol and the one table that says what each one is. Every
// place that asks "is this a keyed write?", "does it carry a key?" or "is it an admin
// request?" asks this table, never its own list of ops.
#pragma once

#include <cstdint>
#include <string_view>

namespace rdkv::kv {

enum class Op : uint8_t {
  kPut = 1,     // upsert
  kInsert = 2,  // only if absent (kAlreadyExists otherwise)
  kDelete = 3,  // kNotFound if absent
  kCas = 4,     // replace only if current version == expected_version (kVersionMismatch)
  kStats = 5,   // body: JSON object
  kPing = 6,
  kSnapshot = 7,     // a RocksDB checkpoint (admin)
  kClusterMap = 8,   // fetch the server's cluster map
  kShardScan = 9,    // admin: one batch of a shard's items
  kImport = 10,      // admin: store one item with exactly its version (a shard copy)
  kDropShard = 11,   // admin: delete a shard this server does not own
  kInstallMap = 12,  // admin: install a cluster map with a higher epoch (wire version 2)
  kReplicate = 13,   // admin: a primary's write forwarded to a backup (wire version 3)
  kShardIds = 14,    // admin: one page of the request ids a server keeps for a shard
  kRecordIds = 15,   // admin: record a page of request ids copied from another server
};

enum class OpClass : uint8_t {
  kWrite,  // a keyed write of an application: routed to the key's owner, counted as a write;
           // the writer's cached location of the key goes stale
  kQuery,  // reads server state, changes nothing (STATS, PING, CLUSTER_MAP)
  kAdmin,  // operators, the shard mover and primaries (SNAPSHOT, INSTALL_MAP, SHARD_SCAN,
           // IMPORT, DROP_SHARD, REPLICATE, SHARD_IDS, RECORD_IDS)
};

struct OpInfo {
  Op op;
  std::string_view name;  // lower case, as logs and errors print it
  OpClass op_class;
  bool keyed;      // carries a key the decoder checks against the key limits
  bool has_value;  // carries a value the decoder checks against the value limit
};

// Indexed by the op's wire number; entry 0 is no op.
inline constexpr OpInfo kOpTable[] = {
    {Op{0}, "none", OpClass::kQuery, false, false},
    {Op::kPut, "put", OpClass::kWrite, true, true},
    {Op::kInsert, "insert", OpClass::kWrite, true, true},
    {Op::kDelete, "delete", OpClass::kWrite, true, false},
    {Op::kCas, "cas", OpClass::kWrite, true, true},
    {Op::kStats, "stats", OpClass::kQuery, false, false},
    {Op::kPing, "ping", OpClass::kQuery, false, false},
    {Op::kSnapshot, "snapshot", OpClass::kAdmin, false, false},
    {Op::kClusterMap, "cluster_map", OpClass::kQuery, false, false},
    {Op::kShardScan, "shard_scan", OpClass::kAdmin, false, false},
    {Op::kImport, "import", OpClass::kAdmin, true, true},
    {Op::kDropShard, "drop_shard", OpClass::kAdmin, false, false},
    {Op::kInstallMap, "install_map", OpClass::kAdmin, false, false},
    {Op::kReplicate, "replicate", OpClass::kAdmin, true, true},
    {Op::kShardIds, "shard_ids", OpClass::kAdmin, false, false},
    {Op::kRecordIds, "record_ids", OpClass::kAdmin, false, false},
};
inline constexpr uint8_t kMaxOp = sizeof(kOpTable) / sizeof(kOpTable[0]) - 1;

constexpr bool TableInOpOrder() {
  for (uint8_t i = 0; i <= kMaxOp; ++i) {
    if (static_cast<uint8_t>(kOpTable[i].op) != i) return false;
  }
  return true;
}
static_assert(TableInOpOrder(), "kOpTable must list the ops in wire-number order");

// nullptr for a number that is no op (0 or above kMaxOp).
constexpr const OpInfo* FindOp(uint8_t wire_op) {
  return wire_op >= 1 && wire_op <= kMaxOp ? &kOpTable[wire_op] : nullptr;
}
// The entry of a known op.
constexpr const OpInfo& InfoOf(Op op) { return kOpTable[static_cast<uint8_t>(op)]; }
constexpr std::string_view OpName(Op op) {
  const OpInfo* info = FindOp(static_cast<uint8_t>(op));
  return info != nullptr ? info->name : std::string_view("unknown");
}
constexpr bool IsWrite(Op op) { return InfoOf(op).op_class == OpClass::kWrite; }
constexpr bool IsAdmin(Op op) { return InfoOf(op).op_class == OpClass::kAdmin; }

}  // namespace rdkv::kv

#include "common/kv/admin_wire.h"

#include <charconv>

namespace rdkv::kv {

namespace {

Status WrongOp(const Request& r, Op want) {
  return Status::Internal("decoder for " + std::string(OpName(want)) + " given a " +
                          std::string(OpName(r.op)) + " request");
}

// Which frame fields a message uses; every other one must be empty (zero).
struct Fields {
  bool key = false;
  bool value = false;
  bool expected_version = false;
};

Status CheckFields(const Request& r, Op want, Fields used) {
  if (r.op != want) return WrongOp(r, want);
  const std::string name(OpName(want));
  if (!used.key && !r.key.empty()) return Status::ProtocolError(name + " carries no key");
  if (!used.value && !r.value.empty()) return Status::ProtocolError(name + " carries no value");
  if (!used.expected_version && r.expected_version != 0) {
    return Status::ProtocolError(name + " carries no version");
  }
  return Status::Ok();
}

// A shard number in canonical decimal: digits only, no leading zero, below kMaxShards.
Result<uint32_t> ParseShard(std::string_view text, Op op) {
  uint32_t shard = 0;
  const char* end = text.data() + text.size();
  bool canonical =
      !text.empty() && text.size() <= kMaxShardDigits && (text.size() == 1 || text[0] != '0');
  if (canonical) {
    auto [p, ec] = std::from_chars(text.data(), end, shard);
    canonical = ec == std::errc() && p == end && shard < kMaxShards;
  }
  if (!canonical) {
    // The key field may hold anything: show at most a few bytes of it.
    std::string shown(text.substr(0, 16));
    return Status::InvalidArgument(std::string(OpName(op)) + ": '" + shown +
                                   "' is not a shard number (0.." + std::to_string(kMaxShards - 1) +
                                   ", in decimal)");
  }
  return shard;
}

}  // namespace

Request EncodeSnapshot(const SnapshotRequest& m) { return Request{Op::kSnapshot, m.name, {}, 0}; }

Request EncodeMapFetch(const MapFetchRequest&) { return Request{Op::kClusterMap, {}, {}, 0}; }

Request EncodeMapInstall(const MapInstallRequest& m) {
  return Request{Op::kInstallMap, {}, m.map_json, 0};
}

Request EncodeShardScan(const ShardScanRequest& m, std::string* scratch) {
  *scratch = std::to_string(m.shard);
  return Request{Op::kShardScan, *scratch, {}, m.cursor};
}

Request EncodeImport(const ImportRequest& m) {
  return Request{Op::kImport, m.key, m.value, m.version};
}

Request EncodeDropShard(const DropShardRequest& m, std::string* scratch) {
  *scratch = std::to_string(m.shard);
  return Request{Op::kDropShard, *scratch, {}, m.version_floor};
}

Result<SnapshotRequest> DecodeSnapshot(const Request& r) {
  RDKV_RETURN_IF_ERROR(CheckFields(r, Op::kSnapshot, {.key = true}));
  if (r.key.size() > kMaxSnapshotNameBytes) {
    return Status::InvalidArgument("snapshot name of " + std::to_string(r.key.size()) +
                                   " bytes is longer than the limit of " +
                                   std::to_string(kMaxSnapshotNameBytes) + " bytes");
  }
  return SnapshotRequest{r.key};
}

Result<MapFetchRequest> DecodeMapFetch(const Request& r) {
  if (r.op == Op::kClusterMap && !r.value.empty()) {
    // The install of wire version 1; a peer that still sends it gets told what replaced it.
    return Status::ProtocolError(
        "cluster_map carries no map: it only fetches one (since wire version 2 a map is "
        "installed with install_map)");
  }
  RDKV_RETURN_IF_ERROR(CheckFields(r, Op::kClusterMap, {}));
  return MapFetchRequest{};
}

Result<MapInstallRequest> DecodeMapInstall(const Request& r) {
  RDKV_RETURN_IF_ERROR(CheckFields(r, Op::kInstallMap, {.value = true}));
  if (r.value.empty()) return Status::ProtocolError("install_map carries no map");
  return MapInstallRequest{r.value};
}

Result<ShardScanRequest> DecodeShardScan(const Request& r) {
  RDKV_RETURN_IF_ERROR(CheckFields(r, Op::kShardScan, {.key = true, .expected_version = true}));
  RDKV_ASSIGN_OR_RETURN(uint32_t shard, ParseShard(r.key, r.op));
  if (r.expected_version == kScanDone) {
    return Status::InvalidArgument("shard_scan: the cursor is the end of the scan");
  }
  return ShardScanRequest{shard, r.expected_version};
}

Result<ImportRequest> DecodeImport(const Request& r) {
  RDKV_RETURN_IF_ERROR(
      CheckFields(r, Op::kImport, {.key = true, .value = true, .expected_version = true}));
  RDKV_RETURN_IF_ERROR(CheckKey(r.key));
  if (r.expected_version == 0) {
    return Status::InvalidArgument("IMPORT needs the item's version (> 0)");
  }
  return ImportRequest{r.key, r.value, r.expected_version};
}

Result<DropShardRequest> DecodeDropShard(const Request& r) {
  RDKV_RETURN_IF_ERROR(CheckFields(r, Op::kDropShard, {.key = true, .expected_version = true}));
  RDKV_ASSIGN_OR_RETURN(uint32_t shard, ParseShard(r.key, r.op));
  return DropShardRequest{shard, r.expected_version};
}

bool ScanAnswerBuilder::Add(const ScanEntry& e) {
  const size_t entry = kScanEntryHeaderBytes + e.key.size() + e.value.size();
  if (!body_.empty() && body_.size() + entry > max_body_bytes_) return false;
  AppendScanEntry(e, &body_);
  return true;
}

Result<SnapshotAnswer> DecodeSnapshotAnswer(uint64_t version, std::string_view body) {
  if (version != 0) return Status::ProtocolError("snapshot answer carries a version");
  return SnapshotAnswer{body};
}

Result<MapAnswer> DecodeMapAnswer(uint64_t version, std::string_view body) {
  if (version != 0 && body.empty()) {
    return Status::ProtocolError("cluster map answer has epoch " + std::to_string(version) +
                                 " but no map");
  }
  return MapAnswer{version, body};
}

Result<ShardScanAnswer> DecodeShardScanAnswer(uint64_t request_cursor, uint64_t version,
                                              std::string_view body, const WireLimits& limits) {
  if (version != kScanDone && version <= request_cursor) {
    return Status::ProtocolError("shard_scan answer at cursor " + std::to_string(request_cursor) +
                                 " makes no progress (next cursor " + std::to_string(version) +
                                 ")");
  }
  ShardScanAnswer a;
  a.next_cursor = version;
  RDKV_ASSIGN_OR_RETURN(a.entries, DecodeScanEntries(body, limits));
  return a;
}

Result<DropShardAnswer> DecodeDropShardAnswer(uint64_t version, std::string_view body) {
  if (!body.empty()) return Status::ProtocolError("drop_shard answer carries a body");
  return DropShardAnswer{version};
}

}  // namespace rdkv::kv

#include "common/kv/admin_wire.h"

#include <charconv>
#include <cstring>

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
  bool map_epoch = false;
  bool request_id = false;
};

Status CheckFields(const Request& r, Op want, Fields used) {
  if (r.op != want) return WrongOp(r, want);
  const std::string name(OpName(want));
  if (!used.key && !r.key.empty()) return Status::ProtocolError(name + " carries no key");
  if (!used.value && !r.value.empty()) return Status::ProtocolError(name + " carries no value");
  if (!used.expected_version && r.expected_version != 0) {
    return Status::ProtocolError(name + " carries no version");
  }
  if (!used.map_epoch && r.map_epoch != 0) return Status::ProtocolError(name + " carries no epoch");
  if (!used.request_id && r.client_id != 0) {
    return Status::ProtocolError(name + " carries no request id");
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
  return Request{Op::kInstallMap, {}, m.map_json, m.check_only ? kMapInstallCheckOnly : 0};
}

Request EncodeShardScan(const ShardScanRequest& m, std::string* scratch) {
  // The key and the value view one scratch string: the shard's digits, then the server's.
  *scratch = std::to_string(m.shard);
  const size_t shard_digits = scratch->size();
  if (m.copy_for != kScanForNoReplica) *scratch += std::to_string(m.copy_for);
  const std::string_view all = *scratch;
  return Request{Op::kShardScan, all.substr(0, shard_digits), all.substr(shard_digits), m.cursor};
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
  RDKV_RETURN_IF_ERROR(CheckFields(r, Op::kInstallMap, {.value = true, .expected_version = true}));
  if (r.value.empty()) return Status::ProtocolError("install_map carries no map");
  if (r.expected_version != 0 && r.expected_version != kMapInstallCheckOnly) {
    return Status::ProtocolError("install_map: " + std::to_string(r.expected_version) +
                                 " is neither 0 nor check-only (" +
                                 std::to_string(kMapInstallCheckOnly) + ")");
  }
  return MapInstallRequest{r.value, r.expected_version == kMapInstallCheckOnly};
}

Result<ShardScanRequest> DecodeShardScan(const Request& r) {
  RDKV_RETURN_IF_ERROR(
      CheckFields(r, Op::kShardScan, {.key = true, .value = true, .expected_version = true}));
  RDKV_ASSIGN_OR_RETURN(uint32_t shard, ParseShard(r.key, r.op));
  if (r.expected_version == kScanDone) {
    return Status::InvalidArgument("shard_scan: the cursor is the end of the scan");
  }
  uint32_t copy_for = kScanForNoReplica;
  if (!r.value.empty()) {
    // A server id in canonical decimal, below the sentinel.
    const char* end = r.value.data() + r.value.size();
    auto [p, ec] = std::from_chars(r.value.data(), end, copy_for);
    if (ec != std::errc() || p != end || (r.value.size() > 1 && r.value[0] == '0') ||
        copy_for == kScanForNoReplica) {
      return Status::InvalidArgument("shard_scan: '" + std::string(r.value.substr(0, 16)) +
                                     "' is not a server id (in decimal)");
    }
  }
  return ShardScanRequest{shard, r.expected_version, copy_for};
}

Result<ImportRequest> DecodeImport(const Request& r) {
  RDKV_RETURN_IF_ERROR(
      CheckFields(r, Op::kImport, {.key = true, .value = true, .expected_version = true}));
  RDKV_RETURN_IF_ERROR(CheckKey(r.key));
  if (r.expected_version == 0) {
    return Status::InvalidArgument("IMPORT needs the item's version (> 0)");
  }
  RDKV_RETURN_IF_ERROR(CheckItemVersion(r.expected_version, "IMPORT version"));
  return ImportRequest{r.key, r.value, r.expected_version};
}

Result<DropShardRequest> DecodeDropShard(const Request& r) {
  RDKV_RETURN_IF_ERROR(CheckFields(r, Op::kDropShard, {.key = true, .expected_version = true}));
  RDKV_ASSIGN_OR_RETURN(uint32_t shard, ParseShard(r.key, r.op));
  // 0 means no floor; any other floor is a version and must be one a store can hand out.
  if (r.expected_version != 0) {
    RDKV_RETURN_IF_ERROR(CheckItemVersion(r.expected_version, "DROP_SHARD version floor"));
  }
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

namespace {

// Checks packed AnsweredWrite entries: `min`..`max` whole entries, each a valid version (at
// most `max_version`; 0 too where `zero_version` allows it) and an id with both halves non-zero.
Status CheckAnsweredWrites(std::string_view packed, size_t min, size_t max, uint64_t max_version,
                           bool zero_version, const std::string& name) {
  const size_t n = packed.size() / kAnsweredWriteBytes;
  if (packed.size() % kAnsweredWriteBytes != 0 || n < min || n > max) {
    return Status::ProtocolError(name + ": ids of " + std::to_string(packed.size()) +
                                 " bytes are not " + std::to_string(min) + ".." +
                                 std::to_string(max) + " entries of " +
                                 std::to_string(kAnsweredWriteBytes));
  }
  for (const AnsweredWrite& w : DecodeAnsweredWrites(packed)) {
    if (w.version != 0 || !zero_version) {
      RDKV_RETURN_IF_ERROR(CheckItemVersion(w.version, name + ": an answer's version"));
    }
    if (w.client_id == 0 || w.request_seq == 0) {
      return Status::ProtocolError(name + ": an answer's request id is zero");
    }
    if (w.version > max_version) {
      return Status::ProtocolError(name + ": an answer's version is above the message's");
    }
  }
  return Status::Ok();
}

// Checks an answers message's value and fields (either form); the rest of `m` is checked by
// its decoder.
Status CheckAnswers(const ReplicateRequest& m, std::string_view what) {
  const std::string name(what);
  if (m.is_delete) return Status::ProtocolError(name + ": answers cannot be a delete");
  if (m.client_id != 0 || m.request_seq != 0) {
    return Status::ProtocolError(name + ": answers carry no request id of their own");
  }
  return CheckAnsweredWrites(m.value, 1, kMaxAnsweredWrites, m.version, false, name);
}

}  // namespace

Request EncodeShardIds(const ShardIdsRequest& m, std::string* scratch) {
  *scratch = std::to_string(m.shard);
  return Request{Op::kShardIds, *scratch, {}, m.cursor};
}

Request EncodeRecordIds(const RecordIdsRequest& m, std::string* scratch) {
  *scratch = std::to_string(m.shard);
  return Request{Op::kRecordIds, *scratch, m.ids, 0};
}

Result<ShardIdsRequest> DecodeShardIds(const Request& r) {
  RDKV_RETURN_IF_ERROR(CheckFields(r, Op::kShardIds, {.key = true, .expected_version = true}));
  RDKV_ASSIGN_OR_RETURN(uint32_t shard, ParseShard(r.key, r.op));
  if (r.expected_version == kScanDone) {
    return Status::InvalidArgument("shard_ids: the cursor is the end of the scan");
  }
  return ShardIdsRequest{shard, r.expected_version};
}

Result<RecordIdsRequest> DecodeRecordIds(const Request& r) {
  RDKV_RETURN_IF_ERROR(CheckFields(r, Op::kRecordIds, {.key = true, .value = true}));
  RDKV_ASSIGN_OR_RETURN(uint32_t shard, ParseShard(r.key, r.op));
  RDKV_RETURN_IF_ERROR(
      CheckAnsweredWrites(r.value, 1, kMaxIdsPerRecord, UINT64_MAX, true, "record_ids"));
  return RecordIdsRequest{shard, r.value};
}

Result<ShardIdsAnswer> DecodeShardIdsAnswer(uint64_t request_cursor, uint64_t version,
                                            std::string_view body) {
  if (version != kScanDone && version <= request_cursor) {
    return Status::ProtocolError("shard_ids answer at cursor " + std::to_string(request_cursor) +
                                 " makes no progress (next cursor " + std::to_string(version) +
                                 ")");
  }
  RDKV_RETURN_IF_ERROR(
      CheckAnsweredWrites(body, 0, kMaxIdsPerShardIdsAnswer, UINT64_MAX, true, "shard_ids answer"));
  return ShardIdsAnswer{version, DecodeAnsweredWrites(body)};
}

std::string EncodeAnsweredWrites(const std::vector<AnsweredWrite>& writes) {
  std::string out(writes.size() * kAnsweredWriteBytes, '\0');
  char* p = out.data();
  for (const AnsweredWrite& w : writes) {
    std::memcpy(p, &w.version, 8);
    std::memcpy(p + 8, &w.client_id, 8);
    std::memcpy(p + 16, &w.request_seq, 8);
    p += kAnsweredWriteBytes;
  }
  return out;
}

std::vector<AnsweredWrite> DecodeAnsweredWrites(std::string_view value) {
  std::vector<AnsweredWrite> out(value.size() / kAnsweredWriteBytes);
  const char* p = value.data();
  for (AnsweredWrite& w : out) {
    std::memcpy(&w.version, p, 8);
    std::memcpy(&w.client_id, p + 8, 8);
    std::memcpy(&w.request_seq, p + 16, 8);
    p += kAnsweredWriteBytes;
  }
  return out;
}

Request EncodeReplicate(const ReplicateRequest& m) {
  Request r{Op::kReplicate, m.key, m.is_delete ? std::string_view() : m.value, m.version};
  r.map_epoch = m.map_epoch;
  r.flags = (m.is_delete ? kFlagReplicateDelete : 0) | (m.answers ? kFlagReplicateAnswers : 0) |
            ((m.sender_id << kReplicateSenderShift) & kReplicateSenderMask);
  r.client_id = m.client_id;
  r.request_seq = m.request_seq;
  return r;
}

Result<ReplicateRequest> DecodeReplicate(const Request& r) {
  RDKV_RETURN_IF_ERROR(CheckFields(r, Op::kReplicate,
                                   {.key = true,
                                    .value = true,
                                    .expected_version = true,
                                    .map_epoch = true,
                                    .request_id = true}));
  if ((r.flags & ~kReplicateFlagBits) != 0) {
    return Status::ProtocolError("replicate: unknown flags are set");
  }
  ReplicateRequest m;
  m.key = r.key;
  m.value = r.value;
  m.version = r.expected_version;
  m.map_epoch = r.map_epoch;
  m.is_delete = (r.flags & kFlagReplicateDelete) != 0;
  m.answers = (r.flags & kFlagReplicateAnswers) != 0;
  m.sender_id = (r.flags & kReplicateSenderMask) >> kReplicateSenderShift;
  m.client_id = r.client_id;
  m.request_seq = r.request_seq;
  if (m.is_delete && !m.value.empty()) {
    return Status::ProtocolError("replicate: a forwarded delete carries no value");
  }
  RDKV_RETURN_IF_ERROR(CheckItemVersion(m.version, "REPLICATE version"));
  if (m.answers) RDKV_RETURN_IF_ERROR(CheckAnswers(m, "replicate"));
  if (m.map_epoch == 0) {
    return Status::InvalidArgument("replicate: the primary's map epoch must be positive");
  }
  return m;
}

namespace {

template <typename T>
void Put(std::string* out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out->append(b, sizeof(T));
}
template <typename T>
T Get(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

}  // namespace

bool ReplicateBatchBuilder::Add(const ReplicateRequest& m) {
  const std::string_view value = m.is_delete ? std::string_view() : m.value;
  const size_t entry = kReplicateBatchEntryHeaderBytes + m.key.size() + value.size();
  if (count_ >= kMaxReplicateBatchEntries || body_.size() + entry > max_body_bytes_) return false;
  Put<uint8_t>(&body_, static_cast<uint8_t>((m.is_delete ? kFlagReplicateDelete : 0) |
                                            (m.answers ? kFlagReplicateAnswers : 0)));
  Put<uint32_t>(&body_, static_cast<uint32_t>(m.key.size()));
  Put<uint32_t>(&body_, static_cast<uint32_t>(value.size()));
  Put<uint64_t>(&body_, m.version);
  Put<uint64_t>(&body_, m.client_id);
  Put<uint64_t>(&body_, m.request_seq);
  body_.append(m.key);
  body_.append(value);
  ++count_;
  return true;
}

Request ReplicateBatchBuilder::Encode(uint64_t map_epoch, uint32_t sender_id) const {
  Request r{Op::kReplicate, kReplicateBatchKey, body_, 0};
  r.map_epoch = map_epoch;
  r.flags = (sender_id << kReplicateSenderShift) & kReplicateSenderMask;
  return r;
}

Result<ReplicateBatch> DecodeReplicateBatch(const Request& r, const WireLimits& limits) {
  RDKV_RETURN_IF_ERROR(
      CheckFields(r, Op::kReplicate, {.key = true, .value = true, .map_epoch = true}));
  if (r.key != kReplicateBatchKey) {
    return Status::ProtocolError("replicate batch: the key field is not the batch marker");
  }
  if ((r.flags & ~kReplicateSenderMask) != 0) {
    return Status::ProtocolError("replicate batch: flags other than the sender are set");
  }
  if (r.map_epoch == 0) {
    return Status::InvalidArgument("replicate batch: the primary's map epoch must be positive");
  }
  ReplicateBatch b;
  b.map_epoch = r.map_epoch;
  b.sender_id = (r.flags & kReplicateSenderMask) >> kReplicateSenderShift;
  std::string_view in = r.value;
  while (!in.empty()) {
    if (b.entries.size() == kMaxReplicateBatchEntries) {
      return Status::ProtocolError("replicate batch: more than " +
                                   std::to_string(kMaxReplicateBatchEntries) + " entries");
    }
    if (in.size() < kReplicateBatchEntryHeaderBytes) {
      return Status::ProtocolError("replicate batch: a truncated entry header");
    }
    const uint8_t flags = Get<uint8_t>(in.data());
    const uint32_t kb = Get<uint32_t>(in.data() + 1);
    const uint32_t vb = Get<uint32_t>(in.data() + 5);
    ReplicateRequest m;
    m.version = Get<uint64_t>(in.data() + 9);
    m.client_id = Get<uint64_t>(in.data() + 17);
    m.request_seq = Get<uint64_t>(in.data() + 25);
    in.remove_prefix(kReplicateBatchEntryHeaderBytes);
    if ((flags & ~(kReplicateFlagBits & ~kReplicateSenderMask)) != 0) {
      return Status::ProtocolError("replicate batch: an entry has reserved flags set");
    }
    if (uint64_t{kb} + vb > in.size()) {
      return Status::ProtocolError("replicate batch: an entry is longer than the batch");
    }
    m.is_delete = (flags & kFlagReplicateDelete) != 0;
    m.answers = (flags & kFlagReplicateAnswers) != 0;
    m.key = in.substr(0, kb);
    m.value = in.substr(kb, vb);
    in.remove_prefix(uint64_t{kb} + vb);
    if (m.is_delete && !m.value.empty()) {
      return Status::ProtocolError("replicate batch: a forwarded delete carries no value");
    }
    if ((m.client_id == 0) != (m.request_seq == 0)) {
      return Status::ProtocolError("replicate batch: an entry's request id is half zero");
    }
    if (m.key.empty() || m.key.size() > limits.max_key_bytes) {
      return Status::InvalidArgument("replicate batch: an entry's key of " +
                                     std::to_string(m.key.size()) + " bytes is outside 1.." +
                                     std::to_string(limits.max_key_bytes));
    }
    if (!m.answers && m.value.size() > limits.max_value_bytes) {
      return Status::InvalidArgument(
          "replicate batch: an entry's value of " + std::to_string(m.value.size()) +
          " bytes is larger than --max_value_size=" + std::to_string(limits.max_value_bytes));
    }
    RDKV_RETURN_IF_ERROR(CheckItemVersion(m.version, "REPLICATE batch entry version"));
    if (m.answers) RDKV_RETURN_IF_ERROR(CheckAnswers(m, "replicate batch"));
    m.map_epoch = b.map_epoch;
    m.sender_id = b.sender_id;
    b.entries.push_back(m);
  }
  if (b.entries.empty()) return Status::ProtocolError("replicate batch: no entry");
  return b;
}

void AppendReplicateBatchResult(StatusCode code, uint64_t version, std::string* body) {
  Put<uint8_t>(body, static_cast<uint8_t>(code));
  Put<uint64_t>(body, version);
}

Result<std::vector<ReplicateBatchResult>> DecodeReplicateBatchAnswer(uint64_t version,
                                                                     std::string_view body,
                                                                     size_t expected) {
  if (version != expected || body.size() != expected * kReplicateBatchResultBytes) {
    return Status::ProtocolError("replicate batch answer: " + std::to_string(version) +
                                 " results in " + std::to_string(body.size()) + " bytes for " +
                                 std::to_string(expected) + " entries");
  }
  std::vector<ReplicateBatchResult> out(expected);
  for (size_t i = 0; i < expected; ++i) {
    const char* p = body.data() + i * kReplicateBatchResultBytes;
    const uint8_t code = Get<uint8_t>(p);
    if (code > static_cast<uint8_t>(StatusCode::kProtocolError)) {
      return Status::ProtocolError("replicate batch answer: unknown status code " +
                                   std::to_string(code));
    }
    out[i].code = static_cast<StatusCode>(code);
    out[i].version = Get<uint64_t>(p + 1);
  }
  return out;
}

}  // namespace rdkv::kv

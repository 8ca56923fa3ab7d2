// The admin messages of the wire protocol as typed structs, with the one encoder and the one
// decoder of each. docs/design.md ("Wire protocol", "Admin messages") is the prose version.
//
// An admin request travels in the generic request frame (common/kv/wire.h): its fields are
// the frame's key, value and expected_version, each with the meaning given below and nothing
// else; a field a message does not use must be empty (zero). Answers travel in the response
// frame: its item_version and body.
//
//   message          op            key                value       expected_version
//   SNAPSHOT         kSnapshot     name (0..255 B)    -           -
//   MAP_FETCH        kClusterMap   -                  -           -
//   MAP_INSTALL      kInstallMap   -                  map (JSON)  0, or kMapInstallCheckOnly
//   SHARD_SCAN       kShardScan    shard (decimal)    the server  cursor
//                                                     the copy is
//                                                     for (decimal;
//                                                     empty: none)
//   IMPORT           kImport       key                value       the item's version (> 0)
//   DROP_SHARD       kDropShard    shard (decimal)    -           version floor (0: none)
//   REPLICATE        kReplicate    key                value (none the item's version (> 0);
//                                                     for delete) plus map_epoch (> 0),
//                                                     flags (kFlagReplicateDelete) and the
//                                                     original write's request id
//   REPLICATE        kReplicate    key                answers     their highest version
//     answers                                         (packed     plus map_epoch, flags
//                                                     AnsweredWrite) (kFlagReplicateAnswers);
//                                                     no request id
//   REPLICATE batch  kReplicate    kReplicateBatchKey the entries 0 (what tells it from a single
//                                                     REPLICATE) plus map_epoch (> 0) and the
//                                                     sender in flags; no request id
//   SHARD_IDS        kShardIds     shard (decimal)    -           cursor
//   RECORD_IDS       kRecordIds    shard (decimal)    the ids     -
//                                                     (packed
//                                                     AnsweredWrite)
//
//   answer           item_version                     body
//   SNAPSHOT         0                                the snapshot's path
//   MAP_FETCH        the map's epoch (0: standalone)  the map (JSON; empty when standalone)
//   MAP_INSTALL      the installed epoch (check only:  -
//                    the server's epoch)
//   SHARD_SCAN       next cursor (kScanDone: end)     scan entries (wire.h, AppendScanEntry)
//   IMPORT           the item's version               -
//   DROP_SHARD       items dropped                    -
//   REPLICATE        the item's version               -
//   REPLICATE batch  the number of entries            one result per entry, in order
//   SHARD_IDS        next cursor (kScanDone: end)     0..kMaxIdsPerShardIdsAnswer packed
//                                                     AnsweredWrite
//   RECORD_IDS       the number of ids recorded       -
//
// A shard number is written in canonical decimal (no sign, no leading zero, below kMaxShards).
//
// Decoders take an already framed request or answer (DecodeRequest/DecodeResponse checked the
// frame's lengths), check every field and never read outside it. A request field that the
// message does not use, or a shard number that is not canonical, is kProtocolError; a value
// outside its range (IMPORT version 0) is kInvalidArgument. Decoded structs view the input.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/kv/limits.h"
#include "common/kv/wire.h"
#include "rdkv/status.h"

namespace rdkv::kv {

// The longest snapshot name a SNAPSHOT may carry (a directory name).
inline constexpr size_t kMaxSnapshotNameBytes = 255;
// Longest canonical decimal of a shard number below kMaxShards.
inline constexpr size_t kMaxShardDigits = 4;
static_assert(kMaxShards <= 10'000, "kMaxShardDigits must hold every shard number");

// --- requests ---

struct SnapshotRequest {
  std::string_view name;  // may be empty: the server picks one
};
struct MapFetchRequest {};
// MAP_INSTALL's expected_version asking the server to run the checks it would run before an
// install that turns joining replicas into in-sync ones (docs/design.md "Replication"), and
// to install nothing.
inline constexpr uint64_t kMapInstallCheckOnly = 1;

struct MapInstallRequest {
  std::string_view map_json;  // non-empty; the server parses and checks it
  bool check_only = false;    // check, install nothing (kMapInstallCheckOnly)
};
// A sentinel of ShardScanRequest::copy_for: the scan is for no joining replica (a shard move).
inline constexpr uint32_t kScanForNoReplica = UINT32_MAX;
struct ShardScanRequest {
  uint32_t shard = 0;
  uint64_t cursor = 0;  // 0 to start; then the previous answer's next_cursor
  // The joining replica the copy is for (kScanForNoReplica: none, a shard move's). The primary
  // refuses a scan from cursor 0 for a replica it cannot vouch for, and counts one that reaches
  // the end as the whole copy its in-sync check asks for (server::replication::Replicator).
  uint32_t copy_for = kScanForNoReplica;
};
struct ImportRequest {
  std::string_view key;
  std::string_view value;
  uint64_t version = 0;  // > 0: the item's version on its old owner
};
struct DropShardRequest {
  uint32_t shard = 0;
  uint64_t version_floor = 0;  // > 0: the start of a copy in (docs/design.md "Moving a shard")
};

// A primary's write forwarded to a backup (docs/design.md "Replication"), or answers: the
// request ids of earlier writes of `key` that the state the backup was sent before supersedes
// (docs/design.md "Exactly once"; a promoted primary's resend and the repair pass send them).
struct ReplicateRequest {
  std::string_view key;
  // The value; empty for a delete. Answers: 1..kMaxAnsweredWrites packed AnsweredWrite
  // (EncodeAnsweredWrites).
  std::string_view value;
  uint64_t version = 0;    // > 0: the version the primary gave the write; answers: their highest
  uint64_t map_epoch = 0;  // > 0: the primary's map epoch
  bool is_delete = false;
  bool answers = false;    // the value holds answers; apply nothing (never with is_delete)
  uint32_t sender_id = 0;  // the sending primary's server id (0..255)
  uint64_t client_id = 0;  // the original write's request id (0/0: none; always none on answers)
  uint64_t request_seq = 0;
};

// One answer: the write with request id (client_id, request_seq) took effect at `version`.
struct AnsweredWrite {
  uint64_t version = 0;
  uint64_t client_id = 0;
  uint64_t request_seq = 0;
};
inline constexpr size_t kAnsweredWriteBytes = 24;  // u64 version | u64 client_id | u64 seq
inline constexpr size_t kMaxAnsweredWrites = 256;  // in one answers REPLICATE (or batch entry)
static_assert(kMinMaxValueBytes >= kAnsweredWriteBytes, "one answer fits any server's values");
// The value of an answers REPLICATE: 1..kMaxAnsweredWrites writes, in the order given.
std::string EncodeAnsweredWrites(const std::vector<AnsweredWrite>& writes);
// Reads an answers value that its decoder accepted (DecodeReplicate/DecodeReplicateBatch check
// it): every entry has a valid version and a whole request id.
std::vector<AnsweredWrite> DecodeAnsweredWrites(std::string_view value);

// A copy's request ids (docs/design.md "Ids travel with copies"): SHARD_IDS asks a server for
// one page of the ids it keeps for a shard, RECORD_IDS gives up to kMaxIdsPerRecord of them to
// the copy's target (which may be the smallest server: the admin side cannot know).
inline constexpr size_t kMaxIdsPerRecord = 128;
static_assert(sizeof(RequestHeader) + kMaxShardDigits + kMaxIdsPerRecord * kAnsweredWriteBytes <=
                  MaxMessageBytes(kMinMaxValueBytes),
              "a RECORD_IDS fits the smallest server's messages");
// A SHARD_IDS answer holds at most this many, and at most what fits its server's own scan
// answers (MaxIdsPerShardIdsAnswer).
inline constexpr size_t kMaxIdsPerShardIdsAnswer = 4096;
struct ShardIdsRequest {
  uint32_t shard = 0;
  uint64_t cursor = 0;  // 0 to start; then the previous answer's next_cursor
};
struct RecordIdsRequest {
  uint32_t shard = 0;
  std::string_view ids;  // 1..kMaxIdsPerRecord packed AnsweredWrite (EncodeAnsweredWrites)
};

// Several forwarded writes of one primary in one REPLICATE (docs/design.md "Replication",
// batching). The backup applies them in order and answers one result per entry. Body:
//   entry  = u8 flags (bit 0: delete, bit 1: answers; others 0) | u32 key_bytes | u32 value_bytes
//            | u64 version
//            | u64 client_id | u64 request_seq | key | value          (little-endian)
//            An answers entry is as a single answers REPLICATE; its value is not bound by
//            limits.max_value_bytes but by kMaxAnsweredWrites.
//   answer = per entry: u8 status code | u64 version (the item's, or the newer one held for
//            kVersionMismatch)
inline constexpr std::string_view kReplicateBatchKey = "replicate-batch";
inline constexpr size_t kReplicateBatchEntryHeaderBytes = 33;
inline constexpr size_t kReplicateBatchResultBytes = 9;
inline constexpr size_t kMaxReplicateBatchEntries = 256;

struct ReplicateBatch {
  uint64_t map_epoch = 0;  // > 0
  uint32_t sender_id = 0;
  // Each entry's map_epoch and sender_id are the batch's. Views the request.
  std::vector<ReplicateRequest> entries;
};
struct ReplicateBatchResult {
  StatusCode code = StatusCode::kOk;
  uint64_t version = 0;
};

// Builds a batch body: Add appends an entry when the body stays within `max_body_bytes` and the
// batch below kMaxReplicateBatchEntries, else returns false and appends nothing (an entry too
// large for any batch goes as a single REPLICATE). Not thread-safe.
class ReplicateBatchBuilder {
 public:
  explicit ReplicateBatchBuilder(size_t max_body_bytes) : max_body_bytes_(max_body_bytes) {}
  bool Add(const ReplicateRequest& m);
  size_t count() const { return count_; }
  void Clear() {
    body_.clear();
    count_ = 0;
  }
  // The REPLICATE frame of the batch; views body(), which must outlive it.
  Request Encode(uint64_t map_epoch, uint32_t sender_id) const;
  const std::string& body() const { return body_; }

 private:
  size_t max_body_bytes_;
  size_t count_ = 0;
  std::string body_;
};

// Whether a REPLICATE request is a batch (its version field is 0; a single one's is > 0).
inline bool IsReplicateBatch(const Request& r) {
  return r.op == Op::kReplicate && r.expected_version == 0;
}

// Encoders: the frame's fields for a message. The Request views the message's strings and
// `*scratch` (which holds the decimal shard number); both must outlive it.
Request EncodeSnapshot(const SnapshotRequest& m);
Request EncodeMapFetch(const MapFetchRequest& m);
Request EncodeMapInstall(const MapInstallRequest& m);
Request EncodeShardScan(const ShardScanRequest& m, std::string* scratch);
Request EncodeImport(const ImportRequest& m);
Request EncodeDropShard(const DropShardRequest& m, std::string* scratch);
Request EncodeReplicate(const ReplicateRequest& m);
Request EncodeShardIds(const ShardIdsRequest& m, std::string* scratch);
Request EncodeRecordIds(const RecordIdsRequest& m, std::string* scratch);

// Decoders of a request whose op is the message's op (checked: kInternal otherwise).
Result<SnapshotRequest> DecodeSnapshot(const Request& r);
Result<MapFetchRequest> DecodeMapFetch(const Request& r);
Result<MapInstallRequest> DecodeMapInstall(const Request& r);
Result<ShardScanRequest> DecodeShardScan(const Request& r);
Result<ImportRequest> DecodeImport(const Request& r);
Result<DropShardRequest> DecodeDropShard(const Request& r);
// A single REPLICATE: kProtocolError for an unknown flag bit, a delete with a value, or answers
// that are malformed (see below); kInvalidArgument for a version or epoch out of range.
Result<ReplicateRequest> DecodeReplicate(const Request& r);
// A batch: kProtocolError for a frame field it does not use, an entry that does not fit the body
// exactly, reserved flag bits, a delete with a value, half a request id, or no entry / more
// than kMaxReplicateBatchEntries; kInvalidArgument for a key or value outside `limits`, a
// version 0 or an epoch 0. Answers (either form) are kProtocolError when they are also a delete,
// carry a request id of their own, are not 1..kMaxAnsweredWrites whole entries, or hold an id
// that is half zero or a version above the message's; kInvalidArgument for a version 0.
Result<ReplicateBatch> DecodeReplicateBatch(const Request& r, const WireLimits& limits);
// kProtocolError for a field it does not use; kInvalidArgument for a shard that is not
// canonical, or the cursor kScanDone.
Result<ShardIdsRequest> DecodeShardIds(const Request& r);
// kProtocolError for a field it does not use or ids that are not 1..kMaxIdsPerRecord whole
// entries, each with both halves of its id non-zero; kInvalidArgument for a shard that is not
// canonical or a version above the largest item version. A version may be 0: a DELETE of a shard
// without replicas is answered without one.
Result<RecordIdsRequest> DecodeRecordIds(const Request& r);

// --- answers ---

struct SnapshotAnswer {
  std::string_view path;
};
struct MapAnswer {
  uint64_t epoch = 0;  // 0 and an empty map_json: the server is standalone
  std::string_view map_json;
};
struct ShardScanAnswer {
  uint64_t next_cursor = kScanDone;
  std::vector<ScanEntry> entries;
};
struct DropShardAnswer {
  uint64_t dropped = 0;
};
struct ShardIdsAnswer {
  uint64_t next_cursor = kScanDone;
  std::vector<AnsweredWrite> ids;
};

// The largest SHARD_SCAN answer body of a server whose values are at most `max_value_bytes`:
// entries are added while the body stays within this, and one entry always fits. The whole
// answer (header and body) fits MaxMessageBytes(max_value_bytes).
inline constexpr size_t MaxScanAnswerBodyBytes(uint64_t max_value_bytes) {
  return kScanEntryHeaderBytes + kMaxKeyBytes + static_cast<size_t>(max_value_bytes);
}
static_assert(sizeof(ResponseHeader) + MaxScanAnswerBodyBytes(kMaxValueBytes) <=
                  MaxMessageBytes(kMaxValueBytes),
              "a full shard-scan answer must fit the message limit");
// The most ids a server whose values are at most `max_value_bytes` puts in a SHARD_IDS answer:
// within its scan answers' bound (so the answer fits its messages; 46 ids at the smallest
// value limit) and at most kMaxIdsPerShardIdsAnswer.
inline constexpr size_t MaxIdsPerShardIdsAnswer(uint64_t max_value_bytes) {
  const size_t fit = MaxScanAnswerBodyBytes(max_value_bytes) / kAnsweredWriteBytes;
  return fit < kMaxIdsPerShardIdsAnswer ? fit : kMaxIdsPerShardIdsAnswer;
}
static_assert(MaxIdsPerShardIdsAnswer(kMinMaxValueBytes) >= 1, "a page holds an id");

// Builds a SHARD_SCAN answer body: Add appends an entry when the body stays within
// MaxScanAnswerBodyBytes (the first entry always goes in) and returns false, appending
// nothing, when it is full.
class ScanAnswerBuilder {
 public:
  explicit ScanAnswerBuilder(uint64_t max_value_bytes)
      : max_body_bytes_(MaxScanAnswerBodyBytes(max_value_bytes)) {}
  bool Add(const ScanEntry& e);
  const std::string& body() const { return body_; }

 private:
  size_t max_body_bytes_;
  std::string body_;
};

// Appends one entry's result to a REPLICATE batch answer body.
void AppendReplicateBatchResult(StatusCode code, uint64_t version, std::string* body);

// Answer decoders; `version` and `body` are the response's item_version and body.
Result<SnapshotAnswer> DecodeSnapshotAnswer(uint64_t version, std::string_view body);
// kProtocolError for an epoch without a map (a standalone server answers epoch 0, no map).
Result<MapAnswer> DecodeMapAnswer(uint64_t version, std::string_view body);
// kProtocolError for a body the entries do not fill exactly, an entry that breaks `limits`,
// or a next cursor that does not advance past `request_cursor` (and is not kScanDone).
Result<ShardScanAnswer> DecodeShardScanAnswer(uint64_t request_cursor, uint64_t version,
                                              std::string_view body, const WireLimits& limits);
// kProtocolError unless it holds exactly `expected` results (version == expected) with known
// status codes.
Result<std::vector<ReplicateBatchResult>> DecodeReplicateBatchAnswer(uint64_t version,
                                                                     std::string_view body,
                                                                     size_t expected);
// kProtocolError for a non-empty body.
Result<DropShardAnswer> DecodeDropShardAnswer(uint64_t version, std::string_view body);
// kProtocolError for a next cursor that does not pass `request_cursor` (and is not kScanDone),
// or a body that is not 0..kMaxIdsPerShardIdsAnswer whole entries, each a version (0 allowed, as
// for RECORD_IDS) and an id with both halves non-zero.
Result<ShardIdsAnswer> DecodeShardIdsAnswer(uint64_t request_cursor, uint64_t version,
                                            std::string_view body);

}  // namespace rdkv::kv

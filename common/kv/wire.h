// The two-sided request/response messages between clients and kvserver, version 3.
// docs/design.md ("Wire protocol") is the prose version. All integers little-endian.
//
// Request  = RequestHeader (48 B) | key (key_bytes) | value (value_bytes)
// Response = ResponseHeader (24 B) | message (message_bytes, UTF-8 error text) | body (body_bytes)
//
// Decoders validate every length against the buffer and the limits and never read out of
// bounds; they are fuzzed (tests/fuzz/kv_wire_fuzz.cc).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/kv/limits.h"
#include "common/kv/ops.h"
#include "rdkv/status.h"

namespace rdkv::kv {

inline constexpr uint16_t kWireMagic = 0x4b52;  // "RK"
inline constexpr uint8_t kWireVersion = 3;

// Operations and what each one is: common/kv/ops.h. The admin messages (SNAPSHOT, the map
// fetch and install, SHARD_SCAN, IMPORT, DROP_SHARD) and their answers: common/kv/admin_wire.h,
// which has the one encoder and decoder of each.
//
// Version 2 split the map install off CLUSTER_MAP into its own op (INSTALL_MAP). Version 3
// added the request id (client_id, request_seq: exactly-once writes), the sender's map epoch
// and REPLICATE. A peer of another version gets kProtocolError naming both versions.

// RequestHeader::flags: only REPLICATE uses them.
inline constexpr uint32_t kFlagReplicateDelete = 1;  // the forwarded write is a delete
// The REPLICATE carries answers, not a write (admin_wire.h, AnsweredWrite).
inline constexpr uint32_t kFlagReplicateAnswers = 2;
// Bits 16..23 of a REPLICATE's flags: the sending primary's server id (0..255).
inline constexpr int kReplicateSenderShift = 16;
inline constexpr uint32_t kReplicateSenderMask = 0xffu << kReplicateSenderShift;
// Every flag bit a REPLICATE may carry (a batch entry's flag byte: the same, without the sender).
inline constexpr uint32_t kReplicateFlagBits =
    kFlagReplicateDelete | kFlagReplicateAnswers | kReplicateSenderMask;

// The next cursor of a SHARD_SCAN answer that ends the scan.
inline constexpr uint64_t kScanDone = ~uint64_t{0};

struct RequestHeader {
  uint16_t magic;
  uint8_t version;
  uint8_t op;
  uint32_t key_bytes;
  uint32_t value_bytes;
  uint32_t flags;             // 0, except REPLICATE's (delete, sender id)
  uint64_t expected_version;  // CAS; the item's version for IMPORT and REPLICATE
  uint64_t map_epoch;         // REPLICATE: the primary's map epoch; 0 otherwise
  uint64_t client_id;         // request id (exactly-once writes): both 0, or both non-zero
  uint64_t request_seq;
};
static_assert(sizeof(RequestHeader) == 48);

struct ResponseHeader {
  uint16_t magic;
  uint8_t version;
  uint8_t status;  // rdkv::StatusCode
  uint32_t message_bytes;
  uint32_t body_bytes;
  uint32_t reserved;
  uint64_t item_version;  // the key's new version (writes) or current version (kVersionMismatch)
};
static_assert(sizeof(ResponseHeader) == 24);
// MaxMessageBytes' slack holds either header.
static_assert(sizeof(RequestHeader) <= kMessageSlack && sizeof(ResponseHeader) <= kMessageSlack);

struct Request {
  Op op = Op::kPing;
  std::string_view key;
  std::string_view value;
  uint64_t expected_version = 0;
  uint64_t map_epoch = 0;
  uint32_t flags = 0;
  // A write's request id: a retry with the same id gets the first answer (docs/design.md
  // "Replication", exactly once). 0/0: none.
  uint64_t client_id = 0;
  uint64_t request_seq = 0;
};

struct Response {
  Status status;
  uint64_t version = 0;
  std::string_view body;
};

// Limits the decoder enforces (a server passes its own --max_value_size).
struct WireLimits {
  size_t max_key_bytes = kMaxKeyBytes;
  size_t max_value_bytes = kDefaultMaxValueBytes;
};

void EncodeRequest(const Request& r, std::vector<uint8_t>* out);
// Views into `in`; valid while `in` is. kProtocolError for malformed input, kInvalidArgument
// for a well-formed request that breaks a limit (empty/oversize key, oversize value).
Result<Request> DecodeRequest(std::span<const uint8_t> in, const WireLimits& limits);

// One item in a shard scan.
struct ScanEntry {
  std::string_view key;
  std::string_view value;
  uint64_t version = 0;
};
// u32 key_bytes | u32 value_bytes | u64 version | key | value, repeated.
inline constexpr size_t kScanEntryHeaderBytes = 16;
// Appends one entry (no limits checked: the caller's are, see ScanAnswerBuilder).
void AppendScanEntry(const ScanEntry& e, std::string* out);
// Views into `in`. kProtocolError when an entry runs past the end or breaks the limits.
Result<std::vector<ScanEntry>> DecodeScanEntries(std::string_view in, const WireLimits& limits);

void EncodeResponse(const Status& status, uint64_t version, std::string_view body,
                    std::vector<uint8_t>* out);
Result<Response> DecodeResponse(std::span<const uint8_t> in);

// Where a write put the key's new item in the server's region: the body of a successful PUT,
// INSERT or CAS answer, so the writer's client can cache the location (its next GET of the key
// is one READ). Only a hint: a GET through it checks the item like any cached location
// (docs/design.md "GET: resolution"). An answer with an empty body carries none (a retried
// write answered from the retry table, a server without it).
//   offset_units u32 | units u16 | choice u8 | reserved u8 (0)
struct ItemLocation {
  uint32_t offset_units = 0;  // from the heap start, in kUnit
  uint16_t units = 0;         // the item's length in kUnit (> 0)
  uint8_t choice = 0;         // which of the key's two candidate buckets holds its slot (0, 1)
  bool operator==(const ItemLocation&) const = default;
};
inline constexpr size_t kItemLocationBytes = 8;
void EncodeItemLocation(const ItemLocation& where, std::string* out);
// nullopt for an empty body; kProtocolError for anything but a well-formed location.
Result<std::optional<ItemLocation>> DecodeItemLocation(std::string_view body);

}  // namespace rdkv::kv

// The two-sided request/response messages between clients and kvserver, version 2.
// docs/design.md ("Wire protocol") is the prose version. All integers little-endian.
//
// Request  = RequestHeader (24 B) | key (key_bytes) | value (value_bytes)
// Response = ResponseHeader (24 B) | message (message_bytes, UTF-8 error text) | body (body_bytes)
//
// Decoders validate every length against the buffer and the limits and never read out of
// bounds; they are fuzzed (tests/fuzz/kv_wire_fuzz.cc).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/kv/limits.h"
#include "common/kv/ops.h"
#include "rdkv/status.h"

namespace rdkv::kv {

inline constexpr uint16_t kWireMagic = 0x4b52;  // "RK"
inline constexpr uint8_t kWireVersion = 2;

// Operations and what each one is: common/kv/ops.h. The admin messages (SNAPSHOT, the map
// fetch and install, SHARD_SCAN, IMPORT, DROP_SHARD) and their answers: common/kv/admin_wire.h,
// which has the one encoder and decoder of each.
//
// Version 2 split the map install off CLUSTER_MAP into its own op (INSTALL_MAP); a peer of
// another version gets kProtocolError naming both versions.

// The next cursor of a SHARD_SCAN answer that ends the scan.
inline constexpr uint64_t kScanDone = ~uint64_t{0};

struct RequestHeader {
  uint16_t magic;
  uint8_t version;
  uint8_t op;
  uint32_t key_bytes;
  uint32_t value_bytes;
  uint32_t flags;             // reserved, must be 0
  uint64_t expected_version;  // CAS only
};
static_assert(sizeof(RequestHeader) == 24);

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

}  // namespace rdkv::kv

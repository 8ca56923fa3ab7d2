// Encoding helpers of the etcd v3 JSON gateway: base64 for keys and values, int64 fields that
// arrive as JSON strings, the range end of a prefix, KeyValue from its JSON object, and a watch
// stream's message (tests/fuzz/etcd_reply_fuzz.cc feeds them arbitrary input).
// Internal to rdkv_etcd. Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/etcd/etcd_client.h"
#include "common/etcd/watch.h"
#include "rdkv/status.h"

namespace rdkv::etcd::internal {

// Standard base64 (RFC 4648, with padding), as etcd's gateway writes bytes fields.
std::string Base64Encode(std::string_view bytes);
// kProtocolError when `text` is not valid padded base64.
Result<std::string> Base64Decode(std::string_view text);

// The range_end that makes [prefix, range_end) every key starting with `prefix`: the prefix with
// its last byte below 0xff incremented and what follows dropped; "\0" (all keys >= prefix) when
// every byte is 0xff or the prefix is empty.
std::string PrefixRangeEnd(std::string_view prefix);

// An int64 field that the gateway sends as a JSON string ("42") or, rarely, a number; 0 when the
// field is absent (proto3 leaves zero values out). kProtocolError when it is neither.
Result<int64_t> Int64Field(const nlohmann::json& object, const char* name);

// A mvccpb.KeyValue object: key and value base64-decoded, the revisions and lease parsed.
Result<KeyValue> KeyValueFromJson(const nlohmann::json& kv);

// One message of a /v3/watch stream (the gateway writes one JSON object per line), as far as
// Watch acts on it. Never throws, whatever the line holds.
struct WatchMessage {
  // Not a JSON object with a "result" object, or an "error" (e.g. no leader): the message says
  // nothing the watch can use, and the stream is retried when it ends.
  bool ignored = false;
  bool created = false;                    // the stream was created
  std::optional<int64_t> header_revision;  // result.header.revision, when there and an int64
  bool canceled = false;                   // the stream was canceled
  int64_t compact_revision = 0;            // > 0: canceled because that revision was compacted
  // The events in order (objects with a "kv" only); one whose kv is malformed is its error.
  std::vector<Result<WatchEvent>> events;
};
WatchMessage ParseWatchMessage(std::string_view line);

}  // namespace rdkv::etcd::internal

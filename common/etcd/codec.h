// Encoding helpers of the etcd v3 JSON gateway: base64 for keys and values, int64 fields that
// arrive as JSON strings, the range end of a prefix, and KeyValue from its JSON object.
// Internal to rdkv_etcd. Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/etcd/etcd_client.h"
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

}  // namespace rdkv::etcd::internal

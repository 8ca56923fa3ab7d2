#include "common/etcd/codec.h"

#include <array>
#include <charconv>
#include <limits>

#include "common/util/json_bounded.h"

namespace rdkv::etcd::internal {
namespace {

constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

// The 6-bit value of a base64 character; -1 when it is not one (the URL-safe '-' and '_' are
// accepted too: the gateway does not write them, but they are unambiguous).
int DecodeChar(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+' || c == '-') return 62;
  if (c == '/' || c == '_') return 63;
  return -1;
}

}  // namespace

std::string Base64Encode(std::string_view bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 3 <= bytes.size(); i += 3) {
    uint32_t v = (uint32_t{static_cast<uint8_t>(bytes[i])} << 16) |
                 (uint32_t{static_cast<uint8_t>(bytes[i + 1])} << 8) |
                 uint32_t{static_cast<uint8_t>(bytes[i + 2])};
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += kAlphabet[(v >> 6) & 63];
    out += kAlphabet[v & 63];
  }
  size_t rest = bytes.size() - i;
  if (rest > 0) {
    uint32_t v = uint32_t{static_cast<uint8_t>(bytes[i])} << 16;
    if (rest == 2) v |= uint32_t{static_cast<uint8_t>(bytes[i + 1])} << 8;
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += rest == 2 ? kAlphabet[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

Result<std::string> Base64Decode(std::string_view text) {
  if (text.size() % 4 != 0) {
    return Status::ProtocolError("etcd sent a base64 field of " + std::to_string(text.size()) +
                                 " characters (not a multiple of 4)");
  }
  std::string out;
  out.reserve(text.size() / 4 * 3);
  for (size_t i = 0; i < text.size(); i += 4) {
    bool last = i + 4 == text.size();
    int pad = 0;
    if (last && text[i + 3] == '=') pad = text[i + 2] == '=' ? 2 : 1;
    std::array<int, 4> d{};
    for (int k = 0; k < 4 - pad; ++k) {
      d[k] = DecodeChar(text[i + k]);
      if (d[k] < 0) return Status::ProtocolError("etcd sent a base64 field with a bad character");
    }
    uint32_t v =
        (uint32_t(d[0]) << 18) | (uint32_t(d[1]) << 12) | (uint32_t(d[2]) << 6) | uint32_t(d[3]);
    out += static_cast<char>((v >> 16) & 0xff);
    if (pad < 2) out += static_cast<char>((v >> 8) & 0xff);
    if (pad < 1) out += static_cast<char>(v & 0xff);
  }
  return out;
}

std::string PrefixRangeEnd(std::string_view prefix) {
  std::string end(prefix);
  while (!end.empty()) {
    auto last = static_cast<uint8_t>(end.back());
    if (last < 0xff) {
      end.back() = static_cast<char>(last + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');
}

Result<int64_t> Int64Field(const nlohmann::json& object, const char* name) {
  auto it = object.find(name);
  if (it == object.end() || it->is_null()) return int64_t{0};
  if (it->is_number_unsigned()) {
    // Above INT64_MAX it would wrap to a negative revision or lease.
    const uint64_t u = it->get<uint64_t>();
    if (u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return static_cast<int64_t>(u);
    }
  } else if (it->is_number_integer()) {
    return it->get<int64_t>();
  } else if (it->is_string()) {
    // The gateway writes int64 fields as decimal strings: exactly that, nothing around it, in
    // range.
    const std::string& s = it->get_ref<const std::string&>();
    int64_t v = 0;
    const auto [end, err] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (!s.empty() && err == std::errc() && end == s.data() + s.size()) return v;
  }
  return Status::ProtocolError(std::string("etcd sent field '") + name +
                               "' that is not an int64: " + it->dump());
}

Result<KeyValue> KeyValueFromJson(const nlohmann::json& kv) {
  if (!kv.is_object()) return Status::ProtocolError("etcd sent a kv that is not an object");
  KeyValue out;
  auto bytes = [&](const char* name, std::string* dst) -> Status {
    auto it = kv.find(name);
    if (it == kv.end()) return Status::Ok();
    if (!it->is_string()) {
      return Status::ProtocolError(std::string("etcd sent kv field '") + name +
                                   "' that is not a string");
    }
    RDKV_ASSIGN_OR_RETURN(*dst, Base64Decode(it->get_ref<const std::string&>()));
    return Status::Ok();
  };
  RDKV_RETURN_IF_ERROR(bytes("key", &out.key));
  RDKV_RETURN_IF_ERROR(bytes("value", &out.value));
  RDKV_ASSIGN_OR_RETURN(out.create_revision, Int64Field(kv, "create_revision"));
  RDKV_ASSIGN_OR_RETURN(out.mod_revision, Int64Field(kv, "mod_revision"));
  RDKV_ASSIGN_OR_RETURN(out.version, Int64Field(kv, "version"));
  RDKV_ASSIGN_OR_RETURN(out.lease, Int64Field(kv, "lease"));
  return out;
}

WatchMessage ParseWatchMessage(std::string_view line) {
  WatchMessage out;
  const nlohmann::json j = ParseJsonBounded(line);
  auto result = j.is_object() && !j.contains("error") ? j.find("result") : j.end();
  if (result == j.end() || !result->is_object()) {
    out.ignored = true;
    return out;
  }
  // A flag is true only as a JSON true (value() would throw on a field of another type).
  auto flag = [&](const char* name) {
    auto it = result->find(name);
    return it != result->end() && it->is_boolean() && it->get<bool>();
  };
  out.created = flag("created");
  out.canceled = flag("canceled");
  if (auto header = result->find("header"); header != result->end() && header->is_object()) {
    if (Result<int64_t> rev = Int64Field(*header, "revision"); rev.ok()) {
      out.header_revision = *rev;
    }
  }
  if (Result<int64_t> compact = Int64Field(*result, "compact_revision"); compact.ok()) {
    out.compact_revision = *compact;
  }
  auto events = result->find("events");
  if (events == result->end() || !events->is_array()) return out;
  for (const nlohmann::json& e : *events) {
    if (!e.is_object()) continue;
    auto kv_field = e.find("kv");
    if (kv_field == e.end()) continue;
    Result<KeyValue> kv = KeyValueFromJson(*kv_field);
    if (!kv.ok()) {
      out.events.emplace_back(kv.status());
      continue;
    }
    WatchEvent ev;
    auto type = e.find("type");
    ev.type =
        type != e.end() && type->is_string() && type->get_ref<const std::string&>() == "DELETE"
            ? WatchEvent::Type::kDelete
            : WatchEvent::Type::kPut;
    ev.kv = std::move(kv).value();
    out.events.emplace_back(std::move(ev));
  }
  return out;
}

}  // namespace rdkv::etcd::internal

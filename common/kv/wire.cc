#include "common/kv/wire.h"

#include <bit>
#include <cstring>

#include "common/kv/layout.h"
#include "common/util/little_endian.h"

namespace rdkv::kv {

namespace {
// The structs are laid out little-endian on every platform rdkv builds for (x86-64, aarch64
// little-endian); a static_assert keeps it honest.
static_assert(std::endian::native == std::endian::little, "rdkv's wire format is little-endian");
}  // namespace

void EncodeRequest(const Request& r, std::vector<uint8_t>* out) {
  RequestHeader h{};
  h.magic = kWireMagic;
  h.version = kWireVersion;
  h.op = static_cast<uint8_t>(r.op);
  h.key_bytes = static_cast<uint32_t>(r.key.size());
  h.value_bytes = static_cast<uint32_t>(r.value.size());
  h.expected_version = r.expected_version;
  h.flags = r.flags;
  h.map_epoch = r.map_epoch;
  h.client_id = r.client_id;
  h.request_seq = r.request_seq;
  out->resize(sizeof(h) + r.key.size() + r.value.size());
  std::memcpy(out->data(), &h, sizeof(h));
  if (!r.key.empty()) std::memcpy(out->data() + sizeof(h), r.key.data(), r.key.size());
  if (!r.value.empty()) {
    std::memcpy(out->data() + sizeof(h) + r.key.size(), r.value.data(), r.value.size());
  }
}

Result<Request> DecodeRequest(std::span<const uint8_t> in, const WireLimits& limits) {
  RequestHeader h;
  if (in.size() < sizeof(h)) {
    return Status::ProtocolError("request of " + std::to_string(in.size()) +
                                 " bytes is shorter than its " + std::to_string(sizeof(h)) +
                                 "-byte header");
  }
  std::memcpy(&h, in.data(), sizeof(h));
  if (h.magic != kWireMagic) return Status::ProtocolError("request has a bad magic number");
  if (h.version != kWireVersion) {
    return Status::ProtocolError("request has protocol version " + std::to_string(h.version) +
                                 ", this server speaks " + std::to_string(kWireVersion));
  }
  const OpInfo* info = FindOp(h.op);
  if (info == nullptr) return Status::ProtocolError("unknown operation " + std::to_string(h.op));
  const uint32_t allowed_flags =
      h.op == static_cast<uint8_t>(Op::kReplicate) ? kReplicateFlagBits : 0;
  if ((h.flags & ~allowed_flags) != 0) {
    return Status::ProtocolError("request has reserved flags set");
  }
  if ((h.client_id == 0) != (h.request_seq == 0)) {
    return Status::ProtocolError("request id has a client id or a sequence number of 0");
  }
  uint64_t total = uint64_t{sizeof(h)} + h.key_bytes + h.value_bytes;
  if (total != in.size()) {
    return Status::ProtocolError("request lengths (key " + std::to_string(h.key_bytes) +
                                 ", value " + std::to_string(h.value_bytes) +
                                 ") do not match its size " + std::to_string(in.size()));
  }
  Request r;
  r.op = static_cast<Op>(h.op);
  r.expected_version = h.expected_version;
  r.flags = h.flags;
  r.map_epoch = h.map_epoch;
  r.client_id = h.client_id;
  r.request_seq = h.request_seq;
  const char* p = reinterpret_cast<const char*>(in.data() + sizeof(h));
  r.key = std::string_view(p, h.key_bytes);
  r.value = std::string_view(p + h.key_bytes, h.value_bytes);
  if (info->keyed) {
    if (r.key.empty()) return CheckKey(r.key);
    if (r.key.size() > limits.max_key_bytes) {
      return Status::InvalidArgument("key of " + std::to_string(r.key.size()) +
                                     " bytes is longer than the limit of " +
                                     std::to_string(limits.max_key_bytes) + " bytes");
    }
    if (r.value.size() > limits.max_value_bytes) {
      return Status::InvalidArgument(
          "value of " + std::to_string(r.value.size()) +
          " bytes is larger than --max_value_size=" + std::to_string(limits.max_value_bytes));
    }
    if (!info->has_value && !r.value.empty()) {
      return Status::InvalidArgument("delete carries no value");
    }
  }
  return r;
}

void AppendScanEntry(const ScanEntry& e, std::string* out) {
  uint32_t kb = static_cast<uint32_t>(e.key.size()), vb = static_cast<uint32_t>(e.value.size());
  char head[kScanEntryHeaderBytes];
  std::memcpy(head, &kb, 4);
  std::memcpy(head + 4, &vb, 4);
  std::memcpy(head + 8, &e.version, 8);
  out->append(head, sizeof(head));
  out->append(e.key);
  out->append(e.value);
}

Result<std::vector<ScanEntry>> DecodeScanEntries(std::string_view in, const WireLimits& limits) {
  std::vector<ScanEntry> out;
  size_t pos = 0;
  while (pos < in.size()) {
    if (in.size() - pos < kScanEntryHeaderBytes) {
      return Status::ProtocolError("scan entry header cut short");
    }
    uint32_t kb, vb;
    ScanEntry e;
    std::memcpy(&kb, in.data() + pos, 4);
    std::memcpy(&vb, in.data() + pos + 4, 4);
    std::memcpy(&e.version, in.data() + pos + 8, 8);
    pos += kScanEntryHeaderBytes;
    if (kb == 0 || kb > limits.max_key_bytes || vb > limits.max_value_bytes) {
      return Status::ProtocolError("scan entry breaks the key/value limits");
    }
    if (in.size() - pos < uint64_t{kb} + vb) return Status::ProtocolError("scan entry cut short");
    e.key = in.substr(pos, kb);
    e.value = in.substr(pos + kb, vb);
    pos += uint64_t{kb} + vb;
    out.push_back(e);
  }
  return out;
}

void EncodeResponse(const Status& status, uint64_t version, std::string_view body,
                    std::vector<uint8_t>* out) {
  ResponseHeader h{};
  h.magic = kWireMagic;
  h.version = kWireVersion;
  h.status = static_cast<uint8_t>(status.code());
  const std::string& msg = status.message();
  h.message_bytes = static_cast<uint32_t>(msg.size());
  h.body_bytes = static_cast<uint32_t>(body.size());
  h.item_version = version;
  out->resize(sizeof(h) + msg.size() + body.size());
  std::memcpy(out->data(), &h, sizeof(h));
  if (!msg.empty()) std::memcpy(out->data() + sizeof(h), msg.data(), msg.size());
  if (!body.empty()) std::memcpy(out->data() + sizeof(h) + msg.size(), body.data(), body.size());
}

Result<Response> DecodeResponse(std::span<const uint8_t> in) {
  ResponseHeader h;
  if (in.size() < sizeof(h)) return Status::ProtocolError("response shorter than its header");
  std::memcpy(&h, in.data(), sizeof(h));
  if (h.magic != kWireMagic) return Status::ProtocolError("response has a bad magic number");
  if (h.version != kWireVersion) {
    return Status::ProtocolError("response has protocol version " + std::to_string(h.version) +
                                 ", this client speaks " + std::to_string(kWireVersion));
  }
  if (h.status > static_cast<uint8_t>(StatusCode::kProtocolError)) {
    return Status::ProtocolError("response has unknown status " + std::to_string(h.status));
  }
  if (uint64_t{sizeof(h)} + h.message_bytes + h.body_bytes != in.size()) {
    return Status::ProtocolError("response lengths do not match its size");
  }
  Response r;
  const char* p = reinterpret_cast<const char*>(in.data() + sizeof(h));
  auto code = static_cast<StatusCode>(h.status);
  if (code != StatusCode::kOk) r.status = Status(code, std::string(p, h.message_bytes));
  r.version = h.item_version;
  r.body = std::string_view(p + h.message_bytes, h.body_bytes);
  return r;
}

void EncodeItemLocation(const ItemLocation& where, std::string* out) {
  uint8_t b[kItemLocationBytes] = {};
  le::Put32(b, where.offset_units);
  le::Put16(b + 4, where.units);
  b[6] = where.choice;
  out->assign(reinterpret_cast<const char*>(b), sizeof(b));
}

Result<std::optional<ItemLocation>> DecodeItemLocation(std::string_view body) {
  if (body.empty()) return std::optional<ItemLocation>();
  if (body.size() != kItemLocationBytes) {
    return Status::ProtocolError("a write answer's item location has " +
                                 std::to_string(body.size()) + " bytes, not " +
                                 std::to_string(kItemLocationBytes));
  }
  const auto* b = reinterpret_cast<const uint8_t*>(body.data());
  ItemLocation where;
  where.offset_units = le::Get32(b);
  where.units = le::Get16(b + 4);
  where.choice = b[6];
  if (where.units == 0 || where.choice >= kChoices || b[7] != 0) {
    return Status::ProtocolError("a write answer's item location is malformed");
  }
  return std::optional<ItemLocation>(where);
}

}  // namespace rdkv::kv

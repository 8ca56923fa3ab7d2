// Wire formats of the verbs transport (see verbs_wire.h).
#include "common/transport/verbs/verbs_wire.h"

#include "common/util/little_endian.h"

#include <algorithm>
#include <cstring>

namespace rdkv::transport::verbs {

namespace {

using le::Get16;
using le::Get32;
using le::Get64;
using le::Put16;
using le::Put32;
using le::Put64;

}  // namespace

// ---- Connect request: magic u32 | version u16 | role u8 | reserved u8 | credits u32 |
//      max_message u32 | client nonce[32]  (48 bytes) ----
std::array<uint8_t, kConnectRequestSize> EncodeConnectRequest(const ConnectRequestData& d) {
  std::array<uint8_t, kConnectRequestSize> out{};
  Put32(&out[0], kWireMagic);
  Put16(&out[4], d.version);
  out[6] = static_cast<uint8_t>(d.role);
  out[7] = 0;
  Put32(&out[8], d.credits);
  Put32(&out[12], d.max_message);
  std::memcpy(&out[16], d.client_nonce.data(), auth::kNonceSize);
  return out;
}

Status DecodeConnectRequest(std::span<const uint8_t> data, ConnectRequestData* out) {
  if (data.size() < 6 || Get32(&data[0]) != kWireMagic) {
    return Status::ProtocolError("not an rdkv connect request");
  }
  out->version = Get16(&data[4]);
  if (out->version != kProtocolVersion) {
    return Status::NotSupported(
        "client speaks verbs protocol version " + std::to_string(out->version) + ", this server " +
        std::to_string(kProtocolVersion) + " (upgrade servers and clients together)");
  }
  if (data.size() < kConnectRequestSize) {
    return Status::ProtocolError("connect request of " + std::to_string(data.size()) +
                                 " bytes, expected " + std::to_string(kConnectRequestSize));
  }
  if (data[6] != static_cast<uint8_t>(SessionRole::kData) &&
      data[6] != static_cast<uint8_t>(SessionRole::kAdmin)) {
    return Status::ProtocolError("connect request with unknown role " + std::to_string(data[6]));
  }
  if (data[7] != 0) return Status::ProtocolError("connect request with nonzero reserved bytes");
  out->role = static_cast<SessionRole>(data[6]);
  out->credits = Get32(&data[8]);
  out->max_message = Get32(&data[12]);
  std::memcpy(out->client_nonce.data(), &data[16], auth::kNonceSize);
  if (out->credits < 4) return Status::ProtocolError("client grants fewer than 4 credits");
  return Status::Ok();
}

// ---- Accept: magic u32 | version u16 | flags u16 | credits u32 | max_message u32 |
//      session_id u64 | server nonce[32] | server proof[32]  (88 bytes) ----
std::array<uint8_t, kAcceptSize> EncodeAccept(const AcceptData& d) {
  std::array<uint8_t, kAcceptSize> out{};
  Put32(&out[0], kWireMagic);
  Put16(&out[4], d.version);
  Put16(&out[6], d.flags);
  Put32(&out[8], d.credits);
  Put32(&out[12], d.max_message);
  Put64(&out[16], d.session_id);
  std::memcpy(&out[24], d.server_nonce.data(), auth::kNonceSize);
  std::memcpy(&out[kAcceptHeadSize], d.server_proof.data(), auth::kMacSize);
  return out;
}

Status DecodeAccept(std::span<const uint8_t> data, AcceptData* out) {
  if (data.size() < 6 || Get32(&data[0]) != kWireMagic) {
    return Status::ProtocolError("the server's accept carries no rdkv handshake");
  }
  out->version = Get16(&data[4]);
  if (out->version != kProtocolVersion) {
    return Status::NotSupported("server speaks verbs protocol version " +
                                std::to_string(out->version) + ", this client " +
                                std::to_string(kProtocolVersion));
  }
  if (data.size() < kAcceptSize) {
    return Status::ProtocolError("the server's accept is " + std::to_string(data.size()) +
                                 " bytes, expected " + std::to_string(kAcceptSize));
  }
  out->flags = Get16(&data[6]);
  out->credits = Get32(&data[8]);
  out->max_message = Get32(&data[12]);
  out->session_id = Get64(&data[16]);
  std::memcpy(out->server_nonce.data(), &data[24], auth::kNonceSize);
  std::memcpy(out->server_proof.data(), &data[kAcceptHeadSize], auth::kMacSize);
  if (out->credits < 4) return Status::ProtocolError("server grants fewer than 4 credits");
  return Status::Ok();
}

std::array<uint8_t, kConnectRequestSize + kAcceptHeadSize> HandshakeTranscript(
    std::span<const uint8_t, kConnectRequestSize> request,
    std::span<const uint8_t, kAcceptHeadSize> accept_head) {
  std::array<uint8_t, kConnectRequestSize + kAcceptHeadSize> out{};
  std::copy(request.begin(), request.end(), out.begin());
  std::copy(accept_head.begin(), accept_head.end(), out.begin() + kConnectRequestSize);
  return out;
}

// ---- Welcome: flags u32 | region_count u32 | regions ----
uint16_t KeepAliveSeconds(std::chrono::milliseconds idle_timeout) {
  if (idle_timeout.count() <= 0) return 0;
  const int64_t third = idle_timeout.count() / 3000;
  return static_cast<uint16_t>(std::clamp<int64_t>(third, 1, 65535));
}

std::vector<uint8_t> EncodeWelcome(const WelcomeData& d) {
  std::vector<uint8_t> out(kWelcomeHeaderSize + d.regions.size() * kRegionWireSize);
  Put16(&out[0], d.flags);
  Put16(&out[2], d.keepalive_s);
  Put32(&out[4], static_cast<uint32_t>(d.regions.size()));
  uint8_t* p = out.data() + kWelcomeHeaderSize;
  for (const RegionDescriptor& r : d.regions) {
    Put64(p, r.addr);
    Put64(p + 8, r.length);
    Put32(p + 16, r.rkey);
    Put32(p + 20, r.layout_version);
    p += kRegionWireSize;
  }
  return out;
}

Status DecodeWelcome(std::span<const uint8_t> data, WelcomeData* out) {
  if (data.size() < kWelcomeHeaderSize) return Status::ProtocolError("short WELCOME");
  const uint32_t n = Get32(&data[4]);
  if (n > kMaxRegions || data.size() != kWelcomeHeaderSize + size_t{n} * kRegionWireSize) {
    return Status::ProtocolError("WELCOME with a bad region count");
  }
  out->flags = Get16(&data[0]);
  out->keepalive_s = Get16(&data[2]);
  out->regions.clear();
  const uint8_t* p = data.data() + kWelcomeHeaderSize;
  for (uint32_t i = 0; i < n; ++i, p += kRegionWireSize) {
    out->regions.push_back({Get64(p), Get64(p + 8), Get32(p + 16), Get32(p + 20)});
  }
  return Status::Ok();
}

std::vector<uint8_t> EncodeAuthRefused(StatusCode code, std::string_view reason) {
  const size_t len = std::min(reason.size(), kMaxRejectText);
  std::vector<uint8_t> out(1 + len);
  out[0] = static_cast<uint8_t>(code);
  std::memcpy(out.data() + 1, reason.data(), len);
  return out;
}

Status DecodeAuthRefused(std::span<const uint8_t> data, std::string_view peer) {
  if (data.empty() || data.size() > 1 + kMaxRejectText || data[0] == 0 ||
      data[0] > static_cast<uint8_t>(StatusCode::kProtocolError)) {
    return Status::ProtocolError("verbs " + std::string(peer) + ": malformed AUTH_REFUSED");
  }
  return Status(static_cast<StatusCode>(data[0]),
                "verbs " + std::string(peer) + " refused the connection: " +
                    std::string(reinterpret_cast<const char*>(data.data() + 1), data.size() - 1));
}

// ---- Reject: magic u32 | version u16 | reason u16 | text_len u8 | text ----
std::vector<uint8_t> EncodeReject(const RejectData& d) {
  size_t len = std::min(d.text.size(), kMaxRejectText);
  std::vector<uint8_t> out(9 + len);
  Put32(&out[0], kWireMagic);
  Put16(&out[4], kProtocolVersion);
  Put16(&out[6], static_cast<uint16_t>(d.reason));
  out[8] = static_cast<uint8_t>(len);
  std::memcpy(out.data() + 9, d.text.data(), len);
  return out;
}

bool DecodeReject(std::span<const uint8_t> data, RejectData* out) {
  if (data.size() < 9 || Get32(&data[0]) != kWireMagic) return false;
  out->reason = static_cast<RejectReason>(Get16(&data[6]));
  size_t len = std::min<size_t>(data[8], data.size() - 9);
  out->text.assign(reinterpret_cast<const char*>(data.data() + 9), len);
  return true;
}

Status RejectToStatus(const RejectData& r, std::string_view peer) {
  std::string m = "verbs " + std::string(peer) + " refused the connection: " + r.text;
  switch (r.reason) {
    case RejectReason::kBadToken:
      return Status::PermissionDenied(m);
    case RejectReason::kBadVersion:
      return Status::NotSupported(m);
    case RejectReason::kMalformed:
      return Status::ProtocolError(m);
    case RejectReason::kTooManyConnections:
    case RejectReason::kShuttingDown:
      return Status::Unavailable(m);
    case RejectReason::kWrongDevice:
    case RejectReason::kServerError:
      return Status::Unavailable(m);
  }
  return Status::Unavailable(m);
}

// ---- Fragment header: type u8 | version u8 | reserved u16 | credits u32 | id u64 | total u32 |
//      offset u32 | length u32 | magic u32  (32 bytes) ----
void EncodeFragmentHeader(const FragmentHeader& h, uint8_t* out) {
  out[0] = static_cast<uint8_t>(h.type);
  out[1] = static_cast<uint8_t>(kProtocolVersion);
  Put16(out + 2, 0);
  Put32(out + 4, h.credits);
  Put64(out + 8, h.id);
  Put32(out + 16, h.total);
  Put32(out + 20, h.offset);
  Put32(out + 24, h.length);
  Put32(out + 28, kWireMagic);
}

bool DecodeFragmentHeader(const uint8_t* data, size_t byte_len, size_t max_message,
                          FragmentHeader* out, const char** why) {
  if (byte_len < kFragmentHeaderSize || byte_len > kChunkSize) {
    *why = "fragment size out of range";
    return false;
  }
  if (Get32(data + 28) != kWireMagic || data[1] != kProtocolVersion) {
    *why = "fragment without the rdkv magic";
    return false;
  }
  uint8_t type = data[0];
  if (type < static_cast<uint8_t>(MsgType::kRequest) ||
      type > static_cast<uint8_t>(MsgType::kAuthRefused)) {
    *why = "unknown fragment type";
    return false;
  }
  out->type = static_cast<MsgType>(type);
  out->credits = Get32(data + 4);
  out->id = Get64(data + 8);
  out->total = Get32(data + 16);
  out->offset = Get32(data + 20);
  out->length = Get32(data + 24);
  if (out->length != byte_len - kFragmentHeaderSize) {
    *why = "fragment length disagrees with the bytes received";
    return false;
  }
  if (out->credits > (1u << 20)) {
    *why = "absurd credit count";
    return false;
  }
  if (out->type == MsgType::kCredit) {
    if (out->total != 0 || out->length != 0 || out->offset != 0) {
      *why = "credit fragment with payload";
      return false;
    }
    return true;
  }
  if (out->total > max_message && out->type != MsgType::kErrorResponse) {
    *why = "message larger than max_message_size";
    return false;
  }
  if (static_cast<uint64_t>(out->offset) + out->length > out->total) {
    *why = "fragment beyond the message end";
    return false;
  }
  if (out->length == 0 && out->total != 0) {
    *why = "empty fragment of a non-empty message";
    return false;
  }
  return true;
}

}  // namespace rdkv::transport::verbs

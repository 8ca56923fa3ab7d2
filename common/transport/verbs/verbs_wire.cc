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

// ---- SHA-256 (FIPS 180-4), small and dependency-free: used once per connection. ----
constexpr uint32_t kK[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

uint32_t Rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

void Sha256Block(uint32_t h[8], const uint8_t* block) {
  uint32_t w[64];
  for (int i = 0; i < 16; ++i) {
    w[i] = (uint32_t{block[4 * i]} << 24) | (uint32_t{block[4 * i + 1]} << 16) |
           (uint32_t{block[4 * i + 2]} << 8) | uint32_t{block[4 * i + 3]};
  }
  for (int i = 16; i < 64; ++i) {
    uint32_t s0 = Rotr(w[i - 15], 7) ^ Rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
    uint32_t s1 = Rotr(w[i - 2], 17) ^ Rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
    w[i] = w[i - 16] + s0 + w[i - 7] + s1;
  }
  uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
  for (int i = 0; i < 64; ++i) {
    uint32_t s1 = Rotr(e, 6) ^ Rotr(e, 11) ^ Rotr(e, 25);
    uint32_t ch = (e & f) ^ (~e & g);
    uint32_t t1 = hh + s1 + ch + kK[i] + w[i];
    uint32_t s0 = Rotr(a, 2) ^ Rotr(a, 13) ^ Rotr(a, 22);
    uint32_t maj = (a & b) ^ (a & c) ^ (b & c);
    uint32_t t2 = s0 + maj;
    hh = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = b;
    b = a;
    a = t1 + t2;
  }
  h[0] += a;
  h[1] += b;
  h[2] += c;
  h[3] += d;
  h[4] += e;
  h[5] += f;
  h[6] += g;
  h[7] += hh;
}

constexpr std::string_view kDigestDomain = "rdkv-verbs-auth-v1";

}  // namespace

std::array<uint8_t, 32> Sha256(std::span<const uint8_t> data) {
  uint32_t h[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  size_t full = data.size() / 64;
  for (size_t i = 0; i < full; ++i) Sha256Block(h, data.data() + 64 * i);
  uint8_t tail[128] = {};
  size_t rest = data.size() - full * 64;
  if (rest > 0) std::memcpy(tail, data.data() + full * 64, rest);
  tail[rest] = 0x80;
  size_t tail_len = rest + 1 + 8 <= 64 ? 64 : 128;
  uint64_t bits = static_cast<uint64_t>(data.size()) * 8;
  for (int i = 0; i < 8; ++i) tail[tail_len - 1 - i] = static_cast<uint8_t>(bits >> (8 * i));
  for (size_t off = 0; off < tail_len; off += 64) Sha256Block(h, tail + off);
  std::array<uint8_t, 32> out{};
  for (int i = 0; i < 8; ++i) {
    out[4 * i] = static_cast<uint8_t>(h[i] >> 24);
    out[4 * i + 1] = static_cast<uint8_t>(h[i] >> 16);
    out[4 * i + 2] = static_cast<uint8_t>(h[i] >> 8);
    out[4 * i + 3] = static_cast<uint8_t>(h[i]);
  }
  return out;
}

TokenDigest DigestToken(std::string_view token) {
  std::vector<uint8_t> buf;
  buf.reserve(kDigestDomain.size() + 1 + token.size());
  buf.insert(buf.end(), kDigestDomain.begin(), kDigestDomain.end());
  buf.push_back(0);
  buf.insert(buf.end(), token.begin(), token.end());
  std::array<uint8_t, 32> full = Sha256(buf);
  TokenDigest d{};
  std::copy_n(full.begin(), kDigestSize, d.begin());
  return d;
}

bool DigestsEqual(const TokenDigest& a, const TokenDigest& b) {
  volatile uint8_t diff = 0;
  for (size_t i = 0; i < kDigestSize; ++i) diff = diff | (a[i] ^ b[i]);
  return diff == 0;
}

// ---- Connect request: magic u32 | version u16 | flags u16 | credits u32 | max_message u32 |
//      digest[16] | reserved[8]  (40 bytes) ----
std::array<uint8_t, kConnectRequestSize> EncodeConnectRequest(const ConnectRequestData& d) {
  std::array<uint8_t, kConnectRequestSize> out{};
  Put32(&out[0], kWireMagic);
  Put16(&out[4], d.version);
  Put16(&out[6], 0);
  Put32(&out[8], d.credits);
  Put32(&out[12], d.max_message);
  std::memcpy(&out[16], d.digest.data(), kDigestSize);
  return out;
}

Status DecodeConnectRequest(std::span<const uint8_t> data, ConnectRequestData* out) {
  if (data.size() < kConnectRequestSize || Get32(&data[0]) != kWireMagic) {
    return Status::ProtocolError("not an rdkv connect request");
  }
  out->version = Get16(&data[4]);
  if (out->version != kProtocolVersion) {
    return Status::NotSupported("client speaks verbs protocol version " +
                                std::to_string(out->version) + ", server " +
                                std::to_string(kProtocolVersion));
  }
  out->credits = Get32(&data[8]);
  out->max_message = Get32(&data[12]);
  std::memcpy(out->digest.data(), &data[16], kDigestSize);
  if (out->credits < 4) return Status::ProtocolError("client grants fewer than 4 credits");
  return Status::Ok();
}

// ---- Accept: magic u32 | version u16 | region_count u16 | credits u32 | max_message u32 |
//      session_id u64 | region_count x {addr u64 | length u64 | rkey u32 | layout u32} ----
std::vector<uint8_t> EncodeAccept(const AcceptData& d) {
  std::vector<uint8_t> out(kAcceptHeaderSize + d.regions.size() * kRegionWireSize);
  Put32(&out[0], kWireMagic);
  Put16(&out[4], d.version);
  Put16(&out[6], static_cast<uint16_t>(d.regions.size()));
  Put32(&out[8], d.credits);
  Put32(&out[12], d.max_message);
  Put64(&out[16], d.session_id);
  uint8_t* p = out.data() + kAcceptHeaderSize;
  for (const RegionDescriptor& r : d.regions) {
    Put64(p, r.addr);
    Put64(p + 8, r.length);
    Put32(p + 16, r.rkey);
    Put32(p + 20, r.layout_version);
    p += kRegionWireSize;
  }
  return out;
}

Status DecodeAccept(std::span<const uint8_t> data, AcceptData* out) {
  if (data.size() < kAcceptHeaderSize || Get32(&data[0]) != kWireMagic) {
    return Status::ProtocolError("the server's accept carries no rdkv handshake");
  }
  out->version = Get16(&data[4]);
  if (out->version != kProtocolVersion) {
    return Status::NotSupported("server speaks verbs protocol version " +
                                std::to_string(out->version));
  }
  size_t n = Get16(&data[6]);
  if (n > kMaxRegions || data.size() < kAcceptHeaderSize + n * kRegionWireSize) {
    return Status::ProtocolError("the server's accept has a bad region count");
  }
  out->credits = Get32(&data[8]);
  out->max_message = Get32(&data[12]);
  out->session_id = Get64(&data[16]);
  if (out->credits < 4) return Status::ProtocolError("server grants fewer than 4 credits");
  out->regions.clear();
  const uint8_t* p = data.data() + kAcceptHeaderSize;
  for (size_t i = 0; i < n; ++i, p += kRegionWireSize) {
    out->regions.push_back({Get64(p), Get64(p + 8), Get32(p + 16), Get32(p + 20)});
  }
  return Status::Ok();
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
      type > static_cast<uint8_t>(MsgType::kErrorResponse)) {
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

#include "common/transport/tcp/frame.h"

#include "common/util/little_endian.h"

#include <algorithm>
#include <cstdio>

namespace rdkv::transport::tcp {

namespace {

using le::Get16;
using le::Get32;
using le::Get64;
using le::Put16;
using le::Put32;
using le::Put64;

Status Bad(FrameType type, const std::string& what) {
  return Status::ProtocolError(std::string(FrameTypeName(type)) + ": " + what);
}

std::string Hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

bool KnownType(uint8_t t) {
  return t >= static_cast<uint8_t>(FrameType::kHello) &&
         t <= static_cast<uint8_t>(FrameType::kProof);
}

}  // namespace

std::string_view FrameTypeName(FrameType type) {
  switch (type) {
    case FrameType::kHello:
      return "HELLO";
    case FrameType::kWelcome:
      return "WELCOME";
    case FrameType::kRefused:
      return "REFUSED";
    case FrameType::kReadRequest:
      return "READ_REQUEST";
    case FrameType::kReadResponse:
      return "READ_RESPONSE";
    case FrameType::kCallRequest:
      return "CALL_REQUEST";
    case FrameType::kCallResponse:
      return "CALL_RESPONSE";
    case FrameType::kCallError:
      return "CALL_ERROR";
    case FrameType::kChallenge:
      return "CHALLENGE";
    case FrameType::kProof:
      return "PROOF";
  }
  return "UNKNOWN";
}

size_t MaxBodyLength(FrameType type, size_t max_message_size) {
  max_message_size = std::min(max_message_size, kMaxMessageSizeLimit);
  switch (type) {
    case FrameType::kHello:
      // The largest HELLO of any version (version 2 carried a token of up to 1024 bytes), so
      // an old client's HELLO is read whole and refused with both versions named.
      return std::max(kHelloBodySize, size_t{12} + kMaxTokenLength);
    case FrameType::kChallenge:
      return auth::kAuthChallengeSize;
    case FrameType::kProof:
      return auth::kAuthProofSize;
    case FrameType::kWelcome:
      return kWelcomeFixedSize + kMaxRegions * kRegionDescriptorWireSize;
    case FrameType::kRefused:
      return kRefusedFixedSize + kMaxReasonLength;
    case FrameType::kReadRequest:
      return kReadRequestBodySize;
    case FrameType::kReadResponse:
      return kReadResponseFixedSize + max_message_size;
    case FrameType::kCallRequest:
    case FrameType::kCallResponse:
      return kCallFixedSize + max_message_size;
    case FrameType::kCallError:
      return kCallErrorFixedSize + kMaxReasonLength;
  }
  return 0;
}

Result<FrameHeader> DecodeFrameHeader(std::span<const uint8_t> bytes, size_t max_message_size) {
  if (bytes.size() < kFrameHeaderSize) {
    return Status::ProtocolError("truncated frame header: " + std::to_string(bytes.size()) +
                                 " of " + std::to_string(kFrameHeaderSize) + " bytes");
  }
  const uint8_t* p = bytes.data();
  uint32_t magic = Get32(p);
  if (magic != kFrameMagic) {
    // The first bytes as text when they are printable: another protocol's answer ("HTTP").
    std::string text;
    for (size_t i = 0; i < 4; ++i) {
      const char c = static_cast<char>(p[i]);
      text += (c >= 0x20 && c < 0x7f) ? c : '?';
    }
    const bool printable = text.find('?') == std::string::npos;
    return Status::ProtocolError(
        "bad frame magic " + Hex32(magic) + " (expected " + Hex32(kFrameMagic) + ")" +
        (printable ? ": the peer is not an rdkv server (it sent \"" + text + "...\")"
                   : ": the peer is not an rdkv server, or not one of this protocol"));
  }
  if (!KnownType(p[4])) {
    return Status::ProtocolError("unknown frame type " + std::to_string(p[4]));
  }
  FrameHeader h;
  h.type = static_cast<FrameType>(p[4]);
  if (p[5] != 0 || Get16(p + 6) != 0) return Bad(h.type, "nonzero flags/reserved header bytes");
  h.body_length = Get32(p + 8);
  size_t limit = MaxBodyLength(h.type, max_message_size);
  if (h.body_length > limit) {
    return Bad(h.type, "body of " + std::to_string(h.body_length) + " bytes exceeds the limit of " +
                           std::to_string(limit));
  }
  return h;
}

void EncodeFrameHeader(FrameType type, uint32_t body_length,
                       std::span<uint8_t, kFrameHeaderSize> out) {
  uint8_t* p = out.data();
  Put32(p, kFrameMagic);
  p[4] = static_cast<uint8_t>(type);
  p[5] = 0;
  Put16(p + 6, 0);
  Put32(p + 8, body_length);
}

Result<StreamFrame> NextFrame(std::span<const uint8_t> buffered, size_t max_message_size) {
  StreamFrame f;
  if (buffered.size() < kFrameHeaderSize) return f;
  auto h = DecodeFrameHeader(buffered, max_message_size);
  if (!h.ok()) return h.status();
  f.have_header = true;
  f.header = *h;
  f.frame_size = kFrameHeaderSize + h->body_length;
  if (buffered.size() >= f.frame_size) {
    f.complete = true;
    f.body = buffered.subspan(kFrameHeaderSize, h->body_length);
  }
  return f;
}

// ---- HELLO ----

std::vector<uint8_t> EncodeHello(const Hello& hello) {
  std::vector<uint8_t> out(kFrameHeaderSize + kHelloBodySize);
  EncodeFrameHeader(FrameType::kHello, static_cast<uint32_t>(kHelloBodySize),
                    std::span<uint8_t, kFrameHeaderSize>(out.data(), kFrameHeaderSize));
  uint8_t* p = out.data() + kFrameHeaderSize;
  Put16(p, hello.version);
  Put16(p + 2, 0);
  Put32(p + 4, hello.max_message_size);
  auth::EncodeAuthHello(hello.auth, std::span<uint8_t, auth::kAuthHelloSize>(p + kHelloFixedSize,
                                                                             auth::kAuthHelloSize));
  return out;
}

Result<uint16_t> PeekHelloVersion(std::span<const uint8_t> body) {
  if (body.size() < 2) return Bad(FrameType::kHello, "body too short for a version");
  return Get16(body.data());
}

Result<Hello> DecodeHello(std::span<const uint8_t> body) {
  constexpr FrameType t = FrameType::kHello;
  if (body.size() != kHelloBodySize) {
    return Bad(t,
               std::to_string(body.size()) + " bytes, expected " + std::to_string(kHelloBodySize));
  }
  const uint8_t* p = body.data();
  Hello h;
  h.version = Get16(p);
  if (Get16(p + 2) != 0) return Bad(t, "nonzero reserved bytes");
  h.max_message_size = Get32(p + 4);
  if (h.max_message_size == 0 || h.max_message_size > kMaxMessageSizeLimit) {
    return Bad(t, "max_message_size " + std::to_string(h.max_message_size) + " out of range");
  }
  auto a = auth::DecodeAuthHello(body.subspan(kHelloFixedSize));
  if (!a.ok()) return Bad(t, a.status().message());
  h.auth = *a;
  return h;
}

// ---- CHALLENGE / PROOF ----

std::vector<uint8_t> EncodeChallenge(const auth::AuthChallenge& challenge) {
  std::vector<uint8_t> out(kFrameHeaderSize + auth::kAuthChallengeSize);
  EncodeFrameHeader(FrameType::kChallenge, static_cast<uint32_t>(auth::kAuthChallengeSize),
                    std::span<uint8_t, kFrameHeaderSize>(out.data(), kFrameHeaderSize));
  auth::EncodeAuthChallenge(
      challenge, std::span<uint8_t, auth::kAuthChallengeSize>(out.data() + kFrameHeaderSize,
                                                              auth::kAuthChallengeSize));
  return out;
}

Result<auth::AuthChallenge> DecodeChallenge(std::span<const uint8_t> body) {
  auto c = auth::DecodeAuthChallenge(body);
  if (!c.ok()) return Bad(FrameType::kChallenge, c.status().message());
  return *c;
}

std::vector<uint8_t> EncodeProof(const auth::AuthProof& proof) {
  std::vector<uint8_t> out(kFrameHeaderSize + auth::kAuthProofSize);
  EncodeFrameHeader(FrameType::kProof, static_cast<uint32_t>(auth::kAuthProofSize),
                    std::span<uint8_t, kFrameHeaderSize>(out.data(), kFrameHeaderSize));
  auth::EncodeAuthProof(proof, std::span<uint8_t, auth::kAuthProofSize>(
                                   out.data() + kFrameHeaderSize, auth::kAuthProofSize));
  return out;
}

Result<auth::AuthProof> DecodeProof(std::span<const uint8_t> body) {
  auto p = auth::DecodeAuthProof(body);
  if (!p.ok()) return Bad(FrameType::kProof, p.status().message());
  return *p;
}

// ---- WELCOME ----

std::vector<uint8_t> EncodeWelcome(const Welcome& w) {
  size_t n = std::min(w.regions.size(), kMaxRegions);
  size_t body = kWelcomeFixedSize + n * kRegionDescriptorWireSize;
  std::vector<uint8_t> out(kFrameHeaderSize + body);
  EncodeFrameHeader(FrameType::kWelcome, static_cast<uint32_t>(body),
                    std::span<uint8_t, kFrameHeaderSize>(out.data(), kFrameHeaderSize));
  uint8_t* p = out.data() + kFrameHeaderSize;
  Put16(p, w.version);
  Put16(p + 2, 0);
  Put32(p + 4, w.max_message_size);
  Put64(p + 8, w.session_id);
  Put32(p + 16, static_cast<uint32_t>(n));
  Put32(p + 20, 0);
  p += kWelcomeFixedSize;
  for (size_t i = 0; i < n; ++i, p += kRegionDescriptorWireSize) {
    const RegionDescriptor& r = w.regions[i];
    Put64(p, r.addr);
    Put64(p + 8, r.length);
    Put32(p + 16, r.rkey);
    Put32(p + 20, r.layout_version);
  }
  return out;
}

Result<Welcome> DecodeWelcome(std::span<const uint8_t> body) {
  constexpr FrameType t = FrameType::kWelcome;
  if (body.size() < kWelcomeFixedSize) {
    return Bad(t, "truncated: " + std::to_string(body.size()) + " bytes");
  }
  const uint8_t* p = body.data();
  Welcome w;
  w.version = Get16(p);
  if (Get16(p + 2) != 0 || Get32(p + 20) != 0) return Bad(t, "nonzero reserved bytes");
  w.max_message_size = Get32(p + 4);
  if (w.max_message_size == 0 || w.max_message_size > kMaxMessageSizeLimit) {
    return Bad(t, "max_message_size " + std::to_string(w.max_message_size) + " out of range");
  }
  w.session_id = Get64(p + 8);
  uint32_t n = Get32(p + 16);
  if (n > kMaxRegions)
    return Bad(t, std::to_string(n) + " regions (max " + std::to_string(kMaxRegions) + ")");
  if (body.size() != kWelcomeFixedSize + size_t{n} * kRegionDescriptorWireSize) {
    return Bad(t, "region count " + std::to_string(n) + " does not match a body of " +
                      std::to_string(body.size()) + " bytes");
  }
  w.regions.resize(n);
  p += kWelcomeFixedSize;
  for (uint32_t i = 0; i < n; ++i, p += kRegionDescriptorWireSize) {
    RegionDescriptor& r = w.regions[i];
    r.addr = Get64(p);
    r.length = Get64(p + 8);
    r.rkey = Get32(p + 16);
    r.layout_version = Get32(p + 20);
    if (r.length == 0 || r.addr + r.length < r.addr) {
      return Bad(t, "region " + std::to_string(i) + " is empty or wraps the address space");
    }
  }
  return w;
}

// ---- REFUSED ----

std::vector<uint8_t> EncodeRefused(const Refused& r) {
  size_t reason = std::min(r.reason.size(), kMaxReasonLength);
  std::vector<uint8_t> out(kFrameHeaderSize + kRefusedFixedSize + reason);
  EncodeFrameHeader(FrameType::kRefused, static_cast<uint32_t>(kRefusedFixedSize + reason),
                    std::span<uint8_t, kFrameHeaderSize>(out.data(), kFrameHeaderSize));
  uint8_t* p = out.data() + kFrameHeaderSize;
  p[0] = static_cast<uint8_t>(r.code);
  p[1] = 0;
  Put16(p + 2, r.server_version);
  Put16(p + 4, static_cast<uint16_t>(reason));
  Put16(p + 6, 0);
  std::copy_n(r.reason.data(), reason, p + kRefusedFixedSize);
  return out;
}

Result<Refused> DecodeRefused(std::span<const uint8_t> body) {
  constexpr FrameType t = FrameType::kRefused;
  if (body.size() < kRefusedFixedSize) {
    return Bad(t, "truncated: " + std::to_string(body.size()) + " bytes");
  }
  const uint8_t* p = body.data();
  if (p[0] == 0 || p[0] > static_cast<uint8_t>(StatusCode::kProtocolError)) {
    return Bad(t, "bad status code " + std::to_string(p[0]));
  }
  if (p[1] != 0 || Get16(p + 6) != 0) return Bad(t, "nonzero reserved bytes");
  Refused r;
  r.code = static_cast<StatusCode>(p[0]);
  r.server_version = Get16(p + 2);
  size_t reason = Get16(p + 4);
  if (reason > kMaxReasonLength) return Bad(t, "reason too long");
  if (body.size() != kRefusedFixedSize + reason) {
    return Bad(t, "reason length " + std::to_string(reason) + " does not match a body of " +
                      std::to_string(body.size()) + " bytes");
  }
  r.reason.assign(reinterpret_cast<const char*>(p + kRefusedFixedSize), reason);
  return r;
}

// ---- READ_REQUEST ----

void EncodeReadRequest(const ReadRequest& rq, std::span<uint8_t, kReadRequestFrameSize> out) {
  EncodeFrameHeader(FrameType::kReadRequest, kReadRequestBodySize, out.first<kFrameHeaderSize>());
  uint8_t* p = out.data() + kFrameHeaderSize;
  Put64(p, rq.wr_id);
  Put64(p + 8, rq.remote_addr);
  Put32(p + 16, rq.rkey);
  Put32(p + 20, rq.length);
}

Result<ReadRequest> DecodeReadRequest(std::span<const uint8_t> body) {
  if (body.size() != kReadRequestBodySize) {
    return Bad(FrameType::kReadRequest, "body of " + std::to_string(body.size()) +
                                            " bytes (expected " +
                                            std::to_string(kReadRequestBodySize) + ")");
  }
  const uint8_t* p = body.data();
  ReadRequest rq;
  rq.wr_id = Get64(p);
  rq.remote_addr = Get64(p + 8);
  rq.rkey = Get32(p + 16);
  rq.length = Get32(p + 20);
  return rq;
}

// ---- READ_RESPONSE ----

void EncodeReadResponseHead(uint64_t wr_id, ReadStatus status, uint32_t data_length,
                            std::span<uint8_t, kReadResponseHeadSize> out) {
  EncodeFrameHeader(FrameType::kReadResponse,
                    static_cast<uint32_t>(kReadResponseFixedSize + data_length),
                    out.first<kFrameHeaderSize>());
  uint8_t* p = out.data() + kFrameHeaderSize;
  Put64(p, wr_id);
  p[8] = static_cast<uint8_t>(status);
  p[9] = p[10] = p[11] = 0;
  Put32(p + 12, data_length);
}

Result<ReadResponse> DecodeReadResponse(std::span<const uint8_t> body) {
  constexpr FrameType t = FrameType::kReadResponse;
  if (body.size() < kReadResponseFixedSize) {
    return Bad(t, "truncated: " + std::to_string(body.size()) + " bytes");
  }
  const uint8_t* p = body.data();
  ReadResponse r;
  r.wr_id = Get64(p);
  uint8_t s = p[8];
  if (s != static_cast<uint8_t>(ReadStatus::kOk) &&
      s != static_cast<uint8_t>(ReadStatus::kRemoteAccessError)) {
    return Bad(t, "bad status " + std::to_string(s));
  }
  r.status = static_cast<ReadStatus>(s);
  if (p[9] != 0 || p[10] != 0 || p[11] != 0) return Bad(t, "nonzero reserved bytes");
  uint32_t len = Get32(p + 12);
  if (body.size() != kReadResponseFixedSize + size_t{len}) {
    return Bad(t, "data length " + std::to_string(len) + " does not match a body of " +
                      std::to_string(body.size()) + " bytes");
  }
  if (r.status != ReadStatus::kOk && len != 0) return Bad(t, "a failed READ carries data");
  r.data = body.subspan(kReadResponseFixedSize, len);
  return r;
}

// ---- CALL ----

void EncodeCallHead(FrameType type, uint64_t request_id, uint32_t payload_length,
                    std::span<uint8_t, kCallHeadSize> out) {
  EncodeFrameHeader(type, static_cast<uint32_t>(kCallFixedSize + payload_length),
                    out.first<kFrameHeaderSize>());
  Put64(out.data() + kFrameHeaderSize, request_id);
}

Result<CallMessage> DecodeCall(std::span<const uint8_t> body) {
  if (body.size() < kCallFixedSize) {
    return Status::ProtocolError("CALL: truncated: " + std::to_string(body.size()) + " bytes");
  }
  CallMessage m;
  m.request_id = Get64(body.data());
  m.payload = body.subspan(kCallFixedSize);
  return m;
}

// ---- CALL_ERROR ----

std::vector<uint8_t> EncodeCallError(const CallError& e) {
  size_t reason = std::min(e.reason.size(), kMaxReasonLength);
  std::vector<uint8_t> out(kFrameHeaderSize + kCallErrorFixedSize + reason);
  EncodeFrameHeader(FrameType::kCallError, static_cast<uint32_t>(kCallErrorFixedSize + reason),
                    std::span<uint8_t, kFrameHeaderSize>(out.data(), kFrameHeaderSize));
  uint8_t* p = out.data() + kFrameHeaderSize;
  Put64(p, e.request_id);
  p[8] = static_cast<uint8_t>(e.code);
  p[9] = 0;
  Put16(p + 10, static_cast<uint16_t>(reason));
  Put32(p + 12, 0);
  std::copy_n(e.reason.data(), reason, p + kCallErrorFixedSize);
  return out;
}

Result<CallError> DecodeCallError(std::span<const uint8_t> body) {
  constexpr FrameType t = FrameType::kCallError;
  if (body.size() < kCallErrorFixedSize) {
    return Bad(t, "truncated: " + std::to_string(body.size()) + " bytes");
  }
  const uint8_t* p = body.data();
  if (p[8] == 0 || p[8] > static_cast<uint8_t>(StatusCode::kProtocolError)) {
    return Bad(t, "bad status code " + std::to_string(p[8]));
  }
  if (p[9] != 0 || Get32(p + 12) != 0) return Bad(t, "nonzero reserved bytes");
  CallError e;
  e.request_id = Get64(p);
  e.code = static_cast<StatusCode>(p[8]);
  size_t reason = Get16(p + 10);
  if (reason > kMaxReasonLength) return Bad(t, "reason too long");
  if (body.size() != kCallErrorFixedSize + reason) {
    return Bad(t, "reason length " + std::to_string(reason) + " does not match a body of " +
                      std::to_string(body.size()) + " bytes");
  }
  e.reason.assign(reinterpret_cast<const char*>(p + kCallErrorFixedSize), reason);
  return e;
}

}  // namespace rdkv::transport::tcp

// Wire format of the tcp transport (the "software NIC"): pure encoders and decoders over byte
// spans, with explicit little-endian fields. Nothing here does I/O, logs or keeps state, so every
// decoder can be fuzzed (tests/fuzz/tcp_frame_fuzz.cc). See docs/transport-tcp.md for the table.
//
// Every frame is a 12-byte header followed by `body_length` bytes of body:
//
//   offset  size  field
//   0       4     magic        kFrameMagic ("RDKT" read as bytes)
//   4       1     type         FrameType
//   5       1     flags        must be 0
//   6       2     reserved     must be 0
//   8       4     body_length  bytes that follow; checked against MaxBodyLength(type) before
//                              any body byte is read
//
// Decoders accept exactly one canonical encoding: reserved fields must be zero and lengths must
// match, so decode(bytes) succeeding implies encode(decoded) == bytes (the fuzzer checks this).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/transport/auth.h"
#include "common/transport/transport.h"
#include "rdkv/status.h"

namespace rdkv::transport::tcp {

inline constexpr uint32_t kFrameMagic = 0x544B4452;  // bytes 'R' 'D' 'K' 'T'
// 2: the CALL_ERROR frame (a version-1 peer would drop the connection on it).
// 3: challenge-response authentication (CHALLENGE and PROOF; no token on the wire).
inline constexpr uint16_t kProtocolVersion = 3;
inline constexpr size_t kFrameHeaderSize = 12;
inline constexpr size_t kMaxTokenLength = 1024;  // longest secret (never sent)
inline constexpr size_t kMaxReasonLength = 1024;
inline constexpr size_t kMaxRegions = 1024;
// The largest max_message_size either side may configure (keeps every body length in 32 bits).
inline constexpr size_t kMaxMessageSizeLimit = size_t{1} << 30;

enum class FrameType : uint8_t {
  kHello = 1,         // client -> server, first frame: version, limits, role, client nonce
  kWelcome = 2,       // server -> client: authenticated; the region descriptors
  kRefused = 3,       // server -> client: handshake refused (code + reason); then the server closes
  kReadRequest = 4,   // client -> server: one-sided READ {wr_id, remote_addr, rkey, length}
  kReadResponse = 5,  // server -> client: {wr_id, status, data}
  kCallRequest = 6,   // client -> server: two-sided request {request_id, payload}
  kCallResponse = 7,  // server -> client: {request_id, payload}
  kCallError = 8,     // server -> client: the request failed in the transport {request_id, code,
                      // reason}, e.g. a response larger than the client accepts
  kChallenge = 9,     // server -> client: server nonce + server proof (auth.h)
  kProof = 10,        // client -> server: client proof (auth.h)
};
std::string_view FrameTypeName(FrameType type);

struct FrameHeader {
  FrameType type = FrameType::kHello;
  uint32_t body_length = 0;
};

// The largest body a frame of `type` may carry when messages are limited to `max_message_size`.
size_t MaxBodyLength(FrameType type, size_t max_message_size);

// Validates magic, type, flags, reserved bytes and the body length limit of the first
// kFrameHeaderSize bytes of `bytes`. kProtocolError on anything wrong (or too few bytes).
Result<FrameHeader> DecodeFrameHeader(std::span<const uint8_t> bytes, size_t max_message_size);
void EncodeFrameHeader(FrameType type, uint32_t body_length,
                       std::span<uint8_t, kFrameHeaderSize> out);

// Splits the first frame off a byte stream. `have_header` is false while fewer than
// kFrameHeaderSize bytes are buffered; `complete` is false while the body is not all there
// (frame_size then says how many bytes the whole frame needs). Errors: the header is invalid.
struct StreamFrame {
  bool have_header = false;
  bool complete = false;
  FrameHeader header;
  size_t frame_size = 0;          // header + body
  std::span<const uint8_t> body;  // valid when complete
};
Result<StreamFrame> NextFrame(std::span<const uint8_t> buffered, size_t max_message_size);

// ---- HELLO (client -> server) ----------------------------------------------------------------
// body: version u16 | reserved u16 | max_message_size u32 | auth hello (auth.h: role u8,
//       reserved 3 bytes, client nonce 32 bytes). The whole body is the authentication
//       transcript's context, so the proofs cover the limits too.
struct Hello {
  uint16_t version = kProtocolVersion;
  uint32_t max_message_size = 0;  // the largest response payload the client accepts
  auth::AuthHello auth;
};
inline constexpr size_t kHelloFixedSize = 8;
inline constexpr size_t kHelloBodySize = kHelloFixedSize + auth::kAuthHelloSize;
std::vector<uint8_t> EncodeHello(const Hello& hello);  // the whole frame, header included
// Reads only the version, so a server can refuse another version with a clear reason before
// parsing the rest (whose layout may differ in that version).
Result<uint16_t> PeekHelloVersion(std::span<const uint8_t> body);
Result<Hello> DecodeHello(std::span<const uint8_t> body);

// ---- CHALLENGE (server -> client) and PROOF (client -> server) -------------------------------
// bodies: exactly auth::AuthChallenge / auth::AuthProof (auth.h).
std::vector<uint8_t> EncodeChallenge(const auth::AuthChallenge& challenge);  // whole frame
Result<auth::AuthChallenge> DecodeChallenge(std::span<const uint8_t> body);
std::vector<uint8_t> EncodeProof(const auth::AuthProof& proof);  // whole frame
Result<auth::AuthProof> DecodeProof(std::span<const uint8_t> body);

// ---- WELCOME (server -> client) --------------------------------------------------------------
// body: version u16 | reserved u16 | max_message_size u32 | session_id u64 | region_count u32 |
//       reserved u32 | region_count x {addr u64, length u64, rkey u32, layout_version u32}
struct Welcome {
  uint16_t version = kProtocolVersion;
  uint32_t max_message_size = 0;  // the largest request payload (and READ) the server accepts
  uint64_t session_id = 0;
  std::vector<RegionDescriptor> regions;
};
inline constexpr size_t kWelcomeFixedSize = 24;
inline constexpr size_t kRegionDescriptorWireSize = 24;
std::vector<uint8_t> EncodeWelcome(const Welcome& welcome);
Result<Welcome> DecodeWelcome(std::span<const uint8_t> body);

// ---- REFUSED (server -> client) --------------------------------------------------------------
// body: code u8 (StatusCode, not OK) | reserved u8 | server_version u16 | reason_length u16 |
//       reserved u16 | reason bytes
struct Refused {
  StatusCode code = StatusCode::kPermissionDenied;
  uint16_t server_version = kProtocolVersion;
  std::string reason;
};
inline constexpr size_t kRefusedFixedSize = 8;
std::vector<uint8_t> EncodeRefused(const Refused& refused);
Result<Refused> DecodeRefused(std::span<const uint8_t> body);

// ---- READ_REQUEST (client -> server) ---------------------------------------------------------
// body: wr_id u64 | remote_addr u64 | rkey u32 | length u32
struct ReadRequest {
  uint64_t wr_id = 0;
  uint64_t remote_addr = 0;
  uint32_t rkey = 0;
  uint32_t length = 0;
};
inline constexpr size_t kReadRequestBodySize = 24;
inline constexpr size_t kReadRequestFrameSize = kFrameHeaderSize + kReadRequestBodySize;
void EncodeReadRequest(const ReadRequest& request, std::span<uint8_t, kReadRequestFrameSize> out);
Result<ReadRequest> DecodeReadRequest(std::span<const uint8_t> body);

// ---- READ_RESPONSE (server -> client) --------------------------------------------------------
// body: wr_id u64 | status u8 (ReadStatus: kOk or kRemoteAccessError) | reserved 3 bytes |
//       data_length u32 | data (data_length bytes; 0 unless status is kOk)
struct ReadResponse {
  uint64_t wr_id = 0;
  ReadStatus status = ReadStatus::kOk;
  std::span<const uint8_t> data;  // points into the decoded body
};
inline constexpr size_t kReadResponseFixedSize = 16;
inline constexpr size_t kReadResponseHeadSize = kFrameHeaderSize + kReadResponseFixedSize;
// Writes header + fixed body part; the `data_length` data bytes follow it on the wire.
void EncodeReadResponseHead(uint64_t wr_id, ReadStatus status, uint32_t data_length,
                            std::span<uint8_t, kReadResponseHeadSize> out);
Result<ReadResponse> DecodeReadResponse(std::span<const uint8_t> body);

// ---- CALL_REQUEST / CALL_RESPONSE ------------------------------------------------------------
// body: request_id u64 | payload
struct CallMessage {
  uint64_t request_id = 0;
  std::span<const uint8_t> payload;  // points into the decoded body
};
inline constexpr size_t kCallFixedSize = 8;
inline constexpr size_t kCallHeadSize = kFrameHeaderSize + kCallFixedSize;
// `type` must be kCallRequest or kCallResponse; the payload bytes follow the head on the wire.
void EncodeCallHead(FrameType type, uint64_t request_id, uint32_t payload_length,
                    std::span<uint8_t, kCallHeadSize> out);
Result<CallMessage> DecodeCall(std::span<const uint8_t> body);

// ---- CALL_ERROR (server -> client) -----------------------------------------------------------
// body: request_id u64 | code u8 (StatusCode, not OK) | reserved u8 | reason_length u16 |
//       reserved u32 | reason bytes
// Sent instead of a CALL_RESPONSE the server cannot send (larger than the client's
// max_message_size), so the caller's Call fails at once with `code` instead of timing out.
struct CallError {
  uint64_t request_id = 0;
  StatusCode code = StatusCode::kInvalidArgument;
  std::string reason;
};
inline constexpr size_t kCallErrorFixedSize = 16;
std::vector<uint8_t> EncodeCallError(const CallError& error);  // the whole frame
Result<CallError> DecodeCallError(std::span<const uint8_t> body);

}  // namespace rdkv::transport::tcp

// Wire formats of the verbs transport: the rdma_cm private data of the handshake and the header
// of every two-sided fragment. All integers are little-endian; docs/transport-verbs.md has the
// byte layouts. Pure functions, host-testable (tests/transport/verbs_smoke_test.cc).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/transport/transport.h"
#include "rdkv/status.h"

namespace rdkv::transport::verbs {

inline constexpr uint32_t kWireMagic = 0x564B4452;  // bytes "RDKV"
inline constexpr uint16_t kProtocolVersion = 1;

// Two-sided messages travel in fragments of at most one chunk (header included). Receive
// buffers are chunk-sized; a message longer than kMaxFragmentPayload is split and reassembled.
inline constexpr size_t kChunkSize = 8192;
inline constexpr size_t kFragmentHeaderSize = 32;
inline constexpr size_t kMaxFragmentPayload = kChunkSize - kFragmentHeaderSize;

// Receive credits each side grants the other at connect (one credit = one posted receive).
inline constexpr uint32_t kServerRecvCredits = 32;  // per connection, backed by the SRQ
inline constexpr uint32_t kClientRecvCredits = 64;  // the client's own receive queue
// Send buffers (and so send-queue SEND slots) per side of one connection.
inline constexpr uint32_t kServerSendSlots = 16;
inline constexpr uint32_t kClientSendSlots = 32;

// Private data limits of rdma_cm over InfiniBand/RoCE (RDMA_PS_TCP).
inline constexpr size_t kMaxConnectData = 56;
inline constexpr size_t kMaxAcceptData = 196;
inline constexpr size_t kMaxRejectData = 148;

// Token digest: the first 16 bytes of SHA-256("rdkv-verbs-auth-v1" || 0x00 || token).
inline constexpr size_t kDigestSize = 16;
using TokenDigest = std::array<uint8_t, kDigestSize>;
TokenDigest DigestToken(std::string_view token);
bool DigestsEqual(const TokenDigest& a, const TokenDigest& b);  // constant time
std::array<uint8_t, 32> Sha256(std::span<const uint8_t> data);

// ---- Handshake -------------------------------------------------------------------------------
struct ConnectRequestData {  // client -> server, in rdma_connect's private data
  uint16_t version = kProtocolVersion;
  uint32_t credits = 0;      // receives the client granted the server
  uint32_t max_message = 0;  // largest response payload the client accepts
  TokenDigest digest{};
};
inline constexpr size_t kConnectRequestSize = 40;
std::array<uint8_t, kConnectRequestSize> EncodeConnectRequest(const ConnectRequestData& d);
// kProtocolError for a short or foreign blob, kNotSupported for another protocol version.
Status DecodeConnectRequest(std::span<const uint8_t> data, ConnectRequestData* out);

struct AcceptData {  // server -> client, in rdma_accept's private data
  uint16_t version = kProtocolVersion;
  uint32_t credits = 0;      // receives (SRQ-backed) the server granted the client
  uint32_t max_message = 0;  // largest request payload the server accepts
  uint64_t session_id = 0;
  std::vector<RegionDescriptor> regions;
};
inline constexpr size_t kAcceptHeaderSize = 24;
inline constexpr size_t kRegionWireSize = 24;
inline constexpr size_t kMaxRegions = (kMaxAcceptData - kAcceptHeaderSize) / kRegionWireSize;  // 7
// Precondition: regions.size() <= kMaxRegions.
std::vector<uint8_t> EncodeAccept(const AcceptData& d);
Status DecodeAccept(std::span<const uint8_t> data, AcceptData* out);

enum class RejectReason : uint16_t {
  kBadToken = 1,
  kBadVersion = 2,
  kMalformed = 3,
  kTooManyConnections = 4,
  kWrongDevice = 5,
  kServerError = 6,
  kShuttingDown = 7,
};
struct RejectData {
  RejectReason reason = RejectReason::kServerError;
  std::string text;  // at most kMaxRejectText bytes travel
};
inline constexpr size_t kMaxRejectText = 120;
std::vector<uint8_t> EncodeReject(const RejectData& d);
// False when the blob is not an rdkv reject (e.g. rdma_cm's own, or zero padding).
bool DecodeReject(std::span<const uint8_t> data, RejectData* out);
// The Status a client reports for a reject: kPermissionDenied for kBadToken, etc.
Status RejectToStatus(const RejectData& r, std::string_view peer);

// ---- Fragments -------------------------------------------------------------------------------
enum class MsgType : uint8_t {
  kRequest = 1,        // client -> server
  kResponse = 2,       // server -> client
  kCredit = 3,         // either way: returns credits only, no payload
  kErrorResponse = 4,  // server -> client: payload = 1 byte StatusCode + text
};

struct FragmentHeader {
  MsgType type = MsgType::kCredit;
  uint32_t credits = 0;  // receive credits returned to the receiver of this fragment
  uint64_t id = 0;       // request id (responses echo it)
  uint32_t total = 0;    // payload bytes of the whole message
  uint32_t offset = 0;   // where this fragment's payload goes in the message
  uint32_t length = 0;   // payload bytes in this fragment
};
void EncodeFragmentHeader(const FragmentHeader& h, uint8_t* out);  // kFragmentHeaderSize bytes
// Checks the header against the received byte count and max_message (the receiver's limit).
// Returns false (and a reason) for anything malformed.
bool DecodeFragmentHeader(const uint8_t* data, size_t byte_len, size_t max_message,
                          FragmentHeader* out, const char** why);

}  // namespace rdkv::transport::verbs

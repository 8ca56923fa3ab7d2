// Wire formats of the verbs transport: the rdma_cm private data of the handshake, the handshake
// messages on the new queue pair, and the header of every two-sided fragment. All integers are
// little-endian; docs/transport-verbs.md has the byte layouts. Pure functions, host-testable
// (tests/transport/verbs_smoke_test.cc).
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/transport/auth.h"
#include "common/transport/transport.h"
#include "rdkv/status.h"

namespace rdkv::transport::verbs {

inline constexpr uint32_t kWireMagic = 0x564B4452;  // bytes "RDKV"
inline constexpr uint16_t kProtocolVersion = 2;     // 1: token digest in the connect request

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

// ---- Handshake (protocol version 2; docs/security.md "The handshake (verbs)") ----------------
// The mutual challenge-response of common/transport/auth.h, carried by rdma_cm and the new QP:
//   connect request  (rdma_connect private data)  role, credits, limit, client nonce Nc
//   accept           (rdma_accept private data)   credits, limit, session id, Ns, server proof
//   AUTH_PROOF       (first SEND on the QP)       client proof
//   WELCOME          (SEND)                        the regions (per-connection rkeys)
//   or AUTH_REFUSED  (SEND, then disconnect)       code and reason
// The transcript both proofs cover is HandshakeTranscript(connect request, accept head): every
// byte either side sent before the proofs.
struct ConnectRequestData {  // client -> server, in rdma_connect's private data
  uint16_t version = kProtocolVersion;
  SessionRole role = SessionRole::kData;
  uint32_t credits = 0;      // receives the client granted the server
  uint32_t max_message = 0;  // largest response payload the client accepts
  auth::Nonce client_nonce{};
};
inline constexpr size_t kConnectRequestSize = 48;
std::array<uint8_t, kConnectRequestSize> EncodeConnectRequest(const ConnectRequestData& d);
// kProtocolError for a short or foreign blob, an unknown role or nonzero reserved bytes;
// kNotSupported for another protocol version. Bytes past kConnectRequestSize (rdma_cm's zero
// padding) are ignored.
Status DecodeConnectRequest(std::span<const uint8_t> data, ConnectRequestData* out);

inline constexpr uint16_t kAcceptFlagMemoryWindows = 1;  // per-connection type-2 MWs in use

struct AcceptData {  // server -> client, in rdma_accept's private data
  uint16_t version = kProtocolVersion;
  uint16_t flags = 0;
  uint32_t credits = 0;      // receives (SRQ-backed) the server granted the client
  uint32_t max_message = 0;  // largest request payload the server accepts
  uint64_t session_id = 0;
  auth::Nonce server_nonce{};
  auth::Mac server_proof{};
};
inline constexpr size_t kAcceptHeadSize = 24 + auth::kNonceSize;  // what the transcript covers
inline constexpr size_t kAcceptSize = kAcceptHeadSize + auth::kMacSize;  // 88
std::array<uint8_t, kAcceptSize> EncodeAccept(const AcceptData& d);
Status DecodeAccept(std::span<const uint8_t> data, AcceptData* out);

// The context both proofs are computed over: the connect request's kConnectRequestSize bytes
// followed by the accept's first kAcceptHeadSize bytes (everything but the server proof).
std::array<uint8_t, kConnectRequestSize + kAcceptHeadSize> HandshakeTranscript(
    std::span<const uint8_t, kConnectRequestSize> request,
    std::span<const uint8_t, kAcceptHeadSize> accept_head);

// WELCOME payload (server -> client, after the client's proof checked out):
//   flags u16 | keepalive_s u16 | region_count u32 |
//   region_count x {addr u64 | length u64 | rkey u32 | layout u32}
// keepalive_s: the server closes a session that sent it nothing for its idle timeout; the NIC
// serves READs without telling it, so a client that only READs sends a credit-only message
// when it has sent nothing for keepalive_s seconds (0: the server has no idle timeout).
inline constexpr size_t kRegionWireSize = 24;
inline constexpr size_t kWelcomeHeaderSize = 8;
inline constexpr size_t kMaxRegions = 64;
// The keep-alive period a server with this idle timeout asks for: a third of it, at least 1 s
// (so an idle timeout under 3 s may cut a client that only READs), at most 65535 s; 0 without
// an idle timeout.
uint16_t KeepAliveSeconds(std::chrono::milliseconds idle_timeout);

struct WelcomeData {
  uint16_t flags = 0;        // kAcceptFlagMemoryWindows: the rkeys are this connection's own
  uint16_t keepalive_s = 0;  // send something at least this often (0: no need)
  std::vector<RegionDescriptor> regions;
};
std::vector<uint8_t> EncodeWelcome(const WelcomeData& d);  // precondition: <= kMaxRegions
Status DecodeWelcome(std::span<const uint8_t> data, WelcomeData* out);

// AUTH_REFUSED payload: StatusCode u8 | reason text (at most kMaxRejectText bytes).
std::vector<uint8_t> EncodeAuthRefused(StatusCode code, std::string_view reason);
// The Status the client reports (the code, with "verbs PEER refused the connection: reason").
Status DecodeAuthRefused(std::span<const uint8_t> data, std::string_view peer);

enum class RejectReason : uint16_t {
  kBadToken = 1,  // the requested role cannot be had (admin without an admin secret, remote)
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
  kAuthProof = 5,      // client -> server, first message: the client proof (auth::AuthProof)
  kWelcome = 6,        // server -> client: WelcomeData
  kAuthRefused = 7,    // server -> client: the proof failed; the server disconnects next
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

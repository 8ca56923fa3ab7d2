// Session authentication shared by every transport (tcp and verbs): a mutual challenge-response
// over HMAC-SHA256 (OpenSSL). See docs/security.md for the threat model.
//
//   client -> server  HELLO     role, client nonce Nc (32 random bytes)
//   server -> client  CHALLENGE server nonce Ns, server proof = HMAC(K, "server" | T)
//   client -> server  PROOF     client proof = HMAC(K, "client" | T)
//   server -> client  WELCOME   (regions) or REFUSED
//
// K is the secret of the requested role (data or admin); T is the transcript: role, Nc, Ns and
// the transport's own handshake bytes (`context`: the tcp HELLO body), so no field can be
// changed in flight without the proofs failing. Nothing on the wire is the secret or a value
// that can be replayed: a proof is bound to a fresh Ns (server) and Nc (client). The client
// checks the server proof before it sends its own, so a server that does not know the secret
// learns nothing usable and the client refuses it (mutual authentication).
//
// Everything here is pure (no I/O, no logging) except RandomNonce; the decoders are fuzzed
// (tests/fuzz/auth_fuzz.cc). Thread-safety: all functions are safe from any thread.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "common/transport/transport.h"
#include "rdkv/status.h"

namespace rdkv::transport::auth {

inline constexpr size_t kNonceSize = 32;
inline constexpr size_t kMacSize = 32;  // HMAC-SHA256
using Nonce = std::array<uint8_t, kNonceSize>;
using Mac = std::array<uint8_t, kMacSize>;

// 32 bytes from OpenSSL's CSPRNG. kInternal when it cannot produce them (then no handshake
// may proceed).
Result<Nonce> RandomNonce();

// ---- Messages (little-endian, canonical: reserved bytes must be zero) ------------------------
// AUTH_HELLO: role u8 (SessionRole) | reserved 3 bytes | client nonce (32)
struct AuthHello {
  SessionRole role = SessionRole::kData;
  Nonce client_nonce{};
};
inline constexpr size_t kAuthHelloSize = 4 + kNonceSize;
void EncodeAuthHello(const AuthHello& hello, std::span<uint8_t, kAuthHelloSize> out);
// kProtocolError for a wrong length, an unknown role or nonzero reserved bytes.
Result<AuthHello> DecodeAuthHello(std::span<const uint8_t> bytes);

// AUTH_CHALLENGE: server nonce (32) | server proof (32)
struct AuthChallenge {
  Nonce server_nonce{};
  Mac server_proof{};
};
inline constexpr size_t kAuthChallengeSize = kNonceSize + kMacSize;
void EncodeAuthChallenge(const AuthChallenge& c, std::span<uint8_t, kAuthChallengeSize> out);
Result<AuthChallenge> DecodeAuthChallenge(std::span<const uint8_t> bytes);

// AUTH_PROOF: client proof (32)
struct AuthProof {
  Mac client_proof{};
};
inline constexpr size_t kAuthProofSize = kMacSize;
void EncodeAuthProof(const AuthProof& p, std::span<uint8_t, kAuthProofSize> out);
Result<AuthProof> DecodeAuthProof(std::span<const uint8_t> bytes);

// ---- Proofs ----------------------------------------------------------------------------------
enum class Side : uint8_t { kServer = 1, kClient = 2 };
// HMAC-SHA256(secret, "rdkv-auth-v1" | side | role | Nc | Ns | len(context) | context).
// An empty secret is a valid key (an open server still proves the transcript).
Mac ComputeProof(Side side, std::string_view secret, SessionRole role, const Nonce& client_nonce,
                 const Nonce& server_nonce, std::span<const uint8_t> context);
// Constant time (CRYPTO_memcmp).
bool ProofsEqual(const Mac& a, const Mac& b);

// ---- Server policy ---------------------------------------------------------------------------
// What a listener knows: the data secret (empty: data access is open), the admin secret (empty:
// admin is granted only to loopback peers, see GrantRole) and whether loopback counts.
struct ServerSecrets {
  std::string data;
  std::string admin;
  bool loopback_admin = true;
};

// The key a peer asking for `role` must prove, or kPermissionDenied (with the reason to send)
// when that role cannot be had from this peer at all: admin without an admin secret configured
// from a non-loopback peer.
Result<std::string_view> ServerKeyFor(const ServerSecrets& secrets, SessionRole role,
                                      bool peer_is_loopback);
// The role a peer gets once its proof for `requested` checked out: admin for an admin proof;
// for a data proof, admin too when no admin secret is configured and the peer is on loopback
// (protected mode, like Redis), else data.
SessionRole GrantRole(const ServerSecrets& secrets, SessionRole requested, bool peer_is_loopback);
// Which secret a peer asking for `requested` proves (the one ServerKeyFor gives): kAdmin for
// the admin secret; kData for the data secret, which a protected-mode admin proves too.
SessionRole ProvenSecret(const ServerSecrets& secrets, SessionRole requested);
// The one revocation rule of both transports' RotateSecrets: a session (or a handshake waiting
// for its PROOF) that proved `proven` and holds `granted` is revoked when the secret it proved
// changed, and an admin one also when the admin secret changed (a protected-mode admin is admin
// only while no admin secret is configured).
bool RevokedByRotation(SessionRole proven, SessionRole granted, bool data_changed,
                       bool admin_changed);

std::string_view RoleName(SessionRole role);

}  // namespace rdkv::transport::auth

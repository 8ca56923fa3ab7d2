#include "common/transport/auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <algorithm>
#include <cstring>
#include <vector>

namespace rdkv::transport::auth {

namespace {

constexpr std::string_view kLabel = "rdkv-auth-v1";

bool KnownRole(uint8_t r) {
  return r == static_cast<uint8_t>(SessionRole::kData) ||
         r == static_cast<uint8_t>(SessionRole::kAdmin);
}

Status Bad(std::string_view what, const std::string& detail) {
  return Status::ProtocolError(std::string(what) + ": " + detail);
}

}  // namespace

Result<Nonce> RandomNonce() {
  Nonce n{};
  if (RAND_bytes(n.data(), static_cast<int>(n.size())) != 1) {
    return Status::Internal(
        "OpenSSL RAND_bytes failed: no random nonce for the handshake (check the system's "
        "entropy source)");
  }
  return n;
}

void EncodeAuthHello(const AuthHello& hello, std::span<uint8_t, kAuthHelloSize> out) {
  out[0] = static_cast<uint8_t>(hello.role);
  out[1] = out[2] = out[3] = 0;
  std::copy(hello.client_nonce.begin(), hello.client_nonce.end(), out.begin() + 4);
}

Result<AuthHello> DecodeAuthHello(std::span<const uint8_t> bytes) {
  if (bytes.size() != kAuthHelloSize) {
    return Bad("auth hello",
               std::to_string(bytes.size()) + " bytes, expected " + std::to_string(kAuthHelloSize));
  }
  if (!KnownRole(bytes[0])) return Bad("auth hello", "unknown role " + std::to_string(bytes[0]));
  if (bytes[1] != 0 || bytes[2] != 0 || bytes[3] != 0) {
    return Bad("auth hello", "nonzero reserved bytes");
  }
  AuthHello h;
  h.role = static_cast<SessionRole>(bytes[0]);
  std::copy_n(bytes.begin() + 4, kNonceSize, h.client_nonce.begin());
  return h;
}

void EncodeAuthChallenge(const AuthChallenge& c, std::span<uint8_t, kAuthChallengeSize> out) {
  std::copy(c.server_nonce.begin(), c.server_nonce.end(), out.begin());
  std::copy(c.server_proof.begin(), c.server_proof.end(), out.begin() + kNonceSize);
}

Result<AuthChallenge> DecodeAuthChallenge(std::span<const uint8_t> bytes) {
  if (bytes.size() != kAuthChallengeSize) {
    return Bad("auth challenge", std::to_string(bytes.size()) + " bytes, expected " +
                                     std::to_string(kAuthChallengeSize));
  }
  AuthChallenge c;
  std::copy_n(bytes.begin(), kNonceSize, c.server_nonce.begin());
  std::copy_n(bytes.begin() + kNonceSize, kMacSize, c.server_proof.begin());
  return c;
}

void EncodeAuthProof(const AuthProof& p, std::span<uint8_t, kAuthProofSize> out) {
  std::copy(p.client_proof.begin(), p.client_proof.end(), out.begin());
}

Result<AuthProof> DecodeAuthProof(std::span<const uint8_t> bytes) {
  if (bytes.size() != kAuthProofSize) {
    return Bad("auth proof",
               std::to_string(bytes.size()) + " bytes, expected " + std::to_string(kAuthProofSize));
  }
  AuthProof p;
  std::copy_n(bytes.begin(), kMacSize, p.client_proof.begin());
  return p;
}

Mac ComputeProof(Side side, std::string_view secret, SessionRole role, const Nonce& client_nonce,
                 const Nonce& server_nonce, std::span<const uint8_t> context) {
  // label | side | role | client nonce | server nonce | u32 context length (LE) | context,
  // written at fixed offsets into a buffer of the exact size.
  std::vector<uint8_t> msg(kLabel.size() + 2 + 2 * kNonceSize + 4 + context.size());
  uint8_t* p = msg.data();
  std::memcpy(p, kLabel.data(), kLabel.size());
  p += kLabel.size();
  *p++ = static_cast<uint8_t>(side);
  *p++ = static_cast<uint8_t>(role);
  std::memcpy(p, client_nonce.data(), kNonceSize);
  p += kNonceSize;
  std::memcpy(p, server_nonce.data(), kNonceSize);
  p += kNonceSize;
  const uint32_t n = static_cast<uint32_t>(context.size());
  for (int i = 0; i < 4; ++i) *p++ = static_cast<uint8_t>(n >> (8 * i));
  if (!context.empty()) std::memcpy(p, context.data(), context.size());
  Mac out{};
  unsigned int len = 0;
  // A zero-length key is valid for HMAC; OpenSSL wants a non-null pointer for it.
  static const uint8_t kEmpty = 0;
  const void* key = secret.empty() ? static_cast<const void*>(&kEmpty) : secret.data();
  if (HMAC(EVP_sha256(), key, static_cast<int>(secret.size()), msg.data(), msg.size(), out.data(),
           &len) == nullptr ||
      len != kMacSize) {
    // Cannot happen with SHA-256 in a working libcrypto; a random MAC makes every proof fail
    // instead of matching a predictable value.
    RAND_bytes(out.data(), static_cast<int>(out.size()));
  }
  return out;
}

bool ProofsEqual(const Mac& a, const Mac& b) {
  return CRYPTO_memcmp(a.data(), b.data(), kMacSize) == 0;
}

Result<std::string_view> ServerKeyFor(const ServerSecrets& secrets, SessionRole role,
                                      bool peer_is_loopback) {
  if (role == SessionRole::kData) return std::string_view(secrets.data);
  if (!secrets.admin.empty()) return std::string_view(secrets.admin);
  if (secrets.loopback_admin && peer_is_loopback) return std::string_view(secrets.data);
  return Status::PermissionDenied(
      "the admin role needs an admin secret and this server has none configured: admin access "
      "is allowed only from loopback (start the server with --admin_token_file)");
}

SessionRole GrantRole(const ServerSecrets& secrets, SessionRole requested, bool peer_is_loopback) {
  if (requested == SessionRole::kAdmin) return SessionRole::kAdmin;
  if (secrets.admin.empty() && secrets.loopback_admin && peer_is_loopback) {
    return SessionRole::kAdmin;
  }
  return SessionRole::kData;
}

SessionRole ProvenSecret(const ServerSecrets& secrets, SessionRole requested) {
  return requested == SessionRole::kAdmin && !secrets.admin.empty() ? SessionRole::kAdmin
                                                                    : SessionRole::kData;
}

bool RevokedByRotation(SessionRole proven, SessionRole granted, bool data_changed,
                       bool admin_changed) {
  const bool secret_changed = proven == SessionRole::kAdmin ? admin_changed : data_changed;
  return secret_changed || (granted == SessionRole::kAdmin && admin_changed);
}

std::string_view RoleName(SessionRole role) {
  switch (role) {
    case SessionRole::kData:
      return "data";
    case SessionRole::kAdmin:
      return "admin";
  }
  return "unknown";
}

}  // namespace rdkv::transport::auth

// The shared handshake (common/transport/auth.h): message parsers under random and mutated
// input (a deterministic, always-run companion of tests/fuzz/session_auth_fuzz.cc), proof
// properties, and the server's role policy.
#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "common/transport/auth.h"
#include "common/transport/tcp/frame.h"

namespace rdkv::transport::auth {
namespace {

TEST(SessionAuth, ParsersAcceptOnlyCanonicalMessagesUnderMutation) {
  std::mt19937_64 rng(12345);
  auto nonce = RandomNonce();
  ASSERT_TRUE(nonce.ok());
  uint8_t hello[kAuthHelloSize];
  EncodeAuthHello({SessionRole::kAdmin, *nonce}, hello);
  uint8_t challenge[kAuthChallengeSize];
  EncodeAuthChallenge({*nonce, Mac{}}, challenge);
  const std::vector<std::vector<uint8_t>> seeds = {
      {hello, hello + sizeof hello},
      {challenge, challenge + sizeof challenge},
      std::vector<uint8_t>(kAuthProofSize, 0xab),
      tcp::EncodeHello({tcp::kProtocolVersion, 4096, {SessionRole::kData, *nonce}}),
  };
  int accepted = 0;
  for (int iter = 0; iter < 200000; ++iter) {
    std::vector<uint8_t> in = seeds[iter % seeds.size()];
    int mutations = 1 + static_cast<int>(rng() % 4);
    for (int m = 0; m < mutations; ++m) {
      switch (rng() % 4) {
        case 0:
          if (!in.empty()) in[rng() % in.size()] = static_cast<uint8_t>(rng());
          break;
        case 1:
          if (!in.empty()) in.resize(rng() % in.size());
          break;
        case 2:
          in.push_back(static_cast<uint8_t>(rng()));
          break;
        default:
          if (!in.empty()) in[rng() % in.size()] ^= static_cast<uint8_t>(1u << (rng() % 8));
      }
    }
    if (auto h = DecodeAuthHello(in); h.ok()) {
      ++accepted;
      uint8_t out[kAuthHelloSize];
      EncodeAuthHello(*h, out);
      ASSERT_EQ(std::vector<uint8_t>(out, out + sizeof out), in);
      ASSERT_TRUE(h->role == SessionRole::kData || h->role == SessionRole::kAdmin);
    }
    if (auto c = DecodeAuthChallenge(in); c.ok()) {
      uint8_t out[kAuthChallengeSize];
      EncodeAuthChallenge(*c, out);
      ASSERT_EQ(std::vector<uint8_t>(out, out + sizeof out), in);
    }
    if (auto p = DecodeAuthProof(in); p.ok()) {
      uint8_t out[kAuthProofSize];
      EncodeAuthProof(*p, out);
      ASSERT_EQ(std::vector<uint8_t>(out, out + sizeof out), in);
    }
    // The tcp HELLO body as a whole (the frame minus its header).
    if (in.size() > tcp::kFrameHeaderSize) {
      std::span<const uint8_t> body(in.data() + tcp::kFrameHeaderSize,
                                    in.size() - tcp::kFrameHeaderSize);
      if (auto th = tcp::DecodeHello(body); th.ok()) {
        std::vector<uint8_t> re = tcp::EncodeHello(*th);
        ASSERT_TRUE(
            std::equal(body.begin(), body.end(), re.begin() + tcp::kFrameHeaderSize, re.end()));
      }
    }
  }
  EXPECT_GT(accepted, 0);  // the mutations do reach the accepting paths
  // Explicit rejections.
  std::vector<uint8_t> h(hello, hello + sizeof hello);
  h[0] = 0;
  EXPECT_FALSE(DecodeAuthHello(h).ok());
  h[0] = 3;
  EXPECT_FALSE(DecodeAuthHello(h).ok());
  h[0] = 1;
  h[3] = 1;
  EXPECT_FALSE(DecodeAuthHello(h).ok());
  EXPECT_FALSE(DecodeAuthChallenge(std::span(challenge, sizeof challenge - 1)).ok());
  EXPECT_FALSE(DecodeAuthProof({}).ok());
}

TEST(SessionAuth, ProofsBindSecretRoleSideNoncesAndContext) {
  auto nc = RandomNonce(), ns = RandomNonce();
  ASSERT_TRUE(nc.ok() && ns.ok());
  EXPECT_NE(*nc, *ns);  // fresh randomness
  std::vector<uint8_t> ctx = {1, 2, 3};
  Mac m = ComputeProof(Side::kClient, "s", SessionRole::kData, *nc, *ns, ctx);
  EXPECT_TRUE(ProofsEqual(m, ComputeProof(Side::kClient, "s", SessionRole::kData, *nc, *ns, ctx)));
  EXPECT_FALSE(ProofsEqual(m, ComputeProof(Side::kClient, "t", SessionRole::kData, *nc, *ns, ctx)));
  EXPECT_FALSE(ProofsEqual(m, ComputeProof(Side::kServer, "s", SessionRole::kData, *nc, *ns, ctx)));
  EXPECT_FALSE(
      ProofsEqual(m, ComputeProof(Side::kClient, "s", SessionRole::kAdmin, *nc, *ns, ctx)));
  EXPECT_FALSE(ProofsEqual(m, ComputeProof(Side::kClient, "s", SessionRole::kData, *ns, *nc, ctx)));
  std::vector<uint8_t> ctx2 = {1, 2, 4};
  EXPECT_FALSE(
      ProofsEqual(m, ComputeProof(Side::kClient, "s", SessionRole::kData, *nc, *ns, ctx2)));
  // An empty secret is a key like any other (an open server), distinct from a set one.
  EXPECT_FALSE(ProofsEqual(ComputeProof(Side::kClient, "", SessionRole::kData, *nc, *ns, ctx),
                           ComputeProof(Side::kClient, "x", SessionRole::kData, *nc, *ns, ctx)));
  // Known answer: HMAC-SHA256("key", "rdkv-auth-v1" 02 01 <64 zero bytes> 00000000), computed
  // independently (Python hmac). A change of the MAC input would break every peer.
  Nonce z{};
  Mac kat = ComputeProof(Side::kClient, "key", SessionRole::kData, z, z, {});
  const char* want = "9264096cbd849f8969c1de837b345a5fd78c94ad1afdd54ac376a3973c989892";
  std::string hex;
  for (uint8_t b : kat) {
    char buf[3];
    std::snprintf(buf, sizeof buf, "%02x", b);
    hex += buf;
  }
  EXPECT_EQ(hex, want);
}

TEST(SessionAuth, RolePolicy) {
  ServerSecrets open{"", "", true};
  EXPECT_TRUE(ServerKeyFor(open, SessionRole::kData, false).ok());
  EXPECT_EQ(GrantRole(open, SessionRole::kData, false), SessionRole::kData);
  EXPECT_EQ(GrantRole(open, SessionRole::kData, true), SessionRole::kAdmin);  // protected mode
  EXPECT_FALSE(ServerKeyFor(open, SessionRole::kAdmin, false).ok());
  EXPECT_TRUE(ServerKeyFor(open, SessionRole::kAdmin, true).ok());
  ServerSecrets no_loop{"", "", false};
  EXPECT_EQ(GrantRole(no_loop, SessionRole::kData, true), SessionRole::kData);
  EXPECT_FALSE(ServerKeyFor(no_loop, SessionRole::kAdmin, true).ok());
  ServerSecrets both{"d", "a", true};
  EXPECT_EQ(*ServerKeyFor(both, SessionRole::kData, true), "d");
  EXPECT_EQ(*ServerKeyFor(both, SessionRole::kAdmin, false), "a");
  EXPECT_EQ(GrantRole(both, SessionRole::kData, true), SessionRole::kData);  // no upgrade
  EXPECT_EQ(GrantRole(both, SessionRole::kAdmin, false), SessionRole::kAdmin);
  ServerSecrets data_only{"d", "", true};
  EXPECT_EQ(*ServerKeyFor(data_only, SessionRole::kAdmin, true), "d");
  EXPECT_FALSE(ServerKeyFor(data_only, SessionRole::kAdmin, false).ok());
}

// Which secret a session proved, and when rotating the secrets revokes it: the secret it proved
// changed, or (admin sessions) the admin secret changed. A protected-mode admin proved the data
// secret, so either change revokes it.
TEST(SessionAuth, RevocationFollowsTheSecretProved) {
  ServerSecrets data_only{"d", "", true};
  ServerSecrets both{"d", "a", true};
  EXPECT_EQ(ProvenSecret(data_only, SessionRole::kAdmin), SessionRole::kData);  // protected mode
  EXPECT_EQ(ProvenSecret(data_only, SessionRole::kData), SessionRole::kData);
  EXPECT_EQ(ProvenSecret(both, SessionRole::kAdmin), SessionRole::kAdmin);
  EXPECT_EQ(ProvenSecret(both, SessionRole::kData), SessionRole::kData);
  const SessionRole kD = SessionRole::kData, kA = SessionRole::kAdmin;
  // proven, granted, data changed, admin changed
  EXPECT_TRUE(RevokedByRotation(kD, kD, true, false));
  EXPECT_FALSE(RevokedByRotation(kD, kD, false, true));
  EXPECT_TRUE(RevokedByRotation(kA, kA, false, true));
  EXPECT_FALSE(RevokedByRotation(kA, kA, true, false));
  EXPECT_TRUE(RevokedByRotation(kD, kA, true, false));  // protected mode: its data secret went
  EXPECT_TRUE(RevokedByRotation(kD, kA, false, true));  // an admin secret now exists
  EXPECT_FALSE(RevokedByRotation(kD, kA, false, false));
}

}  // namespace
}  // namespace rdkv::transport::auth

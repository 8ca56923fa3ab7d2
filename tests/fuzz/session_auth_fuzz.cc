// libFuzzer target for the handshake messages of common/transport/auth.h (used by both
// transports): every decoder must refuse or accept without crashing, and what it accepts must
// re-encode to the same bytes (one canonical encoding). Also checks that a proof never verifies
// under a different secret, role, nonce or context derived from the input.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <string_view>

#include "common/transport/auth.h"

namespace {

using namespace rdkv::transport;

void Check(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::span<const uint8_t> in(data, size);
  if (auto h = auth::DecodeAuthHello(in); h.ok()) {
    uint8_t out[auth::kAuthHelloSize];
    auth::EncodeAuthHello(*h, out);
    Check(size == sizeof out && std::equal(in.begin(), in.end(), out));
  }
  if (auto c = auth::DecodeAuthChallenge(in); c.ok()) {
    uint8_t out[auth::kAuthChallengeSize];
    auth::EncodeAuthChallenge(*c, out);
    Check(size == sizeof out && std::equal(in.begin(), in.end(), out));
  }
  if (auto p = auth::DecodeAuthProof(in); p.ok()) {
    uint8_t out[auth::kAuthProofSize];
    auth::EncodeAuthProof(*p, out);
    Check(size == sizeof out && std::equal(in.begin(), in.end(), out));
  }
  // Proofs: secret = first byte's worth of input, context = the rest.
  if (size >= 1) {
    size_t k = std::min<size_t>(data[0], size - 1);
    std::string_view secret(reinterpret_cast<const char*>(data + 1), k);
    std::span<const uint8_t> ctx = in.subspan(1 + k);
    auth::Nonce nc{}, ns{};
    nc[0] = 1;
    ns[0] = 2;
    auth::Mac a = auth::ComputeProof(auth::Side::kClient, secret, SessionRole::kData, nc, ns, ctx);
    Check(auth::ProofsEqual(
        a, auth::ComputeProof(auth::Side::kClient, secret, SessionRole::kData, nc, ns, ctx)));
    Check(!auth::ProofsEqual(
        a, auth::ComputeProof(auth::Side::kServer, secret, SessionRole::kData, nc, ns, ctx)));
    Check(!auth::ProofsEqual(
        a, auth::ComputeProof(auth::Side::kClient, secret, SessionRole::kAdmin, nc, ns, ctx)));
    Check(!auth::ProofsEqual(
        a, auth::ComputeProof(auth::Side::kClient, secret, SessionRole::kData, ns, nc, ctx)));
  }
  return 0;
}

// libFuzzer target: the verbs transport's wire decoders (common/transport/verbs/verbs_wire.h):
// the connect request and accept blobs that rdma_cm carries, rejects, the WELCOME and
// AUTH_REFUSED messages of the handshake, and fragment headers.
// None may crash or read out of bounds; what decodes must survive an encode/decode round trip
// unchanged, and a decoded fragment must lie inside its message.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

#include "common/transport/verbs/verbs_wire.h"

using namespace rdkv::transport::verbs;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::span<const uint8_t> in(data, size);
  ConnectRequestData req;
  if (DecodeConnectRequest(in, &req).ok()) {
    auto bytes = EncodeConnectRequest(req);
    ConnectRequestData again;
    if (!DecodeConnectRequest(bytes, &again).ok() || again.version != req.version ||
        again.role != req.role || again.credits != req.credits ||
        again.max_message != req.max_message || again.client_nonce != req.client_nonce ||
        std::memcmp(bytes.data(), data, bytes.size()) != 0) {
      std::abort();  // canonical: what decodes re-encodes to the same bytes
    }
  }
  AcceptData acc;
  if (DecodeAccept(in, &acc).ok()) {
    auto bytes = EncodeAccept(acc);
    if (std::memcmp(bytes.data(), data, bytes.size()) != 0) std::abort();
  }
  WelcomeData w;
  if (DecodeWelcome(in, &w).ok()) {
    if (w.regions.size() > kMaxRegions ||
        EncodeWelcome(w) != std::vector<uint8_t>(data, data + size)) {
      std::abort();
    }
  }
  rdkv::Status refused = DecodeAuthRefused(in, "fuzz");
  if (refused.ok()) std::abort();  // a refusal never decodes to OK
  RejectData rej;
  if (DecodeReject(in, &rej) && rej.text.size() > size) std::abort();
  FragmentHeader h;
  const char* why = nullptr;
  if (DecodeFragmentHeader(data, size, 1u << 20, &h, &why)) {
    if (uint64_t{h.offset} + h.length > h.total) std::abort();
    if (h.total > (1u << 20) && h.type != MsgType::kErrorResponse) std::abort();
  }
  return 0;
}

// libFuzzer target: the verbs transport's wire decoders (common/transport/verbs/verbs_wire.h):
// the connect request and accept blobs that rdma_cm carries, rejects, and fragment headers.
// None may crash or read out of bounds; what decodes must survive an encode/decode round trip
// unchanged, and a decoded fragment must lie inside its message.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>

#include "common/transport/verbs/verbs_wire.h"

using namespace rdkv::transport::verbs;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::span<const uint8_t> in(data, size);
  ConnectRequestData req;
  if (DecodeConnectRequest(in, &req).ok()) {
    auto bytes = EncodeConnectRequest(req);
    ConnectRequestData again;
    if (!DecodeConnectRequest(bytes, &again).ok() || again.version != req.version ||
        again.credits != req.credits || again.max_message != req.max_message ||
        again.digest != req.digest) {
      std::abort();
    }
  }
  AcceptData acc;
  if (DecodeAccept(in, &acc).ok() && acc.regions.size() > kMaxRegions) std::abort();
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

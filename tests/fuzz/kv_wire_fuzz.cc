// libFuzzer target: the key-value request and response decoders (common/kv/wire.h) and the
// item check clients run on bytes READ from a server (common/kv/layout.h). None may crash,
// read out of bounds, or accept what it should not.
#include <cstddef>
#include <cstdint>
#include <algorithm>
#include <cstdlib>
#include <span>
#include <string_view>
#include <vector>

#include "common/kv/layout.h"
#include "common/kv/wire.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::span<const uint8_t> in(data, size);
  rdkv::kv::WireLimits limits{1024, 4096};
  rdkv::Result<rdkv::kv::Request> req = rdkv::kv::DecodeRequest(in, limits);
  if (req.ok()) {
    // A decoded request re-encodes to the same bytes.
    std::vector<uint8_t> again;
    rdkv::kv::EncodeRequest(*req, &again);
    if (again.size() != size || !std::equal(again.begin(), again.end(), data)) std::abort();
  }
  rdkv::Result<rdkv::kv::Response> resp = rdkv::kv::DecodeResponse(in);
  if (resp.ok() && resp->body.size() > size) std::abort();
  // Shard scan bodies (admin responses): entries never point outside the input.
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto entries = rdkv::kv::DecodeScanEntries(text, limits);
  if (entries.ok()) {
    for (const auto& e : *entries) {
      if (e.key.data() < text.data() || e.value.data() + e.value.size() > text.data() + size) std::abort();
    }
  }
  // Bytes READ from a region: the check must never accept a wrong key.
  std::string_view value;
  uint64_t version = 0;
  if (rdkv::kv::CheckItem(data, size, "fuzz-key", &value, &version) == rdkv::kv::ItemCheck::kOk) {
    if (size < sizeof(rdkv::kv::ItemHeader) + 8 ||
        std::string_view(reinterpret_cast<const char*>(data) + sizeof(rdkv::kv::ItemHeader), 8) !=
            "fuzz-key") {
      std::abort();
    }
  }
  return 0;
}

// libFuzzer target: what rdkv reads from etcd's JSON gateway besides the cluster map
// (cluster_map_fuzz): a watch stream's message (common/etcd/codec.h ParseWatchMessage), a
// KeyValue object, base64 fields, and a server's registration value (common/cluster/etcd_map.h).
// No input may throw or crash; a registration that parses writes back to one that parses the
// same, and every string base64-encodes and decodes to itself.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/cluster/etcd_map.h"
#include "common/etcd/codec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace internal = rdkv::etcd::internal;
  const std::string in(reinterpret_cast<const char*>(data), size);
  internal::WatchMessage m = internal::ParseWatchMessage(in);
  if (m.ignored && (m.created || m.canceled || !m.events.empty())) std::abort();
  for (const auto& e : m.events) {
    if (!e.ok() && e.status().code() != rdkv::StatusCode::kProtocolError) std::abort();
  }
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!j.is_discarded()) {
    (void)internal::KeyValueFromJson(j);
    if (j.is_object()) (void)internal::Int64Field(j, "revision");
  }
  rdkv::Result<std::string> decoded = internal::Base64Decode(in);
  if (decoded.ok() && decoded->size() > in.size()) std::abort();
  rdkv::Result<std::string> again = internal::Base64Decode(internal::Base64Encode(in));
  if (!again.ok() || *again != in) std::abort();
  rdkv::Result<rdkv::cluster::RegistrationValue> r = rdkv::cluster::ParseRegistrationJson(in);
  if (r.ok()) {
    const std::string written = rdkv::cluster::RegistrationJson(*r);
    rdkv::Result<rdkv::cluster::RegistrationValue> back =
        rdkv::cluster::ParseRegistrationJson(written);
    if (!back.ok() || rdkv::cluster::RegistrationJson(*back) != written) std::abort();
  }
  return 0;
}

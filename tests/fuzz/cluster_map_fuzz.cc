// libFuzzer target: the cluster map as servers and tools read it (common/cluster/cluster_map.h).
// A map comes off the wire (INSTALL_MAP, a CLUSTER_MAP answer, etcd's value through the watch):
// no input may throw or crash, and a map that parses is one that ToJson writes back the same
// (its compact JSON parses again to the same compact JSON, within kMaxMapJsonBytes).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "common/cluster/cluster_map.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  rdkv::Result<rdkv::cluster::ClusterMap> m = rdkv::cluster::ParseClusterMap(in);
  if (!m.ok()) return 0;
  const std::string compact = m->ToJson();
  if (compact.size() > rdkv::cluster::kMaxMapJsonBytes) std::abort();
  rdkv::Result<rdkv::cluster::ClusterMap> again = rdkv::cluster::ParseClusterMap(compact);
  if (!again.ok() || again->ToJson() != compact) std::abort();
  for (uint32_t s = 0; s < m->shards; ++s) {
    // Every joining pair's epoch, when said, is one of the map's.
    for (uint32_t id : m->joining[s]) {
      if (m->JoinedAt(s, id) > m->epoch) std::abort();
    }
    (void)m->ReplicasOf(s);
  }
  (void)m->ToPrettyJson();
  return 0;
}

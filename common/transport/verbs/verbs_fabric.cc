#include "common/transport/verbs/verbs_fabric.h"

namespace rdkv::transport {

Result<std::unique_ptr<Fabric>> CreateVerbsFabric(const FabricOptions&) {
  return Status::NotSupported("verbs transport not built yet");
}

}  // namespace rdkv::transport

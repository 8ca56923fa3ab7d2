#include "common/transport/tcp/tcp_fabric.h"

namespace rdkv::transport {

Result<std::unique_ptr<Fabric>> CreateTcpFabric(const FabricOptions&) {
  return Status::NotSupported("tcp transport not built yet");
}

}  // namespace rdkv::transport

// Entry point of the tcp transport (see common/transport/transport.h for the contract).
#pragma once

#include <memory>

#include "common/transport/transport.h"

namespace rdkv::transport {

Result<std::unique_ptr<Fabric>> CreateTcpFabric(const FabricOptions& options);

}  // namespace rdkv::transport

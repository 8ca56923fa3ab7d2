// Entry point of the verbs transport (see common/transport/transport.h for the contract).
#pragma once

#include <memory>

#include "common/transport/transport.h"

namespace rdkv::transport {

Result<std::unique_ptr<Fabric>> CreateVerbsFabric(const FabricOptions& options);

}  // namespace rdkv::transport

// Client side of the tcp transport: one TCP connection to a TcpListener, read by whichever
// caller is waiting (no thread of its own), which completes READs and Calls. See
// docs/transport-tcp.md "Client: the waiting caller reads".
#pragma once

#include <memory>

#include "common/transport/tcp/region_registry.h"
#include "common/transport/transport.h"

namespace rdkv::transport::tcp {

// Connects, authenticates and returns a ready connection (control path).
// Errors: kUnavailable (cannot connect), kTimedOut (connect_timeout), kPermissionDenied (the
// server refused the token), kProtocolError (version mismatch or a malformed handshake),
// kInvalidArgument (bad options).
Result<std::unique_ptr<Connection>> CreateTcpConnection(const ConnectOptions& options,
                                                        std::shared_ptr<RegionRegistry> registry);

}  // namespace rdkv::transport::tcp

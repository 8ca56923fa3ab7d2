// Entry point of the verbs transport (see common/transport/transport.h for the contract and
// docs/transport-verbs.md for the design: objects, threads, sizing, credits, error model).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>

#include "common/transport/transport.h"

namespace rdkv::transport {

Result<std::unique_ptr<Fabric>> CreateVerbsFabric(const FabricOptions& options);

// Every Connection made by a verbs Fabric is a VerbsConnection; tests reach these hooks with
// dynamic_cast<VerbsConnection*>(connection.get()). Not for production code.
class VerbsConnection : public Connection {
 public:
  // Posts one signaled RDMA WRITE of `local` (inside a MemoryRegion of this Fabric, `lkey`) to
  // remote_addr/rkey and waits for its completion. Returns the work completion's status as an
  // int (IBV_WC_SUCCESS is 0, IBV_WC_REM_ACCESS_ERR is 10), kTimedOut if no completion came, or
  // kConnectionLost if the connection was already broken. Server regions are registered without
  // IBV_ACCESS_REMOTE_WRITE, so against them this must complete with IBV_WC_REM_ACCESS_ERR, which
  // (RC semantics) also moves this connection's queue pair to the error state.
  virtual Result<int> PostWriteForTest(std::span<const uint8_t> local, uint32_t lkey,
                                       uint64_t remote_addr, uint32_t rkey,
                                       std::chrono::milliseconds timeout) = 0;

  // PostReads normally checks each READ against the regions of the handshake and completes a
  // READ outside them at once with kRemoteAccessError, without touching the queue pair. Turning
  // the check off sends such READs to the NIC, which refuses them with IBV_WC_REM_ACCESS_ERR and
  // moves the queue pair to the error state (the connection dies): the test of that path.
  virtual void SetLocalReadCheckForTest(bool enabled) = 0;
};

}  // namespace rdkv::transport

// Entry point of the verbs transport (see common/transport/transport.h for the contract and
// docs/transport-verbs.md for the design: objects, threads, sizing, credits, error model).
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
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
  // kConnectionLost if the connection was already broken. Server queue pairs allow remote READ
  // only and server regions are registered without IBV_ACCESS_REMOTE_WRITE, so against them this
  // must complete with IBV_WC_REM_INV_REQ_ERR (the QP refuses the opcode) or
  // IBV_WC_REM_ACCESS_ERR, which (RC semantics) also moves this connection's QP to the error state.
  virtual Result<int> PostWriteForTest(std::span<const uint8_t> local, uint32_t lkey,
                                       uint64_t remote_addr, uint32_t rkey,
                                       std::chrono::milliseconds timeout) = 0;

  // PostReads normally checks each READ against the regions of the handshake and completes a
  // READ outside them at once with kRemoteAccessError, without touching the queue pair. Turning
  // the check off sends such READs to the NIC, which refuses them with IBV_WC_REM_ACCESS_ERR and
  // moves the queue pair to the error state (the connection dies): the test of that path.
  virtual void SetLocalReadCheckForTest(bool enabled) = 0;

  // True when the server bound a type-2 memory window to this connection's queue pair: the
  // rkeys in regions() are this connection's own, useless on any other queue pair and dead once
  // this connection closes. False when the server's device has no type-2 windows (it logs so)
  // and hands out its regions' own rkeys.
  virtual bool per_connection_windows() const = 0;
};

// Test hooks into the verbs handshake (tests/transport/verbs_auth_test.cc): record what a
// connect sent, replay or forge it, or stop before the proof. Not for production code.
struct VerbsHandshakeTap {
  // Filled in by the connect: the client nonce it sent and the proof it sent (or would have).
  std::array<uint8_t, 32> sent_client_nonce{};
  std::array<uint8_t, 32> sent_proof{};
  // Set: sent instead of a fresh nonce / the computed proof (a replay or a forgery).
  std::optional<std::array<uint8_t, 32>> client_nonce;
  std::optional<std::array<uint8_t, 32>> proof;
  // An attacker cannot check the server's proof: go on when it is wrong.
  bool ignore_server_proof = false;
  // Stop after rdma_cm's accept, before sending the proof, and return the half-open connection
  // (regions() empty): what a client without the secret holds.
  bool stop_before_proof = false;
  // After the handshake, send whenever a send slot is free, ignoring the server's credits, and
  // return none of the server's: a client that ignores flow control.
  bool flood = false;
  // After the handshake, keep to the server's credits but return none of its: a client that
  // takes no answers.
  bool withhold_credits = false;
};
// Connect with the tap; `fabric` must be a verbs Fabric (else kInvalidArgument).
Result<std::unique_ptr<Connection>> ConnectVerbsForTest(Fabric* fabric,
                                                        const ConnectOptions& options,
                                                        VerbsHandshakeTap* tap);

}  // namespace rdkv::transport

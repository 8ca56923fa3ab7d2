// Writes: Put, Insert, Delete and Cas as requests to the key's owner (the seed when
// standalone). In a cluster a redirect (kWrongOwner) refreshes the map from the server that
// redirected and retries, until op_timeout (Router::RunRouted).
//
// Exactly once: every write carries a request id (this client's random id, a sequence number).
// A write whose outcome is unknown because its connection broke (kConnectionLost), or that a
// replicated primary could not acknowledge (the server's kUnavailable), is retried with the
// same id until op_timeout; a server that already applied it answers with the first answer
// (docs/design.md "Replication").
//
// Ownership: borrows the options, links, router and caller (they outlive it).
// Thread-safety: Write is safe from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <string_view>

#include "client/call.h"
#include "client/links.h"
#include "client/router.h"
#include "common/kv/ops.h"
#include "rdkv/client.h"

namespace rdkv::client {

class Writer {
 public:
  Writer(const ClientOptions& options, Links* links, Router* router, Caller* caller);

  // One keyed write (kv::IsWrite(op)); `expected` is CAS's expected version. Returns the
  // key's new version. Errors: kInvalidArgument for a bad key or an oversize value (before
  // sending), the server's answer (kNotFound, kAlreadyExists, kVersionMismatch), kWrongOwner
  // after op_timeout of redirects, Caller::Call's errors.
  Result<uint64_t> Write(kv::Op op, std::string_view key, std::string_view value,
                         uint64_t expected);

 private:
  const ClientOptions& options_;
  Links* const links_;
  Router* const router_;
  Caller* const caller_;
  const uint64_t client_id_;  // random, never 0
  std::atomic<uint64_t> next_seq_{1};
};

}  // namespace rdkv::client

// Writes: Put, Insert, Delete and Cas as requests to the key's owner (the seed when
// standalone). In a cluster a redirect (kWrongOwner) refreshes the map from the server that
// redirected and retries, until op_timeout (Router::RunRouted).
//
// Ownership: borrows the options, links, router and caller (they outlive it).
// Thread-safety: Write is safe from any thread.
#pragma once

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
  Writer(const ClientOptions& options, Links* links, Router* router, Caller* caller)
      : options_(options), links_(links), router_(router), caller_(caller) {}

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
};

}  // namespace rdkv::client

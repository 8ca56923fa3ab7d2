// The client's one request/response call: encodes a request, sends it over a link's session,
// decodes the answer and turns it into a Status that names the op and the server. Keyed
// writes (kv::IsWrite, the op table) are counted and evict the key's cached location.
//
// Ownership: borrows the options, the links and the counters (they outlive it).
// Thread-safety: Call is safe from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "client/counters.h"
#include "client/links.h"
#include "common/kv/wire.h"
#include "rdkv/client.h"

namespace rdkv::client {

class Caller {
 public:
  Caller(const ClientOptions& options, Links* links, Counters* counters)
      : options_(options), links_(links), counters_(counters) {}

  // One request to `link`'s server and its answer. On OK *version and *body (either may be
  // null) hold the answer's; on kWrongOwner *version holds the epoch the server reports.
  // Errors: the server's status (its message, or "<op> [of <key>] to <peer>: <code>"),
  // kInvalidArgument for a value over the server's limit (checked before sending), the
  // transport's error (kConnectionLost marks the session for reconnect), or Links::SessionOf's.
  // Every error is counted in ClientStats::errors except the answers kNotFound,
  // kAlreadyExists, kVersionMismatch, and kWrongOwner, which the caller follows.
  // `timeout` zero: options.op_timeout. *from_server (when not null) tells whether the status
  // is the server's answer (true) or the transport's / the link's (false).
  Status Call(Link& link, const kv::Request& request, uint64_t* version, std::string* body,
              std::chrono::milliseconds timeout = std::chrono::milliseconds::zero(),
              bool* from_server = nullptr);

  // Counts `error` in ClientStats::errors and returns it.
  template <typename T>
  T Fail(T error) {
    Add(counters_->errors);
    return error;
  }

 private:
  const ClientOptions& options_;
  Links* const links_;
  Counters* const counters_;
};

}  // namespace rdkv::client

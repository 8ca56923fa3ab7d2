// The request handler: decodes a two-sided request, applies it to the Store, encodes the
// response. Bad input gets an error response; it never takes the server down.
//
// Thread-safety: Handle() runs on many worker threads at once.
#pragma once

#include <atomic>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/kv/wire.h"
#include "server/store.h"

namespace rdkv::server {

struct OpCounters {
  std::atomic<uint64_t> puts{0}, inserts{0}, deletes{0}, cas{0}, stats{0}, pings{0};
  std::atomic<uint64_t> errors{0}, protocol_errors{0}, out_of_space{0};
};

class Service {
 public:
  Service(Store* store, kv::WireLimits limits) : store_(store), limits_(limits) {}

  // Appends nothing to logs on the fast path; a malformed request is logged (rate-limited)
  // and answered with kProtocolError. `response` is overwritten.
  void Handle(std::span<const uint8_t> request, std::vector<uint8_t>* response);

  const OpCounters& counters() const { return counters_; }
  // The stats body: JSON with items, bytes, free space, ops by type, errors.
  std::string StatsJson() const;

 private:
  Store* store_;
  kv::WireLimits limits_;
  OpCounters counters_;
};

}  // namespace rdkv::server

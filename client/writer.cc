#include "client/writer.h"

#include <algorithm>
#include <chrono>
#include <random>
#include <thread>
#include <utility>

#include "common/kv/layout.h"
#include "common/kv/limits.h"

namespace rdkv::client {

using Clock = std::chrono::steady_clock;

namespace {
uint64_t NewClientId() {
  std::random_device rd;
  uint64_t id = 0;
  while (id == 0) id = (uint64_t{rd()} << 32) ^ rd();
  return id;
}

// Whether a write's failure leaves its outcome unknown in a way a retry with the same request
// id resolves: the connection broke under it, or a replicated primary could not get it
// acknowledged (its kUnavailable answer).
bool RetryWithSameId(const Status& s, bool from_server) {
  return s.Is(StatusCode::kConnectionLost) || (from_server && s.Is(StatusCode::kUnavailable));
}

// A retry that timed out after the server had refused the write (kUnavailable: a replicated
// primary could not get it acknowledged) keeps that refusal's reason: the timeout alone would
// hide it (a backup that cannot be reached, servers whose admin secrets differ). The code stays
// kTimedOut; both leave the write's outcome unknown.
Status WithEarlierRefusal(Status last, const Status& refused) {
  if (!last.Is(StatusCode::kTimedOut) || refused.ok()) return last;
  return Status(last.code(), last.message() + "; the attempt before: " + refused.ToString());
}

constexpr std::chrono::milliseconds kRetryPause{20};
// A retry needs at least this much of op_timeout left; otherwise the last error stands (a
// retry with 1 ms left would only turn it into kTimedOut, which hides the reason).
constexpr std::chrono::milliseconds kMinRetryBudget{100};
}  // namespace

Writer::Writer(const ClientOptions& options, Links* links, Router* router, Caller* caller)
    : options_(options),
      links_(links),
      router_(router),
      caller_(caller),
      client_id_(NewClientId()) {}

Result<uint64_t> Writer::Write(kv::Op op, std::string_view key, std::string_view value,
                               uint64_t expected) {
  Status bad = kv::CheckKey(key);
  if (!bad.ok()) return caller_->Fail(bad);
  kv::Request req;
  req.op = op;
  req.key = key;
  req.value = value;
  req.expected_version = expected;
  req.client_id = client_id_;
  req.request_seq = next_seq_.fetch_add(1, std::memory_order_relaxed);
  uint64_t version = 0;
  const Clock::time_point deadline = Clock::now() + options_.op_timeout;
  auto left = [&] {
    return std::max(std::chrono::milliseconds(1),
                    std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
  };
  Status refused;  // the server's last kUnavailable answer (WithEarlierRefusal)
  if (!router_->cluster()) {
    for (;;) {
      bool from_server = false;
      Status s = caller_->Call(links_->seed(), req, &version, nullptr, left(), &from_server);
      if (s.ok()) return version;
      if (!RetryWithSameId(s, from_server) ||
          Clock::now() + kRetryPause + kMinRetryBudget >= deadline) {
        return WithEarlierRefusal(std::move(s), refused);
      }
      if (from_server) refused = s;
      std::this_thread::sleep_for(kRetryPause);
    }
  }
  // Cluster: to the key's owner; a redirect retries with a refreshed map until op_timeout.
  const uint64_t hash = kv::KeyHash(key);
  Status result;
  router_->RunRouted([&](const Routing& rt) -> Link* {
    Link* link = rt.owners[kv::ShardOf(hash, rt.map->shards)];
    bool from_server = false;
    result = WithEarlierRefusal(caller_->Call(*link, req, &version, nullptr, left(), &from_server),
                                refused);
    if (from_server && result.Is(StatusCode::kUnavailable)) refused = result;
    // The owner cannot be reached (it died or is cut off), or what answers at its address is
    // no rdkv server. In a cluster a failover coordinator manages (docs/design.md "Failover")
    // one is under way: ask the map again and retry, with the same id, until op_timeout.
    // Without a coordinator nothing will change: fail at once, naming the server.
    const bool unreachable =
        !from_server && rt.map->coordinated &&
        (result.Is(StatusCode::kUnavailable) || result.Is(StatusCode::kProtocolError));
    if (!result.Is(StatusCode::kWrongOwner) && !RetryWithSameId(result, from_server) &&
        !unreachable) {
      return nullptr;
    }
    if (Clock::now() +
            (result.Is(StatusCode::kWrongOwner) ? std::chrono::milliseconds(0) : kMinRetryBudget) >=
        deadline) {
      // A redirect no longer followed is an error (the others were counted by Call).
      if (result.Is(StatusCode::kWrongOwner)) result = caller_->Fail(std::move(result));
      return nullptr;
    }
    return link;
  });
  if (!result.ok()) return result;
  return version;
}

}  // namespace rdkv::client

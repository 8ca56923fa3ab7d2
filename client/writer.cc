#include "client/writer.h"

#include <chrono>
#include <utility>

#include "common/kv/layout.h"
#include "common/kv/limits.h"

namespace rdkv::client {

using Clock = std::chrono::steady_clock;

Result<uint64_t> Writer::Write(kv::Op op, std::string_view key, std::string_view value,
                               uint64_t expected) {
  Status bad = kv::CheckKey(key);
  if (!bad.ok()) return caller_->Fail(bad);
  kv::Request req;
  req.op = op;
  req.key = key;
  req.value = value;
  req.expected_version = expected;
  uint64_t version = 0;
  if (!router_->cluster()) {
    RDKV_RETURN_IF_ERROR(caller_->Call(links_->seed(), req, &version, nullptr));
    return version;
  }
  // Cluster: to the key's owner; a redirect retries with a refreshed map until op_timeout.
  const Clock::time_point deadline = Clock::now() + options_.op_timeout;
  const uint64_t hash = kv::KeyHash(key);
  Status result;
  router_->RunRouted([&](const Routing& rt) -> Link* {
    Link* link = rt.owners[kv::ShardOf(hash, rt.map->shards)];
    result = caller_->Call(*link, req, &version, nullptr);
    if (!result.Is(StatusCode::kWrongOwner)) return nullptr;
    if (Clock::now() >= deadline) {
      result = caller_->Fail(std::move(result));  // a redirect no longer followed is an error
      return nullptr;
    }
    return link;
  });
  if (!result.ok()) return result;
  return version;
}

}  // namespace rdkv::client

// The GET engine: resolves keys with one-sided READs of the servers' regions, as
// docs/design.md ("GET: resolution and why it is linearizable") describes. Per server, a
// batch of keys goes through the location cache (one READ of the cached item, optionally with
// the key's window), then through the index (the key's window, then every candidate item the
// window's fingerprints point at), each candidate judged (ClassifyItem) and, in a cluster,
// every result gated by the server's ownership lease. In a cluster keys are grouped by owner
// and a redirected key is re-routed by the Router until op_timeout.
//
// The datapath (cache pass, index chunk, judging) neither allocates nor logs: READs go into a
// registered scratch borrowed from the pool; only error messages and results allocate.
//
// Ownership: borrows the options, links, router, pool and counters (they outlive it).
// Thread-safety: Get, MultiGet and ResolveOn are safe from any thread (each call borrows its
// own scratch).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "client/counters.h"
#include "client/links.h"
#include "client/location_cache.h"
#include "client/read_buffers.h"
#include "client/router.h"
#include "client/session.h"
#include "common/kv/layout.h"
#include "rdkv/client.h"

namespace rdkv::client {

// Why an attempt was retried (the last reason is named in the final error).
enum class Problem : uint8_t { kNone, kSlow, kTorn, kRetired, kBadSlot, kLease };
const char* ProblemText(Problem p);

// One key being looked up by Get or MultiGet.
struct KeyJob {
  Link* link = nullptr;      // the server it is read from
  uint32_t shard = 0;        // cluster: the key's shard
  bool wrong_owner = false;  // cluster: the server does not serve the shard (re-route)
  std::string_view key;
  uint64_t hash = 0;
  uint64_t window_offset = 0;  // region offset of the key's 128-byte window
  uint16_t fingerprint = 0;
  std::optional<Result<GetResult>>* out = nullptr;  // where the result goes (caller-owned)
  bool done = false;
  int attempts = 0;                                // index attempts (window READs) so far
  std::chrono::steady_clock::time_point deadline;  // op_timeout from the start of the call
  std::optional<CachedLocation> cached;
  // The current index attempt.
  std::chrono::steady_clock::time_point t0;
  uint8_t ncand = 0;                 // candidates found in the window
  uint8_t unresolved = 0;            // candidates not yet read and judged
  bool retry = false;                // a candidate said "changed under us"
  bool slow = false;                 // the attempt exceeded read_deadline
  int slow_attempts = 0;             // attempts that exceeded read_deadline
  Problem problem = Problem::kNone;  // the last reason for a retry, for the final error
  kv::SlotFields cand[kMaxCandidates];
};

// What one READ of a batch is for, packed into the batch's 64-bit tag: the job (its index in
// the call's span), the candidate slot, and the byte offset of its destination in the
// scratch's item (or window) buffer.
struct ReadTag {
  uint32_t job = 0;
  uint8_t candidate = 0;
  uint32_t offset = 0;  // below 2^24 (items are at most 4 MiB: 16-bit units of 64 bytes)

  uint64_t Pack() const {
    return (uint64_t{job} << 32) | (uint64_t{candidate} << 24) | (offset & 0xffffffu);
  }
  static ReadTag Unpack(uint64_t tag) {
    return ReadTag{static_cast<uint32_t>(tag >> 32), static_cast<uint8_t>(tag >> 24),
                   static_cast<uint32_t>(tag & 0xffffffu)};
  }
};

class GetEngine {
 public:
  GetEngine(const ClientOptions& options, Links* links, Router* router, ScratchPool* pool,
            Counters* counters);

  // Client::Get and Client::MultiGet (their contracts: rdkv/client.h). Errors are counted.
  Result<GetResult> Get(std::string_view key);
  std::vector<Result<GetResult>> MultiGet(std::span<const std::string_view> keys);

  // Resolves `jobs` (each with key, out, and in a cluster shard set) on `link`'s server:
  // each ends done with its result in *out, or the error that stopped them all is returned
  // (no connection, a failed READ). A job whose shard the server does not serve ends with
  // kWrongOwner and wrong_owner set. Counts gets, READs, retries and cache hits.
  Status ResolveOn(Link& link, std::span<KeyJob> jobs);

 private:
  Status RunJobs(std::span<KeyJob> jobs);
  Status RunReads(Session& session, ScratchLease& scratch);
  Status CachePass(Session& session, ScratchLease& x, std::span<KeyJob> jobs);
  Status IndexChunk(Session& session, ScratchLease& x, std::span<KeyJob> jobs, size_t i,
                    size_t* end, bool* any_work, bool* any_retry);
  Status JudgeCandidates(Session& session, ScratchLease& x, std::span<KeyJob> jobs,
                         bool* any_retry);
  void EndAttempt(const Session& session, KeyJob& job,
                  std::chrono::steady_clock::time_point completed, bool* any_retry);
  void NotFound(const Session& session, KeyJob& job,
                std::chrono::steady_clock::time_point completed, bool* any_retry);
  void Retry(KeyJob& job, bool* any_retry);
  // The lease gate: true when a result read from `session` at `completed` may be returned.
  // Otherwise the job either ended with kWrongOwner (the server does not serve its shard;
  // RunJobs re-routes it) or is left undone with problem kLease (read again with a fresh
  // lease).
  bool LeaseAllows(const Session& session, KeyJob& job,
                   std::chrono::steady_clock::time_point completed);
  size_t CacheItemLimit(const ReadScratch& x) const;

  const ClientOptions& options_;
  Links* const links_;
  Router* const router_;
  ScratchPool* const pool_;
  Counters* const counters_;
  const size_t batch_limit_;
  const std::chrono::steady_clock::duration lease_;
};

}  // namespace rdkv::client

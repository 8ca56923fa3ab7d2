// The GET engine: resolves keys with one-sided READs of the servers' regions, as
// docs/design.md ("GET: resolution and why it is linearizable") describes. Per server, a
// batch of keys goes through the location cache (one READ of the cached item, optionally with
// the index bucket that held it), then through the index (the key's two candidate buckets in
// one batch, then every candidate item their fingerprints point at), each candidate judged
// (ClassifyItem) and, in a cluster, every result gated by the server's ownership lease. In a
// cluster keys are grouped by owner and a redirected key is re-routed by the Router until
// op_timeout. Each owner's keys are one run (a coroutine of the calling thread), and the runs
// advance in rounds: every owner's batch is posted before any is waited for, so a MultiGet
// over several owners costs the round trips of the slowest, not their sum (docs/design.md,
// "MultiGet: every owner's batch in flight together").
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

class GetTask;    // a coroutine of one run (get_engine.cc)
struct OwnerRun;  // one owner's jobs of a call, resolved by a GetTask (get_engine.cc)

// Why an attempt was retried (the last reason is named in the final error).
enum class Problem : uint8_t { kNone, kSlow, kTorn, kRetired, kBadSlot, kLease };
const char* ProblemText(Problem p);

// One key being looked up by Get or MultiGet.
struct KeyJob {
  Link* link = nullptr;      // the server it is read from
  uint32_t shard = 0;        // cluster: the key's shard
  bool wrong_owner = false;  // cluster: the server does not serve the shard (re-route)
  // Cluster: the kWrongOwner it was last re-routed after. A GET whose retry then times out
  // answers with it (why it could not be served) rather than a bare kTimedOut.
  std::optional<Status> redirect;
  std::string_view key;
  uint64_t hash = 0;
  uint64_t bucket_offset[kv::kChoices] = {};  // region offsets of the key's candidate buckets
  uint16_t fingerprint = 0;
  std::optional<Result<GetResult>>* out = nullptr;  // where the result goes (caller-owned)
  bool done = false;
  int attempts = 0;                                // index attempts (window READs) so far
  std::chrono::steady_clock::time_point deadline;  // op_timeout from the start of the call
  std::optional<CachedLocation> cached;
  // Its cached location was (or went) stale: the index path READs that item with the buckets,
  // and the location it finds is cached as contended (CachedLocation::contended).
  bool contended = false;
  // The current index attempt.
  std::chrono::steady_clock::time_point t0;
  // Standalone, or an ownership READ completed before this attempt's slots were posted showed
  // the shard owned (IndexChunk): a retired item or NotFound may then be the answer.
  bool owned_before_slots = true;
  uint32_t images = 0;                     // where its bucket images lie in the scratch's buckets
  uint64_t candidates[kv::kChoices] = {};  // per bucket, its slots with the key's fingerprint
  uint8_t ncand = 0;                       // candidates found in its buckets (at most 128)
  uint8_t unresolved = 0;                  // candidates not yet read and judged
  bool retry = false;                      // a candidate said "changed under us"
  bool slow = false;                       // the attempt exceeded read_deadline
  int slow_attempts = 0;                   // attempts that exceeded read_deadline
  Problem problem = Problem::kNone;        // the last reason for a retry, for the final error
};

// Owners a MultiGet has batches in flight on at once; more owners are resolved in further waves
// of this many. Bounds the registered scratch one calling thread holds (one per owner in flight,
// about 1.2 MiB each with 1 MiB values).
inline constexpr size_t kMaxOwnersInFlight = 8;

// What one READ of a batch is for, packed into the batch's 64-bit tag: the job (its index in
// the call's span), the candidate slot (0..127 over both buckets; for a bucket READ, which
// bucket), and the byte offset of its destination in the scratch's item (or bucket) buffer.
struct ReadTag {
  uint32_t job = 0;
  uint8_t candidate = 0;
  uint32_t offset = 0;  // below 2^24 (items are at most 2 MiB: 16-bit units of 32 bytes;
                        // bucket images are capped to fit: ScratchShapeFor)

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
  // ResolveOn for a call that began at `start` (its op_timeout runs from there).
  Status ResolveOn(Link& link, std::span<KeyJob> jobs, std::chrono::steady_clock::time_point start);
  // `start`: when the call began (its op_timeout runs from there).
  // `reroute`: a fast path found the owner unreachable or not serving the shard: the map is
  // refreshed from that server before the first round, as after a round of the engine's own.
  Status RunJobs(std::span<KeyJob> jobs, std::chrono::steady_clock::time_point start,
                 Link* reroute = nullptr);
  // Sets up a run for `jobs` on `link`'s server (session, scratch, each job's buckets, each
  // job's deadline op_timeout after `start`) and starts nothing; an error (no connection, no
  // scratch) is the run's result at once.
  void PrepareRun(OwnerRun& run, Link& link, std::span<KeyJob> jobs,
                  std::chrono::steady_clock::time_point start);
  // Drives every run to its end in rounds (docs/design.md, "MultiGet: every owner's batch in
  // flight together"); each run's outcome is left in its `result`.
  void DriveRuns(std::span<OwnerRun> runs);
  // After a run's batch was waited for (`waited`: what the wait returned): OK when every READ
  // completed OK; otherwise the error for the run (its session is marked for reconnect).
  Status CheckBatch(OwnerRun& run, Status waited);
  // The same for one batch of `session` in `scratch` (a scratch with READs still in flight is
  // quarantined in the session).
  Status CheckReads(Session& session, ScratchLease& scratch, Status waited);
  // Cluster: a batch that failed with `s` on an owner the routing names is re-routed rather
  // than failed (a coordinator manages the cluster, and the failure is about reaching it).
  static bool Unreachable(const Routing& rt, const Status& s);
  // Get's fast path for a key with a cached location (get_engine.cc says what it decides).
  // `start`: when Get began (its op_timeout and the lease's posting time run from there).
  // *reroute: set when nullopt means "re-route the key" (its owner unreachable, or not the
  // owner), for RunJobs; `engine_job` (key and out set) may be given its redirect.
  std::optional<Result<GetResult>> TryCachedGet(std::string_view key,
                                                std::chrono::steady_clock::time_point start,
                                                bool* stale, KeyJob& engine_job, Link** reroute);
  // Get's path for a key without a cached location (get_engine.cc says what it decides): one
  // attempt of the index path, straight-line. `engine_job`: the job Get gives the engine when
  // this returns nullopt (key, out and contended set; this may count an attempt in it).
  std::optional<Result<GetResult>> TryIndexGet(KeyJob& engine_job,
                                               std::chrono::steady_clock::time_point start,
                                               Link** reroute);
  // The server a fast path reads a key of `hash` from: the seed, or in a cluster the owner of
  // its shard under the current routing (*rt and *shard set).
  Link* OwnerOf(uint64_t hash, std::shared_ptr<const Routing>* rt, uint32_t* shard);
  // The fast paths' end when the key must be re-routed (get_engine.cc).
  std::optional<Result<GetResult>> Reroute(Link& link, Status s, bool wrong_owner,
                                           std::chrono::steady_clock::time_point start,
                                           KeyJob& engine_job, Link** reroute);
  // The kWrongOwner of a GET of `key` from `link`, which does not serve `shard`.
  Status WrongOwner(const Link& link, uint32_t shard, std::string_view key) const;
  // One candidate item READ through the index, judged (JudgeCandidates and TryIndexGet):
  // `slot_word` is the slot that led to it (candidate `candidate` of the job's two bucket
  // images), `completed` when its READ completed. Too late (read_deadline after job.t0), an
  // item that may not be the key's current value (torn, PENDING, retired without an earlier
  // lease), or not allowed by the lease: the job is marked for a retry (or ends with
  // kWrongOwner). Another key's intact item marks nothing. Accepted: the job is done, and its
  // location cached if the item is LIVE and fits a cache batch (`cache_item_limit`).
  void JudgeCandidate(const Session& session, KeyJob& job, const uint8_t* item, uint32_t length,
                      uint64_t slot_word, size_t candidate, size_t cache_item_limit,
                      std::chrono::steady_clock::time_point completed);
  // The resolution of one run's jobs, and its steps; each suspends at every batch of READs.
  GetTask Resolve(OwnerRun& run);
  GetTask CachePass(OwnerRun& run);
  GetTask IndexChunk(OwnerRun& run, size_t i, size_t* end, bool* any_work, bool* any_retry);
  GetTask JudgeCandidates(OwnerRun& run, bool* any_retry);
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
  // *torn: the READ overlapped an in-place rewrite (the key's bytes, a failed checksum): the
  // location is still right, so the entry is kept and the key is not marked contended.
  bool JudgeCachedItem(const Session& session, KeyJob& job, const uint8_t* item, uint32_t length,
                       bool linked, std::chrono::steady_clock::time_point completed, bool* torn);
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

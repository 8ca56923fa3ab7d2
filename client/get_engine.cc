#include "client/get_engine.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <thread>
#include <utility>

#include "client/client_internal.h"
#include "common/kv/limits.h"

namespace rdkv::client {

using Clock = std::chrono::steady_clock;

// --- judging one candidate ---

namespace {

// True when `bytes` hold a complete, intact item (its own checksum matches) whatever its key
// and state: then the slot that pointed here belonged to that item's key.
bool IntactItem(const uint8_t* bytes, size_t n) {
  if (n < sizeof(kv::ItemHeader)) return false;
  kv::ItemHeader h;
  std::memcpy(&h, bytes, sizeof(h));
  if (h.key_bytes == 0 || h.key_bytes > kv::kMaxKeyBytes) return false;
  uint64_t need = uint64_t{sizeof(h)} + h.key_bytes + h.value_bytes;
  if (need > n || h.units == 0 || uint64_t{h.units} * kv::kUnit < need) return false;
  const char* k = reinterpret_cast<const char*>(bytes + sizeof(h));
  return kv::ItemChecksum(h, std::string_view(k, h.key_bytes),
                          std::string_view(k + h.key_bytes, h.value_bytes)) == h.checksum;
}

}  // namespace

Verdict ClassifyItem(const uint8_t* bytes, size_t n, std::string_view key, std::string_view* value,
                     uint64_t* version, bool* torn) {
  *torn = false;
  switch (kv::CheckItem(bytes, n, key, value, version)) {
    case kv::ItemCheck::kOk:
      return Verdict::kAccept;
    case kv::ItemCheck::kDead:
      return Verdict::kRetry;  // the key's item, retired: the key was replaced or deleted
    case kv::ItemCheck::kBadChecksum:
      *torn = true;
      return Verdict::kRetry;
    case kv::ItemCheck::kWrongKey:
    case kv::ItemCheck::kBadLengths:
    case kv::ItemCheck::kTooShort:
      // Another key's intact item (a fingerprint collision), or bytes that are no item at all
      // (torn or reused): only the former proves this slot is not ours.
      if (IntactItem(bytes, n)) return Verdict::kForeign;
      *torn = true;
      return Verdict::kRetry;
  }
  return Verdict::kRetry;
}

const char* ProblemText(Problem p) {
  switch (p) {
    case Problem::kNone:
      return "unknown";
    case Problem::kSlow:
      return "READs slower than read_deadline";
    case Problem::kTorn:
      return "item failed its checksum";
    case Problem::kRetired:
      return "item retired while being read";
    case Problem::kBadSlot:
      return "slot points outside the heap or past the largest item";
    case Problem::kLease:
      return "the ownership lease expired before the READ completed";
  }
  return "unknown";
}

namespace {

// The tag of the ownership READ that rides in a batch (never unpacked: it follows the jobs').
constexpr uint64_t kOwnershipTag = ~uint64_t{0};

// Where an ownership READ lands in a scratch: the tail of the item buffer, which the cache
// pass leaves free in a cluster (the index pass reads candidates only after it completed).
size_t OwnershipOffset(const ReadScratch& x) {
  return (x.item_capacity - kv::kOwnershipBytes) & ~size_t{63};
}

void AddRead(Session& session, ReadScratch& x, uint8_t* dest, uint64_t region_offset,
             uint32_t length, uint64_t tag) {
  transport::ReadOp& op = x.ops[x.batch.size()];
  op.Reset();
  op.local = dest;
  op.lkey = x.lkey();
  op.remote_addr = session.RemoteAddr(region_offset);
  op.rkey = session.region().rkey;
  op.length = length;
  x.batch.push_back(&op);
  x.tags.push_back(tag);
}

// Where an item of `units` at `offset_units` lies, or nullopt when it is outside the heap.
std::optional<uint64_t> ItemOffset(const kv::RegionHeader& h, uint32_t offset_units,
                                   uint32_t units) {
  uint64_t start = uint64_t{offset_units} * kv::kUnit;
  uint64_t len = uint64_t{units} * kv::kUnit;
  if (units == 0 || start > h.heap_bytes || len > h.heap_bytes - start) return std::nullopt;
  return h.heap_offset + start;
}

// True when a slot of the window points at `loc` under `fingerprint`.
bool WindowHolds(const uint8_t* window, uint16_t fingerprint, CachedLocation loc) {
  for (size_t s = 0; s < kMaxCandidates; ++s) {
    uint64_t word;
    std::memcpy(&word, window + s * 8, 8);
    kv::SlotFields f = kv::UnpackSlot(word);
    if (word != 0 && f.fingerprint == fingerprint && f.offset_units == loc.offset_units &&
        f.units == loc.units) {
      return true;
    }
  }
  return false;
}

// The job's final error (constructed in place).
void Finish(KeyJob& job, Status error) {
  job.done = true;
  job.out->emplace(std::move(error));
}

void Accept(KeyJob& job, std::string_view value, uint64_t version) {
  job.done = true;
  job.out->emplace(GetResult{std::string(value), version});
}

// Between index attempts of one batch: a yield first (a torn read usually clears within
// microseconds), then 10 us doubling to 2 ms.
void Backoff(int round) {
  if (round == 0) {
    std::this_thread::yield();
    return;
  }
  int shift = std::min(round - 1, 8);
  std::this_thread::sleep_for(std::chrono::microseconds(std::min(10 << shift, 2000)));
}

}  // namespace

GetEngine::GetEngine(const ClientOptions& options, Links* links, Router* router, ScratchPool* pool,
                     Counters* counters)
    : options_(options),
      links_(links),
      router_(router),
      pool_(pool),
      counters_(counters),
      batch_limit_(BatchLimit(options)),
      lease_(options.ownership_lease) {}

Result<GetResult> GetEngine::Get(std::string_view key) {
  Status bad = kv::CheckKey(key);
  if (!bad.ok()) {
    Add(counters_->errors);
    return bad;
  }
  std::optional<Result<GetResult>> out;
  KeyJob job;
  job.key = key;
  job.out = &out;
  Status s = RunJobs(std::span<KeyJob>(&job, 1));
  if (!s.ok()) {
    Add(counters_->errors);
    return s;
  }
  if (!out.has_value()) {
    Add(counters_->errors);
    return Status::Internal("GET of " + DescribeKey(key) + " unresolved");
  }
  if (!out->ok() && !out->status().Is(StatusCode::kNotFound)) Add(counters_->errors);
  return std::move(*out);
}

std::vector<Result<GetResult>> GetEngine::MultiGet(std::span<const std::string_view> keys) {
  std::vector<std::optional<Result<GetResult>>> outs(keys.size());
  std::vector<KeyJob> jobs;
  jobs.reserve(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    Status bad = kv::CheckKey(keys[i]);
    if (!bad.ok()) {
      outs[i] = bad;
      continue;
    }
    KeyJob& job = jobs.emplace_back();
    job.key = keys[i];
    job.out = &outs[i];
  }
  Status s = jobs.empty() ? Status::Ok() : RunJobs(jobs);
  std::vector<Result<GetResult>> results;
  results.reserve(keys.size());
  for (auto& o : outs) {
    if (!o.has_value()) o = s.ok() ? Status::Internal("GET unresolved") : s;
    if (!o->ok() && !o->status().Is(StatusCode::kNotFound)) Add(counters_->errors);
    results.push_back(std::move(*o));
  }
  return results;
}

// Standalone: every job on the seed, or the error that stopped them all. In a cluster the jobs
// are grouped by owner; a server's failure ends only its own jobs (with the error naming
// it), and jobs whose server no longer serves their shard are re-routed after a map refresh
// until op_timeout.
Status GetEngine::RunJobs(std::span<KeyJob> jobs) {
  if (!router_->cluster()) {
    Link& seed = links_->seed();
    for (KeyJob& job : jobs) job.link = &seed;
    return ResolveOn(seed, jobs);
  }
  Clock::time_point deadline = Clock::now() + options_.op_timeout;
  router_->RunRouted([&](const Routing& rt) -> Link* {
    std::map<Link*, std::vector<size_t>> groups;
    for (size_t i = 0; i < jobs.size(); ++i) {
      KeyJob& job = jobs[i];
      if (job.done) continue;
      job.shard = kv::ShardOf(kv::KeyHash(job.key), rt.map->shards);
      job.link = rt.owners[job.shard];
      groups[job.link].push_back(i);
    }
    Link* redirected = nullptr;
    for (auto& [link, idx] : groups) {
      std::vector<KeyJob> sub;
      sub.reserve(idx.size());
      for (size_t i : idx) sub.push_back(jobs[i]);
      Status s = ResolveOn(*link, sub);
      for (size_t n = 0; n < idx.size(); ++n) {
        KeyJob& job = sub[n];
        if (!job.done && !s.ok()) Finish(job, s);
        if (job.wrong_owner && Clock::now() < deadline) {
          // Not done: re-routed with the refreshed map.
          redirected = link;
          job.out->reset();
          job.done = false;
          job.wrong_owner = false;
          job.attempts = 0;
          job.cached.reset();
        }
        jobs[idx[n]] = job;
      }
    }
    return redirected;
  });
  return Status::Ok();
}

Status GetEngine::ResolveOn(Link& link, std::span<KeyJob> jobs) {
  RDKV_ASSIGN_OR_RETURN(std::shared_ptr<Session> session, links_->SessionOf(link));
  RDKV_ASSIGN_OR_RETURN(std::unique_ptr<ReadScratch> raw, pool_->Acquire());
  ScratchLease scratch(pool_, std::move(raw));
  const kv::RegionHeader& h = session->header();
  Clock::time_point start = Clock::now();
  for (KeyJob& job : jobs) {
    job.link = &link;
    job.hash = kv::KeyHash(job.key);
    job.window_offset = h.index_offset + kv::BucketOf(job.hash, h.bucket_count) * kv::kBucketBytes;
    job.fingerprint = kv::FingerprintOf(job.hash);
    job.deadline = start + options_.op_timeout;
  }
  Add(counters_->gets, jobs.size());
  if (link.cache.entries() > 0) RDKV_RETURN_IF_ERROR(CachePass(*session, scratch, jobs));
  for (int round = 0;; ++round) {
    bool any_retry = false;
    bool any_work = false;
    for (size_t i = 0; i < jobs.size();) {
      size_t end = i;
      RDKV_RETURN_IF_ERROR(IndexChunk(*session, scratch, jobs, i, &end, &any_work, &any_retry));
      i = end;
    }
    if (!any_work) break;
    if (any_retry) Backoff(round);
  }
  return Status::Ok();
}

// Posts scratch->batch and waits. OK when every READ completed OK; otherwise the error for the
// call (the session is marked for reconnect).
Status GetEngine::RunReads(Session& session, ScratchLease& scratch) {
  Add(counters_->get_reads, scratch->batch.size());
  Status s = session.conn().ReadAndWait(scratch->batch, Clock::now() + options_.op_timeout);
  if (!s.ok()) {
    session.MarkBroken();
    if (!scratch->Idle()) session.Quarantine(scratch.Take());  // the transport still owns it
    if (s.Is(StatusCode::kTimedOut)) {
      return Status::TimedOut("READ from " + session.conn().peer() + " did not complete within " +
                              std::to_string(options_.op_timeout.count()) + " ms");
    }
    return Status(s.code(), "READ from " + session.conn().peer() + ": " + s.message());
  }
  for (transport::ReadOp* op : scratch->batch) {
    transport::ReadStatus rs = op->status.load(std::memory_order_acquire);
    if (rs == transport::ReadStatus::kOk) continue;
    session.MarkBroken();
    switch (rs) {
      case transport::ReadStatus::kRemoteAccessError:
        return Status::RemoteAccessError("server " + session.conn().peer() +
                                         " refused a READ of its region (restarted?)");
      case transport::ReadStatus::kConnectionLost:
        return Status::ConnectionLost("connection to " + session.conn().peer() +
                                      " broke during a READ");
      default:
        return Status::Internal("READ from " + session.conn().peer() + " failed locally");
    }
  }
  return Status::Ok();
}

size_t GetEngine::CacheItemLimit(const ReadScratch& x) const {
  return router_->cluster() ? OwnershipOffset(x) : x.item_capacity;
}

bool GetEngine::LeaseAllows(const Session& session, KeyJob& job, Clock::time_point completed) {
  if (!router_->cluster()) return true;
  switch (session.CheckLease(job.shard, completed, lease_)) {
    case Session::LeaseVerdict::kOk:
      return true;
    case Session::LeaseVerdict::kNotOwned:
      // Done here, re-routed by RunJobs.
      job.wrong_owner = true;
      Finish(job, Status::WrongOwner(links_->Name(*job.link) + " does not serve shard " +
                                     std::to_string(job.shard) + " of " + DescribeKey(job.key) +
                                     " (the shard moved, or is moving: a move serves no GET of "
                                     "it from its step 1 to its step 3)"));
      return false;
    case Session::LeaseVerdict::kExpired:
      job.problem = Problem::kLease;  // read again with a fresh lease
      return false;
  }
  return false;
}

// Ends an attempt that did not resolve the key: the next round retries it, or it fails.
void GetEngine::Retry(KeyJob& job, bool* any_retry) {
  if (job.attempts >= options_.max_get_attempts) {
    bool slow = job.slow_attempts == job.attempts;
    std::string what = "GET of " + DescribeKey(job.key) + " from " + links_->Name(*job.link) +
                       " failed " + std::to_string(job.attempts) + " attempts";
    if (slow) {
      Finish(job, Status::TimedOut(what + ": every attempt took longer than read_deadline (" +
                                   std::to_string(options_.read_deadline.count()) +
                                   " ms); no value was returned"));
    } else {
      Finish(job, Status::Corruption(what + " (last: " + ProblemText(job.problem) +
                                     "); no value was returned"));
    }
    return;
  }
  Add(counters_->get_retries);
  *any_retry = true;
}

// No slot held the key when its window was read (or only other keys' items): NotFound if the
// lease allows, else re-routed or retried.
void GetEngine::NotFound(const Session& session, KeyJob& job, Clock::time_point completed,
                         bool* any_retry) {
  job.link->cache.Erase(job.hash);
  if (LeaseAllows(session, job, completed)) {
    Finish(job, Status::NotFound("key not found"));  // short: no allocation
  } else if (!job.done) {
    Retry(job, any_retry);
  }
}

// Nothing accepted and no candidate left: NotFound if every candidate was another key's,
// else retry.
void GetEngine::EndAttempt(const Session& session, KeyJob& job, Clock::time_point completed,
                           bool* any_retry) {
  if (job.retry) {
    Retry(job, any_retry);
  } else {
    NotFound(session, job, completed, any_retry);
  }
}

// One READ per job with a cached location, in batches (with cache_checks_slot, also the key's
// window in the same batch, right after its item). Accepted jobs are done; the rest forget
// the stale location and go through the index.
Status GetEngine::CachePass(Session& session, ScratchLease& x, std::span<KeyJob> jobs) {
  const kv::RegionHeader& h = session.header();
  const bool check_slot = options_.cache_checks_slot;
  const bool cluster = router_->cluster();
  const size_t per_job = check_slot ? 2 : 1;
  const size_t max_ops = std::min(x->op_capacity, batch_limit_);
  for (size_t i = 0; i < jobs.size();) {
    x->batch.clear();
    x->tags.clear();
    size_t bytes = 0;
    size_t windows = 0;
    size_t j = i;
    for (; j < jobs.size(); ++j) {
      KeyJob& job = jobs[j];
      job.cached = job.link->cache.Lookup(job.hash);
      if (!job.cached.has_value()) continue;
      uint32_t len = uint32_t{job.cached->units} * kv::kUnit;
      auto off = ItemOffset(h, job.cached->offset_units, job.cached->units);
      if (!off.has_value() || len > x->item_capacity) {
        job.link->cache.Erase(job.hash, job.cached);
        job.cached.reset();
        continue;
      }
      if (x->batch.size() + per_job > max_ops || bytes + len > CacheItemLimit(*x) ||
          (check_slot && windows == x->window_capacity)) {
        break;
      }
      const auto job_index = static_cast<uint32_t>(j);
      AddRead(session, *x, x->items + bytes, *off, len,
              ReadTag{job_index, 0, static_cast<uint32_t>(bytes)}.Pack());
      bytes += len;
      if (check_slot) {
        const size_t w = windows * kv::kWindowBytes;
        AddRead(session, *x, x->windows + w, job.window_offset, kv::kWindowBytes,
                ReadTag{job_index, 0, static_cast<uint32_t>(w)}.Pack());
        ++windows;
      }
    }
    if (!x->batch.empty()) {
      const size_t job_ops = x->batch.size();
      Clock::time_point t0 = Clock::now();
      // Cluster: the ownership READ rides along when the lease is older than lease / 2 (one
      // batch per connection at a time while the lease is still valid).
      const bool probe = cluster && session.ClaimLeaseRefresh(t0, lease_ / 2);
      uint8_t* own = x->items + OwnershipOffset(*x);
      if (probe) {
        AddRead(session, *x, own, kv::kOwnershipOffset, kv::kOwnershipBytes, kOwnershipTag);
      }
      RDKV_RETURN_IF_ERROR(RunReads(session, x));
      Clock::time_point completed = Clock::now();
      if (probe) session.UpdateLease(t0, own);
      bool in_time = !check_slot || completed - t0 <= options_.read_deadline;
      for (size_t k = 0; k < job_ops; k += per_job) {
        const ReadTag tag = ReadTag::Unpack(x->tags[k]);
        KeyJob& job = jobs[tag.job];
        const uint8_t* item = x->items + tag.offset;
        std::string_view value;
        uint64_t version = 0;
        bool torn = false;
        Verdict v = ClassifyItem(item, x->batch[k]->length, job.key, &value, &version, &torn);
        if (torn) Add(counters_->torn_reads);
        bool linked = !check_slot ||
                      (in_time && WindowHolds(x->windows + ReadTag::Unpack(x->tags[k + 1]).offset,
                                              job.fingerprint, *job.cached));
        if (v == Verdict::kAccept && linked) {
          if (LeaseAllows(session, job, completed)) {
            Add(counters_->cache_hits);
            Accept(job, value, version);
          }
          // Not allowed: re-routed (kWrongOwner), or read again by the index pass with a
          // fresh lease.
        } else {
          Add(counters_->cache_misses);
          job.link->cache.Erase(job.hash, job.cached);
        }
      }
    }
    i = j;
  }
  return Status::Ok();
}

// One index attempt for up to batch_limit_ unresolved jobs from jobs[i...]: their windows in
// one batch, then their candidates in as few batches as the scratch allows.
Status GetEngine::IndexChunk(Session& session, ScratchLease& x, std::span<KeyJob> jobs, size_t i,
                             size_t* end, bool* any_work, bool* any_retry) {
  const kv::RegionHeader& h = session.header();
  size_t max_windows = std::min({x->window_capacity, x->op_capacity, batch_limit_});
  x->batch.clear();
  x->tags.clear();
  Clock::time_point t0 = Clock::now();
  // Cluster: the ownership READ rides in the window batch when the lease is older than
  // lease / 2 (t0, taken before posting, is its time; one batch per connection at a time
  // while the lease is still valid).
  const bool probe = router_->cluster() && session.ClaimLeaseRefresh(t0, lease_ / 2);
  if (probe && max_windows > 1) --max_windows;
  size_t j = i;
  for (; j < jobs.size() && x->batch.size() < max_windows; ++j) {
    KeyJob& job = jobs[j];
    if (job.done) continue;
    if (job.attempts > 0 && t0 > job.deadline) {
      Finish(job, Status::TimedOut("GET of " + DescribeKey(job.key) + " from " +
                                   links_->Name(*job.link) + " did not succeed within " +
                                   std::to_string(options_.op_timeout.count()) + " ms (" +
                                   std::to_string(job.attempts) + " attempts)"));
      continue;
    }
    const size_t w = x->batch.size() * kv::kWindowBytes;
    AddRead(session, *x, x->windows + w, job.window_offset, kv::kWindowBytes,
            ReadTag{static_cast<uint32_t>(j), 0, static_cast<uint32_t>(w)}.Pack());
    job.t0 = t0;
    ++job.attempts;
  }
  *end = j;
  if (x->batch.empty()) return Status::Ok();
  *any_work = true;
  const size_t nwindows = x->batch.size();
  uint8_t* own = x->items + OwnershipOffset(*x);
  if (probe) AddRead(session, *x, own, kv::kOwnershipOffset, kv::kOwnershipBytes, kOwnershipTag);
  RDKV_RETURN_IF_ERROR(RunReads(session, x));
  const Clock::time_point windows_done = Clock::now();
  if (probe) session.UpdateLease(t0, own);

  // Candidates: the slots whose fingerprint matches.
  for (size_t k = 0; k < nwindows; ++k) {
    const ReadTag tag = ReadTag::Unpack(x->tags[k]);
    KeyJob& job = jobs[tag.job];
    const uint8_t* w = x->windows + tag.offset;
    job.ncand = 0;
    job.retry = false;
    job.slow = false;
    for (size_t s = 0; s < kMaxCandidates; ++s) {
      uint64_t word;
      std::memcpy(&word, w + s * 8, 8);
      if (word == 0) continue;
      kv::SlotFields f = kv::UnpackSlot(word);
      if (f.fingerprint == job.fingerprint) job.cand[job.ncand++] = f;
    }
    job.unresolved = job.ncand;
    // No slot of the window held the key's fingerprint when it was read: absent then.
    if (job.ncand == 0) NotFound(session, job, windows_done, any_retry);
  }

  // Candidate items, streamed through the item buffer in job order.
  const size_t max_ops = std::min(x->op_capacity, batch_limit_);
  x->batch.clear();
  x->tags.clear();
  size_t bytes = 0;
  for (size_t k = i; k < j; ++k) {
    KeyJob& job = jobs[k];
    if (job.done || job.t0 != t0 || job.unresolved == 0) continue;
    for (uint8_t c = 0; c < job.ncand; ++c) {
      const kv::SlotFields& f = job.cand[c];
      uint32_t len = uint32_t{f.units} * kv::kUnit;
      auto off = ItemOffset(h, f.offset_units, f.units);
      if (!off.has_value() || len > x->item_capacity) {
        // Not a readable item: the server broke the layout contract. Never trust it.
        job.problem = Problem::kBadSlot;
        job.retry = true;
        --job.unresolved;
        continue;
      }
      if (x->batch.size() == max_ops || bytes + len > x->item_capacity) {
        RDKV_RETURN_IF_ERROR(JudgeCandidates(session, x, jobs, any_retry));
        x->batch.clear();
        x->tags.clear();
        bytes = 0;
        if (job.done) break;
      }
      AddRead(session, *x, x->items + bytes, *off, len,
              ReadTag{static_cast<uint32_t>(k), c, static_cast<uint32_t>(bytes)}.Pack());
      bytes += len;
    }
    if (!job.done && job.unresolved == 0) {
      EndAttempt(session, job, Clock::now(), any_retry);  // all unreadable
    }
  }
  if (!x->batch.empty()) RDKV_RETURN_IF_ERROR(JudgeCandidates(session, x, jobs, any_retry));
  return Status::Ok();
}

// READs the batched candidates and judges them, in slot order per job.
Status GetEngine::JudgeCandidates(Session& session, ScratchLease& x, std::span<KeyJob> jobs,
                                  bool* any_retry) {
  RDKV_RETURN_IF_ERROR(RunReads(session, x));
  Clock::time_point now = Clock::now();
  for (size_t n = 0; n < x->batch.size(); ++n) {
    const ReadTag tag = ReadTag::Unpack(x->tags[n]);
    KeyJob& job = jobs[tag.job];
    if (job.done) continue;  // an earlier candidate was accepted
    const uint8_t* item = x->items + tag.offset;
    --job.unresolved;
    if (now - job.t0 > options_.read_deadline) {
      // Too slow: the block may have been reused since the window was read.
      if (!job.slow) {
        Add(counters_->slow_reads);
        ++job.slow_attempts;
      }
      job.slow = true;
      job.problem = Problem::kSlow;
      job.retry = true;
    } else {
      std::string_view value;
      uint64_t version = 0;
      bool torn = false;
      Verdict v = ClassifyItem(item, x->batch[n]->length, job.key, &value, &version, &torn);
      if (torn) {
        Add(counters_->torn_reads);
        job.problem = Problem::kTorn;
      }
      if (v == Verdict::kAccept) {
        if (LeaseAllows(session, job, now)) {
          const kv::SlotFields& f = job.cand[tag.candidate];
          job.link->cache.Store(job.hash, CachedLocation{f.offset_units, f.units});
          Accept(job, value, version);
          continue;
        }
        if (job.done) continue;  // kWrongOwner
        job.retry = true;        // retried with a fresh lease
      }
      if (v == Verdict::kRetry) {
        if (!torn) job.problem = Problem::kRetired;
        job.retry = true;
      }
    }
    if (job.unresolved == 0) EndAttempt(session, job, now, any_retry);
  }
  return Status::Ok();
}

}  // namespace rdkv::client

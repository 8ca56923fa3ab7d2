#include "client/get_engine.h"

#include <algorithm>
#include <bit>
#include <coroutine>
#include <cstring>
#include <exception>
#include <map>
#include <optional>
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
                     uint64_t* version, bool* torn, Reach reach, bool* live) {
  *torn = false;
  if (live != nullptr) *live = false;
  switch (kv::CheckItem(bytes, n, key, value, version)) {
    case kv::ItemCheck::kOk:
      if (live != nullptr) *live = true;
      return Verdict::kAccept;
    case kv::ItemCheck::kDead:
      // The key's item, replaced or deleted since. Through a slot READ first it was the current
      // value when the slot was read.
      return reach == Reach::kSlotReadFirst ? Verdict::kAccept : Verdict::kRetry;
    case kv::ItemCheck::kPending:
      return Verdict::kRetry;  // just linked: LIVE a few stores later
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

namespace {
// The key's item whose checksum failed: a READ that overlapped an in-place rewrite (as opposed
// to bytes of another item, which say the location may be stale).
bool TornRewrite(const uint8_t* bytes, size_t n, std::string_view key) {
  std::string_view value;
  uint64_t version = 0;
  return kv::CheckItem(bytes, n, key, &value, &version) == kv::ItemCheck::kBadChecksum;
}
}  // namespace

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

// The slot word at `slot` of a bucket image (0..127 over a job's two images).
uint64_t SlotWord(const uint8_t* images, size_t slot) {
  uint64_t word;
  std::memcpy(&word, images + slot * 8, 8);
  return word;
}

// The first candidate slot of `job` (0..kMaxCandidates-1 over both buckets) at or after `from`,
// or kMaxCandidates when none is left.
size_t NextCandidate(const KeyJob& job, size_t from) {
  for (size_t c = from / kv::kSlotsPerBucket; c < kv::kChoices; ++c) {
    const size_t skip = c == from / kv::kSlotsPerBucket ? from % kv::kSlotsPerBucket : 0;
    const uint64_t left = skip == 0 ? job.candidates[c] : job.candidates[c] >> skip << skip;
    if (left != 0) return c * kv::kSlotsPerBucket + static_cast<size_t>(std::countr_zero(left));
  }
  return kMaxCandidates;
}

// Where `job`'s key lies in the index of `h`: its two candidate buckets and its fingerprint
// (job.hash set). PrepareRun and TryIndexGet.
void PlaceInIndex(KeyJob& job, const kv::RegionHeader& h) {
  const kv::Buckets b = kv::BucketsOf(job.hash, kv::SecondHash(job.key), h.bucket_count);
  for (size_t c = 0; c < kv::kChoices; ++c) {
    job.bucket_offset[c] = h.index_offset + b.b[c] * kv::kBucketBytes;
  }
  job.fingerprint = kv::FingerprintOf(job.hash);
}

// Starts judging an index attempt of `job` whose two bucket images lie at `images`: its
// candidates are the slots with its fingerprint, none judged yet. IndexChunk and TryIndexGet.
void FindCandidates(KeyJob& job, const uint8_t* images) {
  job.retry = false;
  job.slow = false;
  job.ncand = 0;
  for (size_t c = 0; c < kv::kChoices; ++c) {
    job.candidates[c] = kv::MatchFingerprints(images + c * kv::kBucketBytes, job.fingerprint);
    job.ncand += static_cast<uint8_t>(std::popcount(job.candidates[c]));
  }
  job.unresolved = job.ncand;
}

// Where the item of `slot_word` (a candidate of `job`) lies in `h`'s region, and *len its
// bytes; nullopt when it is no readable item of at most `item_capacity` bytes: the server broke
// the layout contract, never trusted (the candidate is resolved, the attempt marked for a
// retry). IndexChunk and TryIndexGet.
std::optional<uint64_t> CandidateItem(KeyJob& job, const kv::RegionHeader& h, uint64_t slot_word,
                                      size_t item_capacity, uint32_t* len) {
  const kv::SlotFields f = kv::UnpackSlot(slot_word);
  *len = uint32_t{f.units} * kv::kUnit;
  const std::optional<uint64_t> off = kv::SlotItemOffset(h, f);
  if (!off.has_value() || *len > item_capacity) {
    job.problem = Problem::kBadSlot;
    job.retry = true;
    --job.unresolved;
    return std::nullopt;
  }
  return off;
}

// RunJobs' rule for re-routing a key whose owner failed (`wrong_owner`: does not serve its
// shard; else unreachable): only while the call's `deadline` is ahead, with 20 ms to spare for
// an unreachable owner (a new owner must still be found and READ).
bool TimeToReroute(bool wrong_owner, Clock::time_point deadline) {
  const Clock::time_point now = Clock::now();
  return wrong_owner ? now < deadline : now + std::chrono::milliseconds(20) < deadline;
}

// True when a slot of the bucket image points at `loc` under `fingerprint`.
bool BucketHolds(const uint8_t* bucket, uint16_t fingerprint, CachedLocation loc) {
  for (uint64_t m = kv::MatchFingerprints(bucket, fingerprint); m != 0; m &= m - 1) {
    const kv::SlotFields f =
        kv::UnpackSlot(SlotWord(bucket, static_cast<size_t>(std::countr_zero(m))));
    if (f.offset_units == loc.offset_units && f.units == loc.units) return true;
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

// Between index attempts of one run: a yield first (a torn read usually clears within
// microseconds), then 10 us doubling to 2 ms.
Clock::duration BackoffDelay(int round) {
  if (round == 0) return Clock::duration::zero();
  int shift = std::min(round - 1, 8);
  return std::chrono::microseconds(std::min(10 << shift, 2000));
}

// Coroutine frames come from a per-thread cache of blocks (a few size classes), so that a GET
// allocates nothing once its thread has run one: frames are created and destroyed on the
// calling thread (DriveRuns never hands a run to another thread).
class FrameCache {
 public:
  static constexpr size_t kGrain = 256;
  static constexpr size_t kClasses = 16;  // frames up to 4 KiB are cached
  static constexpr size_t kKeep = 32;     // blocks kept per class

  ~FrameCache() {
    for (auto& list : free_) {
      for (void* p : list) ::operator delete(p);
    }
  }
  void* Allocate(size_t n) {
    const size_t c = (n + kGrain - 1) / kGrain;
    if (c == 0 || c > kClasses) return ::operator new(n);
    std::vector<void*>& list = free_[c - 1];
    if (!list.empty()) {
      void* p = list.back();
      list.pop_back();
      return p;
    }
    return ::operator new(c* kGrain);
  }
  void Free(void* p, size_t n) {
    const size_t c = (n + kGrain - 1) / kGrain;
    if (c == 0 || c > kClasses) {
      ::operator delete(p);
      return;
    }
    std::vector<void*>& list = free_[c - 1];
    if (list.size() >= kKeep) {
      ::operator delete(p);
      return;
    }
    if (list.capacity() == 0) list.reserve(kKeep);
    list.push_back(p);
  }

 private:
  std::vector<void*> free_[kClasses];
};

FrameCache& Frames() {
  thread_local FrameCache cache;
  return cache;
}

}  // namespace

// A lazily started coroutine that ends with a Status. `co_await task` runs it to its end (through
// any number of suspensions at batches) and resumes the awaiting coroutine with its Status
// (symmetric transfer: no stack growth). A top-level task is started by resuming handle().
class [[nodiscard]] GetTask {
 public:
  struct promise_type;
  using Handle = std::coroutine_handle<promise_type>;

  struct promise_type {
    Status result;
    std::coroutine_handle<> continuation;

    GetTask get_return_object() { return GetTask(Handle::from_promise(*this)); }
    std::suspend_always initial_suspend() noexcept { return {}; }
    struct FinalAwait {
      bool await_ready() noexcept { return false; }
      std::coroutine_handle<> await_suspend(Handle h) noexcept {
        std::coroutine_handle<> next = h.promise().continuation;
        return next ? next : std::noop_coroutine();
      }
      void await_resume() noexcept {}
    };
    FinalAwait final_suspend() noexcept { return {}; }
    void return_value(Status s) { result = std::move(s); }
    void unhandled_exception() { std::terminate(); }
    static void* operator new(size_t n) { return Frames().Allocate(n); }
    static void operator delete(void* p, size_t n) { Frames().Free(p, n); }
  };

  GetTask() = default;
  explicit GetTask(Handle h) : h_(h) {}
  GetTask(GetTask&& o) noexcept : h_(std::exchange(o.h_, {})) {}
  GetTask& operator=(GetTask&& o) noexcept {
    if (this != &o) {
      if (h_) h_.destroy();
      h_ = std::exchange(o.h_, {});
    }
    return *this;
  }
  GetTask(const GetTask&) = delete;
  GetTask& operator=(const GetTask&) = delete;
  ~GetTask() {
    if (h_) h_.destroy();
  }

  Handle handle() const { return h_; }
  bool done() const { return !h_ || h_.done(); }
  Status TakeResult() { return std::move(h_.promise().result); }

  bool await_ready() const noexcept { return false; }
  std::coroutine_handle<> await_suspend(std::coroutine_handle<> awaiting) noexcept {
    h_.promise().continuation = awaiting;
    return h_;
  }
  Status await_resume() { return std::move(h_.promise().result); }

 private:
  Handle h_;
};

// One owner's jobs of a Get or MultiGet, resolved by one coroutine (Resolve) that DriveRuns
// resumes; it suspends with a batch in scratch->batch (kBatch) or a back-off (kSleeping).
struct OwnerRun {
  enum class State : uint8_t { kReady, kBatch, kSleeping, kDone };

  Link* link = nullptr;
  std::span<KeyJob> jobs;
  std::shared_ptr<Session> session;
  std::optional<ScratchLease> scratch;
  GetTask task;
  std::coroutine_handle<> resume;  // the innermost suspended coroutine of the run
  State state = State::kReady;
  Status batch_status;          // what the last batch's wait came to (CheckBatch)
  Clock::time_point completed;  // when the last batch's wait returned
  Clock::time_point wake;       // kSleeping: when to resume
  bool posted = false;          // this round's batch went out with PostReads
  Status post_status;           // what PostReads said
  Status result;                // the run's outcome once kDone
};

namespace {

// `co_await Batch{&run}` hands run.scratch->batch to DriveRuns and resumes with its Status (the
// READs done, run.completed set).
struct Batch {
  OwnerRun* run;
  bool await_ready() const noexcept { return false; }
  void await_suspend(std::coroutine_handle<> h) noexcept {
    run->resume = h;
    run->state = OwnerRun::State::kBatch;
  }
  Status await_resume() { return std::move(run->batch_status); }
};

// `co_await Sleep{&run, until}`: resumes no earlier than `until` (other runs go on meanwhile).
struct Sleep {
  OwnerRun* run;
  Clock::time_point until;
  bool await_ready() const noexcept { return false; }
  void await_suspend(std::coroutine_handle<> h) noexcept {
    run->resume = h;
    run->wake = until;
    run->state = OwnerRun::State::kSleeping;
  }
  void await_resume() noexcept {}
};

// RDKV_RETURN_IF_ERROR for coroutines.
#define RDKV_CO_RETURN_IF_ERROR(expr)         \
  do {                                        \
    ::rdkv::Status rdkv_co_s = (expr);        \
    if (!rdkv_co_s.ok()) co_return rdkv_co_s; \
  } while (0)

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
  const Clock::time_point start = Clock::now();  // op_timeout runs from here, on either path
  bool stale = false;
  std::optional<Result<GetResult>> out;
  KeyJob job;  // what the engine resolves if neither fast path decides
  job.key = key;
  job.out = &out;
  Link* reroute = nullptr;  // a fast path found the key's owner unreachable or not the owner
  out = TryCachedGet(key, start, &stale, job, &reroute);
  if (out.has_value()) {
    if (!out->ok()) Add(counters_->errors);  // the fast path ends with a value or an error
    return std::move(*out);
  }
  job.contended = stale;  // its cached item was stale: the location found is kept as contended
  if (reroute == nullptr) {
    out = TryIndexGet(job, start, &reroute);
    if (out.has_value()) {
      if (!out->ok() && !out->status().Is(StatusCode::kNotFound)) Add(counters_->errors);
      return std::move(*out);
    }
  }
  Status s = RunJobs(std::span<KeyJob>(&job, 1), start, reroute);
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

// The single-key GET whose location is cached, without the engine's runs and coroutines
// (docs/design.md "The single-key cached path"): one READ of the cached item (with the
// ownership READ beside it when the lease wants a refresh), judged exactly as the cache pass
// judges it. A LIVE item of the key under a valid lease is the answer; no session or a failed
// READ is the error the engine would have ended the GET with. A key to re-route (no session
// or a failed READ in a coordinated cluster, a server not serving the shard) is Reroute's.
// Everything else returns nullopt having decided nothing, and Get goes on (TryIndexGet, then
// the engine): no entry, a contended key, cache_checks_slot, no scratch, or an expired lease.
// A stale item (not LIVE, torn, another key's) is a cache miss: the entry is forgotten and
// *stale set.
std::optional<Result<GetResult>> GetEngine::TryCachedGet(std::string_view key,
                                                         Clock::time_point start, bool* stale,
                                                         KeyJob& engine_job, Link** reroute) {
  if (options_.cache_checks_slot) return std::nullopt;
  const uint64_t hash = kv::KeyHash(key);
  const bool cluster = router_->cluster();
  std::shared_ptr<const Routing> rt;
  uint32_t shard = 0;
  Link* link = OwnerOf(hash, &rt, &shard);
  if (link->cache.entries() == 0) return std::nullopt;
  // The session first: a reconnect to a new incarnation of the server clears the cache.
  Result<std::shared_ptr<Session>> opened = links_->SessionOf(*link);
  if (!opened.ok()) {  // what the engine would end with
    if (cluster && Unreachable(*rt, opened.status())) {
      return Reroute(*link, opened.status(), false, start, engine_job, reroute);
    }
    return Result<GetResult>(opened.status());
  }
  Session& session = **opened;
  const std::optional<CachedLocation> cached = link->cache.Lookup(hash);
  if (!cached.has_value() || cached->contended) return std::nullopt;
  const uint32_t len = uint32_t{cached->units} * kv::kUnit;
  const auto off = kv::SlotItemOffset(session.header(), {0, cached->units, cached->offset_units});
  if (!off.has_value()) return std::nullopt;  // the cache pass forgets it
  Result<std::unique_ptr<ReadScratch>> raw = pool_->Acquire();
  if (!raw.ok()) return std::nullopt;
  ScratchLease x(pool_, std::move(*raw));
  if (len > CacheItemLimit(*x)) return std::nullopt;
  x->batch.clear();
  x->tags.clear();
  AddRead(session, *x, x->items, *off, len, 0);
  // Get's start stands for the posting time: earlier than the post, so a lease measured from it
  // ends no later than one measured from the post (and one clock read fewer: where the clock is
  // a device, as an emulated HPET, each read is a system call of a microsecond).
  const Clock::time_point t0 = start;
  const bool probe = cluster && session.ClaimLeaseRefresh(t0, lease_ / 2);
  uint8_t* own = x->items + OwnershipOffset(*x);
  if (probe) AddRead(session, *x, own, kv::kOwnershipOffset, kv::kOwnershipBytes, kOwnershipTag);
  Add(counters_->get_round_trips);
  Add(counters_->get_reads, x->batch.size());
  Status waited = session.conn().ReadAndWait(x->batch, t0 + options_.op_timeout);
  // Only a cluster's lease check needs the completion time.
  const Clock::time_point completed = cluster ? Clock::now() : Clock::time_point{};
  Status s = CheckReads(session, x, std::move(waited));
  if (!s.ok()) {
    Add(counters_->gets);
    if (cluster && Unreachable(*rt, s)) return Reroute(*link, s, false, start, engine_job, reroute);
    return Result<GetResult>(std::move(s));
  }
  if (probe) session.UpdateLease(t0, own);
  std::string_view value;
  uint64_t version = 0;
  bool torn = false;
  const Verdict v = ClassifyItem(x->items, len, key, &value, &version, &torn);
  if (torn) Add(counters_->torn_reads);
  if (v != Verdict::kAccept) {
    Add(counters_->cache_misses);
    // A READ that overlapped an in-place rewrite of the key's item: the location is right.
    if (torn && TornRewrite(x->items, len, key)) return std::nullopt;
    link->cache.Erase(hash, cached);
    *stale = true;
    return std::nullopt;
  }
  if (cluster) {
    switch (session.CheckLease(shard, completed, lease_)) {
      case Session::LeaseVerdict::kOk:
        break;
      case Session::LeaseVerdict::kNotOwned:
        Add(counters_->gets);
        return Reroute(*link, WrongOwner(*link, shard, key), true, start, engine_job, reroute);
      case Session::LeaseVerdict::kExpired:
        return std::nullopt;  // READ again under a fresh lease: the engine
    }
  }
  Add(counters_->gets);
  Add(counters_->cache_hits);
  return Result<GetResult>(GetResult{std::string(value), version});
}

Link* GetEngine::OwnerOf(uint64_t hash, std::shared_ptr<const Routing>* rt, uint32_t* shard) {
  if (!router_->cluster()) return &links_->seed();
  *rt = router_->routing();
  *shard = kv::ShardOf(hash, (*rt)->map->shards);
  return (*rt)->owners[*shard];
}

// A fast path of Get found `link` unreachable (`s`) or not serving the key's shard
// (`wrong_owner`, `s` its kWrongOwner): RunJobs' rule for a job of the engine. With time left
// before op_timeout (20 ms to spare when unreachable), nullopt, and the engine re-routes the key
// first thing (*reroute; a kWrongOwner is kept as the job's redirect, the reason its retry is
// given if it then times out); else the error ends the GET.
std::optional<Result<GetResult>> GetEngine::Reroute(Link& link, Status s, bool wrong_owner,
                                                    Clock::time_point start, KeyJob& engine_job,
                                                    Link** reroute) {
  if (TimeToReroute(wrong_owner, start + options_.op_timeout)) {
    *reroute = &link;
    if (wrong_owner) engine_job.redirect = std::move(s);
    return std::nullopt;
  }
  return Result<GetResult>(std::move(s));
}

Status GetEngine::WrongOwner(const Link& link, uint32_t shard, std::string_view key) const {
  return Status::WrongOwner(links_->Name(link) + " does not serve shard " + std::to_string(shard) +
                            " of " + DescribeKey(key) +
                            " (the shard moved, or is moving: a move serves no GET of it from "
                            "its step 1 to its step 3)");
}

// The single-key index path (docs/design.md "The single-key index path"): one attempt of the
// index path for a key this client has no cached location for, without the engine's runs and
// coroutines: the two buckets (with the ownership READ beside them when the lease wants a
// refresh), then every candidate in one batch, each judged by the engine's own rules
// (JudgeCandidate, NotFound, EndAttempt on a KeyJob of its own). What those rules finish is
// the answer: a value, NotFound, or the error a failed READ (or no session) ends the GET with.
// Everything else returns nullopt, and Get runs the engine: a cached location (the engine's
// cache pass, or a contended key's batch), no scratch, candidates for more than one batch (no
// attempt counted: none was judged), and any attempt the rules would retry (it is the engine
// job's first: its attempts, slow attempts and problem are left in `engine_job`, so
// max_get_attempts counts the GET's attempts on both paths). A key to re-route (its server
// unreachable, or not serving the shard) is Reroute's.
std::optional<Result<GetResult>> GetEngine::TryIndexGet(KeyJob& engine_job, Clock::time_point start,
                                                        Link** reroute) {
  std::optional<Result<GetResult>> out;
  KeyJob job;
  const std::string_view key = engine_job.key;
  job.key = key;
  job.out = &out;
  job.contended = engine_job.contended;
  job.hash = kv::KeyHash(key);
  const bool cluster = router_->cluster();
  std::shared_ptr<const Routing> rt;
  job.link = OwnerOf(job.hash, &rt, &job.shard);
  if (job.link->cache.entries() > 0 && job.link->cache.Lookup(job.hash).has_value()) {
    return std::nullopt;
  }
  Result<std::shared_ptr<Session>> opened = links_->SessionOf(*job.link);
  if (!opened.ok()) {  // what the engine would end with
    if (cluster && Unreachable(*rt, opened.status())) {
      return Reroute(*job.link, opened.status(), false, start, engine_job, reroute);
    }
    return Result<GetResult>(opened.status());
  }
  Session& session = **opened;
  Result<std::unique_ptr<ReadScratch>> raw = pool_->Acquire();
  if (!raw.ok()) return std::nullopt;
  ScratchLease x(pool_, std::move(*raw));
  if (x->bucket_capacity < kv::kChoices) return std::nullopt;
  // A failed batch: the engine's error, or (re-routed) the engine.
  auto failed = [&](Status s) -> std::optional<Result<GetResult>> {
    Add(counters_->gets);
    if (cluster && Unreachable(*rt, s)) {
      return Reroute(*job.link, s, false, start, engine_job, reroute);
    }
    return Result<GetResult>(std::move(s));
  };
  // An attempt made and not finished: the engine's next one is the GET's second.
  auto hand_over = [&]() -> std::optional<Result<GetResult>> {
    engine_job.attempts = job.attempts;
    engine_job.slow_attempts = job.slow_attempts;
    engine_job.problem = job.problem;
    return std::nullopt;
  };
  // What the rules finished is the answer; a job they left for a retry (after a yield, as the
  // engine's first back-off), or re-route, is the engine's.
  auto decided = [&]() -> std::optional<Result<GetResult>> {
    if (job.wrong_owner) {
      Add(counters_->gets);
      return Reroute(*job.link, out->status(), true, start, engine_job, reroute);
    }
    if (!job.done) {
      std::this_thread::yield();
      return hand_over();
    }
    Add(counters_->gets);
    Add(counters_->single_key_index);
    return std::move(out);
  };

  // The buckets (IndexChunk's first batch, for one key).
  const kv::RegionHeader& h = session.header();
  PlaceInIndex(job, h);
  x->batch.clear();
  x->tags.clear();
  job.t0 = Clock::now();
  job.attempts = 1;
  for (size_t c = 0; c < kv::kChoices; ++c) {
    AddRead(session, *x, x->buckets + c * kv::kBucketBytes, job.bucket_offset[c], kv::kBucketBytes,
            c);
  }
  const bool probe = cluster && session.ClaimLeaseRefresh(job.t0, lease_ / 2);
  uint8_t* own = x->items + OwnershipOffset(*x);
  if (probe) AddRead(session, *x, own, kv::kOwnershipOffset, kv::kOwnershipBytes, kOwnershipTag);
  if (cluster) {
    job.owned_before_slots =
        session.CheckLease(job.shard, Clock::now(), lease_) == Session::LeaseVerdict::kOk;
  }
  Add(counters_->get_round_trips);
  Add(counters_->get_reads, x->batch.size());
  Status waited = session.conn().ReadAndWait(x->batch, job.t0 + options_.op_timeout);
  const Clock::time_point buckets_done = Clock::now();
  if (Status s = CheckReads(session, x, std::move(waited)); !s.ok()) return failed(std::move(s));
  if (probe) session.UpdateLease(job.t0, own);
  bool any_retry = false;
  FindCandidates(job, x->buckets);
  if (job.ncand == 0) {
    NotFound(session, job, buckets_done, &any_retry);
    return decided();
  }

  // Every candidate in one batch (IndexChunk's second), judged in slot order.
  x->batch.clear();
  x->tags.clear();
  const size_t max_ops = std::min(x->op_capacity, batch_limit_);
  size_t bytes = 0;
  for (size_t c = NextCandidate(job, 0); c < kMaxCandidates; c = NextCandidate(job, c + 1)) {
    uint32_t len = 0;
    const std::optional<uint64_t> off =
        CandidateItem(job, h, SlotWord(x->buckets, c), x->item_capacity, &len);
    if (!off.has_value()) continue;
    // More than one batch of candidates: the engine's, as if this attempt had not been made
    // (it judged nothing).
    if (len > x->item_capacity - bytes || x->batch.size() == max_ops) return std::nullopt;
    AddRead(session, *x, x->items + bytes, *off, len,
            ReadTag{0, static_cast<uint8_t>(c), static_cast<uint32_t>(bytes)}.Pack());
    bytes += len;
  }
  Clock::time_point completed = buckets_done;
  if (!x->batch.empty()) {
    Add(counters_->get_round_trips);
    Add(counters_->get_reads, x->batch.size());
    waited = session.conn().ReadAndWait(x->batch, buckets_done + options_.op_timeout);
    completed = Clock::now();
    if (Status s = CheckReads(session, x, std::move(waited)); !s.ok()) {
      return failed(std::move(s));
    }
  }
  for (size_t n = 0; n < x->batch.size() && !job.done; ++n) {
    const ReadTag tag = ReadTag::Unpack(x->tags[n]);
    --job.unresolved;
    JudgeCandidate(session, job, x->items + tag.offset, x->batch[n]->length,
                   SlotWord(x->buckets, tag.candidate), tag.candidate, CacheItemLimit(*x),
                   completed);
  }
  if (!job.done) EndAttempt(session, job, completed, &any_retry);
  return decided();
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
  Status s = jobs.empty() ? Status::Ok() : RunJobs(jobs, Clock::now());
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
Status GetEngine::RunJobs(std::span<KeyJob> jobs, Clock::time_point start, Link* reroute) {
  if (!router_->cluster()) {
    Link& seed = links_->seed();
    for (KeyJob& job : jobs) job.link = &seed;
    return ResolveOn(seed, jobs, start);
  }
  const Clock::time_point deadline = start + options_.op_timeout;
  router_->RunRouted(reroute, [&](const Routing& rt) -> Link* {
    std::map<Link*, std::vector<size_t>> groups;
    for (size_t i = 0; i < jobs.size(); ++i) {
      KeyJob& job = jobs[i];
      if (job.done) continue;
      job.shard = kv::ShardOf(kv::KeyHash(job.key), rt.map->shards);
      job.link = rt.owners[job.shard];
      groups[job.link].push_back(i);
    }
    // Every owner's jobs are resolved together: each round has every owner's batch in flight
    // (up to kMaxOwnersInFlight owners at a time, each holding a scratch of the pool).
    std::vector<std::vector<KeyJob>> subs(groups.size());
    std::unique_ptr<OwnerRun[]> runs(new OwnerRun[groups.size()]);
    std::vector<Link*> owners;
    owners.reserve(groups.size());
    size_t g = 0;
    for (auto& [link, idx] : groups) {
      subs[g].reserve(idx.size());
      for (size_t i : idx) subs[g].push_back(jobs[i]);
      owners.push_back(link);
      ++g;
    }
    for (size_t first = 0; first < owners.size(); first += kMaxOwnersInFlight) {
      const size_t last = std::min(owners.size(), first + kMaxOwnersInFlight);
      for (size_t k = first; k < last; ++k) PrepareRun(runs[k], *owners[k], subs[k], start);
      DriveRuns(std::span<OwnerRun>(runs.get() + first, last - first));
      for (size_t k = first; k < last; ++k) {  // the scratches go back before the next wave
        runs[k].task = GetTask();
        runs[k].scratch.reset();
        runs[k].session.reset();
      }
    }
    Link* redirected = nullptr;
    g = 0;
    for (auto& [link, idx] : groups) {
      std::vector<KeyJob>& sub = subs[g];
      const Status s = std::move(runs[g].result);
      ++g;
      // The owner cannot be reached (dead or cut off) in a cluster a failover coordinator
      // manages: a failover is under way, so its jobs are re-routed with a refreshed map until
      // op_timeout, like a redirect (without a coordinator they fail at once, naming it).
      const bool unreachable = Unreachable(rt, s) && TimeToReroute(false, deadline);
      for (size_t n = 0; n < idx.size(); ++n) {
        KeyJob& job = sub[n];
        const bool reroute = unreachable && !job.done && !s.ok();
        if (!job.done && !s.ok() && !reroute) Finish(job, s);
        if (reroute || (job.wrong_owner && TimeToReroute(true, deadline))) {
          // Not done: re-routed with the refreshed map.
          if (job.wrong_owner && job.out->has_value() && !(*job.out)->ok()) {
            job.redirect = (*job.out)->status();
          }
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
  // A redirect followed until op_timeout ran out in its retry: the redirect says why (a shard
  // that stayed moving ends with its kWrongOwner, not a bare kTimedOut).
  for (KeyJob& job : jobs) {
    if (!job.redirect || !job.out->has_value() || (*job.out)->ok()) continue;
    const Status& last = (*job.out)->status();
    if (!last.Is(StatusCode::kTimedOut)) continue;
    job.out->emplace(
        Status(job.redirect->code(),
               job.redirect->message() + "; the retry after it timed out: " + last.message()));
  }
  return Status::Ok();
}

Status GetEngine::ResolveOn(Link& link, std::span<KeyJob> jobs) {
  return ResolveOn(link, jobs, Clock::now());
}

Status GetEngine::ResolveOn(Link& link, std::span<KeyJob> jobs, Clock::time_point start) {
  OwnerRun run;
  PrepareRun(run, link, jobs, start);
  DriveRuns(std::span<OwnerRun>(&run, 1));
  return std::move(run.result);
}

void GetEngine::PrepareRun(OwnerRun& run, Link& link, std::span<KeyJob> jobs,
                           Clock::time_point start) {
  run.link = &link;
  run.jobs = jobs;
  run.state = OwnerRun::State::kDone;
  for (KeyJob& job : jobs) job.link = &link;
  Result<std::shared_ptr<Session>> session = links_->SessionOf(link);
  if (!session.ok()) {
    run.result = session.status();
    return;
  }
  run.session = std::move(*session);
  Result<std::unique_ptr<ReadScratch>> raw = pool_->Acquire();
  if (!raw.ok()) {
    run.result = raw.status();
    return;
  }
  run.scratch.emplace(pool_, std::move(*raw));
  const kv::RegionHeader& h = run.session->header();
  for (KeyJob& job : jobs) {
    job.hash = kv::KeyHash(job.key);
    PlaceInIndex(job, h);
    job.deadline = start + options_.op_timeout;
  }
  Add(counters_->gets, jobs.size());
  run.task = Resolve(run);
  run.resume = run.task.handle();
  run.state = OwnerRun::State::kReady;
}

GetTask GetEngine::Resolve(OwnerRun& run) {
  if (run.link->cache.entries() > 0) {
    GetTask cache = CachePass(run);
    RDKV_CO_RETURN_IF_ERROR(co_await cache);
  }
  // A single key's attempt made by TryIndexGet counts as the first round.
  int first_round = 0;
  for (const KeyJob& job : run.jobs) first_round = std::max(first_round, job.attempts);
  for (int round = first_round;; ++round) {
    bool any_retry = false;
    bool any_work = false;
    for (size_t i = 0; i < run.jobs.size();) {
      size_t end = i;
      GetTask chunk = IndexChunk(run, i, &end, &any_work, &any_retry);
      RDKV_CO_RETURN_IF_ERROR(co_await chunk);
      i = end;
    }
    if (!any_work) break;
    if (any_retry) co_await Sleep{&run, Clock::now() + BackoffDelay(round)};
  }
  co_return Status::Ok();
}

// The rounds: every run that can proceed runs to its next batch; every batch is posted, then
// each is waited for (one round trip for all); runs backing off are resumed when due.
void GetEngine::DriveRuns(std::span<OwnerRun> runs) {
  using State = OwnerRun::State;
  for (;;) {
    for (OwnerRun& run : runs) {
      if (run.state == State::kSleeping && run.wake <= Clock::now()) run.state = State::kReady;
      if (run.state != State::kReady) continue;
      run.resume.resume();  // until its next batch or back-off, or its end
      if (run.task.done()) {
        run.state = State::kDone;
        run.result = run.task.TakeResult();
      }
    }
    size_t batches = 0;
    OwnerRun* only = nullptr;
    bool sleeping = false;
    Clock::time_point wake = Clock::time_point::max();
    for (OwnerRun& run : runs) {
      if (run.state == State::kBatch) {
        ++batches;
        only = &run;
      } else if (run.state == State::kSleeping) {
        sleeping = true;
        wake = std::min(wake, run.wake);
      }
    }
    if (batches == 0) {
      if (!sleeping) return;  // every run ended
      if (wake > Clock::now()) {
        std::this_thread::sleep_until(wake);
      } else {
        std::this_thread::yield();
      }
      continue;
    }
    Add(counters_->get_round_trips);  // batches posted together, waited for together
    if (batches == 1) {
      // One owner: exactly the single-server batch.
      ReadScratch& x = **only->scratch;
      Add(counters_->get_reads, x.batch.size());
      Status s = only->session->conn().ReadAndWait(x.batch, Clock::now() + options_.op_timeout);
      only->completed = Clock::now();
      only->batch_status = CheckBatch(*only, std::move(s));
      only->state = State::kReady;
      continue;
    }
    const Clock::time_point deadline = Clock::now() + options_.op_timeout;
    for (OwnerRun& run : runs) {
      if (run.state != State::kBatch) continue;
      ReadScratch& x = **run.scratch;
      Add(counters_->get_reads, x.batch.size());
      run.post_status = run.session->conn().PostReads(x.batch);
    }
    // Waited for one after another; after each wait, the batches that completed meanwhile are
    // stamped at once, so a slow owner does not make the others' READs look slow.
    auto stamp_completed = [&](Clock::time_point now) {
      for (OwnerRun& other : runs) {
        if (other.state != State::kBatch || !other.post_status.ok()) continue;
        other.session->conn().PollReads();  // reaps completions (tcp: reads the socket if idle)
        const std::vector<transport::ReadOp*>& ops = (*other.scratch)->batch;
        if (std::all_of(ops.begin(), ops.end(),
                        [](const transport::ReadOp* op) { return op->done(); })) {
          other.completed = now;
          other.batch_status = CheckBatch(other, Status::Ok());
          other.state = State::kReady;
        }
      }
    };
    for (OwnerRun& run : runs) {
      if (run.state != State::kBatch) continue;
      ReadScratch& x = **run.scratch;
      transport::Connection& conn = run.session->conn();
      Status s;
      if (run.post_status.ok()) {
        s = conn.WaitReads(x.batch, deadline);
      } else if (run.post_status.Is(StatusCode::kBusy)) {
        s = conn.ReadAndWait(x.batch, deadline);  // other threads hold the slots: post when free
      } else {
        // Not posted, or (verbs) posted part-way before the connection died: CheckReads
        // quarantines the scratch while any of its READs is still in flight.
        s = std::move(run.post_status);
      }
      const Clock::time_point now = Clock::now();
      run.completed = now;
      run.batch_status = CheckBatch(run, std::move(s));
      run.state = State::kReady;
      stamp_completed(now);
    }
  }
}

bool GetEngine::Unreachable(const Routing& rt, const Status& s) {
  return rt.map->coordinated &&
         (s.Is(StatusCode::kUnavailable) || s.Is(StatusCode::kConnectionLost) ||
          s.Is(StatusCode::kProtocolError));
}

Status GetEngine::CheckBatch(OwnerRun& run, Status waited) {
  return CheckReads(*run.session, *run.scratch, std::move(waited));
}

Status GetEngine::CheckReads(Session& session, ScratchLease& scratch, Status waited) {
  if (!waited.ok()) {
    session.MarkBroken();
    if (!scratch->Idle()) session.Quarantine(scratch.Take());  // the transport still owns it
    if (waited.Is(StatusCode::kTimedOut)) {
      return Status::TimedOut("READ from " + session.conn().peer() + " did not complete within " +
                              std::to_string(options_.op_timeout.count()) + " ms");
    }
    return Status(waited.code(), "READ from " + session.conn().peer() + ": " + waited.message());
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
      Finish(job, WrongOwner(*job.link, job.shard, job.key));
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

// No slot held the key when its buckets were read (or only other keys' items): NotFound if the
// lease allows, else re-routed or retried.
void GetEngine::NotFound(const Session& session, KeyJob& job, Clock::time_point completed,
                         bool* any_retry) {
  job.link->cache.Erase(job.hash);
  if (!LeaseAllows(session, job, completed)) {
    if (!job.done) Retry(job, any_retry);  // else re-routed (kWrongOwner)
  } else if (!job.owned_before_slots) {
    // Cluster: the slots may have been read before this server owned the shard (its lease
    // comes from this very batch): they prove nothing yet. Again, under that lease.
    job.problem = Problem::kLease;
    Retry(job, any_retry);
  } else {
    Finish(job, Status::NotFound("key not found"));  // short: no allocation
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

// Judges an item READ through job's cached location (the cache path's checks; `linked`: the
// slot check of cache_checks_slot passed, or it is off). Accepted and allowed by the lease:
// the job is done (a cache hit). Accepted but not allowed: re-routed (kWrongOwner) or left
// for the index pass with a fresh lease. Not accepted: a miss, the entry is forgotten, and
// false is returned.
bool GetEngine::JudgeCachedItem(const Session& session, KeyJob& job, const uint8_t* item,
                                uint32_t length, bool linked, Clock::time_point completed,
                                bool* torn) {
  std::string_view value;
  uint64_t version = 0;
  *torn = false;
  Verdict v = ClassifyItem(item, length, job.key, &value, &version, torn);
  if (*torn) Add(counters_->torn_reads);
  if (v == Verdict::kAccept && linked) {
    if (LeaseAllows(session, job, completed)) {
      Add(counters_->cache_hits);
      Accept(job, value, version);
    }
    return true;
  }
  Add(counters_->cache_misses);
  // A READ that overlapped an in-place rewrite of the key's item: the location is still right.
  *torn = *torn && TornRewrite(item, length, job.key);
  if (!*torn) job.link->cache.Erase(job.hash, job.cached);
  return false;
}

// One READ per job with a cached location, in batches (with cache_checks_slot, also the index
// bucket that held it in the same batch, right after its item). Accepted jobs are done; the rest
// forget the stale location and go through the index.
GetTask GetEngine::CachePass(OwnerRun& run) {
  Session& session = *run.session;
  ScratchLease& x = *run.scratch;
  const std::span<KeyJob> jobs = run.jobs;
  const kv::RegionHeader& h = session.header();
  const bool check_slot = options_.cache_checks_slot;
  const bool cluster = router_->cluster();
  const size_t per_job = check_slot ? 2 : 1;
  // Room for the ownership READ that may ride along (batch_limit_ >= kMinBatchReads).
  const size_t max_ops = std::min(x->op_capacity, batch_limit_) - (cluster ? 1 : 0);
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
      if (job.cached->contended) {
        job.contended = true;  // READ with its buckets by IndexChunk
        continue;
      }
      uint32_t len = uint32_t{job.cached->units} * kv::kUnit;
      auto off = kv::SlotItemOffset(h, {0, job.cached->units, job.cached->offset_units});
      if (!off.has_value() || len > x->item_capacity) {
        job.link->cache.Erase(job.hash, job.cached);
        job.cached.reset();
        continue;
      }
      if (x->batch.size() + per_job > max_ops || bytes + len > CacheItemLimit(*x) ||
          (check_slot && windows == x->bucket_capacity)) {
        if (x->batch.empty()) {
          // It fits no batch of this scratch (in a cluster the ownership READ keeps the item
          // buffer's tail): the index path, which READs up to item_capacity, finds it instead.
          // Breaking here would leave this pass with nothing to post and no way forward.
          job.link->cache.Erase(job.hash, job.cached);
          job.cached.reset();
          continue;
        }
        break;
      }
      const auto job_index = static_cast<uint32_t>(j);
      AddRead(session, *x, x->items + bytes, *off, len,
              ReadTag{job_index, 0, static_cast<uint32_t>(bytes)}.Pack());
      bytes += len;
      if (check_slot) {
        const size_t w = windows * kv::kBucketBytes;
        AddRead(session, *x, x->buckets + w, job.bucket_offset[job.cached->choice & 1u],
                kv::kBucketBytes, ReadTag{job_index, 0, static_cast<uint32_t>(w)}.Pack());
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
      RDKV_CO_RETURN_IF_ERROR(co_await Batch{&run});
      const Clock::time_point completed = run.completed;
      if (probe) session.UpdateLease(t0, own);
      bool in_time = !check_slot || completed - t0 <= options_.read_deadline;
      for (size_t k = 0; k < job_ops; k += per_job) {
        const ReadTag tag = ReadTag::Unpack(x->tags[k]);
        KeyJob& job = jobs[tag.job];
        const bool linked =
            !check_slot ||
            (in_time && BucketHolds(x->buckets + ReadTag::Unpack(x->tags[k + 1]).offset,
                                    job.fingerprint, *job.cached));
        bool torn = false;
        if (!JudgeCachedItem(session, job, x->items + tag.offset, x->batch[k]->length, linked,
                             completed, &torn)) {
          job.cached.reset();
          // Someone else moved it: expect it again. (A torn READ met an in-place rewrite: the
          // location stays right, so no mark; this GET goes through the index.)
          if (!torn) job.contended = true;
        }
      }
    }
    i = j;
  }
  co_return Status::Ok();
}

// One index attempt for unresolved jobs from jobs[i...]: their candidate buckets (two READs
// per job) in one batch of up to batch_limit_ READs, then their candidates in as few batches as
// the scratch allows.
GetTask GetEngine::IndexChunk(OwnerRun& run, size_t i, size_t* end, bool* any_work,
                              bool* any_retry) {
  Session& session = *run.session;
  ScratchLease& x = *run.scratch;
  const std::span<KeyJob> jobs = run.jobs;
  const kv::RegionHeader& h = session.header();
  x->batch.clear();
  x->tags.clear();
  Clock::time_point t0 = Clock::now();
  // Cluster: the ownership READ rides in the bucket batch when the lease is older than
  // lease / 2 (t0, taken before posting, is its time; one batch per connection at a time
  // while the lease is still valid).
  const bool probe = router_->cluster() && session.ClaimLeaseRefresh(t0, lease_ / 2);
  // batch_limit_ >= kMinBatchReads, so at least one job fits next to the ownership READ.
  const size_t max_ops = std::min(x->op_capacity, batch_limit_) - (probe ? 1 : 0);
  const size_t max_jobs = std::min(x->bucket_capacity, max_ops) / kv::kChoices;
  size_t njobs = 0;
  size_t j = i;
  for (; j < jobs.size() && njobs < max_jobs; ++j) {
    KeyJob& job = jobs[j];
    if (job.done) continue;
    if (job.attempts > 0 && t0 > job.deadline) {
      Finish(job, Status::TimedOut("GET of " + DescribeKey(job.key) + " from " +
                                   links_->Name(*job.link) + " did not succeed within " +
                                   std::to_string(options_.op_timeout.count()) + " ms (" +
                                   std::to_string(job.attempts) + " attempts)"));
      continue;
    }
    job.images = static_cast<uint32_t>(njobs * kv::kChoices * kv::kBucketBytes);
    for (size_t c = 0; c < kv::kChoices; ++c) {
      const uint32_t w = job.images + static_cast<uint32_t>(c * kv::kBucketBytes);
      AddRead(session, *x, x->buckets + w, job.bucket_offset[c], kv::kBucketBytes,
              ReadTag{static_cast<uint32_t>(j), static_cast<uint8_t>(c), w}.Pack());
    }
    job.t0 = t0;
    ++job.attempts;
    ++njobs;
  }
  *end = j;
  if (njobs == 0) co_return Status::Ok();
  *any_work = true;
  const size_t nreads = x->batch.size();
  // Contended keys: their cached item rides in the same batch (docs/design.md "Where locations
  // come from"), while the batch and the item buffer have room.
  size_t item_bytes = 0;
  for (size_t k = i; k < j; ++k) {
    KeyJob& job = jobs[k];
    if (job.done || job.t0 != t0 || !job.cached.has_value() || !job.contended) continue;
    const uint32_t len = uint32_t{job.cached->units} * kv::kUnit;
    auto off = kv::SlotItemOffset(h, {0, job.cached->units, job.cached->offset_units});
    if (!off.has_value() || x->batch.size() + 1 > max_ops ||
        item_bytes + len > CacheItemLimit(*x)) {
      job.cached.reset();
      continue;
    }
    AddRead(session, *x, x->items + item_bytes, *off, len,
            ReadTag{static_cast<uint32_t>(k), 0, static_cast<uint32_t>(item_bytes)}.Pack());
    item_bytes += len;
  }
  const size_t ncached = x->batch.size() - nreads;
  uint8_t* own = x->items + OwnershipOffset(*x);
  if (probe) AddRead(session, *x, own, kv::kOwnershipOffset, kv::kOwnershipBytes, kOwnershipTag);
  // Cluster: did an ownership READ that completed before this batch show the shard owned? The
  // probe above is READ after the buckets (a QP runs READs in order), so its lease may begin
  // after the slots were read: enough for a LIVE item (current when READ, after it) but not for
  // a retired item or NotFound, which speak of the moment the slots were read.
  if (router_->cluster()) {
    const Clock::time_point posting = Clock::now();
    for (size_t k = i; k < j; ++k) {
      KeyJob& job = jobs[k];
      if (job.done || job.t0 != t0) continue;
      job.owned_before_slots =
          session.CheckLease(job.shard, posting, lease_) == Session::LeaseVerdict::kOk;
    }
  }
  RDKV_CO_RETURN_IF_ERROR(co_await Batch{&run});
  const Clock::time_point buckets_done = run.completed;
  if (probe) session.UpdateLease(t0, own);

  // The contended keys' cached items: accepted under the cache path's checks (with
  // cache_checks_slot, a slot of the bucket READ beside it must still point at it, in time).
  for (size_t n = nreads; n < nreads + ncached; ++n) {
    const ReadTag tag = ReadTag::Unpack(x->tags[n]);
    KeyJob& job = jobs[tag.job];
    const bool linked =
        !options_.cache_checks_slot ||
        (buckets_done - t0 <= options_.read_deadline &&
         BucketHolds(x->buckets + job.images + (job.cached->choice & 1u) * kv::kBucketBytes,
                     job.fingerprint, *job.cached));
    // Not accepted, or not allowed by the lease: the buckets below are judged as any index READ.
    bool torn = false;
    JudgeCachedItem(session, job, x->items + tag.offset, x->batch[n]->length, linked, buckets_done,
                    &torn);
    job.cached.reset();
  }

  // Candidates: the slots of either bucket whose fingerprint matches.
  for (size_t k = 0; k < nreads; k += kv::kChoices) {
    KeyJob& job = jobs[ReadTag::Unpack(x->tags[k]).job];
    if (job.done) continue;  // its cached item was accepted above
    FindCandidates(job, x->buckets + job.images);
    // No slot of either bucket held the key's fingerprint when it was read: absent at some
    // moment of the GET (docs/design.md, "index path, NotFound").
    if (job.ncand == 0) NotFound(session, job, buckets_done, any_retry);
  }

  // Candidate items, streamed through the item buffer in job order.
  const size_t max_item_ops = std::min(x->op_capacity, batch_limit_);
  x->batch.clear();
  x->tags.clear();
  size_t bytes = 0;
  for (size_t k = i; k < j; ++k) {
    KeyJob& job = jobs[k];
    if (job.done || job.t0 != t0 || job.unresolved == 0) continue;
    const uint8_t* images = x->buckets + job.images;
    for (size_t c = NextCandidate(job, 0); c < kMaxCandidates; c = NextCandidate(job, c + 1)) {
      uint32_t len = 0;
      const std::optional<uint64_t> off =
          CandidateItem(job, h, SlotWord(images, c), x->item_capacity, &len);
      if (!off.has_value()) continue;
      if (x->batch.size() == max_item_ops || bytes + len > x->item_capacity) {
        GetTask judge = JudgeCandidates(run, any_retry);
        RDKV_CO_RETURN_IF_ERROR(co_await judge);
        x->batch.clear();
        x->tags.clear();
        bytes = 0;
        if (job.done) break;
      }
      AddRead(
          session, *x, x->items + bytes, *off, len,
          ReadTag{static_cast<uint32_t>(k), static_cast<uint8_t>(c), static_cast<uint32_t>(bytes)}
              .Pack());
      bytes += len;
    }
    if (!job.done && job.unresolved == 0) {
      EndAttempt(session, job, Clock::now(), any_retry);  // all unreadable
    }
  }
  if (!x->batch.empty()) {
    GetTask judge = JudgeCandidates(run, any_retry);
    RDKV_CO_RETURN_IF_ERROR(co_await judge);
  }
  co_return Status::Ok();
}

void GetEngine::JudgeCandidate(const Session& session, KeyJob& job, const uint8_t* item,
                               uint32_t length, uint64_t slot_word, size_t candidate,
                               size_t cache_item_limit, Clock::time_point completed) {
  if (completed - job.t0 > options_.read_deadline) {
    // Too slow: the block may have been reused since the buckets were read.
    if (!job.slow) {
      Add(counters_->slow_reads);
      ++job.slow_attempts;
    }
    job.slow = true;
    job.problem = Problem::kSlow;
    job.retry = true;
    return;
  }
  std::string_view value;
  uint64_t version = 0;
  bool torn = false;
  bool live = false;
  // Candidates are READ only after their buckets' batch completed, and this one within
  // read_deadline of t0: the slot was read first.
  Verdict v =
      ClassifyItem(item, length, job.key, &value, &version, &torn,
                   job.owned_before_slots ? Reach::kSlotReadFirst : Reach::kCachedLocation, &live);
  if (torn) {
    Add(counters_->torn_reads);
    job.problem = Problem::kTorn;
  }
  if (v == Verdict::kAccept) {
    if (LeaseAllows(session, job, completed)) {
      // A retired item is an answer but not a location worth remembering, nor is one that
      // fits no cache batch (the cache pass would only erase it again).
      const kv::SlotFields f = kv::UnpackSlot(slot_word);
      if (live && uint32_t{f.units} * kv::kUnit <= cache_item_limit) {
        job.link->cache.Store(
            job.hash,
            CachedLocation{f.offset_units, f.units,
                           static_cast<uint8_t>(candidate / kv::kSlotsPerBucket), job.contended});
      } else if (!live) {
        Add(counters_->retired_accepts);
      }
      Accept(job, value, version);
      return;
    }
    if (job.done) return;  // kWrongOwner
    job.retry = true;      // retried with a fresh lease
  }
  if (v == Verdict::kRetry) {
    if (!torn) job.problem = Problem::kRetired;
    job.retry = true;
  }
}

// READs the batched candidates and judges them, in slot order per job.
GetTask GetEngine::JudgeCandidates(OwnerRun& run, bool* any_retry) {
  Session& session = *run.session;
  ScratchLease& x = *run.scratch;
  const std::span<KeyJob> jobs = run.jobs;
  RDKV_CO_RETURN_IF_ERROR(co_await Batch{&run});
  const Clock::time_point now = run.completed;
  for (size_t n = 0; n < x->batch.size(); ++n) {
    const ReadTag tag = ReadTag::Unpack(x->tags[n]);
    KeyJob& job = jobs[tag.job];
    if (job.done) continue;  // an earlier candidate was accepted
    --job.unresolved;
    JudgeCandidate(session, job, x->items + tag.offset, x->batch[n]->length,
                   SlotWord(x->buckets + job.images, tag.candidate), tag.candidate,
                   CacheItemLimit(*x), now);
    if (job.done) continue;
    if (job.unresolved == 0) EndAttempt(session, job, now, any_retry);
  }
  co_return Status::Ok();
}

}  // namespace rdkv::client

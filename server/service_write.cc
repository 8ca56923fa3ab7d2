// The Service's writes: PUT, INSERT, CAS, DELETE of applications, IMPORT of the shard mover and
// REPLICATE of a primary. Steps: admit, check ownership, count, the retry check, replicate
// (a replicated shard: precondition, version, every in-sync backup, docs/design.md
// "Replication"), apply to the store, persist, answer (now, or once durable).
#include <glog/logging.h>

#include <algorithm>
#include <map>
#include <optional>
#include <tuple>

#include "common/kv/admin_wire.h"
#include "common/util/thread_name.h"
#include "server/service.h"

namespace rdkv::server {

namespace {
using persistence::Durability;

// Set while the transport's receiving thread runs TryWriteOnReceivingThread: a completion that
// runs there (every backup of a write failed at once) must not wait.
thread_local bool t_on_receiving_thread = false;

// One answer per request id (an id logged twice, e.g. by a write and by the answers that
// repeated it, keeps its highest version, as the retry table does), in version order.
void UniqueAnswers(std::vector<kv::AnsweredWrite>* answers) {
  auto by_id = [](const kv::AnsweredWrite& a, const kv::AnsweredWrite& b) {
    return std::tie(a.client_id, a.request_seq, b.version) <
           std::tie(b.client_id, b.request_seq, a.version);
  };
  std::sort(answers->begin(), answers->end(), by_id);
  answers->erase(std::unique(answers->begin(), answers->end(),
                             [](const kv::AnsweredWrite& a, const kv::AnsweredWrite& b) {
                               return a.client_id == b.client_id && a.request_seq == b.request_seq;
                             }),
                 answers->end());
  std::sort(
      answers->begin(), answers->end(),
      [](const kv::AnsweredWrite& a, const kv::AnsweredWrite& b) { return a.version < b.version; });
}

// A REPLICATE batch's answer body: one result per entry.
std::string EncodeReplicateResults(const std::vector<kv::ReplicateBatchResult>& results) {
  std::string body;
  body.reserve(results.size() * kv::kReplicateBatchResultBytes);
  for (const kv::ReplicateBatchResult& res : results) {
    kv::AppendReplicateBatchResult(res.code, res.version, &body);
  }
  return body;
}
}  // namespace

size_t Service::StripeIndex(std::string_view key) { return kv::KeyHash(key) % kKeyStripes; }

bool Service::IsReplicated(const cluster::ClusterMap& map, uint32_t shard) {
  return (shard < map.backups.size() && !map.backups[shard].empty()) ||
         (shard < map.joining.size() && !map.joining[shard].empty());
}

bool Service::HandleWrite(const kv::Request& r, Exchange ex) {
  // A replicated shard's write waits for its backups. On this transport worker only while
  // another worker stays free for REPLICATE (two servers backing each other must never wait
  // for each other's workers), else on the writer pool. The map read here only picks the
  // thread; the write checks it again.
  if (replicator_ != nullptr && cluster_ != nullptr && r.op != kv::Op::kImport &&
      IsReplicated(*cluster_->map(), store_->ShardOfKey(r.key))) {
    // The asynchronous path waits for no backup, but may still wait briefly (the persister's
    // admission, a transport call slot or socket buffer toward a backup): it keeps to the same
    // share of the workers.
    if (!ex.on_worker) {
      return async_replicated_writes_ ? *StartReplicatedWrite(r, ex) : OffloadWrite(r, ex);
    }
    const int workers =
        transport_workers_ > 0 ? transport_workers_ : workers_seen_.load(std::memory_order_relaxed);
    if (inline_writes_.fetch_add(1, std::memory_order_acq_rel) + 1 >= workers) {
      inline_writes_.fetch_sub(1, std::memory_order_acq_rel);
      return OffloadWrite(r, ex);
    }
    const bool answered =
        async_replicated_writes_ ? *StartReplicatedWrite(r, ex) : HandleWriteNow(r, ex);
    inline_writes_.fetch_sub(1, std::memory_order_acq_rel);
    return answered;
  }
  return HandleWriteNow(r, ex);
}

bool Service::OffloadWrite(const kv::Request& r, Exchange ex) {
  size_t waiting = 0, waiting_bytes = 0;
  if (!EnterPoolQueue(r, &waiting, &waiting_bytes)) {
    counters_.pool_refused.fetch_add(1, std::memory_order_relaxed);
    return AnswerNow(ex, Status::Unavailable("server overloaded: " + std::to_string(waiting) +
                                             " writes (" + std::to_string(waiting_bytes) +
                                             " bytes) already wait for this server's backups; "
                                             "nothing was applied, retry later"));
  }
  // The request's bytes live only during the transport's handler call: copy them.
  auto w = std::make_unique<ReplicatedWrite>(r);
  w->op = ex.op;
  w->received = ex.received;
  w->role = ex.role;
  w->deliver = (*ex.defer)();
  std::vector<std::unique_ptr<ReplicatedWrite>> one;
  one.push_back(std::move(w));
  RunParkedWaiting(std::move(one));
  return false;
}

void Service::RunParkedWaiting(std::vector<std::unique_ptr<ReplicatedWrite>> parked) {
  for (std::unique_ptr<ReplicatedWrite>& w : parked) {
    std::shared_ptr<ReplicatedWrite> shared(std::move(w));  // a std::function is copyable
    replicator_->Submit([this, shared]() {
      std::vector<uint8_t> response;
      Deliver deliver = std::move(shared->deliver);
      const std::function<Deliver()> defer = [&deliver]() { return std::move(deliver); };
      Exchange mine{&response, &defer, shared->op, shared->received, shared->role};
      if (HandleWriteNow(shared->owned.request, mine)) deliver(response);  // else it took it
      LeavePoolQueue(shared->owned.bytes());
      FinishOffloaded();
    });
  }
}

bool Service::EnterPoolQueue(const kv::Request& r, size_t* waiting, size_t* waiting_bytes) {
  const size_t bytes = r.key.size() + r.value.size();
  MutexLock lock(&offload_mu_);
  *waiting = pool_writes_;
  *waiting_bytes = pool_bytes_;
  // A shard move's IMPORT is not refused: the mover does not retry it, and its copies are
  // bounded by the mover's own window (8 in flight).
  if (r.op != kv::Op::kImport &&
      (pool_writes_ >= max_pool_writes_ || pool_bytes_ + bytes > kMaxPoolBytes)) {
    return false;
  }
  ++offloaded_;
  ++pool_writes_;
  pool_bytes_ += bytes;
  return true;
}

void Service::LeavePoolQueue(size_t bytes) {
  MutexLock lock(&offload_mu_);
  --pool_writes_;
  pool_bytes_ -= bytes;
}

void Service::FinishOffloaded(size_t n) {
  if (n == 0) return;
  MutexLock lock(&offload_mu_);
  offloaded_ -= n;
  if (offloaded_ == 0) offload_cv_.SignalAll();
}

void Service::WaitForWrites() {
  {
    MutexLock lock(&offload_mu_);
    while (offloaded_ > 0) offload_cv_.Wait(&offload_mu_);
  }
  {
    MutexLock lock(&repair_mu_);
    repair_stop_ = true;
  }
  repair_cv_.SignalAll();
  if (repair_thread_.joinable()) repair_thread_.join();
}

Service::~Service() { WaitForWrites(); }

void Service::set_replicator(replication::Replicator* replicator) {
  replicator_ = replicator;
  if (replicator_ == nullptr) return;
  replicator_->set_max_value_bytes(limits_.max_value_bytes);
  if (cluster_ != nullptr && !repair_thread_.joinable()) {
    repair_thread_ = std::thread([this] {
      rdkv::util::NameThisThread("rdkv-repair");
      RepairLoop();
    });
  }
}

bool Service::HandleWriteNow(const kv::Request& r, Exchange ex) {
  if (r.op == kv::Op::kImport) {
    Result<kv::ImportRequest> import = kv::DecodeImport(r);
    if (!import.ok()) return AnswerNow(ex, import.status());
  }
  // Refused before anything is applied while the persister cannot write; waits while its queue
  // is full (backpressure). Before the owner guard: a writer waiting here must not hold off a
  // map install.
  const Status admitted = persister_ != nullptr ? persister_->Admit() : Status::Ok();
  // Cluster: the owner check and the apply happen under one guard, so a map change that takes
  // the shard away waits for this write (and the shard's data is complete when it moves).
  ClusterState::OwnerGuard owner_guard(cluster_);  // holds nothing when standalone
  // Writers of one key serialize across the retry check, the replication, the apply and the
  // enqueue: backups and RocksDB get each key's writes in version order. A transport worker
  // does not wait for a stripe (an asynchronous replicated write may hold it for a round trip
  // to its backups): the write goes to the writer pool, nothing done or counted yet.
  // Replicated writes that find it held park behind this write (it hands the stripe on when
  // it returns), as they do behind an asynchronous one.
  StripeTurn key_lock =
      ex.on_worker && replicator_ != nullptr ? TryTakeStripe(r.key) : TakeStripe(r.key);
  if (!key_lock) return OffloadWrite(r, ex);
  if (std::optional<bool> refused = CheckWriteOwner(r, ex)) return *refused;
  CountWrite(r.op);
  if (!admitted.ok()) return AnswerNow(ex, admitted);
  std::shared_ptr<const cluster::ClusterMap> map;
  uint32_t shard = 0;
  if (cluster_ != nullptr && r.op != kv::Op::kImport) {
    map = cluster_->map_held();
    shard = store_->ShardOfKey(r.key);
    // An earlier write of this key failed after its forward: every replica gets it (or a newer
    // version) before this write is checked against the key (it may be this write's retry).
    if (repairs_pending_.load(std::memory_order_relaxed) > 0 && replicator_ != nullptr) {
      if (Status repaired = RepairKey(r.key, *map, shard); !repaired.ok()) {
        return AnswerNow(ex, repaired);
      }
    }
    if (!IsReplicated(*map, shard)) map.reset();  // not replicated: the plain path
  }
  return WriteUnderLocks(r, ex, map.get(), shard);
}

std::optional<bool> Service::CheckWriteOwner(const kv::Request& r, Exchange ex) {
  if (cluster_ == nullptr) return std::nullopt;
  cluster_->AssertOwnerHeld();  // the callers hold an OwnerGuard
  if (r.op == kv::Op::kImport) {
    // A moved item goes only into a shard this server does not own yet: once it owns the
    // shard it has acknowledged writes there, which a late or repeated copy must not replace.
    const uint32_t shard = store_->ShardOfKey(r.key);
    NoteCopy(shard, /*begin=*/false).IgnoreError();
    if (store_->Owns(shard)) {
      return AnswerNow(
          ex, Status::InvalidArgument(
                  "IMPORT refused: this server already owns shard " + std::to_string(shard) +
                  " (a copy must finish before the new owner takes the shard; is another move "
                  "running?)"));
    }
    return std::nullopt;
  }
  uint64_t epoch = 0;
  Status own = cluster_->CheckOwner(r.key, &epoch);
  if (own.ok()) return std::nullopt;
  // Not an error of this server: counted apart, and the answer carries the map epoch.
  counters_.wrong_owner.fetch_add(1, std::memory_order_relaxed);
  RecordAnswer(ex.op, ex.received, own.code());
  kv::EncodeResponse(own, epoch, {}, ex.response);
  return true;
}

std::optional<bool> Service::AnswerRetry(const kv::Request& r, Exchange ex) {
  if (r.client_id == 0) return std::nullopt;
  // A retry of a write this server (or, before a promotion, its primary) already applied.
  std::optional<RetryTable::Answer> first = retry_table_.Find(r.client_id, r.request_seq);
  if (!first) return std::nullopt;
  counters_.retries_answered.fetch_add(1, std::memory_order_relaxed);
  if (first->code != StatusCode::kOk) {
    // A refusal (RecordRefusal): nothing was written, so nothing to wait for.
    return AnswerNow(ex, Status(first->code, "refused when this request id was first seen"),
                     first->version);
  }
  if (persister_ != nullptr && persister_->durability() == Durability::kSync) {
    // The first attempt is recorded when it is applied, and may still wait for its WAL sync
    // (its own answer goes out only then): a retry that overtook it must not be acknowledged
    // before that. A marker enqueued now is written after it, so the retry is answered once
    // everything enqueued so far is durable (or with the error that made it not durable).
    persister_->EnqueueMaxVersion(first->version,
                                  [answer = AnswerLater(ex), code = first->code,
                                   version = first->version](const Status& durable) {
                                    answer(durable.ok() ? Status(code, "") : durable, version, {});
                                  });
    return false;
  }
  return AnswerNow(ex, Status(first->code, ""), first->version);
}

bool Service::AnswerApplied(const kv::Request& r, Exchange ex, uint64_t version,
                            const std::optional<kv::ItemLocation>& where) {
  if (r.client_id != 0) {
    retry_table_.Record(store_->ShardOfKey(r.key), r.client_id, r.request_seq,
                        {StatusCode::kOk, version});
  }
  if (persister_ == nullptr) return AnswerNow(ex, Status::Ok(), version, WriteAnswerBody(where));
  return Persist(r, version, where, ex);
}

bool Service::IsDefiniteRefusal(StatusCode code) {
  return code == StatusCode::kAlreadyExists || code == StatusCode::kNotFound ||
         code == StatusCode::kVersionMismatch || code == StatusCode::kOutOfSpace;
}

void Service::RecordRefusal(const kv::Request& r, const Status& refusal, uint64_t version) {
  if (r.client_id == 0 || !IsDefiniteRefusal(refusal.code())) return;
  retry_table_.Record(store_->ShardOfKey(r.key), r.client_id, r.request_seq,
                      {refusal.code(), version});
}

bool Service::WriteUnderLocks(const kv::Request& r, Exchange ex, const cluster::ClusterMap* map,
                              uint32_t shard) {
  if (std::optional<bool> retried = AnswerRetry(r, ex)) return *retried;
  uint64_t version = 0;
  std::optional<kv::ItemLocation> where;
  Status applied = map != nullptr ? ApplyReplicated(r, *map, shard, &version, &where)
                                  : ApplyToStore(r, &version, &where);
  if (!applied.ok()) {
    RecordRefusal(r, applied, version);
    return AnswerNow(ex, applied, version);
  }
  return AnswerApplied(r, ex, version, where);
}

bool Service::TryWriteOnReceivingThread(std::span<const uint8_t> request,
                                        std::vector<uint8_t>* response,
                                        transport::ReplyHandle* reply) {
  // Only what can never wait: no persister (whose queue may push back), no repair pending, and
  // locks that are free right now. A replicated write is only started here (answered later
  // from the thread that reads its backups' answers); a REPLICATE is a backup's side.
  if (persister_ != nullptr) return false;
  Result<kv::Request> decoded = kv::DecodeRequest(request, limits_);
  if (!decoded.ok()) return false;  // a worker answers (and counts) the error
  const kv::Request& r = *decoded;
  const transport::SessionRole role = reply != nullptr && reply->session != nullptr
                                          ? reply->session->role()
                                          : transport::SessionRole::kData;
  if (r.op == kv::Op::kReplicate) {
    // A backup's side waits for no other server: applied here when its locks are free now.
    return role == transport::SessionRole::kAdmin && TryReplicateOnReceivingThread(r, response);
  }
  if (repairs_pending_.load(std::memory_order_relaxed) > 0) return false;
  if (r.op != kv::Op::kPut && r.op != kv::Op::kInsert && r.op != kv::Op::kCas &&
      r.op != kv::Op::kDelete) {
    return false;
  }
  // Small values only (a large copy and checksum would hold up the thread's READs), and a heap
  // with room: a write must not wait for blocks in their grace period here.
  if (r.value.size() > kv::kInPlaceMaxItemBytes ||
      !store_->HasRoomFor(r.key.size(), r.value.size())) {
    return false;
  }
  if (async_replicated_writes_ && replicator_ != nullptr && cluster_ != nullptr &&
      reply != nullptr && reply->session != nullptr &&
      IsReplicated(*cluster_->map(), store_->ShardOfKey(r.key))) {
    // Started here (no worker): answered now when refused, or later through *reply once its
    // backups have answered (docs/design.md "No thread waits for the backups").
    const std::function<Deliver()> defer = [reply]() -> Deliver {
      return [h = std::move(*reply)](std::span<const uint8_t> out) {
        h.session->Reply(h.request_id, out).IgnoreError();  // client gone: nothing to do
      };
    };
    Exchange ex{response, &defer};
    ex.op = static_cast<uint8_t>(r.op);
    ex.role = role;
    Store::NoWaitScope no_wait;
    t_on_receiving_thread = true;
    const std::optional<bool> started = StartReplicatedWrite(r, ex, /*on_receiving_thread=*/true);
    t_on_receiving_thread = false;
    // Declined (nothing done or counted, *reply untouched): a worker takes it. Else answered
    // into *response, or *reply was taken.
    return started.has_value();
  }
  Store::NoWaitScope no_wait;
  const std::function<Deliver()> no_defer;  // never used: this path answers at once
  Exchange ex{response, &no_defer};
  ex.op = static_cast<uint8_t>(r.op);
  ClusterState::OwnerTryGuard owner_guard(cluster_);
  if (!owner_guard.held()) return false;  // a map install is under way
  if (cluster_ != nullptr && IsReplicated(*cluster_->map_held(), store_->ShardOfKey(r.key))) {
    return false;
  }
  StripeTurn key_lock = TryTakeStripe(r.key);
  if (!key_lock) return false;  // another write of a key of this stripe is running
  if (std::optional<bool> refused = CheckWriteOwner(r, ex)) return *refused;
  CountWrite(r.op);
  counters_.writes_on_receiving_thread.fetch_add(1, std::memory_order_relaxed);
  return WriteUnderLocks(r, ex, nullptr, 0);
}

Status Service::CheckReplicatedWrite(const kv::Request& r, uint32_t shard, uint64_t* version) {
  // The precondition, against the store (this write holds the key's stripe; in a group, the
  // first write of its key: the later ones are PUTs, which have none).
  uint64_t current = 0;
  Status found = store_->Lookup(r.key, &current);
  if (!found.ok() && !found.Is(StatusCode::kNotFound)) return found;
  const bool present = found.ok();
  switch (r.op) {
    case kv::Op::kInsert:
      if (present) {
        *version = current;
        return Status::AlreadyExists("key exists (version " + std::to_string(current) + ")");
      }
      break;
    case kv::Op::kCas:
      if (!present) return Status::NotFound("key not found");
      if (current != r.expected_version) {
        *version = current;
        return Status::VersionMismatch("current version is " + std::to_string(current) + ", not " +
                                       std::to_string(r.expected_version));
      }
      break;
    case kv::Op::kDelete:
      if (!present) return Status::NotFound("key not found");
      break;
    default:
      break;
  }
  if (r.op != kv::Op::kDelete && r.value.size() > limits_.max_value_bytes) {
    return Status::InvalidArgument(
        "value of " + std::to_string(r.value.size()) +
        " bytes is larger than --max_value_size=" + std::to_string(limits_.max_value_bytes));
  }
  if (replicator_ == nullptr) {
    return Status::Internal("shard " + std::to_string(shard) +
                            " is replicated but this server has no replicator");
  }
  const size_t repair_keys = repairs_pending_.load(std::memory_order_relaxed);
  const size_t repair_bytes = repair_bytes_pending_.load(std::memory_order_relaxed);
  if (repair_keys >= kMaxRepairKeys || repair_bytes >= max_repair_bytes_) {
    return Status::Unavailable(
        "shard " + std::to_string(shard) + ": " + std::to_string(repair_keys) +
        " earlier writes of this server (" + std::to_string(repair_bytes) +
        " bytes of keys and values; the limits are " + std::to_string(kMaxRepairKeys) +
        " writes and " + std::to_string(max_repair_bytes_) +
        " bytes) failed at a backup and await repair; writes are refused until its backups "
        "answer again");
  }
  return Status::Ok();
}

kv::ReplicateRequest Service::ReplicateRequestFor(const kv::Request& r, uint64_t epoch) const {
  kv::ReplicateRequest m;
  m.key = r.key;
  m.value = r.value;
  m.map_epoch = epoch;
  m.is_delete = r.op == kv::Op::kDelete;
  m.sender_id = cluster_->server_id();
  m.client_id = r.client_id;
  m.request_seq = r.request_seq;
  return m;
}

std::optional<Status> Service::ForwardFailed(const kv::ReplicateRequest& m, uint32_t shard,
                                             const Status& forwarded, uint64_t newer, int attempt) {
  // A backup holds a newer version of the key than this server ever gave it (a write of an
  // earlier primary that this server never received): go above it and forward again.
  if (newer == 0) {
    // Some backups may have applied it: every replica gets it before the key's next write.
    NoteFailedWrite(m, shard);
    return forwarded;
  }
  if (attempt >= 3) {
    NoteFailedWrite(m, shard);
    return Status::Unavailable("shard " + std::to_string(shard) +
                               ": the write was not acknowledged (backups kept holding newer "
                               "versions; it may be applied on some replicas): " +
                               forwarded.message());
  }
  store_->EnsureVersionAbove(newer);
  return std::nullopt;
}

Status Service::PublishReplicated(const kv::ReplicateRequest& m, uint32_t shard,
                                  std::optional<kv::ItemLocation>* where) {
  bool changed = false;
  kv::ItemLocation stored;
  Status s = m.is_delete
                 ? store_->DeleteVersioned(m.key, m.version, &changed)
                 : store_->ApplyVersioned(m.key, m.value, m.version, &changed, nullptr, &stored);
  if (!s.ok()) {
    // The backups have it and this server could not store it (out of space): the replicas
    // disagree until the key's next write. Say so loudly; the client sees the error.
    LOG(ERROR) << "shard " << shard
               << ": a write the backups applied failed here: " << s.ToString();
    NoteFailedWrite(m, shard);  // the repair applies it here once there is room
    return Status::Unavailable("shard " + std::to_string(shard) +
                               ": the write was applied by the backups but not by the primary (" +
                               s.ToString() + "); its outcome is unknown");
  }
  if (changed && !m.is_delete) *where = stored;
  return Status::Ok();
}

Status Service::ApplyReplicated(const kv::Request& r, const cluster::ClusterMap& map,
                                uint32_t shard, uint64_t* version,
                                std::optional<kv::ItemLocation>* where) {
  // 2. The precondition and the limits.
  if (Status checked = CheckReplicatedWrite(r, shard, version); !checked.ok()) return checked;
  // 3 and 4. A version, and every in-sync backup applies the write before this server does.
  kv::ReplicateRequest m = ReplicateRequestFor(r, map.epoch);
  counters_.replicated_writes.fetch_add(1, std::memory_order_relaxed);
  for (int attempt = 0;; ++attempt) {
    m.version = store_->NextVersion();
    uint64_t newer = 0;
    Status forwarded = replicator_->Forward(map, shard, m, &newer);
    if (forwarded.ok()) break;
    if (std::optional<Status> failed = ForwardFailed(m, shard, forwarded, newer, attempt)) {
      return *failed;
    }
  }
  // 5. Published here: from now on one-sided GETs see it.
  RDKV_RETURN_IF_ERROR(PublishReplicated(m, shard, where));
  *version = m.version;
  return Status::Ok();
}

std::optional<bool> Service::StartReplicatedWrite(const kv::Request& r, Exchange ex,
                                                  bool on_receiving_thread) {
  // Never waits except for the persister's admission (local; there is no persister on the
  // receiving thread): what would wait goes to the writer pool, whose thread may
  // (docs/design.md "Why two servers cannot stall each other"). On the receiving thread it
  // is declined instead (nothing done or counted): the transport queues it for a worker, which
  // keeps the session's order (an inline answer must not overtake queued work).
  auto wait_elsewhere = [&]() -> std::optional<bool> {
    if (on_receiving_thread) return std::nullopt;
    return OffloadWrite(r, ex);
  };
  if (repairs_pending_.load(std::memory_order_relaxed) > 0) return wait_elsewhere();
  if (async_writes_.load(std::memory_order_relaxed) >= kMaxAsyncWrites ||
      async_bytes_.load(std::memory_order_relaxed) >= kMaxAsyncBytes) {
    return wait_elsewhere();  // enough in flight: this one waits on a thread
  }
  const Status admitted = persister_ != nullptr ? persister_->Admit() : Status::Ok();
  ClusterState::OwnerTryGuard owner_guard(cluster_);
  if (!owner_guard.held()) return wait_elsewhere();  // an install is under way
  // A write of this stripe in flight: parked behind it when it will hand the stripe on (no
  // thread waits), else the waiting path.
  const size_t stripe_index = StripeIndex(r.key);
  StripeTurn stripe;  // every return below hands the stripe on to what parks meanwhile
  switch (TakeStripeOrPark(r, ex, stripe_index, /*may_park=*/!on_receiving_thread, &stripe)) {
    case StripeTake::kTaken:
      break;
    case StripeTake::kParked:
      return false;
    case StripeTake::kBusy:
      return wait_elsewhere();
  }
  // Again under the stripe: an earlier write of this key may have failed (and been kept for
  // repair) since the first look; its repair (step 0) runs on the waiting path.
  if (repairs_pending_.load(std::memory_order_acquire) > 0) return wait_elsewhere();
  if (std::optional<bool> refused = CheckWriteOwner(r, ex)) return *refused;
  CountWrite(r.op);
  if (!admitted.ok()) return AnswerNow(ex, admitted);
  std::shared_ptr<const cluster::ClusterMap> map = cluster_->map_held();
  const uint32_t shard = store_->ShardOfKey(r.key);
  if (!IsReplicated(*map, shard)) return WriteUnderLocks(r, ex, nullptr, 0);  // since changed
  // 1. A retry of a write already applied gets its first answer.
  if (std::optional<bool> retried = AnswerRetry(r, ex)) return *retried;
  // 2. The precondition and the limits.
  uint64_t version = 0;
  if (Status checked = CheckReplicatedWrite(r, shard, &version); !checked.ok()) {
    RecordRefusal(r, checked, version);
    return AnswerNow(ex, checked, version);
  }
  auto w = std::make_unique<ReplicatedWrite>(r);
  w->m = ReplicateRequestFor(w->owned.request, map->epoch);
  w->map = std::move(map);
  w->shard = shard;
  w->op = ex.op;
  w->received = ex.received;
  w->role = ex.role;
  w->deliver = (*ex.defer)();
  w->owner = cluster_->HoldForWrite();
  w->stripe = stripe.Take();  // from here the completion hands the stripe on
  w->stripe_index = stripe_index;
  w->start_here = !on_receiving_thread;
  counters_.replicated_writes.fetch_add(1, std::memory_order_relaxed);
  async_writes_.fetch_add(1, std::memory_order_relaxed);
  async_bytes_.fetch_add(w->owned.bytes(), std::memory_order_relaxed);
  {
    MutexLock lock(&offload_mu_);
    ++offloaded_;
  }
  ForwardReplicatedWrite(std::move(w));
  return false;
}

void Service::ForwardReplicatedWrite(std::unique_ptr<ReplicatedWrite> w) {
  // 3 and 4.
  w->m.version = store_->NextVersion();
  // The completion owns the write from here (it runs exactly once, maybe before this returns).
  ReplicatedWrite* raw = w.release();
  replicator_->ForwardAsync(
      *raw->map, raw->shard, raw->m,
      [this, raw](const Status& forwarded, uint64_t newer) {
        OnForwarded(std::unique_ptr<ReplicatedWrite>(raw), forwarded, newer);
      },
      raw->start_here);
}

void Service::OnForwarded(std::unique_ptr<ReplicatedWrite> w, const Status& forwarded,
                          uint64_t newer) {
  std::vector<uint8_t> response;
  Deliver deliver = std::move(w->deliver);
  const std::function<Deliver()> defer = [&deliver]() { return std::move(deliver); };
  Exchange ex{&response, &defer, w->op, w->received, w->role};
  bool answered = false;
  std::optional<kv::ItemLocation> where;
  // On the receiving thread (every backup failed at once) the store must not wait either: its
  // NoWaitScope (TryWriteOnReceivingThread) is still in force.
  if (!forwarded.ok()) {
    std::optional<Status> failed = ForwardFailed(w->m, w->shard, forwarded, newer, w->attempt);
    if (!failed) {
      ++w->attempt;  // above the newer version: again, still holding everything
      // Queued only: this thread may be a sender (whose own backup's answers must not wait
      // for another backup's send) or the receiving thread.
      w->start_here = false;
      w->deliver = std::move(deliver);
      ForwardReplicatedWrite(std::move(w));
      return;
    }
    answered = AnswerNow(ex, *failed);
  } else if (Status published = PublishReplicated(w->m, w->shard, &where); !published.ok()) {
    answered = AnswerNow(ex, published);
  } else {
    // 5 and 6, as WriteUnderLocks after its apply.
    answered = AnswerApplied(w->owned.request, ex, w->m.version, where);
  }
  async_writes_.fetch_sub(1, std::memory_order_relaxed);
  async_bytes_.fetch_sub(w->owned.bytes(), std::memory_order_relaxed);
  TransferableHold stripe = std::move(w->stripe);
  const size_t stripe_index = w->stripe_index;
  w.reset();  // gives the ownership hold back (after the persister's enqueue)
  HandOnStripe(stripe_index, std::move(stripe));  // to the writes parked behind it, if any
  if (answered) deliver(response);                // else Persist took `deliver`
  FinishOffloaded();
}

bool Service::TryReplicateOnReceivingThread(const kv::Request& r, std::vector<uint8_t>* response) {
  if (cluster_ == nullptr) return false;    // a worker answers the error
  if (before_replica_apply_) return false;  // a test's hook may block: not on this thread
  std::vector<kv::ReplicateRequest> entries;
  const bool is_batch = kv::IsReplicateBatch(r);
  if (is_batch) {
    Result<kv::ReplicateBatch> batch = kv::DecodeReplicateBatch(r, limits_);
    if (!batch.ok()) return false;
    entries = std::move(batch->entries);
  } else {
    Result<kv::ReplicateRequest> m = kv::DecodeReplicate(r);
    if (!m.ok()) return false;
    entries.push_back(*m);
  }
  // A larger batch (a catch-up copy's, a deep pipeline's) goes to a worker, which takes each
  // entry's stripe in turn: this thread would hold a stripe per entry at once, and also serves
  // READs meanwhile.
  if (entries.size() > kMaxEntriesOnReceivingThread) return false;
  // All or nothing, so that a worker can take the whole request instead: room in the heap for
  // every entry, and every entry's replica stripe free now (held across the request; TryLock
  // never waits, so the order they are taken in does not matter).
  size_t key_bytes = 0, value_bytes = 0;
  for (const kv::ReplicateRequest& m : entries) {
    // Small values only, as for a client's write here (a large copy and checksum would hold up
    // this thread's READs).
    if (m.value.size() > kv::kInPlaceMaxItemBytes) return false;
    key_bytes += m.key.size();
    value_bytes += m.value.size() + sizeof(kv::ItemHeader) + kv::kUnit;  // an item each
  }
  if (!store_->HasRoomFor(key_bytes, value_bytes)) return false;
  std::vector<Mutex*> held;
  held.reserve(entries.size());
  auto release = [&held]() NO_THREAD_SAFETY_ANALYSIS {
    for (Mutex* mu : held) mu->Unlock();
  };
  for (const kv::ReplicateRequest& m : entries) {
    Mutex* mu = &replica_stripes_[kv::KeyHash(m.key) % kKeyStripes];
    if (std::find(held.begin(), held.end(), mu) != held.end()) continue;
    if (!TryLockStripe(mu)) {
      release();
      return false;
    }
    held.push_back(mu);
  }
  Store::NoWaitScope no_wait;
  const std::function<Deliver()> no_defer;  // never used: this path answers at once
  Exchange ex{response, &no_defer};
  ex.op = static_cast<uint8_t>(kv::Op::kReplicate);
  counters_.replicates_on_receiving_thread.fetch_add(1, std::memory_order_relaxed);
  if (is_batch) counters_.replicate_batches.fetch_add(1, std::memory_order_relaxed);
  // As HandleReplicate / HandleReplicateBatch, entry by entry in the request's order (each
  // role check under the entry's stripe, held since the TryLocks above).
  std::vector<kv::ReplicateBatchResult> results(entries.size());
  Status single;
  for (size_t i = 0; i < entries.size(); ++i) {
    const kv::ReplicateRequest& m = entries[i];
    const uint32_t shard = store_->ShardOfKey(m.key);
    bool joining = false;
    Status s = cluster_->CheckReplica(shard, m.map_epoch, m.sender_id, &joining);
    uint64_t version = 0;
    if (s.ok()) {
      counters_.replicas_applied.fetch_add(1, std::memory_order_relaxed);
      bool changed = false;
      s = ApplyReplica(m, shard, joining, &version, &changed);
      if (s.ok()) RecordReplicaApplied(m);  // no persister on this path
    }
    results[i] = {s.code(), version};
    single = s;
  }
  release();
  if (is_batch) return AnswerNow(ex, Status::Ok(), entries.size(), EncodeReplicateResults(results));
  return AnswerNow(ex, single, results[0].version);
}

bool Service::TryLockStripe(Mutex* mu) NO_THREAD_SAFETY_ANALYSIS { return mu->TryLock(); }

uint64_t Service::StaleAfterDelete(const kv::ReplicateRequest& m) const {
  const uint64_t deleted = replica_deletes_.DeletedAtOrAbove(m.key, m.version);
  if (deleted == 0) return 0;
  // Only an absent key: a present one refuses an older PUT by its version (and a key written
  // again after the delete has a version above it).
  uint64_t current = 0;
  return store_->Lookup(m.key, &current).Is(StatusCode::kNotFound) ? deleted : 0;
}

void Service::PersistReplica(const kv::ReplicateRequest& m,
                             persistence::Persister::Completion done) {
  if (m.is_delete) {
    persister_->EnqueueDelete(m.key, std::move(done));
  } else {
    persister_->EnqueuePut(m.key, m.version, m.value, std::move(done));
  }
  RecordReplicaApplied(m);
}

void Service::RecordReplicaApplied(const kv::ReplicateRequest& m) {
  // After the persister has the write (when it takes one): a retry that finds the id here after
  // a promotion waits for a marker enqueued behind it (AnswerRetry), so it is not acknowledged
  // before the write is durable.
  if (m.client_id != 0) {
    retry_table_.Record(store_->ShardOfKey(m.key), m.client_id, m.request_seq,
                        {StatusCode::kOk, m.version});
  }
}

bool Service::HandleReplicate(const kv::Request& r, Exchange ex) {
  if (kv::IsReplicateBatch(r)) return HandleReplicateBatch(r, ex);
  Result<kv::ReplicateRequest> m = kv::DecodeReplicate(r);
  if (!m.ok()) return AnswerNow(ex, m.status());
  if (Status s = RequireCluster("replicate"); !s.ok()) return AnswerNow(ex, s);
  const Status admitted = persister_ != nullptr ? persister_->Admit() : Status::Ok();
  // No OwnerGuard: an install here may be waiting for this server's own writes, which may be
  // waiting for a primary that waits for this answer.
  const uint32_t shard = store_->ShardOfKey(m->key);
  // Its own stripes, not the primary writes' (KeyStripe): a primary write holds its key's
  // stripe while it waits for its backups, and a backup's stripe of another key hashed alike,
  // held by a write of its own waiting for this server, would close a cycle between servers.
  // The role is checked under the stripe (WaitForReplicaApplies).
  MutexLock key_lock(&replica_stripes_[kv::KeyHash(m->key) % kKeyStripes]);
  bool joining = false;
  Status role = cluster_->CheckReplica(shard, m->map_epoch, m->sender_id, &joining);
  if (!role.ok()) return AnswerNow(ex, role);
  if (!admitted.ok()) return AnswerNow(ex, admitted);
  if (before_replica_apply_) {
    if (Status injected = before_replica_apply_(*m); !injected.ok()) return AnswerNow(ex, injected);
  }
  counters_.replicas_applied.fetch_add(1, std::memory_order_relaxed);
  uint64_t version = 0;
  bool changed = false;
  Status s = ApplyReplica(*m, shard, joining, &version, &changed);
  if (!s.ok()) return AnswerNow(ex, s, version);
  // Answered once durable in sync mode, like the primary's own write.
  const bool deferred = persister_ != nullptr && persister_->durability() == Durability::kSync;
  if (!changed && deferred) {
    // Nothing applied: this server has the version already (a forward sent again by a repair
    // or a promoted primary's resend), but its first copy may still wait for its WAL sync. A
    // marker enqueued now is synced after it: the answer waits for that.
    RecordReplicaApplied(*m);
    persister_->EnqueueMaxVersion(m->version, [answer = AnswerLater(ex), v = m->version](
                                                  const Status& st) { answer(st, v, {}); });
    return false;
  }
  if (persister_ == nullptr || !changed) {
    RecordReplicaApplied(*m);
    return AnswerNow(ex, Status::Ok(), m->version);
  }
  persistence::Persister::Completion done;
  if (deferred) {
    done = [answer = AnswerLater(ex), v = m->version](const Status& st) { answer(st, v, {}); };
  }
  PersistReplica(*m, std::move(done));
  if (deferred) return false;
  return AnswerNow(ex, Status::Ok(), m->version);
}

Status Service::ApplyReplica(const kv::ReplicateRequest& m, uint32_t shard, bool joining,
                             uint64_t* version, bool* changed) {
  *changed = false;
  *version = 0;
  if (m.answers) {
    // Earlier writes of the key, superseded by the state sent before this (docs/design.md
    // "Exactly once"): nothing to apply. Taken only where that state (or a newer one) is:
    // the answers say the writes took effect, which is true here only then. Their retries get
    // these answers from now on, and this server sends them on if it is promoted.
    uint64_t current = 0;
    const bool held = store_->Lookup(m.key, &current).ok() && current >= m.version;
    // (A joining replica also counts the deletes it remembers for its catch-up: it skipped the
    // state for one of those, and may have forgotten its own tombstone of it.)
    if (!held && replica_deletes_.DeletedAtOrAbove(m.key, m.version) == 0 &&
        !(joining && DeletedSince(shard, m.key, m.version))) {
      return Status::Unavailable("answers for version " + std::to_string(m.version) +
                                 " of a key this backup does not hold at that version (the "
                                 "state sent before them did not arrive)");
    }
    for (const kv::AnsweredWrite& w : kv::DecodeAnsweredWrites(m.value)) {
      retry_table_.Record(shard, w.client_id, w.request_seq, {StatusCode::kOk, w.version});
      RememberApplied(shard, m.key, w.version, w.client_id, w.request_seq);
    }
    counters_.answers_received.fetch_add(1, std::memory_order_relaxed);
    *version = m.version;
    return Status::Ok();
  }
  Status s;
  uint64_t current = 0;
  if (m.is_delete) {
    s = store_->DeleteVersioned(m.key, m.version, changed, &current);
    // Catching up: a copied item older than this delete must not bring the key back.
    if (s.ok() && joining) RememberDelete(shard, m.key, m.version);
    // A stale forward older than this delete must not bring the key back either (whether
    // the key was here or not).
    if (s.ok()) replica_deletes_.RememberDelete(m.key, m.version);
  } else if (joining && DeletedSince(shard, m.key, m.version)) {
    s = Status::Ok();  // deleted after the copied version: nothing to apply
  } else if (const uint64_t deleted = joining ? 0 : StaleAfterDelete(m); deleted != 0) {
    // Not above a delete applied here (docs/design.md, a stale REPLICATE after a delete): as
    // for a newer version, the primary takes a version above it if it still waits.
    counters_.stale_forwards_refused.fetch_add(1, std::memory_order_relaxed);
    *version = deleted;
    return Status::VersionMismatch("the key was deleted here at version " +
                                   std::to_string(deleted));
  } else {
    s = store_->ApplyVersioned(m.key, m.value, m.version, changed, &current);
  }
  if (s.ok() && !*changed && current > m.version) {
    // A version this primary never saw (an earlier primary's write that failed at it): the
    // primary takes a version above it and forwards again.
    *version = current;
    return Status::VersionMismatch("the key has the newer version " + std::to_string(current) +
                                   " here");
  }
  if (!joining && has_tombstones_.load(std::memory_order_relaxed)) ForgetDeletes(shard);
  if (s.ok() && *changed) RememberApplied(shard, m.key, m.version, m.client_id, m.request_seq);
  if (!s.ok()) return s;
  if (joining) counters_.catchup_applied.fetch_add(1, std::memory_order_relaxed);
  *version = m.version;
  return Status::Ok();
}

bool Service::HandleReplicateBatch(const kv::Request& r, Exchange ex) {
  Result<kv::ReplicateBatch> batch = kv::DecodeReplicateBatch(r, limits_);
  if (!batch.ok()) return AnswerNow(ex, batch.status());
  if (Status s = RequireCluster("replicate"); !s.ok()) return AnswerNow(ex, s);
  // As HandleReplicate, entry by entry in the batch's order (the primary's version order).
  const Status admitted = persister_ != nullptr ? persister_->Admit() : Status::Ok();
  if (!admitted.ok()) return AnswerNow(ex, admitted);
  counters_.replicate_batches.fetch_add(1, std::memory_order_relaxed);
  const size_t n = batch->entries.size();
  // In sync mode the answer waits for every entry's persistence: the last completion (or this
  // thread, when it finishes last) answers.
  struct Pending {
    Mutex mu;
    std::vector<kv::ReplicateBatchResult> results GUARDED_BY(mu);
    size_t waiting GUARDED_BY(mu) = 1;  // this thread's hold
    std::function<void(const Status&, uint64_t, std::string_view)> answer;
  };
  const auto encode = EncodeReplicateResults;
  std::vector<kv::ReplicateBatchResult> results(n);
  std::shared_ptr<Pending> pending;
  auto start_pending = [&] {
    if (pending != nullptr) return;
    pending = std::make_shared<Pending>();
    pending->answer = AnswerLater(ex);
    MutexLock lock(&pending->mu);
    pending->results.assign(n, {StatusCode::kOk, 0});  // completions write failures here
  };
  const bool sync = persister_ != nullptr && persister_->durability() == Durability::kSync;
  std::vector<size_t> unchanged;  // sync mode: entries this server had already
  uint64_t unchanged_max = 0;
  for (size_t i = 0; i < n; ++i) {
    const kv::ReplicateRequest& m = batch->entries[i];
    const uint32_t shard = store_->ShardOfKey(m.key);
    MutexLock key_lock(&replica_stripes_[kv::KeyHash(m.key) % kKeyStripes]);
    bool joining = false;
    Status role = cluster_->CheckReplica(shard, m.map_epoch, m.sender_id, &joining);
    if (!role.ok()) {
      results[i] = {role.code(), 0};
      continue;
    }
    if (before_replica_apply_) {
      if (Status injected = before_replica_apply_(m); !injected.ok()) {
        results[i] = {injected.code(), 0};
        continue;
      }
    }
    counters_.replicas_applied.fetch_add(1, std::memory_order_relaxed);
    uint64_t version = 0;
    bool changed = false;
    Status s = ApplyReplica(m, shard, joining, &version, &changed);
    results[i] = {s.code(), version};
    if (!s.ok()) continue;
    if (persister_ == nullptr || !changed) {
      RecordReplicaApplied(m);
      // Nothing applied in sync mode: the entry's first copy may still wait for its WAL sync.
      // One marker after the loop, synced after every such copy, holds the answer back.
      if (sync) {
        unchanged.push_back(i);
        unchanged_max = std::max(unchanged_max, m.version);
      }
      continue;
    }
    persistence::Persister::Completion done;
    if (sync) {
      start_pending();
      {
        MutexLock lock(&pending->mu);
        ++pending->waiting;
      }
      done = [pending, i, encode](const Status& st) {
        std::vector<kv::ReplicateBatchResult> out;
        {
          MutexLock lock(&pending->mu);
          if (!st.ok()) pending->results[i] = {st.code(), 0};
          if (--pending->waiting > 0) return;
          out = std::move(pending->results);
        }
        pending->answer(Status::Ok(), out.size(), encode(out));
      };
    }
    PersistReplica(m, std::move(done));
  }
  if (!unchanged.empty()) {
    start_pending();
    {
      MutexLock lock(&pending->mu);
      ++pending->waiting;
    }
    persister_->EnqueueMaxVersion(
        unchanged_max, [pending, encode, unchanged = std::move(unchanged)](const Status& st) {
          std::vector<kv::ReplicateBatchResult> out;
          {
            MutexLock lock(&pending->mu);
            if (!st.ok()) {
              for (size_t i : unchanged) pending->results[i] = {st.code(), 0};
            }
            if (--pending->waiting > 0) return;
            out = std::move(pending->results);
          }
          pending->answer(Status::Ok(), out.size(), encode(out));
        });
  }
  if (pending == nullptr) return AnswerNow(ex, Status::Ok(), n, encode(results));
  std::vector<kv::ReplicateBatchResult> out;
  {
    MutexLock lock(&pending->mu);
    // Completions write only failures: this thread's results go under them.
    for (size_t i = 0; i < n; ++i) {
      if (pending->results[i].code == StatusCode::kOk) pending->results[i] = results[i];
    }
    if (--pending->waiting > 0) return false;
    out = std::move(pending->results);
  }
  pending->answer(Status::Ok(), out.size(), encode(out));
  return false;
}

void Service::CountWrite(kv::Op op) {
  std::atomic<uint64_t>* counter = nullptr;
  switch (op) {
    case kv::Op::kPut:
      counter = &counters_.puts;
      break;
    case kv::Op::kInsert:
      counter = &counters_.inserts;
      break;
    case kv::Op::kDelete:
      counter = &counters_.deletes;
      break;
    case kv::Op::kCas:
      counter = &counters_.cas;
      break;
    case kv::Op::kImport:
      counter = &counters_.imports;
      break;
    case kv::Op::kStats:
    case kv::Op::kPing:
    case kv::Op::kSnapshot:
    case kv::Op::kClusterMap:
    case kv::Op::kShardScan:
    case kv::Op::kDropShard:
    case kv::Op::kInstallMap:
    case kv::Op::kReplicate:
    case kv::Op::kShardIds:
    case kv::Op::kRecordIds:
      break;  // not writes: counted by their handlers
  }
  if (counter != nullptr) counter->fetch_add(1, std::memory_order_relaxed);
}

Status Service::ApplyToStore(const kv::Request& r, uint64_t* version,
                             std::optional<kv::ItemLocation>* where) {
  kv::ItemLocation stored;
  auto done = [&](const Result<uint64_t>& v) {
    if (v.ok()) {
      *version = *v;
      *where = stored;
    }
    return v.status();
  };
  switch (r.op) {
    case kv::Op::kPut:
      return done(store_->Put(r.key, r.value, &stored));
    case kv::Op::kInsert:
      return done(store_->Insert(r.key, r.value, version, &stored));
    case kv::Op::kCas:
      return done(store_->Cas(r.key, r.expected_version, r.value, version, &stored));
    case kv::Op::kDelete:
      return store_->Delete(r.key);
    case kv::Op::kImport: {
      // A moved item keeps its version exactly (DecodeImport checked it is > 0); the key must
      // be absent.
      Status s = store_->Restore(r.key, r.value, r.expected_version);
      if (s.Is(StatusCode::kAlreadyExists)) {
        return Status::AlreadyExists(
            "IMPORT refused: the key is already here (copies of one shard from two moves?)");
      }
      if (!s.ok()) return s;
      store_->EnsureVersionAbove(r.expected_version);
      *version = r.expected_version;
      return Status::Ok();
    }
    case kv::Op::kStats:
    case kv::Op::kPing:
    case kv::Op::kSnapshot:
    case kv::Op::kClusterMap:
    case kv::Op::kShardScan:
    case kv::Op::kDropShard:
    case kv::Op::kInstallMap:
    case kv::Op::kReplicate:
    case kv::Op::kShardIds:
    case kv::Op::kRecordIds:
      break;
  }
  return Status::Internal("operation " + std::string(kv::OpName(r.op)) + " is not a write");
}

std::string Service::WriteAnswerBody(const std::optional<kv::ItemLocation>& where) {
  std::string body;  // 8 bytes: no allocation (short-string storage)
  if (where.has_value()) kv::EncodeItemLocation(*where, &body);
  return body;
}

bool Service::Persist(const kv::Request& r, uint64_t version,
                      const std::optional<kv::ItemLocation>& where, Exchange ex) {
  // Applied (a GET may already see it); in sync mode acknowledged only once durable. IMPORT
  // answers only once the item is in RocksDB in every mode: the mover drops the old owner's
  // copy after the copy is answered.
  const bool deferred = persister_->durability() == Durability::kSync || r.op == kv::Op::kImport;
  persistence::Persister::Completion done;
  if (deferred) {
    done = [answer = AnswerLater(ex), version, body = WriteAnswerBody(where)](const Status& s) {
      answer(s, version, s.ok() ? std::string_view(body) : std::string_view());
    };
  }
  if (r.op == kv::Op::kDelete) {
    persister_->EnqueueDelete(r.key, std::move(done));
  } else {
    persister_->EnqueuePut(r.key, version, r.value, std::move(done));
  }
  if (deferred) return false;
  return AnswerNow(ex, Status::Ok(), version, WriteAnswerBody(where));
}

void Service::RememberDelete(uint32_t shard, std::string_view key, uint64_t version) {
  MutexLock lock(&tombstones_mu_);
  uint64_t& v = tombstones_[shard][std::string(key)];
  v = std::max(v, version);
  has_tombstones_.store(true, std::memory_order_relaxed);
}

bool Service::DeletedSince(uint32_t shard, std::string_view key, uint64_t version) {
  MutexLock lock(&tombstones_mu_);
  auto s = tombstones_.find(shard);
  if (s == tombstones_.end()) return false;
  auto k = s->second.find(std::string(key));
  return k != s->second.end() && k->second >= version;
}

size_t Service::catchup_tombstones() const {
  MutexLock lock(&tombstones_mu_);
  size_t n = 0;
  for (const auto& [shard, keys] : tombstones_) n += keys.size();
  return n;
}

void Service::ForgetDeletes(uint32_t shard) {
  MutexLock lock(&tombstones_mu_);
  tombstones_.erase(shard);
  has_tombstones_.store(!tombstones_.empty(), std::memory_order_relaxed);
}

void Service::RememberApplied(uint32_t shard, std::string_view key, uint64_t version,
                              uint64_t client_id, uint64_t request_seq) {
  const auto now = std::chrono::steady_clock::now();
  MutexLock lock(&recent_mu_);
  recent_.push_back({shard, std::string(key), version, client_id, request_seq, now});
  while (!recent_.empty() &&
         (recent_.size() > kResyncMaxKeys || now - recent_.front().at > kResyncWindow)) {
    recent_.pop_front();
  }
}

void Service::ResyncPromoted(const cluster::ClusterMap& next, const std::vector<uint32_t>& shards) {
  if (replicator_ == nullptr) return;
  // A forward from the old primary that passed its role check before this map was installed
  // is applied under its replica stripe: wait for it, so that what it wrote is in the log and
  // the state read below (one applied after the read would be served here and resent nowhere).
  WaitForReplicaApplies();
  // The newest entry per key of the promoted shards, and the request ids of its writes.
  struct Logged {
    uint64_t version = 0;
    std::vector<kv::AnsweredWrite> writes;
  };
  std::map<std::pair<uint32_t, std::string>, Logged> keys;
  {
    MutexLock lock(&recent_mu_);
    for (const RecentApply& r : recent_) {
      if (std::find(shards.begin(), shards.end(), r.shard) == shards.end()) continue;
      Logged& logged = keys[{r.shard, r.key}];
      logged.version = std::max(logged.version, r.version);
      if (r.client_id != 0) logged.writes.push_back({r.version, r.client_id, r.request_seq});
    }
  }
  // Each key's resend: its state, then the answers, as one chain that every backup applies in
  // order. Many keys at once (a promotion waits for the resend before it serves: one round
  // trip per key made it last seconds once tens of thousands of keys were written in the
  // window), within kResyncInFlight forwards and kResyncBytesInFlight bytes, so that the
  // replicator packs them into batches and none waits in a queue past its forward timeout. A
  // resend is freed when its last forward settles, unless it failed.
  struct Resend {
    uint32_t shard = 0;
    std::string value;
    std::vector<kv::AnsweredWrite> answered;
    std::vector<std::string> packed;  // the answers' values
    std::vector<kv::ReplicateRequest> chain;
    size_t bytes = 0;
    // Settled by the completions (under `mu` below).
    size_t unsettled = 0;
    Status state_result, answers_result;
  };
  const auto started = std::chrono::steady_clock::now();
  Mutex mu;
  CondVar settled;
  size_t in_flight = 0, bytes_in_flight = 0, failed = 0;  // guarded by mu
  size_t answered = 0;
  for (auto& [shard_key, logged] : keys) {
    const auto& [shard, key] = shard_key;
    {
      MutexLock lock(&mu);
      while (in_flight > 0 &&
             (in_flight >= kResyncInFlight || bytes_in_flight >= kResyncBytesInFlight)) {
        settled.Wait(&mu);
      }
    }
    auto r = std::make_unique<Resend>();
    r->shard = shard;
    kv::ReplicateRequest m;
    m.key = key;
    m.map_epoch = next.epoch;
    m.sender_id = cluster_->server_id();
    {
      StripeTurn key_lock = TakeStripe(key);
      uint64_t version = 0;
      Result<std::string> value = store_->Get(key, &version);
      if (value.ok()) {
        r->value = std::move(value).value();
        m.version = version;
      } else {
        m.is_delete = true;  // absent here: deleted (by the logged or a later write)
        m.version = std::max(logged.version, store_->version_counter());
      }
    }
    m.value = r->value;
    // The write that made this state goes with it, and every logged write of the key up to it
    // goes after it as answers (docs/design.md "Exactly once"), so that a backup that missed
    // them answers their retries once it is promoted in turn. That includes the state's own
    // write: a backup that holds a newer version refuses the state and records no id from it.
    UniqueAnswers(&logged.writes);
    for (const kv::AnsweredWrite& w : logged.writes) {
      if (w.version == m.version && m.client_id == 0) {
        m.client_id = w.client_id;
        m.request_seq = w.request_seq;
      }
      if (w.version <= m.version) r->answered.push_back(w);
    }
    answered += r->answered.size();
    r->chain.push_back(m);
    const std::vector<std::vector<kv::AnsweredWrite>> pieces = AnswerPieces(key, r->answered);
    r->packed.resize(pieces.size());  // sized first: the messages view its strings
    for (size_t i = 0; i < pieces.size(); ++i) {
      r->chain.push_back(AnswersMessage(next, key, pieces[i], &r->packed[i]));
    }
    r->bytes = r->chain.size() * (key.size() + kv::kReplicateBatchEntryHeaderBytes);
    for (const kv::ReplicateRequest& entry : r->chain) r->bytes += entry.value.size();
    r->unsettled = r->chain.size();
    std::vector<const kv::ReplicateRequest*> chain;
    std::vector<replication::Replicator::ForwardDone> dones;
    Resend* raw = r.get();
    for (size_t j = 0; j < raw->chain.size(); ++j) {
      chain.push_back(&raw->chain[j]);
      dones.push_back([this, raw, j, &mu, &settled, &in_flight, &bytes_in_flight, &failed](
                          const Status& st, uint64_t) {
        auto settle = [&](size_t bytes, bool failure) {  // under mu
          --in_flight;
          bytes_in_flight -= bytes;
          if (failure) ++failed;
          if (in_flight == 0 || in_flight < kResyncInFlight / 2 ||
              bytes_in_flight < kResyncBytesInFlight / 2) {
            settled.SignalAll();
          }
        };
        {
          MutexLock lock(&mu);
          if (j == 0) {
            raw->state_result = st;
          } else if (raw->answers_result.ok()) {
            raw->answers_result = st;
          }
          if (--raw->unsettled > 0) return settle(0, false);
        }
        // The chain's last completion (the others are done with `raw`). A backup that answers
        // with a newer version (a write or a delete that failed here and was never published)
        // keeps it: writing this state again above it would be a write no client made. Its
        // state is that pending write taken effect, which a failover to it may serve
        // (design.md, "Manual promotion"); the key's next write brings every replica to one
        // state. The answers are true there too (those writes took effect before it). (Not
        // `newer != 0`: with one backup newer and another failing, the result is kUnavailable
        // and `newer` is set too.) What failed is served from now on: the repair brings it and
        // its answers to the backups that missed it. Kept for repair here, before the resend
        // may end (its key views `keys`), so that a failed key's copy is not held until then.
        const bool ok =
            (raw->state_result.ok() || raw->state_result.Is(StatusCode::kVersionMismatch)) &&
            raw->answers_result.ok();
        if (ok) {
          counters_.answers_sent.fetch_add(raw->answered.size(), std::memory_order_relaxed);
        } else {
          NoteFailedWrite(raw->chain[0], raw->shard, /*served=*/true, raw->answered);
        }
        const size_t bytes = raw->bytes;
        delete raw;  // the replicator is done with every entry of its chain
        MutexLock lock(&mu);
        settle(bytes, !ok);
      });
    }
    {
      MutexLock lock(&mu);
      in_flight += chain.size();
      bytes_in_flight += raw->bytes;
    }
    r.release();  // owned by its completions from here
    replicator_->ForwardChainAsync(next, shard, chain, &dones);
  }
  {
    MutexLock lock(&mu);
    while (in_flight > 0) settled.Wait(&mu);
  }
  if (!keys.empty()) {
    LOG(INFO) << "promotion to map epoch " << next.epoch << ": resent " << keys.size()
              << " recently replicated key(s) of " << shards.size() << " shard(s) to their backups"
              << (answered > 0 ? " with " + std::to_string(answered) + " write id(s)" : "")
              << (failed == 0 ? "" : " (" + std::to_string(failed) + " not confirmed)") << " in "
              << std::chrono::duration_cast<std::chrono::milliseconds>(
                     std::chrono::steady_clock::now() - started)
                     .count()
              << " ms";
  }
}

std::vector<std::vector<kv::AnsweredWrite>> Service::AnswerPieces(
    std::string_view key, const std::vector<kv::AnsweredWrite>& answered) const {
  // Within half a batch, as a group's writes, and never fewer than one answer per message.
  const size_t room = replicator_->max_batch_bytes() / 2;
  const size_t overhead = key.size() + kv::kReplicateBatchEntryHeaderBytes;
  const size_t fit = room > overhead ? (room - overhead) / kv::kAnsweredWriteBytes : 1;
  const size_t per_message = std::clamp<size_t>(fit, 1, kv::kMaxAnsweredWrites);
  std::vector<std::vector<kv::AnsweredWrite>> pieces;
  for (size_t at = 0; at < answered.size(); at += per_message) {
    pieces.emplace_back(answered.begin() + at,
                        answered.begin() + std::min(answered.size(), at + per_message));
  }
  return pieces;
}

kv::ReplicateRequest Service::AnswersMessage(const cluster::ClusterMap& map, std::string_view key,
                                             const std::vector<kv::AnsweredWrite>& piece,
                                             std::string* packed) const {
  *packed = kv::EncodeAnsweredWrites(piece);
  kv::ReplicateRequest m;
  m.key = key;
  m.value = *packed;
  m.answers = true;
  m.map_epoch = map.epoch;
  m.sender_id = cluster_->server_id();
  for (const kv::AnsweredWrite& w : piece) m.version = std::max(m.version, w.version);
  return m;
}

Status Service::ForwardAnswers(const cluster::ClusterMap& map, uint32_t shard, std::string_view key,
                               std::vector<kv::AnsweredWrite> answered) {
  UniqueAnswers(&answered);
  std::string packed;
  for (const std::vector<kv::AnsweredWrite>& piece : AnswerPieces(key, answered)) {
    uint64_t newer = 0;
    RDKV_RETURN_IF_ERROR(
        replicator_->Forward(map, shard, AnswersMessage(map, key, piece, &packed), &newer));
  }
  counters_.answers_sent.fetch_add(answered.size(), std::memory_order_relaxed);
  return Status::Ok();
}

void Service::NoteFailedWrite(const kv::ReplicateRequest& m, uint32_t shard, bool served,
                              const std::vector<kv::AnsweredWrite>& answered) {
  counters_.repairs_noted.fetch_add(1, std::memory_order_relaxed);
  MutexLock lock(&repair_mu_);
  auto [it, inserted] = repairs_.try_emplace(std::string(m.key));
  PendingRepair& p = it->second;
  // Earlier than `m`, so earlier than any entry that stays too.
  p.superseded.insert(p.superseded.end(), answered.begin(), answered.end());
  if (!inserted) {
    if (p.version > m.version) return;  // the newer one stays
    repair_bytes_pending_.fetch_sub(it->first.size() + p.value.size(), std::memory_order_relaxed);
    // Superseded by `m`: the older write's id is answered as applied once `m` is repaired.
    if (p.client_id != 0 && p.version < m.version) {
      p.superseded.push_back({p.version, p.client_id, p.request_seq});
    }
  }
  p.shard = shard;
  p.map_epoch = m.map_epoch;
  p.value.assign(m.is_delete ? std::string_view() : m.value);
  p.version = m.version;
  p.is_delete = m.is_delete;
  p.client_id = m.client_id;
  p.request_seq = m.request_seq;
  p.served = served;
  repair_bytes_pending_.fetch_add(it->first.size() + p.value.size(), std::memory_order_relaxed);
  repairs_pending_.store(repairs_.size(), std::memory_order_relaxed);
  repair_cv_.Signal();
}

void Service::ForgetRepair(std::string_view key) {
  MutexLock lock(&repair_mu_);
  auto it = repairs_.find(std::string(key));
  if (it == repairs_.end()) return;
  repair_bytes_pending_.fetch_sub(it->first.size() + it->second.value.size(),
                                  std::memory_order_relaxed);
  repairs_.erase(it);
  repairs_pending_.store(repairs_.size(), std::memory_order_relaxed);
}

Status Service::RepairKey(std::string_view key, const cluster::ClusterMap& map, uint32_t shard) {
  PendingRepair p;
  {
    MutexLock lock(&repair_mu_);
    auto it = repairs_.find(std::string(key));
    if (it == repairs_.end()) return Status::Ok();
    p = it->second;
  }
  kv::ReplicateRequest m;
  m.key = key;
  m.value = p.value;
  m.version = p.version;
  m.is_delete = p.is_delete;
  m.map_epoch = map.epoch;
  m.sender_id = cluster_->server_id();
  m.client_id = p.client_id;
  m.request_seq = p.request_seq;
  auto not_repaired = [&](const Status& why) {
    counters_.repair_failures.fetch_add(1, std::memory_order_relaxed);
    return Status::Unavailable("shard " + std::to_string(shard) +
                               ": an earlier write of this key failed at a backup and is not "
                               "repaired yet (" +
                               why.message() + ")");
  };
  // The writes it superseded, as answers after it (docs/design.md "Exactly once"): a backup
  // promoted later answers their retries instead of applying them again.
  std::vector<kv::AnsweredWrite> answered = p.superseded;
  for (int attempt = 0;; ++attempt) {
    uint64_t newer = 0;
    Status forwarded = replicator_->Forward(map, shard, m, &newer);
    if (forwarded.ok()) break;
    // Only when every backup that did not apply it holds a newer version (one that failed
    // makes the result kUnavailable, with `newer` set by the others).
    if (!forwarded.Is(StatusCode::kVersionMismatch) || attempt == 3) {
      return not_repaired(forwarded);
    }
    if (map.epoch != p.map_epoch || p.served) {
      // Another primary wrote the key since (a promotion came between): its write supersedes
      // this one, which no client could read (it was never applied here). Or this primary
      // serves it already (a promotion's resend): the backup keeps its newer version, a
      // pending write taken effect, as when it answers the resend itself; this write and the
      // ones it superseded took effect before that one, and this primary answers their
      // retries: so do the backups (the newer one never recorded this write's id).
      if (p.served) {
        if (p.client_id != 0) answered.push_back({p.version, p.client_id, p.request_seq});
        if (!answered.empty()) {
          if (Status a = ForwardAnswers(map, shard, key, answered); !a.ok()) {
            return not_repaired(a);
          }
        }
      }
      counters_.repairs_dropped.fetch_add(1, std::memory_order_relaxed);
      ForgetRepair(key);
      return Status::Ok();
    }
    // A backup got a newer version from a copy or an earlier primary: this write goes above.
    store_->EnsureVersionAbove(newer);
    m.version = store_->NextVersion();
  }
  if (!answered.empty()) {
    if (Status a = ForwardAnswers(map, shard, key, answered); !a.ok()) return not_repaired(a);
  }
  // Every in-sync replica has it: this primary applies it too (published here).
  bool changed = false;
  Status applied = m.is_delete ? store_->DeleteVersioned(key, m.version, &changed)
                               : store_->ApplyVersioned(key, m.value, m.version, &changed);
  if (!applied.ok()) {
    counters_.repair_failures.fetch_add(1, std::memory_order_relaxed);
    return Status::Unavailable("shard " + std::to_string(shard) +
                               ": an earlier write of this key, applied by the backups, failed "
                               "here: " +
                               applied.ToString());
  }
  retry_table_.Record(shard, p.client_id, p.request_seq, {StatusCode::kOk, m.version});
  for (const kv::AnsweredWrite& w : p.superseded) {
    retry_table_.Record(shard, w.client_id, w.request_seq, {StatusCode::kOk, w.version});
  }
  if (changed && persister_ != nullptr) {
    // Nobody waits for it; the key's later writes are enqueued after it.
    if (m.is_delete) {
      persister_->EnqueueDelete(key, nullptr);
    } else {
      persister_->EnqueuePut(key, m.version, m.value, nullptr);
    }
  }
  counters_.repairs_done.fetch_add(1, std::memory_order_relaxed);
  ForgetRepair(key);
  return Status::Ok();
}

void Service::RepairLoop() {
  for (;;) {
    std::vector<std::string> keys;
    {
      MutexLock lock(&repair_mu_);
      while (!repair_stop_ && repairs_.empty()) repair_cv_.Wait(&repair_mu_);
      // A moment for the backup that failed to come back (or be removed from the map).
      if (!repair_stop_) repair_cv_.WaitFor(&repair_mu_, kRepairInterval);
      if (repair_stop_) return;
      for (const auto& [key, p] : repairs_) {
        keys.push_back(key);
        if (keys.size() == 1024) break;
      }
    }
    for (const std::string& key : keys) {
      {
        MutexLock lock(&repair_mu_);
        if (repair_stop_) return;
      }
      ClusterState::OwnerGuard owner_guard(cluster_);
      uint64_t epoch = 0;
      Status own = cluster_->CheckOwner(key, &epoch);
      if (own.Is(StatusCode::kWrongOwner)) {
        // Not the primary any more: this server never published the write; the new primary
        // has it (and resent or repairs it) or not (then no client read it).
        counters_.repairs_dropped.fetch_add(1, std::memory_order_relaxed);
        ForgetRepair(key);
        continue;
      }
      if (!own.ok()) break;  // fenced or taking over: later
      std::shared_ptr<const cluster::ClusterMap> map = cluster_->map_held();
      StripeTurn key_lock = TakeStripe(key);
      Status repaired = RepairKey(key, *map, store_->ShardOfKey(key));
      if (!repaired.ok()) {
        LOG_EVERY_N(WARNING, 50) << "replication repair: " << repaired.message()
                                 << " [every 50th logged]";
        break;  // the backup still fails: the next pass tries again
      }
    }
  }
}

}  // namespace rdkv::server

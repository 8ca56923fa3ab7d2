// A hot key's replicated writes go together (docs/design.md "A hot key's writes go together"):
// a write whose key stripe an asynchronous write holds parks behind it without a thread; the
// holder's completion hands the stripe to everything parked as one group, which takes its
// steps 0 to 4 on a writer-pool thread (each key's writes forwarded as one chain) and its
// steps 5 and 6 in version order once its last backup answer is in.
#include <glog/logging.h>

#include <algorithm>
#include <atomic>
#include <string>
#include <utility>

#include "common/kv/admin_wire.h"
#include "server/service.h"

namespace rdkv::server {

namespace {
// Groups being started on this thread by HandOnStripe (0 or 1).
thread_local int t_group_depth = 0;
}  // namespace

struct Service::WriteGroup {
  size_t stripe_index = 0;
  TransferableHold stripe;
  // In the order they parked: forwarded ones in version order, refused ones in between.
  std::vector<std::unique_ptr<ReplicatedWrite>> writes;
  // Forwards not answered yet, plus the starting thread's own hold.
  std::atomic<size_t> pending{1};
  // Writes answered while the group started (refused, retried, not replicated): finished
  // (offloaded_) only after the stripe is handed on, as the others.
  size_t answered_at_start = 0;
};

Service::StripeTake Service::TakeStripeOrPark(const kv::Request& r, Exchange ex, size_t stripe,
                                              bool may_park, StripeTurn* turn) {
  ParkShard& shard = park_[stripe % kParkShards];
  MutexLock lock(&shard.mu);
  auto it = shard.stripes.find(stripe);
  // A group on its way to the stripe goes first: new writes park behind it.
  if (it == shard.stripes.end() || !it->second.group_pending) {
    if (TransferableHold hold = TransferableHold::TryTake(&key_stripes_[stripe])) {
      *turn = StripeTurn(this, stripe, std::move(hold));
      return StripeTake::kTaken;
    }
  }
  // Held, or a thread waits in Take, or a group waits: whoever holds it next hands it on.
  if (!may_park) return StripeTake::kBusy;
  size_t waiting = 0, waiting_bytes = 0;
  if (!EnterPoolQueue(r, &waiting, &waiting_bytes)) return StripeTake::kBusy;  // refused there
  if (it == shard.stripes.end()) it = shard.stripes.try_emplace(stripe).first;
  auto w = std::make_unique<ReplicatedWrite>(r);
  w->op = ex.op;
  w->received = ex.received;
  w->role = ex.role;
  w->deliver = (*ex.defer)();
  w->stripe_index = stripe;
  it->second.parked.push_back(std::move(w));
  counters_.writes_parked.fetch_add(1, std::memory_order_relaxed);
  return StripeTake::kParked;
}

Service::StripeTurn Service::TakeStripe(std::string_view key) {
  const size_t stripe = StripeIndex(key);
  return StripeTurn(this, stripe, TransferableHold::Take(&key_stripes_[stripe]));
}

Service::StripeTurn Service::TryTakeStripe(std::string_view key) {
  const size_t stripe = StripeIndex(key);
  TransferableHold hold = TransferableHold::TryTake(&key_stripes_[stripe]);
  if (!hold) return StripeTurn();
  return StripeTurn(this, stripe, std::move(hold));
}

void Service::HandOnStripe(size_t stripe, TransferableHold hold) {
  ParkShard& shard = park_[stripe % kParkShards];
  std::vector<std::unique_ptr<ReplicatedWrite>> group;
  {
    MutexLock lock(&shard.mu);
    auto it = shard.stripes.find(stripe);
    const bool parked = it != shard.stripes.end() && !it->second.parked.empty();
    if (parked && !key_stripes_[stripe].Contended()) {
      // The next group: FIFO, within the caps; never two attempts of one request (the second
      // would not find the first's answer recorded yet); and after a key's first write only
      // PUTs of it (a precondition is checked against the store, never against a write of
      // the group that may still fail).
      std::deque<std::unique_ptr<ReplicatedWrite>>& q = it->second.parked;
      const size_t max_bytes = replicator_->max_batch_bytes() / 2;
      size_t bytes = 0;
      while (!q.empty() && group.size() < kMaxGroupWrites) {
        const kv::Request& r = q.front()->owned.request;
        const size_t entry = kv::kReplicateBatchEntryHeaderBytes + r.key.size() + r.value.size();
        if (!group.empty() && bytes + entry > max_bytes) break;
        const bool repeated =
            r.client_id != 0 &&
            std::any_of(group.begin(), group.end(), [&](const std::unique_ptr<ReplicatedWrite>& g) {
              return g->owned.request.client_id == r.client_id &&
                     g->owned.request.request_seq == r.request_seq;
            });
        const bool conditional_after_another =
            r.op != kv::Op::kPut &&
            std::any_of(group.begin(), group.end(), [&](const std::unique_ptr<ReplicatedWrite>& g) {
              return g->owned.request.key == r.key;
            });
        if (repeated || conditional_after_another) break;
        bytes += entry;
        group.push_back(std::move(q.front()));
        q.pop_front();
      }
    } else {
      // Released here, under the lock. A thread waiting in Take gets it first, and hands it
      // on to what stays parked when it is done; with nothing parked and no group on its way,
      // the entry goes.
      if (it != shard.stripes.end() && it->second.parked.empty() && !it->second.group_pending) {
        shard.stripes.erase(it);
      }
      hold.Release();
    }
  }
  if (!group.empty() && persister_ == nullptr && replication::Replicator::OnSenderThread() &&
      t_group_depth == 0) {
    // Started on this backup's sender, which holds no lock of a caller's (a waiting writer
    // that completes others' writes holds the ownership guard) and then reads the group's
    // answers itself: no thread is woken for it. Its batches only queue (may_start false: a
    // sender must not wait for another backup's send). Not below another group started here,
    // so that groups answered at once do not nest. The ownership lock only if free now (a
    // sender never waits for it).
    ClusterState::OwnerTryGuard owner_guard(cluster_);
    if (owner_guard.held()) {
      ++t_group_depth;
      StartWriteGroup(stripe, std::move(hold), std::move(group), Status::Ok(),
                      /*may_start=*/false);
      --t_group_depth;
      return;
    }
  }
  if (!group.empty()) {
    // The writer pool starts it. The stripe is released first: a job waiting in the pool's
    // queue must never hold a stripe that the pool's running threads may be waiting for
    // (HandleWriteNow). Meanwhile the group is pending: new writes park behind it instead of
    // taking the free stripe, and what is parked beyond the group stays parked.
    {
      MutexLock lock(&shard.mu);
      shard.stripes[stripe].group_pending = true;
      hold.Release();
    }
    std::shared_ptr<std::vector<std::unique_ptr<ReplicatedWrite>>> job =
        std::make_shared<std::vector<std::unique_ptr<ReplicatedWrite>>>(std::move(group));
    replicator_->Submit([this, stripe, job]() { StartWriteGroupOnPool(stripe, std::move(*job)); });
  }
}

void Service::StartWriteGroupOnPool(size_t stripe,
                                    std::vector<std::unique_ptr<ReplicatedWrite>> parked) {
  // As HandleWriteNow: the persister's admission, then the ownership lock (waited for here,
  // never while holding a stripe), then the stripe, only if it is free now. Taken meanwhile
  // (by a thread that waited in Take; new writes parked behind the pending group): the group
  // parks again at the front of the queue, in order, and that holder hands it on.
  const Status admitted = persister_ != nullptr ? persister_->Admit() : Status::Ok();
  ClusterState::OwnerGuard owner_guard(cluster_);
  TransferableHold hold;
  {
    ParkShard& shard = park_[stripe % kParkShards];
    MutexLock lock(&shard.mu);
    StripeQueue& q = shard.stripes[stripe];
    q.group_pending = false;
    hold = TransferableHold::TryTake(&key_stripes_[stripe]);
    if (!hold) {
      for (auto w = parked.rbegin(); w != parked.rend(); ++w) q.parked.push_front(std::move(*w));
      return;
    }
  }
  StartWriteGroup(stripe, std::move(hold), std::move(parked), admitted, /*may_start=*/true);
}

void Service::ReleaseToWaiting(size_t stripe, TransferableHold hold,
                               std::vector<std::unique_ptr<ReplicatedWrite>> first) {
  ParkShard& shard = park_[stripe % kParkShards];
  {
    MutexLock lock(&shard.mu);
    auto it = shard.stripes.find(stripe);
    if (it != shard.stripes.end()) {
      for (auto& w : it->second.parked) first.push_back(std::move(w));
      shard.stripes.erase(it);
    }
    hold.Release();
  }
  RunParkedWaiting(std::move(first));
}

void Service::StartWriteGroup(size_t stripe, TransferableHold hold,
                              std::vector<std::unique_ptr<ReplicatedWrite>> parked,
                              const Status& admitted, bool may_start) {
  cluster_->AssertOwnerHeld();  // the caller holds an owner guard (groups are clustered)
  // A failed write awaiting repair: step 0 (which forwards synchronously) on the waiting way.
  if (repairs_pending_.load(std::memory_order_acquire) > 0) {
    ReleaseToWaiting(stripe, std::move(hold), std::move(parked));
    return;
  }
  counters_.write_groups.fetch_add(1, std::memory_order_relaxed);
  auto g = std::make_shared<WriteGroup>();
  g->stripe_index = stripe;
  g->stripe = std::move(hold);
  const std::shared_ptr<const cluster::ClusterMap> map = cluster_->map_held();
  for (std::unique_ptr<ReplicatedWrite>& w : parked) {
    LeavePoolQueue(w->owned.bytes());  // started or answered now
    const kv::Request& r = w->owned.request;
    std::vector<uint8_t> response;
    Deliver deliver = std::move(w->deliver);
    const std::function<Deliver()> defer = [&deliver]() { return std::move(deliver); };
    Exchange ex{&response, &defer, w->op, w->received, w->role};
    auto answered_now = [&](bool answered) {
      if (answered) deliver(response);  // else it took `deliver`
      ++g->answered_at_start;           // finished once the stripe is handed on
    };
    // Steps 0 to 2 as StartReplicatedWrite takes them (`admitted`: the group's admission).
    if (std::optional<bool> refused = CheckWriteOwner(r, ex)) {
      answered_now(*refused);
      continue;
    }
    CountWrite(r.op);
    if (!admitted.ok()) {
      answered_now(AnswerNow(ex, admitted));
      continue;
    }
    const uint32_t shard = store_->ShardOfKey(r.key);
    if (!IsReplicated(*map, shard)) {
      // Not replicated any more (a map change while it was parked): applied here, in order
      // (the map cannot change while this thread holds the ownership guard).
      answered_now(WriteUnderLocks(r, ex, nullptr, 0));
      continue;
    }
    if (std::optional<bool> retried = AnswerRetry(r, ex)) {
      answered_now(*retried);
      continue;
    }
    // Against the store: the first write of its key in the group (the later ones are PUTs,
    // which have no precondition).
    uint64_t version = 0;
    Status checked = CheckReplicatedWrite(r, shard, &version);
    w->deliver = std::move(deliver);
    w->shard = shard;
    if (!checked.ok()) {
      // Answered in order at the finish, with the group's other writes; recorded now, under
      // the stripe, like the refusals of single writes.
      RecordRefusal(r, checked, version);
      w->refusal = std::move(checked);
      w->refusal_version = version;
      g->writes.push_back(std::move(w));
      continue;
    }
    // Steps 3 and 4's version (the forward below, by key).
    w->m = ReplicateRequestFor(r, map->epoch);
    w->map = map;
    w->owner = cluster_->HoldForWrite();
    w->m.version = store_->NextVersion();
    w->forwarded = true;
    counters_.replicated_writes.fetch_add(1, std::memory_order_relaxed);
    counters_.grouped_writes.fetch_add(1, std::memory_order_relaxed);
    async_writes_.fetch_add(1, std::memory_order_relaxed);
    async_bytes_.fetch_add(w->owned.bytes(), std::memory_order_relaxed);
    g->writes.push_back(std::move(w));
  }
  // Step 4: each key's writes as one chain (version order), every key's chain at once.
  std::vector<bool> queued(g->writes.size(), false);
  for (size_t i = 0; i < g->writes.size(); ++i) {
    if (!g->writes[i]->forwarded || queued[i]) continue;
    std::vector<const kv::ReplicateRequest*> chain;
    std::vector<replication::Replicator::ForwardDone> dones;
    for (size_t j = i; j < g->writes.size(); ++j) {
      ReplicatedWrite* w = g->writes[j].get();
      if (!w->forwarded || queued[j] || w->m.key != g->writes[i]->m.key) continue;
      queued[j] = true;
      chain.push_back(&w->m);
      g->pending.fetch_add(1, std::memory_order_relaxed);
      dones.push_back([this, g, w](const Status& forwarded, uint64_t newer) {
        w->forwarded_result = forwarded;
        w->newer = newer;
        if (g->pending.fetch_sub(1, std::memory_order_acq_rel) == 1) FinishWriteGroup(g);
      });
    }
    replicator_->ForwardChainAsync(*map, g->writes[i]->shard, chain, &dones, may_start);
  }
  if (g->pending.fetch_sub(1, std::memory_order_acq_rel) == 1) FinishWriteGroup(g);
}

void Service::FinishWriteGroup(const std::shared_ptr<WriteGroup>& g) {
  // Steps 5 and 6 in the group's order: the store, the retry table and RocksDB get each key's
  // writes in version order. A write of a key whose earlier write failed is not published.
  std::vector<std::pair<std::string_view, Status>> failed;  // by key: the first failure
  for (std::unique_ptr<ReplicatedWrite>& w : g->writes) {
    std::vector<uint8_t> response;
    Deliver deliver = std::move(w->deliver);
    const std::function<Deliver()> defer = [&deliver]() { return std::move(deliver); };
    Exchange ex{&response, &defer, w->op, w->received, w->role};
    const std::string_view key = w->owned.request.key;
    auto f =
        std::find_if(failed.begin(), failed.end(), [&](const auto& e) { return e.first == key; });
    const std::string shard = "shard " + std::to_string(w->shard);
    bool answered = false;
    if (!w->forwarded) {
      answered =
          f == failed.end()
              ? AnswerNow(ex, w->refusal, w->refusal_version)
              : AnswerNow(ex, Status::Unavailable(shard +
                                                  ": an earlier write of this key failed, so its "
                                                  "state is unknown; nothing was applied: " +
                                                  f->second.message()));
    } else {
      Status outcome;
      std::optional<kv::ItemLocation> where;
      if (f != failed.end()) {
        // Its backups may have it: kept for repair (the repair table keeps the newest write).
        NoteFailedWrite(w->m, w->shard);
        outcome = Status::Unavailable(shard +
                                      ": an earlier write of this key failed, so this one was "
                                      "not acknowledged (it may be applied on some replicas): " +
                                      f->second.message());
      } else if (!w->forwarded_result.ok() && w->newer > 0) {
        // Never forwarded again above it by itself (that would put it after the chain's later
        // writes): the repair goes above it.
        store_->EnsureVersionAbove(w->newer);
        NoteFailedWrite(w->m, w->shard);
        outcome = Status::Unavailable(
            shard + ": a backup holds a newer version of the key (" + std::to_string(w->newer) +
            "); the write was not acknowledged (it may be applied on some replicas) and is kept "
            "for repair");
      } else if (!w->forwarded_result.ok()) {
        outcome = *ForwardFailed(w->m, w->shard, w->forwarded_result, 0, w->attempt);
      } else {
        outcome = PublishReplicated(w->m, w->shard, &where);
      }
      if (outcome.ok()) {
        answered = AnswerApplied(w->owned.request, ex, w->m.version, where);
      } else {
        if (f == failed.end()) failed.emplace_back(key, outcome);
        answered = AnswerNow(ex, outcome);
      }
      async_writes_.fetch_sub(1, std::memory_order_relaxed);
      async_bytes_.fetch_sub(w->owned.bytes(), std::memory_order_relaxed);
    }
    // `failed` views the key: the write stays alive (its ownership hold is given back here).
    w->owner = ClusterState::WriteHold();
    if (answered) deliver(response);  // else Persist (or AnswerLater) took `deliver`
  }
  HandOnStripe(g->stripe_index, std::move(g->stripe));
  // Last: once offloaded_ reaches 0 the Service may be destroyed (~Service waits for it).
  FinishOffloaded(g->writes.size() + g->answered_at_start);
}

}  // namespace rdkv::server

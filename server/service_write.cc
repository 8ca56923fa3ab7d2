// The Service's writes: PUT, INSERT, CAS, DELETE of applications and IMPORT of the shard mover.
// Steps: admit, check ownership, count, apply to the store, persist, answer (now, or once
// durable).
#include "common/kv/admin_wire.h"
#include "server/service.h"

namespace rdkv::server {

namespace {
using persistence::Durability;
}  // namespace

Mutex* Service::KeyStripe(std::string_view key) {
  return &key_stripes_[kv::KeyHash(key) % kKeyStripes];
}

bool Service::HandleWrite(const kv::Request& r, Exchange ex) {
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
  if (cluster_ != nullptr) {
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
    } else {
      uint64_t epoch = 0;
      Status own = cluster_->CheckOwner(r.key, &epoch);
      if (!own.ok()) {
        // Not an error of this server: counted apart, and the answer carries the map epoch.
        counters_.wrong_owner.fetch_add(1, std::memory_order_relaxed);
        RecordAnswer(ex.op, ex.received, own.code());
        kv::EncodeResponse(own, epoch, {}, ex.response);
        return true;
      }
    }
  }
  CountWrite(r.op);
  if (!admitted.ok()) return AnswerNow(ex, admitted);
  if (persister_ == nullptr) {
    uint64_t version = 0;
    Status applied = ApplyToStore(r, &version);
    return AnswerNow(ex, applied, version);
  }
  // Writers of one key serialize across apply + enqueue: RocksDB gets its versions in order.
  MutexLock key_lock(KeyStripe(r.key));
  uint64_t version = 0;
  Status applied = ApplyToStore(r, &version);
  if (!applied.ok()) return AnswerNow(ex, applied, version);
  return Persist(r, version, ex);
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
      break;  // not writes: counted by their handlers
  }
  if (counter != nullptr) counter->fetch_add(1, std::memory_order_relaxed);
}

Status Service::ApplyToStore(const kv::Request& r, uint64_t* version) {
  switch (r.op) {
    case kv::Op::kPut: {
      Result<uint64_t> v = store_->Put(r.key, r.value);
      if (v.ok()) *version = *v;
      return v.status();
    }
    case kv::Op::kInsert: {
      Result<uint64_t> v = store_->Insert(r.key, r.value, version);
      if (v.ok()) *version = *v;
      return v.status();
    }
    case kv::Op::kCas: {
      Result<uint64_t> v = store_->Cas(r.key, r.expected_version, r.value, version);
      if (v.ok()) *version = *v;
      return v.status();
    }
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
      break;
  }
  return Status::Internal("operation " + std::string(kv::OpName(r.op)) + " is not a write");
}

bool Service::Persist(const kv::Request& r, uint64_t version, Exchange ex) {
  // Applied (a GET may already see it); in sync mode acknowledged only once durable. IMPORT
  // answers only once the item is in RocksDB in every mode: the mover drops the old owner's
  // copy after the copy is answered.
  const bool deferred = persister_->durability() == Durability::kSync || r.op == kv::Op::kImport;
  persistence::Persister::Completion done;
  if (deferred) {
    done = [answer = AnswerLater(ex), version](const Status& s) { answer(s, version, {}); };
  }
  if (r.op == kv::Op::kDelete) {
    persister_->EnqueueDelete(r.key, std::move(done));
  } else {
    persister_->EnqueuePut(r.key, version, r.value, std::move(done));
  }
  if (deferred) return false;
  return AnswerNow(ex, Status::Ok(), version);
}

}  // namespace rdkv::server

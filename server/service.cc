#include "server/service.h"

#include <glog/logging.h>

#include <charconv>
#include <condition_variable>
#include <memory>
#include <mutex>

#include <nlohmann/json.hpp>

namespace rdkv::server {

namespace {
using persistence::Durability;
}  // namespace

void Service::CountError(const Status& status) {
  if (status.ok()) return;
  counters_.errors.fetch_add(1, std::memory_order_relaxed);
  if (status.code() == StatusCode::kOutOfSpace) {
    counters_.out_of_space.fetch_add(1, std::memory_order_relaxed);
  } else if (status.code() == StatusCode::kIoError) {
    counters_.io_errors.fetch_add(1, std::memory_order_relaxed);
  }
}

bool Service::Handle(std::span<const uint8_t> request, std::vector<uint8_t>* response,
                     transport::ReplyHandle* reply) {
  return HandleImpl(request, response, [reply]() -> Deliver {
    return [h = std::move(*reply)](std::span<const uint8_t> r) {
      h.session->Reply(h.request_id, r).IgnoreError();  // client gone: nothing to do
    };
  });
}

void Service::Handle(std::span<const uint8_t> request, std::vector<uint8_t>* response) {
  struct Wait {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
  };
  auto w = std::make_shared<Wait>();
  bool now = HandleImpl(request, response, [&]() -> Deliver {
    return [w, response](std::span<const uint8_t> r) {
      std::lock_guard<std::mutex> l(w->mu);
      response->assign(r.begin(), r.end());
      w->done = true;
      w->cv.notify_all();
    };
  });
  if (now) return;
  std::unique_lock<std::mutex> lk(w->mu);
  w->cv.wait(lk, [&] { return w->done; });
}

bool Service::HandleImpl(std::span<const uint8_t> request, std::vector<uint8_t>* response,
                         const std::function<Deliver()>& defer) {
  Result<kv::Request> decoded = kv::DecodeRequest(request, limits_);
  if (!decoded.ok()) {
    Status s = decoded.status();
    if (s.code() == StatusCode::kProtocolError) {
      counters_.protocol_errors.fetch_add(1, std::memory_order_relaxed);
      LOG_EVERY_N(WARNING, 100) << "malformed request (" << request.size()
                                << " bytes): " << s.message() << " [every 100th logged]";
    }
    CountError(s);
    kv::EncodeResponse(s, 0, {}, response);
    return true;
  }
  const kv::Request& r = *decoded;
  Status status;
  uint64_t version = 0;
  std::string body;
  const bool write = r.op == kv::Op::kPut || r.op == kv::Op::kInsert ||
                     r.op == kv::Op::kCas || r.op == kv::Op::kDelete || r.op == kv::Op::kImport;
  if (write) {
    // Refused before anything is applied while the persister cannot write; waits while its
    // queue is full (backpressure). Before the owner guard: a writer waiting here must not
    // hold off a map install.
    if (persister_ != nullptr) status = persister_->Admit();
    // Cluster: the owner check and the apply happen under one guard, so a map change that takes
    // the shard away waits for this write (and the shard's data is complete when it moves).
    std::shared_lock<std::shared_mutex> owner_guard;
    if (cluster_ != nullptr && r.op == kv::Op::kImport) {
      // A moved item goes only into a shard this server does not own yet: once it owns the
      // shard it has acknowledged writes there, which a late or repeated copy must not replace.
      owner_guard = cluster_->WriteGuard();
      uint32_t shard = store_->ShardOfKey(r.key);
      NoteCopy(shard, /*begin=*/false).IgnoreError();
      if (store_->Owns(shard)) {
        Status own = Status::InvalidArgument(
            "IMPORT refused: this server already owns shard " + std::to_string(shard) +
            " (a copy must finish before the new owner takes the shard; is another move "
            "running?)");
        CountError(own);
        kv::EncodeResponse(own, 0, {}, response);
        return true;
      }
    } else if (cluster_ != nullptr) {
      owner_guard = cluster_->WriteGuard();
      uint64_t epoch = 0;
      Status own = cluster_->CheckOwner(r.key, &epoch);
      if (!own.ok()) {
        counters_.wrong_owner.fetch_add(1, std::memory_order_relaxed);
        kv::EncodeResponse(own, epoch, {}, response);
        return true;
      }
    }
    switch (r.op) {
      case kv::Op::kImport: counters_.imports.fetch_add(1, std::memory_order_relaxed); break;
      case kv::Op::kPut: counters_.puts.fetch_add(1, std::memory_order_relaxed); break;
      case kv::Op::kInsert: counters_.inserts.fetch_add(1, std::memory_order_relaxed); break;
      case kv::Op::kCas: counters_.cas.fetch_add(1, std::memory_order_relaxed); break;
      default: counters_.deletes.fetch_add(1, std::memory_order_relaxed); break;
    }
    if (status.ok()) {
      // Writers of one key serialize across apply + enqueue: RocksDB gets its versions in order.
      std::unique_lock<std::mutex> key_lock;
      if (persister_ != nullptr) {
        key_lock = std::unique_lock<std::mutex>(key_stripes_[kv::KeyHash(r.key) % kKeyStripes]);
      }
      switch (r.op) {
        case kv::Op::kImport: {  // a moved item keeps its version exactly; the key must be absent
          if (r.expected_version == 0) {
            status = Status::InvalidArgument("IMPORT needs the item's version (> 0)");
            break;
          }
          status = store_->Restore(r.key, r.value, r.expected_version);
          if (status.Is(StatusCode::kAlreadyExists)) {
            status = Status::AlreadyExists(
                "IMPORT refused: the key is already here (copies of one shard from two moves?)");
          }
          if (status.ok()) {
            store_->EnsureVersionAbove(r.expected_version);
            version = r.expected_version;
          }
          break;
        }
        case kv::Op::kPut: {
          Result<uint64_t> v = store_->Put(r.key, r.value);
          status = v.status();
          if (v.ok()) version = *v;
          break;
        }
        case kv::Op::kInsert: {
          Result<uint64_t> v = store_->Insert(r.key, r.value, &version);
          status = v.status();
          if (v.ok()) version = *v;
          break;
        }
        case kv::Op::kCas: {
          Result<uint64_t> v = store_->Cas(r.key, r.expected_version, r.value, &version);
          status = v.status();
          if (v.ok()) version = *v;
          break;
        }
        default:
          status = store_->Delete(r.key);
          break;
      }
      if (status.ok() && persister_ != nullptr) {
        persistence::Persister::Completion done;
        // IMPORT answers only once the item is in RocksDB in every mode: the mover drops the
        // old owner's copy after the copy is answered.
        const bool deferred =
            persister_->durability() == Durability::kSync || r.op == kv::Op::kImport;
        if (deferred) {
          // Applied (a GET may already see it); acknowledged only once durable.
          done = [this, deliver = defer(), version](const Status& s) {
            std::vector<uint8_t> out;
            CountError(s);
            kv::EncodeResponse(s, version, {}, &out);
            deliver(out);
          };
        }
        if (r.op == kv::Op::kDelete) {
          persister_->EnqueueDelete(r.key, std::move(done));
        } else {
          persister_->EnqueuePut(r.key, version, r.value, std::move(done));
        }
        if (deferred) return false;
      }
    }
  } else {
    switch (r.op) {
      case kv::Op::kStats:
        counters_.stats.fetch_add(1, std::memory_order_relaxed);
        body = StatsJson();
        break;
      case kv::Op::kPing:
        counters_.pings.fetch_add(1, std::memory_order_relaxed);
        break;
      case kv::Op::kSnapshot:
        counters_.snapshots.fetch_add(1, std::memory_order_relaxed);
        if (persister_ == nullptr) {
          status = Status::NotSupported("this server runs with durability=none: it has nothing "
                                        "on disk to snapshot");
          break;
        }
        // A checkpoint flushes RocksDB's memtables: done on the snapshot thread.
        persister_->Snapshot(std::string(r.key),
                             [this, deliver = defer()](Result<std::string> path) {
                               std::vector<uint8_t> out;
                               CountError(path.status());
                               kv::EncodeResponse(path.status(), 0, path.ok() ? *path : "", &out);
                               deliver(out);
                             });
        return false;
      case kv::Op::kClusterMap:
      case kv::Op::kShardScan:
      case kv::Op::kDropShard:
        status = HandleCluster(r, &version, &body);
        break;
      default:
        status = Status::Internal("unhandled op");
        break;
    }
  }
  CountError(status);
  kv::EncodeResponse(status, version, body, response);
  return true;
}

Status Service::HandleCluster(const kv::Request& r, uint64_t* version, std::string* body) {
  if (r.op == kv::Op::kClusterMap && r.value.empty()) {
    if (cluster_ == nullptr) return Status::Ok();  // standalone: empty map, epoch 0
    std::shared_ptr<const cluster::ClusterMap> m = cluster_->map();
    *body = m->ToJson();
    *version = m->epoch;
    return Status::Ok();
  }
  if (cluster_ == nullptr) {
    return Status::NotSupported("this server is standalone: start it with --cluster_map and "
                                "--server_id to take part in a cluster");
  }
  if (r.op == kv::Op::kClusterMap) {
    RDKV_ASSIGN_OR_RETURN(cluster::ClusterMap next, cluster::ParseClusterMap(r.value));
    RDKV_RETURN_IF_ERROR(cluster_->Install(std::move(next)));
    counters_.map_changes.fetch_add(1, std::memory_order_relaxed);
    *version = cluster_->map()->epoch;
    return Status::Ok();
  }
  uint32_t shard = 0;
  auto [p, ec] = std::from_chars(r.key.data(), r.key.data() + r.key.size(), shard);
  if (ec != std::errc() || p != r.key.data() + r.key.size() || shard >= store_->shard_count()) {
    return Status::InvalidArgument("'" + std::string(r.key) + "' is not a shard number (0.." +
                                   std::to_string(store_->shard_count() - 1) + ")");
  }
  if (r.op == kv::Op::kShardScan) {
    *version = store_->ScanShard(shard, r.expected_version,
                                 kv::kMaxKeyBytes + limits_.max_value_bytes + 16, body);
    return Status::Ok();
  }
  // kDropShard: the shard has moved away (or is about to be copied in); its stale items go,
  // on disk too. Admitted first (backpressure, a failing disk), then under the ownership
  // guard for the whole drop: an install that gives this server the shard waits for it.
  if (persister_ != nullptr) RDKV_RETURN_IF_ERROR(persister_->Admit());
  std::shared_lock<std::shared_mutex> owner_guard = cluster_->WriteGuard();
  if (store_->Owns(shard)) {
    return Status::InvalidArgument("shard " + std::to_string(shard) +
                                   " is still owned by this server; move it first");
  }
  if (r.expected_version > 0) {
    // The start of a copy into this server: refused while another copy of the shard is active.
    RDKV_RETURN_IF_ERROR(NoteCopy(shard, /*begin=*/true));
    // A version floor from the shard's old owner: keys of the shard deleted there left no item
    // to carry their versions, and must not get them again here (CAS would be fooled).
    store_->EnsureVersionAbove(r.expected_version);
    if (persister_ != nullptr) persister_->EnqueueMaxVersion(store_->version_counter(), nullptr);
  }
  uint64_t cursor = 0, dropped = 0;
  std::string batch;
  do {
    batch.clear();
    cursor = store_->ScanShard(shard, cursor, 1 << 20, &batch);
    RDKV_ASSIGN_OR_RETURN(std::vector<kv::ScanEntry> entries,
                          kv::DecodeScanEntries(batch, limits_));
    for (const kv::ScanEntry& e : entries) {
      std::unique_lock<std::mutex> key_lock(key_stripes_[kv::KeyHash(e.key) % kKeyStripes]);
      if (!store_->Delete(e.key).ok()) continue;
      ++dropped;
      if (persister_ != nullptr) persister_->EnqueueDelete(e.key, nullptr);
    }
  } while (cursor != kv::kScanDone);
  // Answered once the floor and the deletes are durable: the copy that follows may be empty,
  // and nothing else would make them so before the shard is served here.
  if (persister_ != nullptr && (dropped > 0 || r.expected_version > 0)) {
    Status flushed = persister_->Flush();
    if (!flushed.ok()) {
      return Status(flushed.code(), "dropped " + std::to_string(dropped) +
                                        " item(s) of shard " + std::to_string(shard) +
                                        " but could not make that durable: " + flushed.message());
    }
  }
  *version = dropped;
  return Status::Ok();
}

Status Service::NoteCopy(uint32_t shard, bool begin) {
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard lock(copies_mu_);
  auto it = copy_seen_.find(shard);
  if (begin && it != copy_seen_.end() && now - it->second < kCopyQuiet) {
    auto ago = std::chrono::duration_cast<std::chrono::milliseconds>(now - it->second);
    return Status::Busy("a copy of shard " + std::to_string(shard) +
                        " into this server was active " + std::to_string(ago.count()) +
                        " ms ago (another move of it running?); a copy is refused until " +
                        std::to_string(kCopyQuiet.count()) + " ms after the last one's requests");
  }
  copy_seen_[shard] = now;
  return Status::Ok();
}

std::string Service::StatsJson() const {
  StoreCounters sc = store_->counters();
  AllocatorStats as = store_->allocator_stats();
  auto load = [](const std::atomic<uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  nlohmann::json j;
  j["items"] = sc.items;
  j["item_bytes"] = sc.item_bytes;
  j["region_bytes"] = store_->header().region_bytes;
  j["heap_bytes"] = as.heap_units * kv::kUnit;
  j["used_bytes"] = as.used_units * kv::kUnit;
  j["free_bytes"] = as.free_units * kv::kUnit;
  j["limbo_bytes"] = as.limbo_units * kv::kUnit;
  j["index_buckets"] = store_->header().bucket_count;
  j["version_counter"] = store_->version_counter();
  j["ops"] = {{"put", load(counters_.puts)},       {"insert", load(counters_.inserts)},
              {"delete", load(counters_.deletes)}, {"cas", load(counters_.cas)},
              {"stats", load(counters_.stats)},    {"ping", load(counters_.pings)},
              {"snapshot", load(counters_.snapshots)},
              {"import", load(counters_.imports)},
              {"map_change", load(counters_.map_changes)}};
  j["errors"] = {{"total", load(counters_.errors)},
                 {"protocol", load(counters_.protocol_errors)},
                 {"out_of_space", load(counters_.out_of_space)},
                 {"io", load(counters_.io_errors)},
                 {"wrong_owner", load(counters_.wrong_owner)}};
  if (cluster_ != nullptr) {
    std::shared_ptr<const cluster::ClusterMap> m = cluster_->map();
    j["cluster"] = {{"server_id", cluster_->server_id()},
                    {"map_epoch", m->epoch},
                    {"shards", m->shards},
                    {"owned_shards", m->ShardsOf(cluster_->server_id()).size()}};
  }
  if (persister_ != nullptr) {
    persistence::PersisterStats p = persister_->stats();
    j["persistence"] = {{"durability", persistence::DurabilityName(p.durability)},
                        {"queued_records", p.queued_records},
                        {"queued_bytes", p.queued_bytes},
                        {"records", p.records},
                        {"groups", p.groups},
                        {"syncs", p.syncs},
                        {"max_group_records", p.max_group_records},
                        {"admission_waits", p.admission_waits},
                        {"max_lag_us", p.max_lag_us},
                        {"io_errors", p.io_errors},
                        {"failing", p.failing},
                        {"last_error", p.last_error},
                        {"snapshots", p.snapshots},
                        {"last_snapshot", p.last_snapshot}};
  } else {
    j["persistence"] = {{"durability", "none"}};
  }
  return j.dump();
}

}  // namespace rdkv::server

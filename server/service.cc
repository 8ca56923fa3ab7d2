#include "server/service.h"

#include <glog/logging.h>

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
                     r.op == kv::Op::kCas || r.op == kv::Op::kDelete;
  if (write) {
    switch (r.op) {
      case kv::Op::kPut: counters_.puts.fetch_add(1, std::memory_order_relaxed); break;
      case kv::Op::kInsert: counters_.inserts.fetch_add(1, std::memory_order_relaxed); break;
      case kv::Op::kCas: counters_.cas.fetch_add(1, std::memory_order_relaxed); break;
      default: counters_.deletes.fetch_add(1, std::memory_order_relaxed); break;
    }
    // Refused before anything is applied while the persister cannot write; waits while its
    // queue is full (backpressure).
    if (persister_ != nullptr) status = persister_->Admit();
    if (status.ok()) {
      // Writers of one key serialize across apply + enqueue: RocksDB gets its versions in order.
      std::unique_lock<std::mutex> key_lock;
      if (persister_ != nullptr) {
        key_lock = std::unique_lock<std::mutex>(key_stripes_[kv::KeyHash(r.key) % kKeyStripes]);
      }
      switch (r.op) {
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
        if (persister_->durability() == Durability::kSync) {
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
        if (persister_->durability() == Durability::kSync) return false;
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
        status = Status::NotSupported(std::string(kv::OpName(r.op)) +
                                      " is not available on this server");
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
  j["ops"] = {{"put", load(counters_.puts)},       {"insert", load(counters_.inserts)},
              {"delete", load(counters_.deletes)}, {"cas", load(counters_.cas)},
              {"stats", load(counters_.stats)},    {"ping", load(counters_.pings)},
              {"snapshot", load(counters_.snapshots)}};
  j["errors"] = {{"total", load(counters_.errors)},
                 {"protocol", load(counters_.protocol_errors)},
                 {"out_of_space", load(counters_.out_of_space)},
                 {"io", load(counters_.io_errors)}};
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

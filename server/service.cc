#include "server/service.h"

#include <glog/logging.h>

#include <nlohmann/json.hpp>

namespace rdkv::server {

void Service::Handle(std::span<const uint8_t> request, std::vector<uint8_t>* response) {
  Result<kv::Request> decoded = kv::DecodeRequest(request, limits_);
  if (!decoded.ok()) {
    Status s = decoded.status();
    if (s.code() == StatusCode::kProtocolError) {
      counters_.protocol_errors.fetch_add(1, std::memory_order_relaxed);
      LOG_EVERY_N(WARNING, 100) << "malformed request (" << request.size()
                                << " bytes): " << s.message() << " [every 100th logged]";
    }
    counters_.errors.fetch_add(1, std::memory_order_relaxed);
    kv::EncodeResponse(s, 0, {}, response);
    return;
  }
  const kv::Request& r = *decoded;
  Status status;
  uint64_t version = 0;
  std::string body;
  switch (r.op) {
    case kv::Op::kPut: {
      counters_.puts.fetch_add(1, std::memory_order_relaxed);
      Result<uint64_t> v = store_->Put(r.key, r.value);
      status = v.status();
      if (v.ok()) version = *v;
      break;
    }
    case kv::Op::kInsert: {
      counters_.inserts.fetch_add(1, std::memory_order_relaxed);
      Result<uint64_t> v = store_->Insert(r.key, r.value, &version);
      status = v.status();
      if (v.ok()) version = *v;
      break;
    }
    case kv::Op::kCas: {
      counters_.cas.fetch_add(1, std::memory_order_relaxed);
      Result<uint64_t> v = store_->Cas(r.key, r.expected_version, r.value, &version);
      status = v.status();
      if (v.ok()) version = *v;
      break;
    }
    case kv::Op::kDelete:
      counters_.deletes.fetch_add(1, std::memory_order_relaxed);
      status = store_->Delete(r.key);
      break;
    case kv::Op::kStats:
      counters_.stats.fetch_add(1, std::memory_order_relaxed);
      body = StatsJson();
      break;
    case kv::Op::kPing:
      counters_.pings.fetch_add(1, std::memory_order_relaxed);
      break;
    case kv::Op::kSnapshot:
    case kv::Op::kClusterMap:
      status = Status::NotSupported(std::string(kv::OpName(r.op)) +
                                    " is not available on this server");
      break;
  }
  if (!status.ok()) {
    counters_.errors.fetch_add(1, std::memory_order_relaxed);
    if (status.code() == StatusCode::kOutOfSpace) {
      counters_.out_of_space.fetch_add(1, std::memory_order_relaxed);
    }
  }
  kv::EncodeResponse(status, version, body, response);
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
              {"stats", load(counters_.stats)},    {"ping", load(counters_.pings)}};
  j["errors"] = {{"total", load(counters_.errors)},
                 {"protocol", load(counters_.protocol_errors)},
                 {"out_of_space", load(counters_.out_of_space)}};
  return j.dump();
}

}  // namespace rdkv::server

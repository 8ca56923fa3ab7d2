// The Service's entry points, its decode and dispatch steps, the queries and the counters.
// Writes: service_write.cc. Admin requests: service_admin.cc.
#include "server/service.h"

#include <glog/logging.h>

#include <memory>

#include <nlohmann/json.hpp>

#include "common/util/latency_json.h"

namespace rdkv::server {

bool Service::Handle(std::span<const uint8_t> request, std::vector<uint8_t>* response,
                     transport::ReplyHandle* reply) {
  const transport::SessionRole role = reply->session->role();
  // The transport's worker threads: how many there are (HandleWrite keeps one free).
  thread_local const Service* counted_for = nullptr;
  if (transport_workers_ == 0 && counted_for != this) {
    counted_for = this;
    workers_seen_.fetch_add(1, std::memory_order_relaxed);
  }
  return HandleImpl(
      request, response,
      [reply]() -> Deliver {
        return [h = std::move(*reply)](std::span<const uint8_t> r) {
          h.session->Reply(h.request_id, r).IgnoreError();  // client gone: nothing to do
        };
      },
      role, /*on_worker=*/true);
}

namespace {

// Waits for an answer that may come from another thread (the blocking Handle forms).
struct Waiter {
  Mutex mu;
  CondVar cv;
  bool done GUARDED_BY(mu) = false;
};

// Runs `handle` with a defer that makes the waiter's Deliver, and waits for a deferred answer.
template <typename HandleFn>
void HandleAndWait(std::vector<uint8_t>* response, const HandleFn& handle) {
  auto w = std::make_shared<Waiter>();
  std::function<std::function<void(std::span<const uint8_t>)>()> defer = [w, response]() {
    return [w, response](std::span<const uint8_t> r) {
      MutexLock l(&w->mu);
      response->assign(r.begin(), r.end());
      w->done = true;
      w->cv.SignalAll();
    };
  };
  if (handle(defer)) return;
  MutexLock l(&w->mu);
  while (!w->done) w->cv.Wait(&w->mu);
}

}  // namespace

void Service::Handle(std::span<const uint8_t> request, std::vector<uint8_t>* response,
                     transport::SessionRole role) {
  HandleAndWait(response, [&](const std::function<Deliver()>& defer) {
    return HandleImpl(request, response, defer, role);
  });
}

void Service::HandleDecoded(const kv::Request& request, std::vector<uint8_t>* response) {
  HandleAndWait(response, [&](const std::function<Deliver()>& defer) {
    Exchange ex{response, &defer};
    ex.role = transport::SessionRole::kAdmin;  // in-process callers are trusted
    return Dispatch(request, ex);
  });
}

bool Service::HandleImpl(std::span<const uint8_t> request, std::vector<uint8_t>* response,
                         const std::function<Deliver()>& defer, transport::SessionRole role,
                         bool on_worker) {
  Exchange ex{response, &defer};
  ex.role = role;
  ex.on_worker = on_worker;
  Result<kv::Request> decoded = kv::DecodeRequest(request, limits_);
  if (!decoded.ok()) {
    const Status& s = decoded.status();
    if (s.code() == StatusCode::kProtocolError) {
      counters_.protocol_errors.fetch_add(1, std::memory_order_relaxed);
      LOG_EVERY_N(WARNING, 100) << "malformed request (" << request.size()
                                << " bytes): " << s.message() << " [every 100th logged]";
    }
    return AnswerNow(ex, s);
  }
  return Dispatch(*decoded, ex);
}

bool Service::Dispatch(const kv::Request& r, Exchange ex) {
  ex.op = static_cast<uint8_t>(r.op);
  if (kv::FindOp(ex.op) != nullptr && kv::IsAdmin(r.op) &&
      ex.role != transport::SessionRole::kAdmin) {
    return AnswerNow(ex, Status::PermissionDenied(
                             "admin op " + std::string(kv::OpName(r.op)) +
                             " needs the admin credential (--admin_token_file), or a loopback "
                             "client when the server has no admin secret"));
  }
  // Every op by name and no default: -Wswitch names an op added to kv::Op without a handler.
  switch (r.op) {
    case kv::Op::kPut:
    case kv::Op::kInsert:
    case kv::Op::kDelete:
    case kv::Op::kCas:
    case kv::Op::kImport:
      return HandleWrite(r, ex);
    case kv::Op::kStats:
      return HandleStats(r, ex);
    case kv::Op::kPing:
      return HandlePing(r, ex);
    case kv::Op::kClusterMap:
      return HandleMapFetch(r, ex);
    case kv::Op::kSnapshot:
      return HandleSnapshot(r, ex);
    case kv::Op::kInstallMap:
      return HandleMapInstall(r, ex);
    case kv::Op::kShardScan:
      return HandleShardScan(r, ex);
    case kv::Op::kDropShard:
      return HandleDropShard(r, ex);
    case kv::Op::kReplicate:
      return HandleReplicate(r, ex);
    case kv::Op::kShardIds:
      return HandleShardIds(r, ex);
    case kv::Op::kRecordIds:
      return HandleRecordIds(r, ex);
  }
  // A number that is no op (the decoder refuses those; HandleDecoded does not).
  return AnswerNow(ex,
                   Status::NotSupported("operation " + std::to_string(static_cast<unsigned>(r.op)) +
                                        " is not handled by this server"));
}

bool Service::HasHandler(kv::Op op) {
  switch (op) {
    case kv::Op::kPut:
    case kv::Op::kInsert:
    case kv::Op::kDelete:
    case kv::Op::kCas:
    case kv::Op::kImport:
    case kv::Op::kStats:
    case kv::Op::kPing:
    case kv::Op::kClusterMap:
    case kv::Op::kSnapshot:
    case kv::Op::kInstallMap:
    case kv::Op::kShardScan:
    case kv::Op::kDropShard:
    case kv::Op::kReplicate:
    case kv::Op::kShardIds:
    case kv::Op::kRecordIds:
      return true;
  }
  return false;
}

bool Service::AnswerNow(Exchange ex, const Status& status, uint64_t version,
                        std::string_view body) {
  CountError(status);
  RecordAnswer(ex.op, ex.received, status.code());
  kv::EncodeResponse(status, version, body, ex.response);
  return true;
}

std::function<void(const Status&, uint64_t, std::string_view)> Service::AnswerLater(Exchange ex) {
  return [this, op = ex.op, received = ex.received, deliver = (*ex.defer)()](
             const Status& s, uint64_t version, std::string_view body) {
    std::vector<uint8_t> out;
    CountError(s);
    RecordAnswer(op, received, s.code());
    kv::EncodeResponse(s, version, body, &out);
    deliver(out);
  };
}

void Service::CountError(const Status& status) {
  if (status.ok()) return;
  counters_.errors.fetch_add(1, std::memory_order_relaxed);
  if (status.code() == StatusCode::kNotFound || status.code() == StatusCode::kVersionMismatch ||
      status.code() == StatusCode::kAlreadyExists) {
    counters_.outcomes.fetch_add(1, std::memory_order_relaxed);
  } else if (status.code() == StatusCode::kOutOfSpace) {
    counters_.out_of_space.fetch_add(1, std::memory_order_relaxed);
  } else if (status.code() == StatusCode::kIoError) {
    counters_.io_errors.fetch_add(1, std::memory_order_relaxed);
  }
}

void Service::RecordAnswer(uint8_t op, std::chrono::steady_clock::time_point received,
                           StatusCode result) {
  request_metrics_.Record(op, result, std::chrono::steady_clock::now() - received);
}

bool Service::HandleStats(const kv::Request&, Exchange ex) {
  counters_.stats.fetch_add(1, std::memory_order_relaxed);
  return AnswerNow(ex, Status::Ok(), 0, StatsJson());
}

bool Service::HandlePing(const kv::Request&, Exchange ex) {
  counters_.pings.fetch_add(1, std::memory_order_relaxed);
  return AnswerNow(ex, Status::Ok());
}

std::string Service::StatsJson() const {
  StoreCounters sc = store_->counters();
  AllocatorStats as = store_->allocator_stats();
  auto load = [](const std::atomic<uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  nlohmann::json j;
  j["items"] = sc.items;
  j["item_bytes"] = sc.item_bytes;
  j["in_place_updates"] = sc.in_place_updates;
  j["writes_on_receiving_thread"] = counters_.writes_on_receiving_thread.load();
  j["replicates_on_receiving_thread"] = counters_.replicates_on_receiving_thread.load();
  j["region_bytes"] = store_->header().region_bytes;
  j["heap_bytes"] = as.heap_units * kv::kUnit;
  j["used_bytes"] = as.used_units * kv::kUnit;
  j["free_bytes"] = as.free_units * kv::kUnit;
  j["limbo_bytes"] = as.limbo_units * kv::kUnit;
  j["heap_merges"] = as.merges;
  j["index_buckets"] = store_->header().bucket_count;
  j["version_counter"] = store_->version_counter();
  j["ops"] = {{"put", load(counters_.puts)},
              {"insert", load(counters_.inserts)},
              {"delete", load(counters_.deletes)},
              {"cas", load(counters_.cas)},
              {"stats", load(counters_.stats)},
              {"ping", load(counters_.pings)},
              {"snapshot", load(counters_.snapshots)},
              {"import", load(counters_.imports)},
              {"map_change", load(counters_.map_changes)}};
  // total: every answer that is not OK; outcomes: of those, a request's normal negative result
  // (not found, version mismatch, already exists); failures: the rest.
  const uint64_t errors_total = load(counters_.errors), outcomes = load(counters_.outcomes);
  j["errors"] = {{"total", errors_total},
                 {"outcomes", outcomes},
                 {"failures", errors_total >= outcomes ? errors_total - outcomes : 0},
                 {"protocol", load(counters_.protocol_errors)},
                 {"out_of_space", load(counters_.out_of_space)},
                 {"io", load(counters_.io_errors)},
                 {"wrong_owner", load(counters_.wrong_owner)}};
  // Latency by op (common/util/latency_json.h): the histograms /metrics exports, read here;
  // ops not seen since the start are left out.
  {
    const RequestMetricsSnapshot rm = request_metrics_.Snapshot();
    nlohmann::json latency = nlohmann::json::object();
    for (size_t op = 1; op < kRequestOpSlots; ++op) {
      uint64_t n = 0;
      for (uint64_t c : rm.latency[op].counts) n += c;
      if (n > 0) AddLatencyOp(&latency, kv::kOpTable[op].name, rm.latency[op]);
    }
    j["latency"] = std::move(latency);
  }
  if (cluster_ != nullptr) {
    std::shared_ptr<const cluster::ClusterMap> m = cluster_->map();
    const uint32_t me = cluster_->server_id();
    size_t backup_shards = 0, joining_shards = 0;
    for (uint32_t s = 0; s < m->shards; ++s) {
      backup_shards += m->IsBackup(s, me);
      joining_shards += m->IsJoining(s, me);
    }
    j["cluster"] = {{"server_id", me},
                    {"map_epoch", m->epoch},
                    {"shards", m->shards},
                    {"owned_shards", m->ShardsOf(me).size()},
                    {"backup_shards", backup_shards},
                    {"joining_shards", joining_shards}};
    j["replication"] = {
        {"replicated_writes", load(counters_.replicated_writes)},
        {"writes_parked", load(counters_.writes_parked)},
        {"write_groups", load(counters_.write_groups)},
        {"grouped_writes", load(counters_.grouped_writes)},
        {"replicas_applied", load(counters_.replicas_applied)},
        {"retries_answered", load(counters_.retries_answered)},
        {"retry_ids_kept", retry_table_.size()},
        {"batches_applied", load(counters_.replicate_batches)},
        {"overload_refused", load(counters_.pool_refused)},
        {"stale_forwards_refused", load(counters_.stale_forwards_refused)},
        {"answers_sent", load(counters_.answers_sent)},
        {"answers_received", load(counters_.answers_received)},
        {"repairs_pending", repairs_pending_.load(std::memory_order_relaxed)},
        {"repair_bytes_pending", repair_bytes_pending_.load(std::memory_order_relaxed)},
        {"repairs_noted", load(counters_.repairs_noted)},
        {"repairs_done", load(counters_.repairs_done)},
        {"repairs_dropped", load(counters_.repairs_dropped)},
        {"repair_failures", load(counters_.repair_failures)},
        {"catchup_applied", load(counters_.catchup_applied)},
        {"catchup_tombstones", catchup_tombstones()},
        {"scan_items", load(counters_.scan_items)},
        {"shard_ids_sent", load(counters_.shard_ids_sent)},
        {"copied_ids_recorded", load(counters_.copied_ids_recorded)}};
    nlohmann::json scans = nlohmann::json::object();
    for (const auto& [shard, at] : ScanProgress()) scans[std::to_string(shard)] = at;
    j["replication"]["scan_progress"] = std::move(scans);
    if (replicator_ != nullptr) {
      replication::ReplicatorStats rs = replicator_->stats();
      j["replication"]["forwards"] = rs.forwards;
      j["replication"]["forward_errors"] = rs.forward_errors;
      j["replication"]["joining_errors"] = rs.joining_errors;
      j["replication"]["epoch_retries"] = rs.epoch_retries;
      j["replication"]["version_retries"] = rs.version_retries;
      j["replication"]["batches_sent"] = rs.batches;
      j["replication"]["batched_writes"] = rs.batched_writes;
      j["replication"]["batches_by_sender"] = rs.sender_batches;
      j["replication"]["async_forwards"] = rs.async_forwards;
      nlohmann::json backups = nlohmann::json::object();
      for (const replication::Replicator::PeerState& p : replicator_->Peers()) {
        nlohmann::json one = {{"connected", p.connected},
                              {"pending", p.pending},
                              {"oldest_pending_s", p.oldest_pending_s}};
        if (p.last_failure_s_ago >= 0) one["last_failure_s_ago"] = p.last_failure_s_ago;
        backups[std::to_string(p.id)] = std::move(one);
      }
      j["replication"]["backups"] = std::move(backups);
    }
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
  // Paths and error texts need not be UTF-8.
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace rdkv::server

#include "server/replication/replicator.h"

#include <glog/logging.h>

#include "common/kv/wire.h"
#include "common/util/units.h"

namespace rdkv::server::replication {

using Clock = std::chrono::steady_clock;

namespace {

// What one Forward waits on: its entries on every backup's queue.
struct Waiter {
  Mutex mu;
  CondVar cv;
  size_t pending GUARDED_BY(mu) = 0;
};

}  // namespace

// One write queued for one backup. Owned by the Forward that waits for it; the sender writes
// result and newer, then counts it done under the waiter's lock.
struct Replicator::Item {
  const kv::ReplicateRequest* m = nullptr;
  Clock::time_point deadline;
  Status result;
  uint64_t newer = 0;
  Waiter* waiter = nullptr;
};

struct Replicator::Peer {
  uint32_t id = 0;
  std::string address;
  std::string who;  // "backup server 1 (host:port)"
  Mutex mu;
  std::shared_ptr<transport::Connection> conn GUARDED_BY(mu);
  Clock::time_point last_failure GUARDED_BY(mu){};
  bool failed_ever GUARDED_BY(mu) = false;
  // Why it last failed: the forwards refused meanwhile (reconnect_interval) carry it, so a
  // client's error and the repair log name the cause (a wrong admin secret, a refused
  // connection), not only that the backup failed recently.
  std::string last_error GUARDED_BY(mu);
  Clock::time_point last_logged GUARDED_BY(mu){};  // connect failures: a line per 10 s per cause

  Mutex queue_mu;
  CondVar queue_cv;  // the sender waits for: queued writes and no batch in flight, or stopping
  std::deque<Item*> queue GUARDED_BY(queue_mu);
  // A batch is in flight (sent by the sender or by a Forward that found the backup idle).
  bool busy GUARDED_BY(queue_mu) = false;
  // The earliest deadline of the batch in flight (max: none), for the lag (Peers).
  Clock::time_point batch_deadline GUARDED_BY(queue_mu) = Clock::time_point::max();
  // Writes queued or in the batch in flight: added when queued, taken off when answered.
  std::atomic<uint64_t> pending{0};
  bool stopping GUARDED_BY(queue_mu) = false;
  std::thread sender;  // started by PeerFor, joined by ~Replicator

  // Moves the next batch off the queue into *batch: whatever is queued, up to
  // kMaxReplicateBatchEntries and `max_bytes`, one map epoch (the frame carries it); marks the
  // peer busy.
  void Take(size_t max_bytes, std::vector<Item*>* batch) REQUIRES(queue_mu) {
    batch->clear();
    busy = true;
    batch_deadline = Clock::time_point::max();
    if (queue.empty()) return;
    size_t bytes = 0;
    const uint64_t epoch = queue.front()->m->map_epoch;
    while (!queue.empty() && batch->size() < kv::kMaxReplicateBatchEntries) {
      const kv::ReplicateRequest* m = queue.front()->m;
      const size_t entry = kv::kReplicateBatchEntryHeaderBytes + m->key.size() + m->value.size();
      if (!batch->empty() && (m->map_epoch != epoch || bytes + entry > max_bytes)) break;
      bytes += entry;
      batch_deadline = std::min(batch_deadline, queue.front()->deadline);
      batch->push_back(queue.front());
      queue.pop_front();
    }
  }
  // The batch in flight is answered: not busy; true when the sender must take the next one.
  bool Done() REQUIRES(queue_mu) {
    busy = false;
    batch_deadline = Clock::time_point::max();
    return !queue.empty();
  }
};

Replicator::Replicator(transport::Fabric* fabric, ReplicatorOptions options)
    : fabric_(fabric),
      options_(std::move(options)),
      max_batch_bytes_(options_.max_batch_bytes),
      auth_token_(options_.auth_token),
      role_(options_.role) {
  if (options_.max_message_size > kv::kMessageSlack) {
    // A batch travels in a request's value field, after the header and the marker key.
    max_batch_bytes_ = std::min(max_batch_bytes_, options_.max_message_size - kv::kMessageSlack);
  }
  for (int i = 0; i < std::max(1, options_.sender_threads); ++i) {
    writers_.emplace_back([this] { WriterLoop(); });
  }
}

Replicator::~Replicator() {
  {
    MutexLock lock(&jobs_mu_);
    stopping_ = true;
  }
  jobs_cv_.SignalAll();
  for (std::thread& t : writers_) t.join();  // queued writes run first (they may forward)
  std::vector<std::shared_ptr<Peer>> all;
  {
    MutexLock lock(&peers_mu_);
    for (auto& [id, p] : peers_) all.push_back(p);
    all.insert(all.end(), retired_.begin(), retired_.end());
  }
  for (const std::shared_ptr<Peer>& p : all) {
    MutexLock lock(&p->queue_mu);
    p->stopping = true;
    p->queue_cv.SignalAll();
  }
  for (const std::shared_ptr<Peer>& p : all) {
    if (p->sender.joinable()) p->sender.join();
  }
}

void Replicator::Submit(std::function<void()> job) {
  {
    MutexLock lock(&jobs_mu_);
    jobs_.push_back(std::move(job));
  }
  jobs_cv_.Signal();
}

void Replicator::WriterLoop() {
  for (;;) {
    std::function<void()> job;
    {
      MutexLock lock(&jobs_mu_);
      while (jobs_.empty() && !stopping_) jobs_cv_.Wait(&jobs_mu_);
      if (jobs_.empty()) return;  // stopping, and every queued job ran
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    job();
  }
}

std::shared_ptr<Replicator::Peer> Replicator::PeerFor(uint32_t id, const std::string& address) {
  MutexLock lock(&peers_mu_);
  std::shared_ptr<Peer>& p = peers_[id];
  if (p != nullptr && p->address == address) return p;
  if (p != nullptr) {  // the map moved the server: its old sender drains its queue and stops
    {
      MutexLock q(&p->queue_mu);
      p->stopping = true;
    }
    p->queue_cv.SignalAll();
    retired_.push_back(p);
  }
  p = std::make_shared<Peer>();
  p->id = id;
  p->address = address;
  p->who = "backup server " + std::to_string(id) + " (" + address + ")";
  p->sender = std::thread([this, peer = p] { SenderLoop(peer); });
  return p;
}

void Replicator::Complete(const std::vector<Item*>& items) {
  for (Item* item : items) {
    Waiter* w = item->waiter;
    MutexLock lock(&w->mu);
    if (--w->pending == 0) w->cv.Signal();  // only the Forward waits on it
  }
}

void Replicator::SenderLoop(std::shared_ptr<Peer> peer) {
  std::vector<Item*> batch;
  for (;;) {
    {
      MutexLock lock(&peer->queue_mu);
      while ((peer->queue.empty() || peer->busy) && !peer->stopping) {
        peer->queue_cv.Wait(&peer->queue_mu);
      }
      if (peer->queue.empty() || peer->busy) return;  // stopping, and nothing waits
      peer->Take(max_batch_bytes_, &batch);
    }
    SendBatch(peer.get(), batch);
    peer->pending.fetch_sub(batch.size(), std::memory_order_relaxed);
    Complete(batch);
    MutexLock lock(&peer->queue_mu);
    peer->Done();  // this thread looks at the queue again next
  }
}

void Replicator::SetCredential(std::string auth_token, transport::SessionRole role) {
  MutexLock cred(&cred_mu_);
  auth_token_ = std::move(auth_token);
  role_ = role;
}

Result<std::shared_ptr<transport::Connection>> Replicator::ConnectionTo(Peer* peer) {
  MutexLock lock(&peer->mu);
  if (peer->conn != nullptr && !peer->conn->alive()) peer->conn.reset();
  if (peer->conn != nullptr) return peer->conn;
  if (peer->failed_ever && Clock::now() - peer->last_failure < options_.reconnect_interval) {
    return Status::Unavailable(peer->who + " failed less than " +
                               std::to_string(options_.reconnect_interval.count()) + " ms ago (" +
                               peer->last_error + "); not retried yet");
  }
  transport::ConnectOptions co;
  Status hp = ParseHostPort(peer->address, &co.host, &co.port);
  if (!hp.ok()) return Status::Unavailable(peer->who + ": " + hp.message());
  {
    MutexLock cred(&cred_mu_);
    co.auth_token = auth_token_;
    co.role = role_;
  }
  co.tls = options_.tls;
  co.connect_timeout = options_.connect_timeout;
  co.busy_poll = options_.busy_poll;
  if (options_.max_message_size > 0) co.max_message_size = options_.max_message_size;
  Result<std::unique_ptr<transport::Connection>> c = fabric_->Connect(co);
  if (!c.ok()) {
    const Clock::time_point now = Clock::now();
    std::string why = "unreachable: " + c.status().message();
    if (why != peer->last_error || now - peer->last_logged >= std::chrono::seconds(10)) {
      LOG(WARNING) << "replication: " << peer->who << " " << why;
      peer->last_logged = now;
    }
    peer->failed_ever = true;
    peer->last_failure = now;
    peer->last_error = why;
    return Status::Unavailable(peer->who + " " + why);
  }
  peer->conn = std::move(*c);
  LOG(INFO) << "replication: connected to " << peer->who;
  return peer->conn;
}

void Replicator::SendBatch(Peer* peer, std::vector<Item*>& items) {
  // The entries still to send: those answered kBusy (the backup's map is behind) go again.
  std::vector<Item*> todo(items.begin(), items.end());
  std::vector<uint8_t> request, response;
  kv::ReplicateBatchBuilder builder(max_batch_bytes_);
  while (!todo.empty()) {
    Clock::time_point deadline = todo.front()->deadline;
    for (Item* item : todo) deadline = std::min(deadline, item->deadline);
    const Clock::time_point now = Clock::now();
    if (now >= deadline) {
      // Some waited past their deadline (behind a stalled batch or an epoch-behind backup).
      std::vector<Item*> left;
      for (Item* item : todo) {
        if (now >= item->deadline) {
          if (item->result.ok()) {
            item->result =
                Status::Unavailable(peer->who + " did not confirm within " +
                                    std::to_string(options_.forward_timeout.count()) + " ms");
          }
        } else {
          left.push_back(item);
        }
      }
      todo.swap(left);
      continue;
    }
    Result<std::shared_ptr<transport::Connection>> conn = ConnectionTo(peer);
    if (!conn.ok()) {
      for (Item* item : todo) item->result = conn.status();
      return;
    }
    // One write: a plain REPLICATE. Several: a batch (what does not fit goes next round).
    const bool single = todo.size() == 1 || !builder.Add(*todo[0]->m);
    size_t sent = 1;
    if (single) {
      kv::EncodeRequest(kv::EncodeReplicate(*todo[0]->m), &request);
    } else {
      while (sent < todo.size() && builder.Add(*todo[sent]->m)) ++sent;
      kv::EncodeRequest(builder.Encode(todo[0]->m->map_epoch, todo[0]->m->sender_id), &request);
      builder.Clear();
    }
    batches_.fetch_add(1, std::memory_order_relaxed);
    batched_writes_.fetch_add(sent, std::memory_order_relaxed);
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now);
    Status called = (*conn)->Call(request, &response, std::max(left, std::chrono::milliseconds(1)));
    std::vector<Item*> again(todo.begin() + static_cast<std::ptrdiff_t>(sent), todo.end());
    bool busy = false;
    auto settle = [&](Item* item, StatusCode code, uint64_t version, const std::string& why) {
      if (code == StatusCode::kOk) {
        item->result = Status::Ok();
      } else if (code == StatusCode::kVersionMismatch) {
        item->newer = version;
        item->result = Status::VersionMismatch(peer->who + ": " + why);
      } else if (code == StatusCode::kBusy && Clock::now() < item->deadline) {
        // A backup whose map is behind ours answers kBusy until it installs our epoch.
        epoch_retries_.fetch_add(1, std::memory_order_relaxed);
        item->result = Status::Ok();
        again.push_back(item);
        busy = true;
      } else {
        item->result = Status::Unavailable(peer->who + " refused: " + Status(code, why).ToString());
      }
    };
    if (!called.ok()) {
      {
        MutexLock lock(&peer->mu);
        if (peer->conn == *conn) peer->conn.reset();
        peer->failed_ever = true;
        peer->last_failure = Clock::now();
        peer->last_error = "did not confirm: " + called.ToString();
      }
      for (size_t i = 0; i < sent; ++i) {
        todo[i]->result = Status::Unavailable(peer->who + " did not confirm: " + called.ToString());
      }
    } else if (Result<kv::Response> answer = kv::DecodeResponse(response); !answer.ok()) {
      for (size_t i = 0; i < sent; ++i) {
        todo[i]->result =
            Status::Unavailable(peer->who + " sent a bad answer: " + answer.status().message());
      }
    } else if (single || !answer->status.ok()) {
      // A plain answer, or a batch refused whole (every entry gets its status).
      for (size_t i = 0; i < sent; ++i) {
        settle(todo[i], answer->status.code(), answer->version, answer->status.message());
      }
    } else {
      Result<std::vector<kv::ReplicateBatchResult>> results =
          kv::DecodeReplicateBatchAnswer(answer->version, answer->body, sent);
      for (size_t i = 0; i < sent; ++i) {
        if (!results.ok()) {
          todo[i]->result = Status::Unavailable(
              peer->who + " sent a bad batch answer: " + results.status().message());
        } else {
          const kv::ReplicateBatchResult& r = (*results)[i];
          settle(todo[i], r.code, r.version,
                 r.code == StatusCode::kVersionMismatch
                     ? "the key has the newer version " + std::to_string(r.version)
                     : std::string("(in a batch)"));
        }
      }
    }
    if (busy) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    todo.swap(again);
  }
}

Status Replicator::Forward(const cluster::ClusterMap& map, uint32_t shard,
                           const kv::ReplicateRequest& m, uint64_t* newer) {
  *newer = 0;
  struct Target {
    uint32_t id;
    bool in_sync;
    std::string address;
  };
  std::vector<Target> targets;
  auto add = [&](const std::vector<std::vector<uint32_t>>& lists, bool in_sync) {
    if (shard >= lists.size()) return;
    for (uint32_t id : lists[shard]) {
      const cluster::ServerEntry* e = map.FindServer(id);
      targets.push_back({id, in_sync, e != nullptr ? e->address : std::string("?")});
    }
  };
  add(map.backups, true);
  add(map.joining, false);
  if (targets.empty()) return Status::Ok();

  // On every backup's queue at once; their senders send in parallel. When the first backup has
  // no batch in flight, this thread sends the batch itself (no handoff to its sender): a lone
  // write costs what an unbatched forward did, and writes that come meanwhile queue up.
  Waiter waiter;
  std::vector<Item> items(targets.size());
  const Clock::time_point deadline = Clock::now() + options_.forward_timeout;
  {
    MutexLock lock(&waiter.mu);
    waiter.pending = targets.size();
  }
  std::shared_ptr<Peer> lead;  // the backup this thread sends to
  std::vector<Item*> batch;
  for (size_t i = 0; i < targets.size(); ++i) {
    items[i].m = &m;
    items[i].deadline = deadline;
    items[i].waiter = &waiter;
    std::shared_ptr<Peer> peer = PeerFor(targets[i].id, targets[i].address);
    bool wake = false;
    {
      MutexLock lock(&peer->queue_mu);
      // The sender waits for a queued write with no batch in flight: wake it on that change.
      wake = peer->queue.empty() && !peer->busy;
      peer->queue.push_back(&items[i]);
      peer->pending.fetch_add(1, std::memory_order_relaxed);
      if (i == 0 && !peer->busy) {
        peer->Take(max_batch_bytes_, &batch);
        lead = peer;
        wake = false;
      }
    }
    if (wake) peer->queue_cv.Signal();
  }
  if (lead != nullptr) {
    SendBatch(lead.get(), batch);
    lead->pending.fetch_sub(batch.size(), std::memory_order_relaxed);
    Complete(batch);
    bool more = false;
    {
      MutexLock lock(&lead->queue_mu);
      more = lead->Done();
    }
    if (more) lead->queue_cv.Signal();  // what queued meanwhile goes with the sender
  }
  {
    MutexLock lock(&waiter.mu);
    while (waiter.pending > 0) waiter.cv.Wait(&waiter.mu);
  }
  Status first_error;
  for (size_t i = 0; i < targets.size(); ++i) {
    if (items[i].result.ok()) {
      forwards_.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    if (items[i].newer > 0) {
      // Not a failure of the backup: the primary retries above this version (joining
      // backups too: a copy may have brought them a newer version than a forward).
      *newer = std::max(*newer, items[i].newer);
      continue;
    }
    if (!targets[i].in_sync) {
      joining_errors_.fetch_add(1, std::memory_order_relaxed);
      MutexLock lock(&joining_mu_);
      ++joining_failures_[{shard, targets[i].id}];
      continue;
    }
    forward_errors_.fetch_add(1, std::memory_order_relaxed);
    if (first_error.ok()) first_error = items[i].result;
  }
  if (first_error.ok() && *newer > 0) {
    version_retries_.fetch_add(1, std::memory_order_relaxed);
    return Status::VersionMismatch("shard " + std::to_string(shard) +
                                   ": a backup holds a newer version (" + std::to_string(*newer) +
                                   ")");
  }
  if (!first_error.ok()) {
    return Status::Unavailable("shard " + std::to_string(shard) +
                               ": the write was not acknowledged (it may be applied on some "
                               "replicas): " +
                               first_error.message());
  }
  return Status::Ok();
}

ReplicatorStats Replicator::stats() const {
  return {forwards_.load(),      forward_errors_.load(),  joining_errors_.load(),
          epoch_retries_.load(), version_retries_.load(), batches_.load(),
          batched_writes_.load()};
}

std::vector<Replicator::PeerState> Replicator::Peers() const {
  std::vector<PeerState> out;
  MutexLock lock(&peers_mu_);
  const Clock::time_point now = Clock::now();
  for (const auto& [id, p] : peers_) {
    PeerState st;
    st.id = id;
    {
      MutexLock pl(&p->mu);
      st.connected = p->conn != nullptr;
      if (p->failed_ever) {
        st.last_failure_s_ago = std::chrono::duration<double>(now - p->last_failure).count();
      }
    }
    st.pending = p->pending.load(std::memory_order_relaxed);
    Clock::time_point oldest = Clock::time_point::max();
    {
      MutexLock q(&p->queue_mu);
      if (p->busy) oldest = p->batch_deadline;
      // The queue is in arrival order: its front waited longest.
      if (!p->queue.empty()) oldest = std::min(oldest, p->queue.front()->deadline);
    }
    if (oldest != Clock::time_point::max()) {
      const Clock::time_point queued = oldest - options_.forward_timeout;
      st.oldest_pending_s = std::max(0.0, std::chrono::duration<double>(now - queued).count());
    }
    out.push_back(st);
  }
  return out;
}

uint64_t Replicator::JoiningFailures(uint32_t shard, uint32_t id) const {
  MutexLock lock(&joining_mu_);
  auto it = joining_failures_.find({shard, id});
  return it == joining_failures_.end() ? 0 : it->second;
}

void Replicator::ResetJoiningFailures(uint32_t shard) {
  MutexLock lock(&joining_mu_);
  for (auto it = joining_failures_.begin(); it != joining_failures_.end();) {
    it = it->first.first == shard ? joining_failures_.erase(it) : std::next(it);
  }
}

}  // namespace rdkv::server::replication

#include "server/replication/replicator.h"

#include <glog/logging.h>

#include <set>
#include <string>
#include <string_view>

#include "common/kv/wire.h"
#include "common/util/thread_name.h"
#include "common/util/units.h"

namespace rdkv::server::replication {

using Clock = std::chrono::steady_clock;

// One write queued for one backup. Owned by its Forwarding; the sender writes result and
// newer, then counts it done under the Forwarding's lock.
struct Replicator::Item {
  const kv::ReplicateRequest* m = nullptr;
  Clock::time_point deadline;
  Status result;
  uint64_t newer = 0;
  Forwarding* owner = nullptr;
  // Of a chain (ForwardChainAsync) and not its last write: the next queued entry is the
  // chain's next write, and no batch ends between them.
  bool glued_to_next = false;
};

// One Forward: its backups, its entry on each backup's queue, and what waits for them (the
// calling thread, or for ForwardAsync the completion, run by whoever settles the last entry).
struct Replicator::Forwarding {
  struct Target {
    uint32_t id;
    bool in_sync;
    std::string address;
    uint64_t joined_at;  // a joining backup's join epoch (ClusterMap::JoinedAt); 0 in sync
  };
  uint32_t shard = 0;
  std::vector<Target> targets;
  std::vector<Item> items;  // one per target
  Mutex mu;
  CondVar cv;
  size_t pending GUARDED_BY(mu) = 0;
  ForwardDone done;  // ForwardAsync's; empty: a thread waits on cv
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
  // The sender waits for: queued writes and room in flight, or stopping with nothing queued.
  CondVar queue_cv;
  std::deque<Item*> queue GUARDED_BY(queue_mu);
  size_t max_in_flight = 1;
  size_t pipeline_min_writes = 1;  // queued writes that start a batch beside one in flight
  // The deadlines of the batches in flight (their earliest entry's), for the lag (Peers); its
  // size is the number in flight.
  std::multiset<Clock::time_point> in_flight GUARDED_BY(queue_mu);
  // Writes queued or in a batch in flight: added when queued, taken off when answered.
  std::atomic<uint64_t> pending{0};
  // Replaced or shutting down: the sender leaves once nothing is queued or handed to it, and
  // then sets `exited`; a batch for a peer whose sender exited is finished (or failed) by the
  // thread that took it (no write may wait for a sender that left).
  bool stopping GUARDED_BY(queue_mu) = false;
  bool exited GUARDED_BY(queue_mu) = false;  // the sender has returned: nothing handed runs
  std::thread sender;                        // started by PeerFor, joined by ~Replicator
  // Batches a Forward took and handed to the sender to finish (started) or to send too (when
  // the backup had no open connection): each backup's answers are waited for on its own
  // thread, so that a slow backup never holds another's places in flight.
  std::deque<std::unique_ptr<Batch>> handed GUARDED_BY(queue_mu);

  bool Connected() EXCLUDES(mu) {
    MutexLock lock(&mu);
    return conn != nullptr && conn->alive();
  }
  // The open connection, without waiting: null when there is none or `mu` is taken (a sender
  // may hold it while it connects, for up to connect_timeout).
  std::shared_ptr<transport::Connection> OpenConnectionNow() EXCLUDES(mu) {
    if (!mu.TryLock()) return nullptr;
    MutexLock lock(&mu, std::adopt_lock);
    if (conn == nullptr || !conn->alive()) return nullptr;
    return conn;
  }

  // A batch may start: something is queued, and nothing is in flight, or there is room and
  // enough is queued to be worth a round trip of its own (or the peer is stopping).
  bool CanTake() const REQUIRES(queue_mu) {
    if (queue.empty()) return false;
    if (in_flight.empty() || stopping) return true;
    return in_flight.size() < max_in_flight && queue.size() >= pipeline_min_writes;
  }
  // Moves the next batch off the queue: whatever is queued, up to kMaxReplicateBatchEntries
  // and `max_bytes`, one map epoch (the frame carries it); counts it in flight.
  std::unique_ptr<Batch> Take(size_t max_bytes) REQUIRES(queue_mu);
  // `batch` is answered: its place in flight is free. True when the sender must take more.
  bool Done(const Batch& batch) REQUIRES(queue_mu);
};

// A batch to one backup: its entries, and the round of it in flight.
struct Replicator::Batch {
  std::vector<Item*> items;  // every entry; each gets its result
  std::vector<Item*> todo;   // entries still to send (the round in flight's first)
  Clock::time_point deadline = Clock::time_point::max();  // the earliest entry's, when taken
  size_t sent = 0;      // entries the round in flight carries (todo's first)
  bool single = false;  // the round is a plain REPLICATE
  bool in_flight = false;
  bool busy = false;   // the last round met an epoch-behind backup: wait before the next
  Status start_error;  // the round's StartCall failed (nothing was sent)
  std::shared_ptr<transport::Connection> conn;
  std::vector<uint8_t> request, response;
  transport::PendingCall call;
};

std::unique_ptr<Replicator::Batch> Replicator::Peer::Take(size_t max_bytes) {
  auto batch = std::make_unique<Batch>();
  size_t bytes = 0;
  const uint64_t epoch = queue.front()->m->map_epoch;
  auto entry_bytes = [](const Item* item) {
    return kv::kReplicateBatchEntryHeaderBytes + item->m->key.size() + item->m->value.size();
  };
  while (!queue.empty() && batch->items.size() < kv::kMaxReplicateBatchEntries) {
    // The next run: one write, or a whole chain (glued entries and the one that ends it). A
    // chain goes into one batch, so that the backup applies it in order; an empty batch takes
    // it whatever its size (rounds then carry it in order).
    size_t run = 1, run_bytes = entry_bytes(queue.front());
    while (queue[run - 1]->glued_to_next && run < queue.size()) {
      run_bytes += entry_bytes(queue[run]);
      ++run;
    }
    if (!batch->items.empty() &&
        (queue.front()->m->map_epoch != epoch || bytes + run_bytes > max_bytes ||
         batch->items.size() + run > kv::kMaxReplicateBatchEntries)) {
      break;
    }
    bytes += run_bytes;
    for (size_t i = 0; i < run; ++i) {
      batch->deadline = std::min(batch->deadline, queue.front()->deadline);
      batch->items.push_back(queue.front());
      queue.pop_front();
    }
  }
  batch->todo = batch->items;
  in_flight.insert(batch->deadline);
  return batch;
}

bool Replicator::Peer::Done(const Batch& batch) {
  auto it = in_flight.find(batch.deadline);
  if (it != in_flight.end()) in_flight.erase(it);
  return CanTake();
}

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
    writers_.emplace_back([this] {
      rdkv::util::NameThisThread("rdkv-repl-write");
      WriterLoop();
    });
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
  p->max_in_flight = static_cast<size_t>(std::max(1, options_.batches_in_flight));
  p->pipeline_min_writes = std::max<size_t>(1, options_.pipeline_min_writes);
  p->sender = std::thread([this, peer = p] {
    rdkv::util::NameThisThread("rdkv-repl-send");
    SenderLoop(peer);
  });
  return p;
}

namespace {
thread_local bool t_sender_thread = false;
}  // namespace

bool Replicator::OnSenderThread() { return t_sender_thread; }

void Replicator::SenderLoop(std::shared_ptr<Peer> peer) {
  t_sender_thread = true;
  std::deque<std::unique_ptr<Batch>> mine;  // started by this thread, finished in that order
  for (;;) {
    std::vector<std::unique_ptr<Batch>> fresh;
    {
      MutexLock lock(&peer->queue_mu);
      if (mine.empty()) {
        while (!peer->CanTake() && peer->handed.empty() &&
               !(peer->stopping && peer->queue.empty())) {
          peer->queue_cv.Wait(&peer->queue_mu);
        }
        if (!peer->CanTake() && peer->handed.empty()) {  // stopping, nothing queued
          peer->exited = true;
          return;
        }
      }
      for (; !peer->handed.empty(); peer->handed.pop_front()) {
        mine.push_back(std::move(peer->handed.front()));
      }
      while (peer->CanTake()) fresh.push_back(peer->Take(max_batch_bytes_));
    }
    sender_batches_.fetch_add(fresh.size(), std::memory_order_relaxed);
    for (std::unique_ptr<Batch>& b : fresh) {
      StartRound(peer.get(), b.get());
      mine.push_back(std::move(b));
    }
    std::unique_ptr<Batch> oldest = std::move(mine.front());
    mine.pop_front();
    RunBatch(peer.get(), oldest.get());
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

bool Replicator::StartRound(Peer* peer, Batch* batch, std::shared_ptr<transport::Connection> open) {
  std::vector<Item*>& todo = batch->todo;
  Clock::time_point deadline = Clock::time_point::max();
  for (Item* item : todo) deadline = std::min(deadline, item->deadline);
  const Clock::time_point now = Clock::now();
  if (now >= deadline) {
    // Some waited past their deadline (behind a stalled backup or an epoch-behind one).
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
    return false;
  }
  Result<std::shared_ptr<transport::Connection>> conn =
      open != nullptr ? Result<std::shared_ptr<transport::Connection>>(std::move(open))
                      : ConnectionTo(peer);
  if (!conn.ok()) {
    for (Item* item : todo) item->result = conn.status();
    todo.clear();
    return false;
  }
  // One write: a plain REPLICATE. Several: a batch (what does not fit goes next round).
  kv::ReplicateBatchBuilder builder(max_batch_bytes_);
  batch->single = todo.size() == 1 || !builder.Add(*todo[0]->m);
  batch->sent = 1;
  if (batch->single) {
    kv::EncodeRequest(kv::EncodeReplicate(*todo[0]->m), &batch->request);
  } else {
    while (batch->sent < todo.size() && builder.Add(*todo[batch->sent]->m)) ++batch->sent;
    kv::EncodeRequest(builder.Encode(todo[0]->m->map_epoch, todo[0]->m->sender_id),
                      &batch->request);
  }
  batches_.fetch_add(1, std::memory_order_relaxed);
  batched_writes_.fetch_add(batch->sent, std::memory_order_relaxed);
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now);
  // A failed start (nothing went out) is settled by FinishRound as a failed call.
  batch->start_error = (*conn)->StartCall(
      batch->request, &batch->response, std::max(left, std::chrono::milliseconds(1)), &batch->call);
  batch->conn = std::move(*conn);
  batch->in_flight = true;
  return true;
}

bool Replicator::WaitRound(Batch* batch, Clock::time_point until) {
  if (!batch->in_flight || !batch->start_error.ok()) return true;
  return batch->conn->WaitCall(&batch->call, until);
}

void Replicator::FinishRound(Peer* peer, Batch* batch) {
  std::vector<Item*>& todo = batch->todo;
  const size_t sent = batch->sent;
  Status called =
      batch->start_error.ok() ? batch->conn->FinishCall(&batch->call) : batch->start_error;
  batch->in_flight = false;
  // Sent again, in their order: the entries answered kBusy (the first `sent`), then those that
  // did not fit (a chain's writes must reach the backup in version order).
  std::vector<Item*> again;
  batch->busy = false;
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
      batch->busy = true;
    } else {
      item->result = Status::Unavailable(peer->who + " refused: " + Status(code, why).ToString());
    }
  };
  if (!called.ok()) {
    {
      MutexLock lock(&peer->mu);
      if (peer->conn == batch->conn) peer->conn.reset();
      peer->failed_ever = true;
      peer->last_failure = Clock::now();
      peer->last_error = "did not confirm: " + called.ToString();
    }
    for (size_t i = 0; i < sent; ++i) {
      todo[i]->result = Status::Unavailable(peer->who + " did not confirm: " + called.ToString());
    }
  } else if (Result<kv::Response> answer = kv::DecodeResponse(batch->response); !answer.ok()) {
    for (size_t i = 0; i < sent; ++i) {
      todo[i]->result =
          Status::Unavailable(peer->who + " sent a bad answer: " + answer.status().message());
    }
  } else if (batch->single || !answer->status.ok()) {
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
  again.insert(again.end(), todo.begin() + static_cast<std::ptrdiff_t>(sent), todo.end());
  todo.swap(again);
  batch->conn.reset();
}

void Replicator::RunBatch(Peer* peer, Batch* batch) {
  while (batch->in_flight || !batch->todo.empty()) {
    if (!batch->in_flight && !StartRound(peer, batch)) continue;
    FinishRound(peer, batch);
    if (batch->busy) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  // The place in flight is freed before the writers learn their results, so that a writer's
  // next write finds it free (and is not queued behind a batch that is already answered).
  bool more = false;
  {
    MutexLock lock(&peer->queue_mu);
    more = peer->Done(*batch);
  }
  peer->pending.fetch_sub(batch->items.size(), std::memory_order_relaxed);
  std::vector<Forwarding*> complete;  // ForwardAsync's whose last entry this was
  for (Item* item : batch->items) {
    Forwarding* f = item->owner;
    MutexLock lock(&f->mu);
    if (--f->pending > 0) continue;
    if (f->done) {
      complete.push_back(f);
    } else {
      f->cv.Signal();  // only the Forward waits on it
    }
  }
  if (more) peer->queue_cv.Signal();  // what queued meanwhile goes with the sender
  // The writes' answers to their clients go out together: usually one write per client
  // connection for the batch, not one per write. The completions do not wait for the network
  // (a retry only queues); the store's wait for a full heap sends what is held first.
  transport::ReplyBatch replies;
  for (Forwarding* f : complete) Complete(std::unique_ptr<Forwarding>(f));
}

void Replicator::Complete(std::unique_ptr<Forwarding> f) {
  uint64_t newer = 0;
  const Status result = Settle(*f, &newer);
  ForwardDone done = std::move(f->done);
  f.reset();  // before the completion, which may free the write the entries point at
  done(result, newer);
}

std::unique_ptr<Replicator::Forwarding> Replicator::Prepare(const cluster::ClusterMap& map,
                                                            uint32_t shard,
                                                            const kv::ReplicateRequest& m) {
  auto f = std::make_unique<Forwarding>();
  f->shard = shard;
  auto add = [&](const std::vector<std::vector<uint32_t>>& lists, bool in_sync) {
    if (shard >= lists.size()) return;
    for (uint32_t id : lists[shard]) {
      const cluster::ServerEntry* e = map.FindServer(id);
      f->targets.push_back({id, in_sync, e != nullptr ? e->address : std::string("?"),
                            in_sync ? 0 : map.JoinedAt(shard, id)});
    }
  };
  add(map.backups, true);
  add(map.joining, false);
  for (const Forwarding::Target& t : f->targets) {
    // A joining pair's forwards in flight: its in-sync check waits for those sent before it.
    if (t.joined_at == 0) continue;
    MutexLock lock(&joining_mu_);
    ++joining_[{shard, t.id, t.joined_at}].sent;
  }
  f->items.resize(f->targets.size());
  const Clock::time_point deadline = Clock::now() + options_.forward_timeout;
  for (Item& item : f->items) {
    item.m = &m;
    item.deadline = deadline;
    item.owner = f.get();
  }
  MutexLock lock(&f->mu);
  f->pending = f->targets.size();
  return f;
}

Replicator::TakenBatches Replicator::Enqueue(std::span<Forwarding* const> chain, bool may_take,
                                             std::vector<Item*>* orphaned) {
  TakenBatches taken;
  // Once its last entry is queued, a Forwarding may be completed and freed by a sender
  // (nothing taken here holds its entries): read nothing of it after that. Every Forwarding of
  // a chain has the same targets (one shard, one map): copied first.
  const std::vector<Forwarding::Target> targets = chain.front()->targets;
  const size_t n = targets.size();
  for (size_t i = 0; i < n; ++i) {
    std::shared_ptr<Peer> peer = PeerFor(targets[i].id, targets[i].address);
    std::unique_ptr<Batch> batch;
    bool wake = false;
    {
      MutexLock lock(&peer->queue_mu);
      if (peer->exited) {
        // Replaced in the map, its sender gone (a write that raced with the replacement).
        for (Forwarding* f : chain) {
          f->items[i].result = Status::Unavailable(peer->who +
                                                   " was replaced in the map while "
                                                   "the write was queued for it");
          orphaned->push_back(&f->items[i]);
        }
        continue;
      }
      // A chain's entries one after another, under one hold of the queue's lock.
      for (size_t j = 0; j < chain.size(); ++j) {
        chain[j]->items[i].glued_to_next = j + 1 < chain.size();
        peer->queue.push_back(&chain[j]->items[i]);
      }
      peer->pending.fetch_add(chain.size(), std::memory_order_relaxed);
      if (may_take && peer->CanTake()) batch = peer->Take(max_batch_bytes_);
      // What did not fit (or all of it, when this thread takes nothing) goes with the sender.
      wake = peer->CanTake();
    }
    if (wake) peer->queue_cv.Signal();
    if (batch != nullptr) taken.emplace_back(std::move(peer), std::move(batch));
  }
  return taken;
}

bool Replicator::HandOver(std::shared_ptr<Peer>& peer, std::unique_ptr<Batch>& batch) {
  {
    MutexLock lock(&peer->queue_mu);
    // A stopping sender still runs what it is handed; one that has returned does not.
    if (peer->exited) return false;
    peer->handed.push_back(std::move(batch));
  }
  peer->queue_cv.Signal();
  return true;
}

Status Replicator::Settle(Forwarding& f, uint64_t* newer) {
  *newer = 0;
  Status first_error;
  for (size_t i = 0; i < f.targets.size(); ++i) {
    const Item& item = f.items[i];
    if (const Forwarding::Target& t = f.targets[i]; t.joined_at != 0) {
      // Counted against the pair the write was forwarded to (a pair no longer joining is
      // forgotten at the next map): answered, and missed unless applied or newer there.
      MutexLock lock(&joining_mu_);
      JoiningRecord& r = joining_[{f.shard, t.id, t.joined_at}];
      ++r.settled;
      if (!item.result.ok() && item.newer == 0) ++r.missed;
    }
    if (item.result.ok()) {
      forwards_.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    if (item.newer > 0) {
      // Not a failure of the backup: the primary retries above this version (joining
      // backups too: a copy may have brought them a newer version than a forward).
      *newer = std::max(*newer, item.newer);
      continue;
    }
    if (!f.targets[i].in_sync) {
      joining_errors_.fetch_add(1, std::memory_order_relaxed);  // and in its record, above
      continue;
    }
    forward_errors_.fetch_add(1, std::memory_order_relaxed);
    if (first_error.ok()) first_error = item.result;
  }
  if (first_error.ok() && *newer > 0) {
    version_retries_.fetch_add(1, std::memory_order_relaxed);
    return Status::VersionMismatch("shard " + std::to_string(f.shard) +
                                   ": a backup holds a newer version (" + std::to_string(*newer) +
                                   ")");
  }
  if (!first_error.ok()) {
    return Status::Unavailable("shard " + std::to_string(f.shard) +
                               ": the write was not acknowledged (it may be applied on some "
                               "replicas): " +
                               first_error.message());
  }
  return Status::Ok();
}

void Replicator::ForwardAsync(const cluster::ClusterMap& map, uint32_t shard,
                              const kv::ReplicateRequest& m, ForwardDone done, bool may_start) {
  std::vector<ForwardDone> dones;
  dones.push_back(std::move(done));
  const kv::ReplicateRequest* const one = &m;
  ForwardChainAsync(map, shard, std::span<const kv::ReplicateRequest* const>(&one, 1), &dones,
                    may_start);
}

void Replicator::ForwardChainAsync(const cluster::ClusterMap& map, uint32_t shard,
                                   std::span<const kv::ReplicateRequest* const> chain,
                                   std::vector<ForwardDone>* dones, bool may_start) {
  std::vector<std::unique_ptr<Forwarding>> fs;
  fs.reserve(chain.size());
  for (const kv::ReplicateRequest* m : chain) fs.push_back(Prepare(map, shard, *m));
  if (fs.empty()) return;
  if (fs.front()->targets.empty()) {
    for (ForwardDone& done : *dones) done(Status::Ok(), 0);
    return;
  }
  std::vector<Forwarding*> raws;
  raws.reserve(fs.size());
  for (size_t j = 0; j < fs.size(); ++j) {
    fs[j]->done = std::move((*dones)[j]);
    raws.push_back(fs[j].get());
  }
  // may_start false: nothing is taken here; the senders take the entries from their queues.
  std::vector<Item*> orphaned;
  auto taken = Enqueue(raws, may_start, &orphaned);
  // From here the entries' answers own them: the last one settled completes and frees each,
  // maybe before this loop ends (only the batches still in this thread's hands are touched
  // below).
  for (std::unique_ptr<Forwarding>& f : fs) f.release();
  async_forwards_.fetch_add(raws.size(), std::memory_order_relaxed);
  for (Item* item : orphaned) {
    Forwarding* raw = item->owner;
    bool last = false;
    {
      MutexLock lock(&raw->mu);
      last = --raw->pending == 0;
    }
    if (last) Complete(std::unique_ptr<Forwarding>(raw));  // on this thread: every entry failed
  }
  for (auto& [peer, batch] : taken) {
    // Started here only on a connection that is open now (never a connect, never a wait for
    // the peer's lock); every batch is then its backup's sender's, which waits for the answer
    // (or connects and sends an unstarted one) and completes what it settles.
    if (std::shared_ptr<transport::Connection> conn = peer->OpenConnectionNow()) {
      StartRound(peer.get(), batch.get(), std::move(conn));
    }
    if (HandOver(peer, batch)) continue;
    // The backup was replaced in the map and its sender has already returned (a write that
    // raced with the replacement): a batch not sent fails here at once (its writes fail
    // kUnavailable and are repaired); one in flight is finished here, within forward_timeout.
    if (!batch->in_flight) {
      for (Item* item : batch->todo) {
        item->result = Status::Unavailable(peer->who +
                                           " was replaced in the map while the write "
                                           "was queued for it");
      }
      batch->todo.clear();
    }
    RunBatch(peer.get(), batch.get());
  }
}

Status Replicator::Forward(const cluster::ClusterMap& map, uint32_t shard,
                           const kv::ReplicateRequest& m, uint64_t* newer) {
  *newer = 0;
  std::unique_ptr<Forwarding> f = Prepare(map, shard, m);
  if (f->targets.empty()) return Status::Ok();

  // 1. On every backup's queue at once. Each backup with room in flight gets its batch taken
  //    by this thread (no handoff: a lone write goes to all its backups at once); a backup with
  //    no room keeps the write queued for its sender, which takes it when a batch of it is
  //    answered.
  std::vector<Item*> orphaned;  // their results are set; settled with the rest below
  Forwarding* const raw = f.get();
  auto taken = Enqueue(std::span<Forwarding* const>(&raw, 1), /*may_take=*/true, &orphaned);
  if (!orphaned.empty()) {
    MutexLock lock(&f->mu);
    f->pending -= orphaned.size();
  }
  // 2. Start them, each on an open connection only (no connect on this path, except for the
  //    first backup's batch); a batch for a backup with no connection goes to its sender.
  // 3. Wait for the first backup's answer, then finish the others here too (their answers
  //    have usually arrived meanwhile: no thread handoff). But a backup that is slow to answer
  //    must not hold the others' places in flight: when the first answer takes longer than
  //    hand_off_after, or its batch must go again, the other batches go to their backups'
  //    senders, which wait for their answers.
  TakenBatches others, kept;
  auto hand_over = [&](std::shared_ptr<Peer>& peer, std::unique_ptr<Batch>& batch) {
    if (!HandOver(peer, batch)) kept.emplace_back(std::move(peer), std::move(batch));
  };
  for (size_t i = 0; i < taken.size(); ++i) {
    auto& [peer, batch] = taken[i];
    if (i == 0 || peer->Connected()) {
      StartRound(peer.get(), batch.get());
      if (i > 0) others.push_back(std::move(taken[i]));
    } else {
      hand_over(peer, batch);
    }
  }
  if (!taken.empty()) {
    auto& [peer, batch] = taken[0];
    if (!others.empty()) {
      bool answered =
          !batch->in_flight || WaitRound(batch.get(), Clock::now() + options_.hand_off_after);
      if (answered && batch->in_flight) {
        FinishRound(peer.get(), batch.get());
        answered = batch->todo.empty();  // else it goes again (a backup behind our epoch)
      }
      if (!answered) {
        for (auto& [p, b] : others) hand_over(p, b);
        others.clear();
      }
    }
    RunBatch(peer.get(), batch.get());
  }
  for (auto& [peer, batch] : others) RunBatch(peer.get(), batch.get());
  for (auto& [peer, batch] : kept) RunBatch(peer.get(), batch.get());
  {
    MutexLock lock(&f->mu);
    while (f->pending > 0) f->cv.Wait(&f->mu);
  }
  return Settle(*f, newer);
}

ReplicatorStats Replicator::stats() const {
  return {forwards_.load(),       forward_errors_.load(),  joining_errors_.load(),
          epoch_retries_.load(),  version_retries_.load(), batches_.load(),
          batched_writes_.load(), sender_batches_.load(),  async_forwards_.load()};
}

std::vector<Replicator::PeerState> Replicator::Peers() const {
  std::vector<PeerState> out;
  // peers_mu_ only for the copy: a peer's mu may be held through a connect (up to
  // connect_timeout), and PeerFor, on every forward, must not queue behind that.
  std::vector<std::pair<uint32_t, std::shared_ptr<Peer>>> peers;
  {
    MutexLock lock(&peers_mu_);
    peers.assign(peers_.begin(), peers_.end());
  }
  const Clock::time_point now = Clock::now();
  for (const auto& [id, p] : peers) {
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
      if (!p->in_flight.empty()) oldest = *p->in_flight.begin();
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

void Replicator::NoteMap(const cluster::ClusterMap& previous, const cluster::ClusterMap& next,
                         uint32_t me) {
  MutexLock lock(&joining_mu_);
  std::erase_if(joining_, [&](const auto& entry) {
    const auto& [shard, id, joined_at] = entry.first;
    return shard >= next.shards || next.OwnerOf(shard) != me ||
           next.JoinedAt(shard, id) != joined_at;
  });
  std::erase_if(own_joins_, [&](const auto& join) {
    return join.first >= next.shards || next.JoinedAt(join.first, me) != join.second;
  });
  for (uint32_t shard = 0; shard < next.shards && shard < next.joining.size(); ++shard) {
    for (uint32_t id : next.joining[shard]) {
      const uint64_t joined_at = next.JoinedAt(shard, id);
      // Only the map that starts the join: from it on, every write of the shard here is
      // forwarded to the pair (this install waits for the writes of the older map).
      if (next.OwnerOf(shard) == me && joined_at == next.epoch) {
        joining_[{shard, id, next.epoch}].from_join = true;
      }
      // This replica's own join, first seen by this process after it emptied the shard:
      // everything of the join (the copy's items, the forwards) comes to this process from
      // here on (a forward sent before it installed the join is refused kBusy and sent again).
      // A process that started from an older map (its saved one lost) sees the join begin too,
      // but did not empty the shard: the emptying belongs to the copy's first step.
      if (id == me && joined_at != 0 &&
          (shard >= previous.shards || previous.JoinedAt(shard, me) != joined_at) &&
          dropped_.erase(shard) > 0) {
        own_joins_.insert({shard, joined_at});
      }
    }
  }
}

void Replicator::NoteDropped(uint32_t shard) {
  MutexLock lock(&joining_mu_);
  dropped_.insert(shard);
}

Status Replicator::MayClaimOwnCopy(uint32_t shard, uint64_t joined_at) const {
  if (joined_at == 0) {
    return Status::Unavailable("it is not joining shard " + std::to_string(shard) +
                               " in its own map (it restarted without the map that added it, "
                               "or has not installed that map yet)");
  }
  MutexLock lock(&joining_mu_);
  if (own_joins_.count({shard, joined_at}) == 0) {
    return Status::Unavailable(
        "it started joining shard " + std::to_string(shard) + " at map epoch " +
        std::to_string(joined_at) +
        " before this server process emptied the shard and installed that map (it restarted "
        "since): the copy's last items may not have been durable here");
  }
  return Status::Ok();
}

namespace {

std::string PairText(uint32_t shard, uint32_t id, uint64_t joined_at) {
  return "server " + std::to_string(id) + " started joining shard " + std::to_string(shard) +
         " at map epoch " + std::to_string(joined_at);
}

// A pair whose join this primary did not see begin (it became the primary, or restarted, since).
Status JoinNotSeen(uint32_t shard, uint32_t id, uint64_t joined_at, std::string_view advice) {
  return Status::Unavailable(PairText(shard, id, joined_at) +
                             ", before this server process was its primary: it cannot vouch that "
                             "the replica got every write since" +
                             std::string(advice));
}

}  // namespace

Status Replicator::CopyScanStarts(uint32_t shard, uint32_t id, uint64_t joined_at) {
  if (joined_at == 0) {
    return Status::Unavailable("server " + std::to_string(id) + " is not joining shard " +
                               std::to_string(shard) +
                               " in this server's map, or the map does not say since when (a "
                               "map written before join epochs): a copy for it would count for "
                               "nothing; add the replica again");
  }
  MutexLock lock(&joining_mu_);
  auto it = joining_.find({shard, id, joined_at});
  if (it == joining_.end() || !it->second.from_join) {
    return JoinNotSeen(shard, id, joined_at, "; add the replica again");
  }
  it->second.scan_started = true;
  return Status::Ok();
}

void Replicator::CopyScanEnded(uint32_t shard, uint32_t id, uint64_t joined_at) {
  MutexLock lock(&joining_mu_);
  auto it = joining_.find({shard, id, joined_at});
  if (it != joining_.end() && it->second.scan_started) it->second.copied = true;
}

Status Replicator::MayBecomeInSync(uint32_t shard, uint32_t id, uint64_t joined_at) const {
  if (joined_at == 0) {
    return Status::Unavailable("the map does not say when server " + std::to_string(id) +
                               " started joining shard " + std::to_string(shard) +
                               " (a map written before join epochs)");
  }
  // The forwards already sent to it must be answered first: one of them may yet fail, after
  // the check, and its write be acknowledged without the replica (its miss would count for
  // nothing once the pair is in sync). At most the forward timeout, and a little more.
  const JoiningPair pair{shard, id, joined_at};
  const Clock::time_point give_up = Clock::now() + options_.forward_timeout + kSettleSlack;
  uint64_t sent = 0;
  {
    MutexLock lock(&joining_mu_);
    if (auto it = joining_.find(pair); it != joining_.end()) sent = it->second.sent;
  }
  for (;;) {
    {
      MutexLock lock(&joining_mu_);
      auto it = joining_.find(pair);
      if (it == joining_.end() || it->second.settled >= sent) break;
    }
    if (Clock::now() >= give_up) {
      return Status::Unavailable(PairText(shard, id, joined_at) +
                                 ", and forwards to it sent before this check are still "
                                 "unanswered after the forward timeout");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  MutexLock lock(&joining_mu_);
  auto it = joining_.find(pair);
  if (it != joining_.end() && it->second.missed > 0) {
    return Status::Unavailable(PairText(shard, id, joined_at) + " and missed " +
                               std::to_string(it->second.missed) + " forwarded write(s) since");
  }
  if (it == joining_.end() || !it->second.from_join) {
    return JoinNotSeen(shard, id, joined_at, "");
  }
  if (!it->second.copied) {
    return Status::Unavailable(PairText(shard, id, joined_at) +
                               ", and no copy of the whole shard into it was read from this "
                               "primary since");
  }
  return Status::Ok();
}

uint64_t Replicator::JoiningFailures(uint32_t shard, uint32_t id, uint64_t joined_at) const {
  MutexLock lock(&joining_mu_);
  auto it = joining_.find({shard, id, joined_at});
  return it == joining_.end() ? 0 : it->second.missed;
}

}  // namespace rdkv::server::replication

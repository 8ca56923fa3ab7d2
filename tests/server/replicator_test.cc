// The primary's Replicator (server/replication/replicator.h) against backups that are bare tcp
// listeners: each answers every REPLICATE with OK, and the test decides when. So it sees which
// thread started each batch and how many batches are in flight to a backup at once
// (docs/design.md "Batching").
#include "server/replication/replicator.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/cluster/cluster_map.h"
#include "common/kv/admin_wire.h"
#include "common/kv/wire.h"
#include "common/util/mutex.h"

namespace rdkv {
namespace {

using Clock = std::chrono::steady_clock;
using server::replication::Replicator;
using server::replication::ReplicatorOptions;

// A backup: answers OK to each entry of every REPLICATE (single or batch), at once or, while
// `hold` is set, when the test releases it.
class FakeBackup {
 public:
  explicit FakeBackup(transport::Fabric* fabric) {
    transport::ListenOptions o;
    o.worker_threads = 2;
    o.handler = [this](std::span<const uint8_t> payload, transport::ReplyHandle reply) {
      Handle(payload, std::move(reply));
    };
    auto l = fabric->Listen(std::move(o));
    EXPECT_TRUE(l.ok()) << l.status().ToString();
    if (l.ok()) listener_ = std::move(*l);
  }
  ~FakeBackup() {
    Release(/*stop_holding=*/true);
    listener_.reset();
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(listener_->port()); }

  void Hold() {
    MutexLock lock(&mu_);
    hold_ = true;
  }
  // Answers every held request (and, with stop_holding, every later one at once).
  void Release(bool stop_holding) {
    std::vector<Held> held;
    {
      MutexLock lock(&mu_);
      held.swap(held_);
      if (stop_holding) hold_ = false;
      in_flight_ -= static_cast<int>(held.size());
    }
    for (Held& h : held) h.reply.session->Reply(h.reply.request_id, h.answer).IgnoreError();
  }
  // Waits until `n` requests have arrived in all (false after 5 s).
  bool WaitForRequests(int n) {
    MutexLock lock(&mu_);
    const Clock::time_point deadline = Clock::now() + std::chrono::seconds(5);
    while (requests_ < n) {
      if (!cv_.WaitUntil(&mu_, deadline) && requests_ < n) return false;
    }
    return true;
  }
  int requests() {
    MutexLock lock(&mu_);
    return requests_;
  }
  int writes() {
    MutexLock lock(&mu_);
    return writes_;
  }
  int max_in_flight() {
    MutexLock lock(&mu_);
    return max_in_flight_;
  }
  std::vector<int> batch_sizes() {
    MutexLock lock(&mu_);
    return batch_sizes_;
  }

 private:
  struct Held {
    transport::ReplyHandle reply;
    std::vector<uint8_t> answer;
  };

  void Handle(std::span<const uint8_t> payload, transport::ReplyHandle reply) {
    std::vector<uint8_t> answer;
    int entries = 0;
    Result<kv::Request> r = kv::DecodeRequest(payload, kv::WireLimits{});
    if (!r.ok()) {
      ADD_FAILURE() << "the replicator sent a bad frame: " << r.status().ToString();
      kv::EncodeResponse(r.status(), 0, {}, &answer);
    } else if (kv::IsReplicateBatch(*r)) {
      Result<kv::ReplicateBatch> b = kv::DecodeReplicateBatch(*r, kv::WireLimits{});
      EXPECT_TRUE(b.ok()) << b.status().ToString();
      std::string body;
      if (b.ok()) {
        for (const kv::ReplicateRequest& e : b->entries) {
          kv::AppendReplicateBatchResult(StatusCode::kOk, e.version, &body);
        }
        entries = static_cast<int>(b->entries.size());
      }
      kv::EncodeResponse(Status::Ok(), static_cast<uint64_t>(entries), body, &answer);
    } else {
      Result<kv::ReplicateRequest> m = kv::DecodeReplicate(*r);
      EXPECT_TRUE(m.ok()) << m.status().ToString();
      entries = 1;
      kv::EncodeResponse(Status::Ok(), m.ok() ? m->version : 0, {}, &answer);
    }
    bool now = true;
    {
      MutexLock lock(&mu_);
      ++requests_;
      writes_ += entries;
      batch_sizes_.push_back(entries);
      if (hold_) {
        held_.push_back({std::move(reply), answer});
        max_in_flight_ = std::max(max_in_flight_, ++in_flight_);
        now = false;
      } else {
        max_in_flight_ = std::max(max_in_flight_, 1);
      }
    }
    cv_.SignalAll();
    if (now) reply.session->Reply(reply.request_id, answer).IgnoreError();
  }

  std::unique_ptr<transport::Listener> listener_;
  Mutex mu_;
  CondVar cv_;
  bool hold_ GUARDED_BY(mu_) = false;
  std::vector<Held> held_ GUARDED_BY(mu_);
  int requests_ GUARDED_BY(mu_) = 0;
  int writes_ GUARDED_BY(mu_) = 0;
  int in_flight_ GUARDED_BY(mu_) = 0;
  int max_in_flight_ GUARDED_BY(mu_) = 0;
  std::vector<int> batch_sizes_ GUARDED_BY(mu_);
};

// On the way out of a test (an ASSERT included): answers what is held, joins the writers.
struct ReleaseAndJoin {
  FakeBackup* backup;
  std::vector<std::thread>* writers;
  ~ReleaseAndJoin() {
    backup->Release(/*stop_holding=*/true);
    for (std::thread& t : *writers) {
      if (t.joinable()) t.join();
    }
  }
};

class ReplicatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto f = transport::Fabric::Create({});
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    fabric_ = std::move(*f);
  }

  // Shard 0 of a map with servers 0..backups: primary 0 (never reached), the others backups.
  cluster::ClusterMap MapWith(const std::vector<FakeBackup*>& backups) {
    std::vector<std::string> addrs = {"127.0.0.1:1"};
    for (FakeBackup* b : backups) addrs.push_back(b->address());
    return cluster::MakeUniformMap(addrs, static_cast<uint32_t>(addrs.size()),
                                   static_cast<uint32_t>(addrs.size()));
  }

  static kv::ReplicateRequest Write(const cluster::ClusterMap& map, const std::string& key,
                                    uint64_t version) {
    kv::ReplicateRequest m;
    m.key = key;
    m.value = "value";
    m.version = version;
    m.map_epoch = map.epoch;
    m.sender_id = 0;
    return m;
  }

  std::unique_ptr<transport::Fabric> fabric_;
};

// A write goes to every backup at once from the writer's own thread: no backup's sender is
// woken for it (each would be a thread handoff per write).
TEST_F(ReplicatorTest, EachWriteGoesToEveryBackupFromTheWritersThread) {
  FakeBackup b1(fabric_.get()), b2(fabric_.get());
  const cluster::ClusterMap map = MapWith({&b1, &b2});
  ASSERT_EQ(map.backups[0].size(), 2u);
  Replicator replicator(fabric_.get(), ReplicatorOptions{});
  constexpr int kWrites = 50;
  for (int i = 0; i < kWrites; ++i) {
    const std::string key = "key" + std::to_string(i);
    uint64_t newer = 0;
    Status s = replicator.Forward(map, 0, Write(map, key, 1000 + i), &newer);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  EXPECT_EQ(b1.writes(), kWrites);
  EXPECT_EQ(b2.writes(), kWrites);
  EXPECT_EQ(replicator.stats().sender_batches, 0u)
      << "a backup's sender started batches of writes that had nothing to wait for";
  EXPECT_EQ(replicator.stats().forwards, 2u * kWrites);
}

// While a batch is in flight to a backup, the next one starts only when pipeline_min_writes
// writes wait for it; never more than batches_in_flight are in flight; every write is answered.
TEST_F(ReplicatorTest, BatchesOverlapOnlyWhenEnoughWritesWait) {
  FakeBackup b1(fabric_.get());
  const cluster::ClusterMap map = MapWith({&b1});
  ReplicatorOptions o;
  o.batches_in_flight = 3;
  o.pipeline_min_writes = 4;
  o.forward_timeout = std::chrono::seconds(20);
  Replicator replicator(fabric_.get(), o);
  b1.Hold();
  std::atomic<int> ok{0};
  std::vector<std::thread> writers;
  ReleaseAndJoin cleanup{&b1, &writers};
  int started = 0;
  auto start = [&](int n) {
    for (int i = 0; i < n; ++i, ++started) {
      writers.emplace_back([&, k = started] {
        const cluster::ClusterMap& m = map;
        uint64_t newer = 0;
        Status s = replicator.Forward(m, 0, Write(m, "w" + std::to_string(k), 5000 + k), &newer);
        EXPECT_TRUE(s.ok()) << s.ToString();
        if (s.ok()) ++ok;
      });
    }
  };
  auto queued = [&](uint64_t want) {  // waits until `want` writes are queued or in flight
    const Clock::time_point deadline = Clock::now() + std::chrono::seconds(5);
    while (Clock::now() < deadline) {
      auto peers = replicator.Peers();
      if (!peers.empty() && peers[0].pending >= want) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return false;
  };
  start(1);
  ASSERT_TRUE(b1.WaitForRequests(1));
  start(3);  // three wait: fewer than pipeline_min_writes
  ASSERT_TRUE(queued(4));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(b1.requests(), 1) << "a batch of 3 started beside one in flight (threshold 4)";
  start(1);  // four wait: a batch of its own
  ASSERT_TRUE(b1.WaitForRequests(2));
  start(8);  // four more make a third batch, then four wait for room
  ASSERT_TRUE(b1.WaitForRequests(3));
  ASSERT_TRUE(queued(13));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(b1.requests(), 3) << "more than batches_in_flight batches in flight";
  EXPECT_EQ(b1.max_in_flight(), 3);
  b1.Release(/*stop_holding=*/true);  // the four left go as the fourth batch
  for (std::thread& t : writers) t.join();
  EXPECT_EQ(ok.load(), started);
  EXPECT_EQ(b1.writes(), started);
  EXPECT_EQ(b1.batch_sizes(), (std::vector<int>{1, 4, 4, 4}));
  EXPECT_EQ(replicator.stats().sender_batches, 1u) << "the fourth batch waited for room";
}

// A backup that does not answer holds up only the writes that need it: a write whose only
// backup is another one goes through while the first is still waiting (its batch to the healthy
// backup was answered and freed its place, though the writer that started it still waits).
TEST_F(ReplicatorTest, ASlowBackupDoesNotHoldUpWritesToAnother) {
  FakeBackup slow(fabric_.get()), healthy(fabric_.get());
  cluster::ClusterMap map = MapWith({&slow, &healthy});
  map.backups[0] = {1, 2};  // shard 0: both backups
  map.backups[1] = {2};     // shard 1: the healthy one only
  ReplicatorOptions o;
  o.forward_timeout = std::chrono::seconds(10);
  Replicator replicator(fabric_.get(), o);
  // Connections open first: a write starts its batches only on open ones.
  for (uint32_t shard : {0u, 1u}) {
    uint64_t newer = 0;
    ASSERT_TRUE(
        replicator
            .Forward(map, shard, Write(map, "warm" + std::to_string(shard), 10 + shard), &newer)
            .ok());
  }
  slow.Hold();
  std::atomic<bool> stuck_done{false};
  std::vector<std::thread> writers;
  ReleaseAndJoin cleanup{&slow, &writers};
  writers.emplace_back([&] {
    uint64_t newer = 0;
    Status s = replicator.Forward(map, 0, Write(map, "both", 100), &newer);
    EXPECT_TRUE(s.ok()) << s.ToString();
    stuck_done = true;
  });
  ASSERT_TRUE(slow.WaitForRequests(2));
  ASSERT_TRUE(healthy.WaitForRequests(3));  // the two warm-ups and "both", answered
  for (int i = 0; i < 3; ++i) {
    uint64_t newer = 0;
    Status s = replicator.Forward(map, 1, Write(map, "only" + std::to_string(i), 200 + i), &newer);
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_FALSE(stuck_done.load()) << "write " << i << " waited for the slow backup";
  }
  EXPECT_EQ(healthy.writes(), 6);
}

// With one batch in flight (batches_in_flight 1), whatever waits goes as the next batch.
TEST_F(ReplicatorTest, OneBatchInFlightBatchesWhatWaits) {
  FakeBackup b1(fabric_.get());
  const cluster::ClusterMap map = MapWith({&b1});
  ReplicatorOptions o;
  o.batches_in_flight = 1;
  o.forward_timeout = std::chrono::seconds(20);
  Replicator replicator(fabric_.get(), o);
  b1.Hold();
  std::vector<std::thread> writers;
  ReleaseAndJoin cleanup{&b1, &writers};
  std::atomic<int> ok{0};
  for (int k = 0; k < 10; ++k) {
    writers.emplace_back([&, k] {
      uint64_t newer = 0;
      Status s = replicator.Forward(map, 0, Write(map, "k" + std::to_string(k), 100 + k), &newer);
      EXPECT_TRUE(s.ok()) << s.ToString();
      if (s.ok()) ++ok;
    });
    if (k == 0) {
      ASSERT_TRUE(b1.WaitForRequests(1));
    }
  }
  const Clock::time_point deadline = Clock::now() + std::chrono::seconds(5);
  while (replicator.Peers().empty() || replicator.Peers()[0].pending < 10) {
    ASSERT_LT(Clock::now(), deadline) << "the writers did not queue";
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(b1.requests(), 1);
  b1.Release(/*stop_holding=*/true);
  for (std::thread& t : writers) t.join();
  EXPECT_EQ(ok.load(), 10);
  EXPECT_EQ(b1.batch_sizes(), (std::vector<int>{1, 9}));
  EXPECT_EQ(b1.max_in_flight(), 1);
}

// ForwardAsync: what the async replicated write builds on (docs/design.md "No thread waits for
// the backups"). The caller does not wait: every completion runs once, on a thread of the
// replicator's, with Forward's result; writes queued while a batch is in flight go together.
TEST_F(ReplicatorTest, ForwardAsyncCompletesEachWriteOnceOnAnotherThread) {
  FakeBackup b1(fabric_.get()), b2(fabric_.get());
  const cluster::ClusterMap map = MapWith({&b1, &b2});
  Replicator replicator(fabric_.get(), ReplicatorOptions{});
  b1.Hold();
  std::vector<std::thread> none;
  ReleaseAndJoin cleanup{&b1, &none};
  constexpr int kWrites = 40;
  std::vector<std::string> keys;
  std::vector<kv::ReplicateRequest> writes;
  for (int i = 0; i < kWrites; ++i) keys.push_back("key" + std::to_string(i));
  for (int i = 0; i < kWrites; ++i) writes.push_back(Write(map, keys[i], 500 + i));
  Mutex mu;
  CondVar cv;
  std::vector<int> completions(kWrites, 0);
  int done = 0;
  bool on_caller = false;
  const std::thread::id caller = std::this_thread::get_id();
  for (int i = 0; i < kWrites; ++i) {
    replicator.ForwardAsync(map, 0, writes[i], [&, i](const Status& s, uint64_t newer) {
      EXPECT_TRUE(s.ok()) << s.ToString();
      EXPECT_EQ(newer, 0u);
      MutexLock lock(&mu);
      ++completions[i];
      ++done;
      if (std::this_thread::get_id() == caller) on_caller = true;
      cv.SignalAll();
    });
  }
  // Nothing completes while backup 1 holds its answers (backup 2 answers at once).
  ASSERT_TRUE(b1.WaitForRequests(1));
  {
    MutexLock lock(&mu);
    EXPECT_EQ(done, 0) << "a write completed before every backup answered";
  }
  b1.Release(/*stop_holding=*/true);
  {
    MutexLock lock(&mu);
    const Clock::time_point deadline = Clock::now() + std::chrono::seconds(10);
    while (done < kWrites) {
      if (!cv.WaitUntil(&mu, deadline) && done < kWrites) break;
    }
    ASSERT_EQ(done, kWrites);
    EXPECT_FALSE(on_caller) << "a completion ran on the thread that called ForwardAsync";
    for (int i = 0; i < kWrites; ++i) EXPECT_EQ(completions[i], 1) << "write " << i;
  }
  EXPECT_EQ(b1.writes(), kWrites);
  EXPECT_EQ(b2.writes(), kWrites);
  // The first write went alone; the rest waited for its answer and went together.
  EXPECT_LT(b1.requests(), kWrites / 2) << "no batches formed behind the held answer";
  EXPECT_EQ(replicator.stats().forwards, 2u * kWrites);
  EXPECT_EQ(replicator.stats().async_forwards, static_cast<uint64_t>(kWrites));
}

// An in-sync backup that cannot be reached fails the write (kUnavailable naming it); a joining
// one that cannot is counted and the write goes on.
TEST_F(ReplicatorTest, ForwardAsyncReportsAnUnreachableBackup) {
  FakeBackup b1(fabric_.get());
  cluster::ClusterMap map = MapWith({&b1});
  map.servers.push_back({2, "127.0.0.1:1"});  // nothing listens there
  Replicator replicator(fabric_.get(), ReplicatorOptions{});
  // The requests point at their keys: the strings outlive every forward.
  const std::string joining_key = "joining", in_sync_key = "in-sync";
  const kv::ReplicateRequest joining_write = Write(map, joining_key, 7);
  const kv::ReplicateRequest in_sync_write = Write(map, in_sync_key, 8);
  auto run = [&](const kv::ReplicateRequest& m) {
    Mutex mu;
    CondVar cv;
    std::optional<Status> result;
    replicator.ForwardAsync(map, 0, m, [&](const Status& s, uint64_t) {
      MutexLock lock(&mu);
      result = s;
      cv.SignalAll();
    });
    MutexLock lock(&mu);
    const Clock::time_point deadline = Clock::now() + std::chrono::seconds(10);
    while (!result && cv.WaitUntil(&mu, deadline)) {
    }
    return result.value_or(Status::Internal("no completion within 10 s"));
  };
  map.SetJoining(0, 2, map.epoch);
  EXPECT_TRUE(run(joining_write).ok());
  EXPECT_EQ(replicator.JoiningFailures(0, 2, map.epoch), 1u);
  EXPECT_EQ(replicator.JoiningFailures(0, 2, map.epoch + 1), 0u) << "counted for another join";
  map.joining.clear();
  map.backups[0].push_back(2);
  const Status s = run(in_sync_write);
  EXPECT_TRUE(s.Is(StatusCode::kUnavailable)) << s.ToString();
  EXPECT_NE(s.message().find("backup server 2"), std::string::npos) << s.ToString();
  EXPECT_EQ(b1.writes(), 2);
}

}  // namespace
}  // namespace rdkv

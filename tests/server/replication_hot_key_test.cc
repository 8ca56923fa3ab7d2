// A hot key's replicated writes go together (docs/design.md "A hot key's writes go together"):
// writes that find their key's stripe held by a write in flight park behind it and go to the
// backups as one group, in order. These tests hold a backup's apply of the key so that writes
// pile up, and check what a group must keep: every backup ends with the primary's value and
// version, preconditions see the group's earlier writes, and a retry inside a group is
// applied once.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/kv/admin_wire.h"
#include "common/kv/wire.h"
#include "rdkv/admin.h"
#include "tests/support/cluster_fixture.h"

namespace rdkv {
namespace {

using testing::ClusterTest;
using Clock = std::chrono::steady_clock;

constexpr uint32_t kShards = 6;

class HotKeyTest : public ClusterTest {
 protected:
  HotKeyTest() : ClusterTest("hot-key", kShards) {}

  server::ServerOptions Options(uint32_t id) const override {
    server::ServerOptions o = ClusterTest::Options(id);
    o.worker_threads = 8;
    o.replication_timeout = replication_timeout_;
    o.persist.durability = durability_;
    if (id == 1) {
      o.before_replica_apply = [this](const kv::ReplicateRequest& m) {
        if (refuse_deletes_ && m.is_delete) {
          return Status::Unavailable("injected: server 1 refuses forwarded deletes");
        }
        if (held_keys_.count(std::string(m.key)) == 0) return Status::Ok();
        std::unique_lock<std::mutex> lock(mu_);
        const int n = ++entered_;
        cv_.notify_all();
        cv_.wait(lock, [&] { return !holding_ || n <= allowed_; });
        return Status::Ok();
      };
    }
    return o;
  }

  void TearDown() override {
    Release();  // a failed assertion must not leave a forward held while the servers stop
    ClusterTest::TearDown();
  }

  // Server 1's applies of `key` (as a backup; several keys may be held) are held from StartHolding
  // to Release. Set before StartReplicated.
  void HoldKey(std::string key) { held_keys_.insert(std::move(key)); }
  void StartHolding() {
    std::lock_guard<std::mutex> lock(mu_);
    holding_ = true;
    allowed_ = entered_;
  }
  void Release() {
    std::lock_guard<std::mutex> lock(mu_);
    holding_ = false;
    cv_.notify_all();
  }
  // Lets the next `n` held applies through (the rest stay held).
  void Allow(int n) {
    std::lock_guard<std::mutex> lock(mu_);
    allowed_ += n;
    cv_.notify_all();
  }
  // Waits until `n` applies of held keys have reached the hook since StartHolding; false
  // after 10 s.
  bool WaitEntered(int n) {
    std::unique_lock<std::mutex> lock(mu_);
    const int base = allowed_;
    return cv_.wait_for(lock, std::chrono::seconds(10), [&] { return entered_ - base >= n; });
  }
  // Waits until server 0 has parked at least `n` writes; false after 10 s.
  bool WaitParked(uint64_t n) {
    const auto until = Clock::now() + std::chrono::seconds(10);
    while (servers_[0]->stats().writes_parked < n) {
      if (Clock::now() > until) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return true;
  }
  kv::Response RawWriteAlone(int id, kv::Op op, std::string_view key, std::string_view value,
                             uint64_t expected, uint64_t client_id, uint64_t seq) {
    kv::Request r{op, key, value, expected};
    r.client_id = client_id;
    r.request_seq = seq;
    return CallAlone(id, r);
  }

  std::set<std::string> held_keys_;  // set before the servers start, read by server 1's hook
  std::atomic<bool> refuse_deletes_{false};  // server 1 refuses every forwarded delete
  // Server 1's hook (a const Options) waits on these.
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  bool holding_ = false;     // guarded by mu_, as are the two below
  mutable int entered_ = 0;  // applies of held keys that reached the hook
  int allowed_ = 0;          // of those, the ones let through while holding
  std::chrono::milliseconds replication_timeout_{2000};
  // With a persister a group starts on the writer pool (StartWriteGroupOnPool), without one
  // on the backup's sender that handed the stripe on.
  server::persistence::Durability durability_ = server::persistence::Durability::kNone;

  // Sixteen writers of one key while its first write is held at the backup: the others park
  // and go as groups; every write is acknowledged with its own version, and the primary and
  // its backup end with the value of the highest acknowledged version.
  void HotWritersEndTheSameEverywhere() {
    const std::string key = KeyIn(0, 1, "hot");  // shard 0: primary 0, backup 1
    HoldKey(key);
    StartHolding();
    StartReplicated(2);
    constexpr int kThreads = 16, kPerThread = 40;
    std::mutex acked_mu;
    std::map<uint64_t, std::string> acked;  // version -> value
    std::atomic<int> errors{0};
    std::vector<std::thread> writers;
    for (int t = 0; t < kThreads; ++t) {
      writers.emplace_back([&, t] {
        auto c = NewClient(0);
        if (c == nullptr) return;
        for (int i = 0; i < kPerThread; ++i) {
          const std::string value = "t" + std::to_string(t) + "-" + std::to_string(i);
          auto v = c->Put(key, value);
          if (!v.ok()) {
            ADD_FAILURE() << v.status().ToString();
            ++errors;
            continue;
          }
          std::lock_guard<std::mutex> lock(acked_mu);
          EXPECT_TRUE(acked.emplace(*v, value).second) << "two writes answered version " << *v;
        }
      });
    }
    EXPECT_TRUE(WaitParked(8)) << "writes did not park behind the held one: "
                               << servers_[0]->stats().writes_parked;
    Release();
    for (std::thread& w : writers) w.join();
    EXPECT_EQ(errors.load(), 0);
    ASSERT_EQ(acked.size(), size_t{kThreads * kPerThread});
    const server::ServerStats st = servers_[0]->stats();
    EXPECT_GT(st.write_groups, 0u);
    EXPECT_GE(st.grouped_writes, 8u);
    // More than one write per group on average: writes went together.
    EXPECT_GT(st.grouped_writes, st.write_groups) << st.write_groups << " groups";
    const auto& [last_version, last_value] = *acked.rbegin();
    auto c = NewClient(0);
    ASSERT_NE(c, nullptr);
    auto got = c->Get(key);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(got->value, last_value);
    EXPECT_EQ(got->version, last_version);
    const testing::ScannedShard on_backup = ScanOf(1, 0);
    ASSERT_EQ(on_backup.count(key), 1u);
    EXPECT_EQ(on_backup.at(key).value, last_value) << "the backup applied a chain out of order";
    EXPECT_EQ(on_backup.at(key).version, last_version);
  }
};

TEST_F(HotKeyTest, ParkedWritesOfOneKeyGoTogetherAndEveryReplicaEndsTheSame) {
  HotWritersEndTheSameEverywhere();
}

// The same with a persister: groups start on the writer pool, the stripe released meanwhile
// (a write that takes it first makes the group park again at the front of the queue).
TEST_F(HotKeyTest, WithAPersisterGroupsStartOnTheWriterPool) {
  durability_ = server::persistence::Durability::kAsync;
  HotWritersEndTheSameEverywhere();
}

// Conditional writes of hot keys keep their meaning (a group holds a key's conditional write
// only as that key's first write, checked against the store): concurrent CAS increments of a
// counter succeed exactly as often as the counter grows, and INSERT/DELETE of one key alternate
// (successful inserts minus successful deletes is whether the key is there at the end).
TEST_F(HotKeyTest, ConditionalWritesOfHotKeysKeepTheirMeaning) {
  const std::string counter = KeyIn(0, 2, "counter"), toggled = KeyIn(0, 3, "toggled");
  ASSERT_NE(kv::KeyHash(counter) % 4096, kv::KeyHash(toggled) % 4096);
  HoldKey(counter);
  HoldKey(toggled);
  StartReplicated(3);
  auto setup = NewClient(0);
  ASSERT_NE(setup, nullptr);
  ASSERT_TRUE(setup->Put(counter, "0").ok());
  StartHolding();
  constexpr int kThreads = 12, kAttempts = 60;
  std::atomic<int> cas_ok{0}, inserts{0}, deletes{0}, errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      auto c = NewClient(0);
      if (c == nullptr) return;
      for (int i = 0; i < kAttempts; ++i) {
        if (t % 3 == 2) {  // the toggled key: half insert, half delete
          if (i % 2 == 0) {
            auto v = c->Insert(toggled, "x");
            if (v.ok()) {
              ++inserts;
            } else if (!v.status().Is(StatusCode::kAlreadyExists)) {
              ADD_FAILURE() << v.status().ToString();
              ++errors;
            }
          } else {
            Status d = c->Delete(toggled);
            if (d.ok()) {
              ++deletes;
            } else if (!d.Is(StatusCode::kNotFound)) {
              ADD_FAILURE() << d.ToString();
              ++errors;
            }
          }
          continue;
        }
        auto got = c->Get(counter);
        if (!got.ok()) {
          ADD_FAILURE() << got.status().ToString();
          ++errors;
          continue;
        }
        const int n = std::stoi(got->value);
        // Several of these wait behind one another with the same expected version: one wins.
        auto v = c->Cas(counter, got->version, std::to_string(n + 1));
        if (v.ok()) {
          ++cas_ok;
        } else if (!v.status().Is(StatusCode::kVersionMismatch)) {
          ADD_FAILURE() << v.status().ToString();
          ++errors;
        }
      }
    });
  }
  EXPECT_TRUE(WaitParked(4)) << servers_[0]->stats().writes_parked;
  Release();
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_GT(servers_[0]->stats().write_groups, 0u);
  auto got = setup->Get(counter);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(std::stoi(got->value), cas_ok.load()) << "a CAS succeeded against a stale version";
  EXPECT_GT(cas_ok.load(), 0);
  auto there = setup->Get(toggled);
  const int present = there.ok() ? 1 : 0;
  if (!there.ok()) {
    EXPECT_TRUE(there.status().Is(StatusCode::kNotFound)) << there.status().ToString();
  }
  EXPECT_EQ(inserts.load() - deletes.load(), present)
      << inserts.load() << " inserts and " << deletes.load() << " deletes succeeded";
  for (int backup : {1, 2}) {
    const testing::ScannedShard held = ScanOf(backup, 0);
    ASSERT_EQ(held.count(counter), 1u);
    EXPECT_EQ(held.at(counter).value, got->value) << "server " << backup;
    EXPECT_EQ(held.at(counter).version, got->version) << "server " << backup;
    EXPECT_EQ(held.count(toggled), static_cast<size_t>(present)) << "server " << backup;
  }
}

// A retry that parks beside its first attempt is not applied twice: the group stops before it,
// and the next group answers it from the retry table.
TEST_F(HotKeyTest, ARetryParkedBesideItsFirstAttemptIsAppliedOnce) {
  const std::string key = KeyIn(0, 4, "retried");
  HoldKey(key);
  StartHolding();
  StartReplicated(2);
  kv::Response held, first, retry;
  std::thread t0([&] { held = RawWriteAlone(0, kv::Op::kPut, key, "a", 0, 501, 1); });
  // Each wait is checked after the threads are joined (an ASSERT here would leave them
  // joinable); Release lets everything finish either way.
  const bool in_flight = WaitEntered(1);
  std::thread t1([&] { first = RawWriteAlone(0, kv::Op::kPut, key, "b", 0, 502, 1); });
  const bool first_parked = in_flight && WaitParked(1);
  std::thread t2([&] { retry = RawWriteAlone(0, kv::Op::kPut, key, "b", 0, 502, 1); });
  const bool retry_parked = first_parked && WaitParked(2);
  Release();
  t0.join();
  t1.join();
  t2.join();
  ASSERT_TRUE(in_flight) << "the first write did not reach the backup";
  ASSERT_TRUE(retry_parked) << "the writes did not park: " << servers_[0]->stats().writes_parked;
  ASSERT_TRUE(held.status.ok()) << held.status.ToString();
  ASSERT_TRUE(first.status.ok()) << first.status.ToString();
  ASSERT_TRUE(retry.status.ok()) << retry.status.ToString();
  EXPECT_EQ(retry.version, first.version) << "the retry was applied again";
  EXPECT_GT(first.version, held.version);
  auto c = NewClient(0);
  ASSERT_NE(c, nullptr);
  auto got = c->Get(key);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->version, first.version);
}

// A chain that fails at its backup: every write of the key after the first failure is kept for
// repair, the repair applies the newest, and the retries of all of them are answered from the
// retry table instead of being applied again (a DELETE retried after the PUT that followed it
// must not delete the key).
TEST_F(HotKeyTest, ARetryOfAWriteSupersededInAFailedChainIsNotAppliedAgain) {
  const std::string key = KeyIn(0, 5, "chain");
  HoldKey(key);
  replication_timeout_ = std::chrono::milliseconds(1500);
  StartReplicated(2);
  auto c = NewClient(0);
  ASSERT_NE(c, nullptr);
  ASSERT_TRUE(c->Put(key, "v0").ok());
  StartHolding();
  kv::Response w0, del, put;
  std::thread t0([&] { w0 = RawWriteAlone(0, kv::Op::kPut, key, "w0", 0, 600, 1); });
  const bool in_flight = WaitEntered(1);
  std::thread t1([&] { del = RawWriteAlone(0, kv::Op::kDelete, key, "", 0, 601, 1); });
  const bool del_parked = in_flight && WaitParked(1);
  std::thread t2([&] { put = RawWriteAlone(0, kv::Op::kPut, key, "new", 0, 602, 1); });
  const bool put_parked = del_parked && WaitParked(2);
  Allow(1);  // the first write goes through; the chain (DELETE, PUT) is held past the timeout
  t0.join();
  t1.join();
  t2.join();
  Release();
  ASSERT_TRUE(put_parked) << "the writes did not park: " << servers_[0]->stats().writes_parked;
  ASSERT_TRUE(w0.status.ok()) << w0.status.ToString();
  ASSERT_TRUE(del.status.Is(StatusCode::kUnavailable)) << del.status.ToString();
  ASSERT_TRUE(put.status.Is(StatusCode::kUnavailable)) << put.status.ToString();
  EXPECT_GT(servers_[0]->stats().write_groups, 0u);
  // The repair pass brings the newest write (the PUT) everywhere.
  const auto until = Clock::now() + std::chrono::seconds(10);
  while (servers_[0]->stats().repairs_pending > 0 && Clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_EQ(servers_[0]->stats().repairs_pending, 0u);
  auto got = c->Get(key);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->value, "new");
  // The clients retry both with their ids: answered, not applied again.
  kv::Response del_again = RawWriteAlone(0, kv::Op::kDelete, key, "", 0, 601, 1);
  kv::Response put_again = RawWriteAlone(0, kv::Op::kPut, key, "new", 0, 602, 1);
  EXPECT_TRUE(del_again.status.ok()) << del_again.status.ToString();
  EXPECT_TRUE(put_again.status.ok()) << put_again.status.ToString();
  EXPECT_EQ(put_again.version, got->version);
  EXPECT_LT(del_again.version, put_again.version);
  got = c->Get(key);
  ASSERT_TRUE(got.ok()) << "the DELETE's retry was applied again: " << got.status().ToString();
  EXPECT_EQ(got->value, "new");
  const testing::ScannedShard on_backup = ScanOf(1, 0);
  ASSERT_EQ(on_backup.count(key), 1u);
  EXPECT_EQ(on_backup.at(key).value, "new");
}

// The same chain failing at the backup on its DELETE only (the backup applies the PUT after
// it): the repair sends the PUT again, then the DELETE's id as an answer (docs/design.md
// "Exactly once"). The backup, promoted, answers the DELETE's retry instead of deleting the
// key that the PUT wrote after it.
TEST_F(HotKeyTest, ASupersededWritesRetryIsAnsweredByThePromotedBackup) {
  const std::string key = KeyIn(0, 6, "chain");
  HoldKey(key);
  StartReplicated(2);
  auto c = NewClient(0);
  ASSERT_NE(c, nullptr);
  ASSERT_TRUE(c->Put(key, "v0").ok());
  StartHolding();
  refuse_deletes_ = true;
  kv::Response w0, del, put;
  std::thread t0([&] { w0 = RawWriteAlone(0, kv::Op::kPut, key, "w0", 0, 700, 1); });
  const bool in_flight = WaitEntered(1);
  std::thread t1([&] { del = RawWriteAlone(0, kv::Op::kDelete, key, "", 0, 701, 1); });
  const bool del_parked = in_flight && WaitParked(1);
  std::thread t2([&] { put = RawWriteAlone(0, kv::Op::kPut, key, "new", 0, 702, 1); });
  const bool put_parked = del_parked && WaitParked(2);
  Release();  // the first write goes through; the chain (DELETE, PUT) fails on its DELETE
  t0.join();
  t1.join();
  t2.join();
  ASSERT_TRUE(put_parked) << "the writes did not park: " << servers_[0]->stats().writes_parked;
  ASSERT_TRUE(w0.status.ok()) << w0.status.ToString();
  ASSERT_TRUE(del.status.Is(StatusCode::kUnavailable)) << del.status.ToString();
  ASSERT_TRUE(put.status.Is(StatusCode::kUnavailable)) << put.status.ToString();
  const auto until = Clock::now() + std::chrono::seconds(10);
  while (servers_[0]->stats().repairs_pending > 0 && Clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_EQ(servers_[0]->stats().repairs_pending, 0u);
  refuse_deletes_ = false;
  EXPECT_GE(servers_[0]->stats().answers_sent, 1u) << "the DELETE's id was not sent";
  EXPECT_GE(servers_[1]->stats().answers_received, 1u);
  Admin admin(*c);
  auto promoted = admin.Promote(0, 1, nullptr);
  ASSERT_TRUE(promoted.ok()) << promoted.status().ToString();
  kv::Response del_again = RawWriteAlone(1, kv::Op::kDelete, key, "", 0, 701, 1);
  ASSERT_TRUE(del_again.status.ok()) << del_again.status.ToString();
  const testing::ScannedShard on_1 = ScanOf(1, 0);
  ASSERT_EQ(on_1.count(key), 1u) << "the DELETE's retry deleted the key again";
  EXPECT_EQ(on_1.at(key).value, "new");
  EXPECT_LT(del_again.version, on_1.at(key).version);
}

}  // namespace
}  // namespace rdkv

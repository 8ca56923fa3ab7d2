// ClusterState's ownership lock as writes hold it: ClusterState::OwnerGuard (the annotated
// scoped guard), which an Install waits for, and which holds nothing on a standalone server.
#include "server/cluster_state.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "common/cluster/cluster_map.h"
#include "server/store.h"

namespace rdkv::server {
namespace {

class ClusterStateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    map_ = cluster::MakeUniformMap({"127.0.0.1:1", "127.0.0.1:2"}, 4);  // server 0: shards 0, 2
    StoreOptions o;
    o.shard_count = 4;
    o.map_epoch = map_.epoch;
    o.owned_shards = map_.ShardsOf(0);
    region_.assign(1 << 20, 0);
    Result<std::unique_ptr<Store>> s = Store::Format(region_.data(), region_.size(), o);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    store_ = std::move(*s);
    Result<std::unique_ptr<ClusterState>> c =
        ClusterState::Create(store_.get(), map_, 0, std::chrono::milliseconds(0));
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    state_ = std::move(*c);
  }
  // A key of a shard this server owns (owned = true) or not.
  std::string KeyOwned(bool owned) const {
    for (int i = 0;; ++i) {
      std::string k = "key" + std::to_string(i);
      if (store_->Owns(store_->ShardOfKey(k)) == owned) return k;
    }
  }

  cluster::ClusterMap map_;
  std::vector<uint8_t> region_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<ClusterState> state_;
};

TEST_F(ClusterStateTest, OwnerGuardOfAStandaloneServerHoldsNothing) {
  { ClusterState::OwnerGuard guard(nullptr); }
  // Nothing was taken: an install proceeds at once.
  cluster::ClusterMap next = map_;
  next.epoch = 2;
  EXPECT_TRUE(state_->Install(next).ok());
}

TEST_F(ClusterStateTest, CheckOwnerUnderTheGuard) {
  ClusterState::OwnerGuard guard(state_.get());
  uint64_t epoch = 0;
  EXPECT_TRUE(state_->CheckOwner(KeyOwned(true), &epoch).ok());
  Status other = state_->CheckOwner(KeyOwned(false), &epoch);
  EXPECT_EQ(other.code(), StatusCode::kWrongOwner) << other.ToString();
  EXPECT_EQ(epoch, map_.epoch);
}

TEST_F(ClusterStateTest, InstallWaitsForTheWritesHoldingTheGuard) {
  cluster::ClusterMap next = map_;
  next.epoch = 2;
  next.owners[1] = 0;  // server 0 gains shard 1
  std::atomic<bool> installed{false};
  std::thread installer;
  {
    ClusterState::OwnerGuard guard(state_.get());
    installer = std::thread([&] {
      EXPECT_TRUE(state_->Install(next).ok());
      installed.store(true);
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    EXPECT_FALSE(installed.load()) << "the install changed ownership under a write's guard";
    EXPECT_FALSE(store_->Owns(1));
  }
  installer.join();
  EXPECT_TRUE(installed.load());
  EXPECT_TRUE(store_->Owns(1));
  EXPECT_EQ(state_->map()->epoch, 2u);
}

// An asynchronous replicated write's hold outlives its guard and is given back on another
// thread; an install waits for it as for a guard (docs/design.md "No thread waits for the
// backups").
TEST_F(ClusterStateTest, InstallWaitsForAWriteHoldGivenBackOnAnotherThread) {
  cluster::ClusterMap next = map_;
  next.epoch = 2;
  next.owners[0] = 1;  // server 0 loses shard 0
  ClusterState::WriteHold hold;
  {
    ClusterState::OwnerGuard guard(state_.get());
    hold = state_->HoldForWrite();
  }
  EXPECT_EQ(state_->write_holds(), 1u);
  std::atomic<bool> installed{false};
  std::thread installer([&] {
    EXPECT_TRUE(state_->Install(next).ok());
    installed.store(true);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_FALSE(installed.load()) << "the install took a shard away under a write's hold";
  EXPECT_TRUE(store_->Owns(0));
  std::thread releaser([h = std::move(hold)]() mutable { h.Release(); });
  releaser.join();
  installer.join();
  EXPECT_TRUE(installed.load());
  EXPECT_FALSE(store_->Owns(0));
  EXPECT_EQ(state_->write_holds(), 0u);
  // A moved-from hold gives nothing back twice.
  ClusterState::WriteHold a;
  {
    ClusterState::OwnerGuard guard(state_.get());
    a = state_->HoldForWrite();
  }
  ClusterState::WriteHold b = std::move(a);
  a.Release();
  EXPECT_EQ(state_->write_holds(), 1u);
  b.Release();
  EXPECT_EQ(state_->write_holds(), 0u);
}

}  // namespace
}  // namespace rdkv::server

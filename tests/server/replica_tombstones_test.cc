// ReplicaTombstones (server/replica_tombstones.h): a forwarded PUT not above a delete the
// backup applied is refused, while the delete is remembered and after it is forgotten.
#include "server/replica_tombstones.h"

#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

namespace rdkv::server {
namespace {

using Clock = ReplicaTombstones::Clock;

TEST(ReplicaTombstones, APutNotAboveARememberedDeleteIsRefused) {
  ReplicaTombstones t(16, std::chrono::seconds(60), 1);
  EXPECT_EQ(t.RefusingVersion(0, "k", 5), 0u) << "nothing remembered yet";
  t.RememberDelete(0, "k", 10);
  EXPECT_EQ(t.RefusingVersion(0, "k", 9), 10u);
  EXPECT_EQ(t.RefusingVersion(0, "k", 10), 10u) << "the delete's own version";
  EXPECT_EQ(t.RefusingVersion(0, "k", 11), 0u) << "a write after the delete";
  EXPECT_EQ(t.RefusingVersion(0, "other", 1), 0u) << "another key";
  t.RememberDelete(0, "k", 7);  // an older delete of the key keeps the newer one
  EXPECT_EQ(t.RefusingVersion(0, "k", 9), 10u);
}

TEST(ReplicaTombstones, ForgettingADeleteRaisesItsShardsFloor) {
  const Clock::time_point t0 = Clock::now();
  ReplicaTombstones t(2, std::chrono::seconds(60), 1);
  t.RememberDelete(1, "a", 100, t0);
  t.RememberDelete(1, "b", 200, t0);
  t.RememberDelete(2, "c", 50, t0);  // past the capacity: "a" (shard 1, version 100) goes
  EXPECT_EQ(t.size(), 2u);
  EXPECT_EQ(t.RefusingVersion(1, "a", 99), 100u) << "forgotten, still refused by the floor";
  EXPECT_EQ(t.RefusingVersion(1, "new-key", 100), 100u) << "the floor holds for every key";
  EXPECT_EQ(t.RefusingVersion(1, "new-key", 101), 0u);
  EXPECT_EQ(t.RefusingVersion(2, "new-key", 60), 0u) << "another shard's versions";
  EXPECT_EQ(t.RefusingVersion(1, "b", 150), 200u) << "still remembered";
  // Older than the retention: forgotten at the next delete, the floor keeps the rule.
  t.RememberDelete(2, "d", 70, t0 + std::chrono::seconds(61));
  EXPECT_EQ(t.size(), 1u);
  EXPECT_EQ(t.RefusingVersion(1, "b", 200), 200u);
  EXPECT_EQ(t.RefusingVersion(2, "c", 50), 50u);
  EXPECT_EQ(t.RefusingVersion(2, "d", 70), 70u);
  EXPECT_EQ(t.RefusingVersion(2, "e", 71), 0u);
}

TEST(ReplicaTombstones, ANewerDeleteOfAKeyOutlivesItsOlderEntry) {
  const Clock::time_point t0 = Clock::now();
  ReplicaTombstones t(2, std::chrono::seconds(60), 1);
  t.RememberDelete(0, "k", 10, t0);
  t.RememberDelete(0, "k", 30, t0);
  t.RememberDelete(0, "x", 20, t0);  // the first entry of "k" goes; the floor is 10
  EXPECT_EQ(t.RefusingVersion(0, "k", 25), 30u)
      << "the newer delete of k was forgotten with the older";
}

TEST(ReplicaTombstones, ConcurrentDeletesAndChecksKeepTheRule) {
  ReplicaTombstones t(1 << 10, std::chrono::seconds(60), 4);
  std::vector<std::thread> threads;
  for (int w = 0; w < 4; ++w) {
    threads.emplace_back([&t, w] {
      for (uint64_t i = 1; i <= 5000; ++i) {
        const std::string key = "k" + std::to_string(w) + "-" + std::to_string(i % 300);
        const uint64_t v = i * 4 + static_cast<uint64_t>(w);
        t.RememberDelete(static_cast<uint32_t>(w), key, v);
        ASSERT_GE(t.RefusingVersion(static_cast<uint32_t>(w), key, v), v);
        ASSERT_GE(t.RefusingVersion(static_cast<uint32_t>(w), key, v - 1), v);
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_LE(t.size(), size_t{1} << 10);
}

}  // namespace
}  // namespace rdkv::server

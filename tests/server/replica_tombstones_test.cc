// ReplicaTombstones (server/replica_tombstones.h): the deletes a backup applied, newest per
// key, kept for a bounded time and number.
#include "server/replica_tombstones.h"

#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

namespace rdkv::server {
namespace {

using Clock = ReplicaTombstones::Clock;

TEST(ReplicaTombstones, ADeleteAtOrAboveTheVersionIsFound) {
  ReplicaTombstones t(16, std::chrono::seconds(60), 1);
  EXPECT_EQ(t.DeletedAtOrAbove("k", 5), 0u) << "nothing remembered yet";
  t.RememberDelete("k", 10);
  EXPECT_EQ(t.DeletedAtOrAbove("k", 9), 10u);
  EXPECT_EQ(t.DeletedAtOrAbove("k", 10), 10u) << "the delete's own version";
  EXPECT_EQ(t.DeletedAtOrAbove("k", 11), 0u) << "a write after the delete";
  EXPECT_EQ(t.DeletedAtOrAbove("other", 1), 0u) << "another key";
  t.RememberDelete("k", 7);  // an older delete of the key keeps the newer one
  EXPECT_EQ(t.DeletedAtOrAbove("k", 9), 10u);
}

TEST(ReplicaTombstones, TheOldestGoFirstByNumberAndByAge) {
  const Clock::time_point t0 = Clock::now();
  ReplicaTombstones t(2, std::chrono::seconds(60), 1);
  t.RememberDelete("a", 100, t0);
  t.RememberDelete("b", 200, t0 + std::chrono::seconds(1));
  t.RememberDelete("c", 50, t0 + std::chrono::seconds(2));  // past the capacity: "a" goes
  EXPECT_EQ(t.size(), 2u);
  EXPECT_EQ(t.DeletedAtOrAbove("a", 99), 0u);
  EXPECT_EQ(t.DeletedAtOrAbove("b", 150), 200u);
  EXPECT_EQ(t.DeletedAtOrAbove("c", 50), 50u);
  // 61 s after "b": it is older than the retention and goes at the next delete; "c" (59 s)
  // stays.
  t.RememberDelete("d", 70, t0 + std::chrono::seconds(61) + std::chrono::milliseconds(500));
  EXPECT_EQ(t.DeletedAtOrAbove("b", 150), 0u);
  EXPECT_EQ(t.DeletedAtOrAbove("c", 50), 50u);
  EXPECT_EQ(t.DeletedAtOrAbove("d", 70), 70u);
}

TEST(ReplicaTombstones, ANewerDeleteOfAKeyOutlivesItsOlderEntry) {
  const Clock::time_point t0 = Clock::now();
  ReplicaTombstones t(2, std::chrono::seconds(60), 1);
  t.RememberDelete("k", 10, t0);
  t.RememberDelete("k", 30, t0);
  t.RememberDelete("x", 20, t0);  // the first entry of "k" goes
  EXPECT_EQ(t.DeletedAtOrAbove("k", 25), 30u) << "the newer delete of k went with the older";
}

// Writers of disjoint keys in several stripes, each checking its own deletes at once and
// another writer's deletes it saw remembered; nothing is lost under the capacity.
TEST(ReplicaTombstones, ConcurrentDeletesAndChecksKeepEveryDeleteUnderTheCapacity) {
  constexpr int kThreads = 4, kKeys = 200;
  ReplicaTombstones t(1 << 12, std::chrono::seconds(60), 4);  // room for every key's entries
  std::vector<std::thread> threads;
  for (int w = 0; w < kThreads; ++w) {
    threads.emplace_back([&t, w] {
      for (uint64_t i = 1; i <= 3 * kKeys; ++i) {
        const std::string key = "k" + std::to_string(w) + "-" + std::to_string(i % kKeys);
        t.RememberDelete(key, i);
        ASSERT_EQ(t.DeletedAtOrAbove(key, i), i);
        ASSERT_EQ(t.DeletedAtOrAbove(key, i + 1), 0u);
        t.DeletedAtOrAbove("k" + std::to_string((w + 1) % kThreads) + "-1", 1);  // contend
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(t.size(), size_t{3} * kKeys * kThreads);
  for (int w = 0; w < kThreads; ++w) {
    for (int k = 0; k < kKeys; ++k) {
      const std::string key = "k" + std::to_string(w) + "-" + std::to_string(k);
      // The last delete of key k was i = 2 * kKeys + k (k = 0: 3 * kKeys).
      const uint64_t last = k == 0 ? 3 * kKeys : 2 * kKeys + k;
      EXPECT_EQ(t.DeletedAtOrAbove(key, 1), last) << key;
    }
  }
}

}  // namespace
}  // namespace rdkv::server

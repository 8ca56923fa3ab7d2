// SpinLock: mutual exclusion and the ordering a lock gives (what one holder wrote, the next
// holder reads), under contention from more threads than this machine has CPUs, so that holders
// are preempted inside the lock and waiters must yield rather than spin it out. The tsan preset
// runs it too: a lock that ordered nothing would show there as a race on `shared`.
#include "common/util/mutex.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

namespace rdkv {
namespace {

struct Guarded {
  SpinLock mu;
  uint64_t count GUARDED_BY(mu) = 0;
  uint64_t shared[4] GUARDED_BY(mu) = {0, 0, 0, 0};
};

TEST(SpinLockTest, ExcludesAndOrdersUnderContention) {
  Guarded g;
  constexpr int kThreads = 8;
  constexpr int kRounds = 50000;
  std::vector<std::thread> threads;
  std::atomic<int> torn{0};
  std::atomic<int> ready{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&g, &torn, &ready, t] {
      // All start together, so that they contend from the first round.
      ready.fetch_add(1);
      while (ready.load() < kThreads) std::this_thread::yield();
      for (int n = 0; n < kRounds; ++n) {
        SpinLockHold h(&g.mu);
        // Several plain writes that must be seen all together: a second holder inside the
        // lock, or a holder not seeing the last one's writes, finds them unequal.
        const uint64_t v = g.shared[0];
        for (uint64_t& x : g.shared) {
          if (x != v) torn.fetch_add(1, std::memory_order_relaxed);
          x = v + 1 + static_cast<uint64_t>(t % 2);
        }
        ++g.count;
      }
    });
  }
  for (auto& th : threads) th.join();
  SpinLockHold h(&g.mu);
  EXPECT_EQ(g.count, uint64_t{kThreads} * kRounds);
  EXPECT_EQ(torn.load(), 0);
}

}  // namespace
}  // namespace rdkv

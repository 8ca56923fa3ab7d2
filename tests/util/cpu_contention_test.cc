// CpuContention: the schedstat parser, the hysteresis rule, sampling a file the test writes,
// and the real signal: a thread sharing one CPU with a spinning thread turns contended.
#include "common/util/cpu_contention.h"

#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

namespace rdkv {
namespace {

using Clock = CpuContention::Clock;
using std::chrono::milliseconds;

TEST(CpuContentionParse, ReadsTheRunDelay) {
  EXPECT_EQ(CpuContention::ParseRunDelay("136597441 2385506 78\n"), 2385506u);
  EXPECT_EQ(CpuContention::ParseRunDelay("0 0 0"), 0u);
  EXPECT_EQ(CpuContention::ParseRunDelay("5 18446744073709551615 1\n"), 18446744073709551615u);
}

TEST(CpuContentionParse, RefusesWhatIsNotSchedstat) {
  for (const char* bad : {"", "\n", "1 2\n", "1 2 3 4\n", "1 x 3\n", "-1 2 3\n", "1 2 3x\n",
                          "some avg10=0.00 total=5\n", "1 99999999999999999999 3\n"}) {
    EXPECT_FALSE(CpuContention::ParseRunDelay(bad).has_value()) << "'" << bad << "'";
  }
}

TEST(CpuContentionRule, TurnsOnAtTheHighShareAndOffBelowTheLowShare) {
  const uint64_t wall = 50'000'000;
  const auto at = [&](double share) { return static_cast<uint64_t>(share * wall); };
  EXPECT_FALSE(CpuContention::NextState(false, 0, wall));
  EXPECT_FALSE(CpuContention::NextState(false, at(CpuContention::kHighShare) - 1, wall));
  EXPECT_TRUE(CpuContention::NextState(false, at(CpuContention::kHighShare), wall));
  EXPECT_TRUE(CpuContention::NextState(false, wall, wall));
  // Contended: stays so down to the low share (the hysteresis), free below it.
  EXPECT_TRUE(CpuContention::NextState(true, at(CpuContention::kHighShare) - 1, wall));
  EXPECT_TRUE(CpuContention::NextState(true, at(CpuContention::kLowShare), wall));
  EXPECT_FALSE(CpuContention::NextState(true, at(CpuContention::kLowShare) - 1, wall));
  EXPECT_TRUE(CpuContention::NextState(true, 0, 0));  // no time passed: no change
  EXPECT_FALSE(CpuContention::NextState(false, 5, 0));
}

class CpuContentionFile : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/rdkv-schedstat-XXXXXX";
    int fd = mkstemp(tmpl);
    ASSERT_GE(fd, 0);
    close(fd);
    path_ = tmpl;
    Write(0);
  }
  void TearDown() override { std::remove(path_.c_str()); }
  // The file as the kernel would show it after `waited_ms` on a runqueue.
  void Write(uint64_t waited_ms) {
    WriteText("1000 " + std::to_string(waited_ms * 1'000'000) + " 7\n");
  }
  void WriteText(const std::string& text) {
    std::ofstream f(path_, std::ios::trunc);
    f << text;
  }
  std::string path_;
};

TEST_F(CpuContentionFile, FollowsTheWaitingShareOfEachInterval) {
  CpuContention c(path_.c_str());
  ASSERT_TRUE(c.available());
  const Clock::time_point t0 = Clock::now();
  const auto t = [&](int interval) { return t0 + interval * CpuContention::kInterval; };
  EXPECT_FALSE(c.Contended(t(0)));                    // the first sample: nothing to compare with
  Write(40);                                          // 40 of 50 ms waiting
  EXPECT_FALSE(c.Contended(t(1) - milliseconds(1)));  // not due: the file is not read
  EXPECT_TRUE(c.Contended(t(1)));
  Write(40 + 5);  // 5 of 50 ms: between the shares, still contended
  EXPECT_TRUE(c.Contended(t(2)));
  Write(45 + 1);  // 1 of 50 ms: below the low share
  EXPECT_FALSE(c.Contended(t(3)));
  Write(46 + 5);  // between the shares: stays free
  EXPECT_FALSE(c.Contended(t(4)));
  Write(51 + 25);  // half the interval waiting
  EXPECT_TRUE(c.Contended(t(5)));
}

TEST_F(CpuContentionFile, AnUnreadableSampleKeepsTheVerdictAndTheNextMeasuresAcrossTheGap) {
  CpuContention c(path_.c_str());
  const Clock::time_point t0 = Clock::now();
  const auto t = [&](int interval) { return t0 + interval * CpuContention::kInterval; };
  EXPECT_FALSE(c.Contended(t(0)));
  Write(50);  // all of the interval waiting
  EXPECT_TRUE(c.Contended(t(1)));
  WriteText("garbage\n");
  EXPECT_TRUE(c.Contended(t(2)));  // kept, not reset
  // The next good sample measures from the last good one, two intervals back: 4 ms of 100 is
  // 4 %, below the low share. (Measured over the last interval alone, 4 ms of 50 would be 8 %:
  // still contended.)
  Write(50 + 4);
  EXPECT_FALSE(c.Contended(t(3)));
}

TEST(CpuContentionMissing, WithoutTheFileTheThreadIsNeverContended) {
  CpuContention none("/nonexistent/schedstat");
  EXPECT_FALSE(none.available());
  EXPECT_FALSE(none.Contended(Clock::now()));
  CpuContention empty("");
  EXPECT_FALSE(empty.available());
  CpuContention dir("/tmp");  // opens, but cannot be read
  EXPECT_FALSE(dir.available());
  EXPECT_FALSE(dir.Contended(Clock::now() + std::chrono::seconds(1)));
}

// The real signal. A thread alone on an idle CPU stays free; sharing one CPU with a spinning
// thread, it waits about half the time and turns contended.
TEST(CpuContentionLive, AThreadSharingItsCpuWithASpinnerTurnsContended) {
  if (!std::filesystem::exists("/proc/thread-self/schedstat")) {
    GTEST_SKIP() << "SKIPPED: this kernel has no /proc/thread-self/schedstat (CONFIG_SCHED_INFO)";
  }
  cpu_set_t one;
  CPU_ZERO(&one);
  cpu_set_t allowed;
  ASSERT_EQ(sched_getaffinity(0, sizeof allowed, &allowed), 0);
  int cpu = 0;
  while (cpu < CPU_SETSIZE && !CPU_ISSET(cpu, &allowed)) ++cpu;
  ASSERT_LT(cpu, CPU_SETSIZE);
  CPU_SET(cpu, &one);
  std::atomic<bool> stop{false};
  bool contended = false;
  std::thread measured([&] {
    ASSERT_EQ(pthread_setaffinity_np(pthread_self(), sizeof one, &one), 0);
    CpuContention c;
    ASSERT_TRUE(c.available());
    std::thread spinner([&] {
      pthread_setaffinity_np(pthread_self(), sizeof one, &one);
      while (!stop.load(std::memory_order_relaxed)) {
      }
    });
    // Spin too, asking each round, for up to 2 s (the verdict needs two samples, 50 ms apart).
    const Clock::time_point end = Clock::now() + std::chrono::seconds(2);
    while (!contended && Clock::now() < end) contended = c.Contended(Clock::now());
    stop.store(true);
    spinner.join();
  });
  measured.join();
  EXPECT_TRUE(contended) << "two spinning threads on CPU " << cpu
                         << " and the measured one never waited 20 % of an interval";
}

}  // namespace
}  // namespace rdkv

// CpuContention: the schedstat parser, the hysteresis rule, sampling a file the test writes,
// and the real signal: a thread sharing one CPU with a spinning thread turns contended.
#include "common/util/cpu_contention.h"
#include "tests/support/run_delay.h"

#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>

namespace rdkv {
namespace {

using Clock = CpuContention::Clock;
using std::chrono::milliseconds;

using testing::KernelKeepsRunDelay;

TEST(CpuContentionParse, ReadsTheRunDelay) {
  EXPECT_EQ(CpuContention::ParseRunDelay("136597441 2385506 78\n"), 2385506u);
  EXPECT_EQ(CpuContention::ParseRunDelay("1 0 0"), 0u);
  EXPECT_EQ(CpuContention::ParseRunDelay("5 18446744073709551615 1\n"), 18446744073709551615u);
}

TEST(CpuContentionParse, RefusesWhatIsNotSchedstat) {
  for (const char* bad : {"", "\n", "1 2\n", "1 2 3 4\n", "1 x 3\n", "-1 2 3\n", "1 2 3x\n",
                          "some avg10=0.00 total=5\n", "1 99999999999999999999 3\n",
                          "0 0 0\n" /* a kernel that keeps no schedstat */}) {
    EXPECT_FALSE(CpuContention::ParseRunDelay(bad).has_value()) << "'" << bad << "'";
  }
}

TEST(CpuContentionParse, JudgesTheShapeApartFromTheValues) {
  EXPECT_TRUE(CpuContention::IsSchedstat("0 0 0\n"));  // a new thread's, or no schedstat
  EXPECT_TRUE(CpuContention::IsSchedstat("136597441 2385506 78\n"));
  for (const char* bad : {"", "1 2\n", "1 2 3 4\n", "1 x 3\n", "some avg10=0.00 total=5\n"}) {
    EXPECT_FALSE(CpuContention::IsSchedstat(bad)) << "'" << bad << "'";
  }
}

constexpr int64_t Ns(std::chrono::nanoseconds d) { return d.count(); }
constexpr int64_t kBase = Ns(CpuContention::kBaseHold);
constexpr int64_t kMax = Ns(CpuContention::kMaxHold);

TEST(CpuContentionRule, AFreeThreadTurnsContendedAtTheHighShareForTheBaseHold) {
  const uint64_t wall = 50'000'000;
  const auto waited = [&](double share) { return static_cast<uint64_t>(share * wall); };
  CpuContention::State free;
  auto s = CpuContention::Next(free, waited(CpuContention::kHighShare) - 1, wall, 1000);
  EXPECT_FALSE(s.contended);
  s = CpuContention::Next(free, waited(CpuContention::kHighShare), wall, 1000);
  EXPECT_TRUE(s.contended);
  EXPECT_FALSE(s.probing);
  EXPECT_EQ(s.hold_ns, kBase);
  EXPECT_EQ(s.hold_until_ns, 1000 + kBase);
  EXPECT_FALSE(CpuContention::Next(free, 5, 0, 1000).contended);  // no time passed
}

TEST(CpuContentionRule, AContendedThreadHoldsWhateverItWaitsThenProbes) {
  CpuContention::State s;
  s = CpuContention::Next(s, 50, 50, 0);  // all waiting: contended until kBase
  ASSERT_TRUE(s.contended);
  // While holding, a sleeping thread's small waits do not end the hold.
  EXPECT_TRUE(CpuContention::Next(s, 0, 50'000'000, kBase - 1).contended);
  // At the hold's end it is free for one interval, probing.
  const auto probe = CpuContention::Next(s, 0, 50'000'000, kBase);
  EXPECT_FALSE(probe.contended);
  EXPECT_TRUE(probe.probing);
  // A probe that finds it contended again doubles the hold, up to kMax.
  auto again = CpuContention::Next(probe, 50, 50, kBase + 10);
  EXPECT_TRUE(again.contended);
  EXPECT_EQ(again.hold_ns, 2 * kBase);
  EXPECT_EQ(again.hold_until_ns, kBase + 10 + 2 * kBase);
  CpuContention::State p = again;
  for (int i = 0; i < 10; ++i) {
    p = CpuContention::Next(p, 0, 1, p.hold_until_ns);  // the hold ends: probe
    ASSERT_TRUE(p.probing);
    p = CpuContention::Next(p, 1, 1, p.hold_until_ns + 1);  // contended again
  }
  EXPECT_EQ(p.hold_ns, kMax);
  // A probe that finds it free resets the hold; the next contention holds for kBase.
  auto freed = CpuContention::Next(probe, 0, 50, kBase + 10);
  EXPECT_FALSE(freed.contended);
  EXPECT_FALSE(freed.probing);
  EXPECT_EQ(freed.hold_ns, kBase);
  freed.hold_ns = 4 * kBase;  // as if it had doubled before
  EXPECT_EQ(CpuContention::Next(freed, 0, 50, 1).hold_ns, kBase);
  EXPECT_EQ(CpuContention::Next(freed, 50, 50, 1).hold_ns, kBase);  // not probing: base
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

TEST_F(CpuContentionFile, StopsForAHoldThenProbesAndDoublesTheHoldWhileStillContended) {
  CpuContention c(path_.c_str());
  ASSERT_TRUE(c.available());
  const Clock::time_point t0 = Clock::now();
  const auto t = [&](int interval) { return t0 + interval * CpuContention::kInterval; };
  constexpr int kHold = CpuContention::kBaseHold / CpuContention::kInterval;  // intervals
  EXPECT_FALSE(c.Contended(t(0)));  // the first sample: nothing to compare with
  Write(5);                         // 5 of 50 ms waiting: free
  EXPECT_FALSE(c.Contended(t(1)));
  Write(5 + 40);                                      // 40 of 50 ms
  EXPECT_FALSE(c.Contended(t(2) - milliseconds(1)));  // not due: the file is not read
  EXPECT_EQ(c.holds(), 0u);
  EXPECT_TRUE(c.Contended(t(2)));  // held until t(2 + kHold)
  EXPECT_EQ(c.holds(), 1u);
  EXPECT_TRUE(c.Contended(t(3)));           // no waiting now: still held
  EXPECT_TRUE(c.Contended(t(1 + kHold)));   // (samples fall on whole intervals from here)
  EXPECT_FALSE(c.Contended(t(2 + kHold)));  // the probe
  Write(45 + 30);                           // the probe interval: 30 of 50 ms
  EXPECT_TRUE(c.Contended(t(3 + kHold)));   // contended again: held twice as long
  EXPECT_EQ(c.holds(), 2u);
  EXPECT_TRUE(c.Contended(t(2 + 3 * kHold)));
  EXPECT_FALSE(c.Contended(t(3 + 3 * kHold)));  // the next probe
  Write(75 + 1);                                // free this time
  EXPECT_FALSE(c.Contended(t(4 + 3 * kHold)));
  Write(76 + 50);  // contended again: the hold is back to the base
  EXPECT_TRUE(c.Contended(t(5 + 3 * kHold)));
  EXPECT_FALSE(c.Contended(t(5 + 4 * kHold)));
  EXPECT_EQ(c.holds(), 3u);  // a hold per stop of polling, however long each was
}

// A thread reads "0 0 0" until the kernel first charges it its CPU time (a tick or a switch
// later). The NIC threads open their file first thing: that read must not cost them the gate.
TEST_F(CpuContentionFile, AFirstReadingOfZerosIsNoSampleAndTheFileStays) {
  WriteText("0 0 0\n");
  CpuContention c(path_.c_str());
  ASSERT_TRUE(c.available());
  const Clock::time_point t0 = Clock::now();
  const auto t = [&](int interval) { return t0 + interval * CpuContention::kInterval; };
  EXPECT_FALSE(c.Contended(t(0)));  // zeros: no sample
  Write(0);
  EXPECT_FALSE(c.Contended(t(1)));  // the first sample
  Write(45);
  EXPECT_TRUE(c.Contended(t(2)));  // 45 of 50 ms waiting
  EXPECT_EQ(c.holds(), 1u);
}

TEST_F(CpuContentionFile, AnUnreadableSampleKeepsTheVerdictAndTheNextMeasuresAcrossTheGap) {
  CpuContention c(path_.c_str());
  const Clock::time_point t0 = Clock::now();
  const auto t = [&](int interval) { return t0 + interval * CpuContention::kInterval; };
  EXPECT_FALSE(c.Contended(t(0)));
  Write(5);
  EXPECT_FALSE(c.Contended(t(1)));
  WriteText("garbage\n");
  EXPECT_FALSE(c.Contended(t(2)));  // kept
  // The next good sample measures from the last good one, two intervals back: 15 ms of 100 is
  // 15 %, below the high share (over the last interval alone, 15 of 50 would be 30 %).
  Write(5 + 15);
  EXPECT_FALSE(c.Contended(t(3)));
  Write(20 + 50);
  EXPECT_TRUE(c.Contended(t(4)));
  WriteText("garbage\n");
  EXPECT_TRUE(c.Contended(t(5)));  // kept
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

// Kernels before 3.17 have no /proc/thread-self; the default constructor falls back to the
// thread's entry under /proc/self/task, which this kernel has as well.
TEST(CpuContentionMissing, TheTaskPathReadsTheSameThreadsRunDelay) {
  EXPECT_EQ(CpuContention::TaskSchedstatPath(42), "/proc/self/task/42/schedstat");
  if (!KernelKeepsRunDelay()) {
    GTEST_SKIP() << "SKIPPED: no readable run delay in /proc/thread-self/schedstat on this kernel";
  }
  CpuContention task(CpuContention::TaskSchedstatPath(static_cast<int64_t>(gettid())).c_str());
  EXPECT_TRUE(task.available());
  CpuContention nobody(CpuContention::TaskSchedstatPath(0).c_str());
  EXPECT_FALSE(nobody.available());
}

// The real signal. A thread sharing one CPU with a spinning thread waits about half the time
// and turns contended.
TEST(CpuContentionLive, AThreadSharingItsCpuWithASpinnerTurnsContended) {
  if (!KernelKeepsRunDelay()) {
    GTEST_SKIP() << "SKIPPED: no readable run delay in /proc/thread-self/schedstat on this kernel";
  }
  cpu_set_t allowed;
  ASSERT_EQ(sched_getaffinity(0, sizeof allowed, &allowed), 0);
  int cpu = 0;
  while (cpu < CPU_SETSIZE && !CPU_ISSET(cpu, &allowed)) ++cpu;
  ASSERT_LT(cpu, CPU_SETSIZE);
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  std::atomic<bool> stop{false};
  bool contended = false;
  int pinned = -1;  // pthread_setaffinity_np's result in the measured thread
  std::thread measured([&] {
    pinned = pthread_setaffinity_np(pthread_self(), sizeof one, &one);
    if (pinned != 0) return;
    CpuContention c;
    std::thread spinner([&] {  // inherits the one-CPU mask
      while (!stop.load(std::memory_order_relaxed)) {
      }
    });
    // Spin too, asking each round, for up to 2 s (the verdict needs two samples 50 ms apart).
    const Clock::time_point end = Clock::now() + std::chrono::seconds(2);
    while (!contended && Clock::now() < end) contended = c.Contended(Clock::now());
    stop.store(true);
    spinner.join();
  });
  measured.join();
  if (pinned != 0) {
    GTEST_SKIP() << "SKIPPED: cannot pin a thread to CPU " << cpu << " here (error " << pinned
                 << ")";
  }
  EXPECT_TRUE(contended) << "two spinning threads on CPU " << cpu
                         << " and the measured one never waited 20 % of an interval";
}

}  // namespace
}  // namespace rdkv

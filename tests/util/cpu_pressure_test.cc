// CpuPressure: the PSI parser, the hysteresis rule, and sampling a PSI file that a test writes.
#include "common/util/cpu_pressure.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace rdkv {
namespace {

using Clock = CpuPressure::Clock;

TEST(CpuPressureParse, ReadsTheSomeLinesTotal) {
  EXPECT_EQ(
      CpuPressure::ParseSomeTotal("some avg10=9.44 avg60=38.16 avg300=46.23 total=19273244651\n"
                                  "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"),
      19273244651u);
  // The full line first, no trailing newline.
  EXPECT_EQ(CpuPressure::ParseSomeTotal("full avg10=0.00 avg60=0.00 avg300=0.00 total=7\n"
                                        "some avg10=0.00 avg60=0.00 avg300=0.00 total=42"),
            42u);
}

TEST(CpuPressureParse, RefusesWhatIsNotPsi) {
  EXPECT_FALSE(CpuPressure::ParseSomeTotal("").has_value());
  EXPECT_FALSE(CpuPressure::ParseSomeTotal("full avg10=0.00 total=5\n").has_value());
  EXPECT_FALSE(CpuPressure::ParseSomeTotal("some avg10=0.00 avg60=0.00\n").has_value());
  EXPECT_FALSE(CpuPressure::ParseSomeTotal("some total=\n").has_value());
  EXPECT_FALSE(CpuPressure::ParseSomeTotal("some total=12x\n").has_value());
  EXPECT_FALSE(CpuPressure::ParseSomeTotal("something total=5\n").has_value());
}

TEST(CpuPressureRule, TurnsOnAtTheHighShareAndOffBelowTheLowShare) {
  const uint64_t wall = 20000;
  const auto at = [&](double share) { return static_cast<uint64_t>(share * wall); };
  // Idle: stays idle below the high share, turns oversubscribed at it.
  EXPECT_FALSE(CpuPressure::NextState(false, at(0.0), wall));
  EXPECT_FALSE(CpuPressure::NextState(false, at(CpuPressure::kHighShare) - 1, wall));
  EXPECT_TRUE(CpuPressure::NextState(false, at(CpuPressure::kHighShare), wall));
  EXPECT_TRUE(CpuPressure::NextState(false, wall, wall));
  // Oversubscribed: stays so down to the low share (the gap is the hysteresis), idle below it.
  EXPECT_TRUE(CpuPressure::NextState(true, at(CpuPressure::kHighShare) - 1, wall));
  EXPECT_TRUE(CpuPressure::NextState(true, at(CpuPressure::kLowShare), wall));
  EXPECT_FALSE(CpuPressure::NextState(true, at(CpuPressure::kLowShare) - 1, wall));
  // No time passed: no change.
  EXPECT_TRUE(CpuPressure::NextState(true, 0, 0));
  EXPECT_FALSE(CpuPressure::NextState(false, 5, 0));
}

class CpuPressureFile : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/rdkv-psi-XXXXXX";
    int fd = mkstemp(tmpl);
    ASSERT_GE(fd, 0);
    close(fd);
    path_ = tmpl;
    Write(0);
  }
  void TearDown() override { std::remove(path_.c_str()); }
  // The file as the kernel would show it with `total` microseconds stalled.
  void Write(uint64_t total) {
    std::ofstream f(path_, std::ios::trunc);
    f << "some avg10=0.00 avg60=0.00 avg300=0.00 total=" << total << "\n"
      << "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n";
  }
  std::string path_;
};

TEST_F(CpuPressureFile, FollowsTheStalledShareOfEachInterval) {
  CpuPressure p(path_.c_str());
  ASSERT_TRUE(p.available());
  const auto ms = [](int n) { return std::chrono::milliseconds(n); };
  const Clock::time_point t0 = Clock::now();
  EXPECT_FALSE(p.Oversubscribed(t0));           // the first sample: nothing to compare with
  Write(15000);                                 // 15 of 20 ms stalled
  EXPECT_FALSE(p.Oversubscribed(t0 + ms(10)));  // not due yet: the file is not read
  EXPECT_TRUE(p.Oversubscribed(t0 + ms(20)));
  Write(15000 + 2000);  // 2 of 20 ms: between the shares, still oversubscribed
  EXPECT_TRUE(p.Oversubscribed(t0 + ms(40)));
  Write(17000 + 500);  // 0.5 of 20 ms: below the low share
  EXPECT_FALSE(p.Oversubscribed(t0 + ms(60)));
  Write(17500 + 3000);  // 3 of 20 ms: between, stays idle
  EXPECT_FALSE(p.Oversubscribed(t0 + ms(80)));
  Write(20500 + 100);  // a counter that cannot be parsed keeps the last verdict
  {
    std::ofstream f(path_, std::ios::trunc);
    f << "garbage\n";
  }
  EXPECT_FALSE(p.Oversubscribed(t0 + ms(100)));
}

TEST_F(CpuPressureFile, ManyThreadsAskingAtOnceSeeOneVerdict) {
  CpuPressure p(path_.c_str());
  const Clock::time_point t0 = Clock::now();
  EXPECT_FALSE(p.Oversubscribed(t0));
  Write(20000);  // every microsecond of the next 20 ms stalled
  std::vector<std::thread> threads;
  std::vector<int> saw(8, 0);
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] {
      for (int k = 0; k < 1000; ++k) saw[i] += p.Oversubscribed(t0 + std::chrono::milliseconds(25));
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_TRUE(p.Oversubscribed(t0 + std::chrono::milliseconds(25)));
  int total = 0;
  for (int s : saw) total += s;
  EXPECT_GT(total, 0);  // the sample was taken by one of them and seen by the rest
}

TEST(CpuPressureMissing, WithoutPsiTheCpusAreNeverOversubscribed) {
  CpuPressure none("/nonexistent/pressure/cpu");
  EXPECT_FALSE(none.available());
  EXPECT_FALSE(none.Oversubscribed());
  CpuPressure empty("");
  EXPECT_FALSE(empty.available());
  char tmpl[] = "/tmp/rdkv-psi-XXXXXX";
  int fd = mkstemp(tmpl);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(write(fd, "not psi\n", 8), 8);
  close(fd);
  CpuPressure junk(tmpl);
  EXPECT_FALSE(junk.available());
  std::remove(tmpl);
}

}  // namespace
}  // namespace rdkv

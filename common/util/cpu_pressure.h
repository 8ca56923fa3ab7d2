// CpuPressure: whether the machine's CPUs are oversubscribed right now, for busy polling.
//
// A thread that busy-polls (tcp NIC threads, waiting tcp clients) spends a CPU to save the
// wake-up of an idle one. That pays while a CPU would otherwise idle, and costs throughput when
// runnable threads wait for a CPU: sched_yield hands the CPU only to threads of the poller's own
// scheduling group, and a server started in its own session (systemd, setsid, a container) is
// its own group under Linux's autogroup and cgroup scheduling, so its polling takes a share
// that its clients needed (docs/transport-tcp.md "Polling only on idle CPUs").
//
// The signal is Linux's pressure stall information (/proc/pressure/cpu, "some" line): the share
// of wall time in which at least one runnable task waited for a CPU. It is re-read at most once
// per kInterval, by whichever caller finds it due; the verdict has hysteresis (oversubscribed
// from kHighShare, idle again below kLowShare) so that polling does not flap at the boundary.
// Without PSI (old kernel, no /proc) the CPUs count as never oversubscribed: polling as before.
//
// Thread-safety: Oversubscribed may be called from any thread at once; it takes no lock and
// never blocks (the one caller that re-reads the file does a pread of a few hundred bytes).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string_view>

namespace rdkv {

class CpuPressure {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr std::chrono::milliseconds kInterval{20};
  static constexpr double kHighShare = 0.20;  // oversubscribed from this share of stalled time
  static constexpr double kLowShare = 0.05;   // idle again below this share
  static_assert(kLowShare < kHighShare, "hysteresis needs a gap");

  // The process's one reader of /proc/pressure/cpu.
  static CpuPressure& Machine();

  // `path`: a PSI file ("" or unreadable: never oversubscribed).
  explicit CpuPressure(const char* path);
  ~CpuPressure();
  CpuPressure(const CpuPressure&) = delete;
  CpuPressure& operator=(const CpuPressure&) = delete;

  // True while the last interval's stalled share put the CPUs in the oversubscribed state.
  bool Oversubscribed(Clock::time_point now = Clock::now());

  // Whether PSI could be read when this object was made.
  bool available() const { return fd_ >= 0; }

  // The "some" line's total (microseconds stalled since boot) in the text of a PSI file;
  // nullopt when there is none. Pure (tested on its own).
  static std::optional<uint64_t> ParseSomeTotal(std::string_view text);

  // The state after an interval in which `stalled_us` of `wall_us` were stalled, from
  // `oversubscribed` (the hysteresis rule). Pure.
  static bool NextState(bool oversubscribed, uint64_t stalled_us, uint64_t wall_us);

 private:
  void Sample(int64_t now_ns);

  int fd_ = -1;
  std::atomic<bool> oversubscribed_{false};
  std::atomic<int64_t> next_sample_ns_{0};
  std::atomic<bool> sampling_{false};  // one caller samples at a time
  // Touched only by the caller holding sampling_.
  int64_t last_ns_ = 0;
  uint64_t last_total_us_ = 0;
  bool have_last_ = false;
};

}  // namespace rdkv

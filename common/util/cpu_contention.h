// CpuContention: whether the calling thread has to wait for its CPU, for busy polling.
//
// A thread that busy-polls (the tcp NIC threads) spends a CPU to save the wake-up of an idle
// one. That pays while the CPU would otherwise idle, and costs throughput when other runnable
// threads wait for it: sched_yield hands the CPU only to threads of the poller's own scheduling
// group, and a server started in its own session (systemd, setsid, a container) is its own
// group under Linux's autogroup and cgroup scheduling, so its polling keeps a share that its
// clients on the same machine needed (docs/transport-tcp.md "Polling only while no thread
// waits for the CPU").
//
// The signal is the thread's own run delay: the time it spent runnable but waiting for a CPU
// (Linux schedstat, /proc/thread-self/schedstat, second field, nanoseconds). It is local: it
// rises only when something competes for the CPUs this thread runs on, whatever group that
// is, and not for contention elsewhere on the machine. It is re-read at most every kInterval;
// the verdict has hysteresis (contended from kHighShare of the interval spent waiting, free
// again below kLowShare). Without schedstat the thread counts as never contended.
//
// Thread-safety: none; each polling thread owns one, made on that thread (the default
// constructor opens the calling thread's file).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string_view>

namespace rdkv {

class CpuContention {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr std::chrono::milliseconds kInterval{50};
  static constexpr double kHighShare = 0.20;  // contended from this share of the time waiting
  static constexpr double kLowShare = 0.05;   // free again below this share
  static_assert(kLowShare < kHighShare, "hysteresis needs a gap");

  // The calling thread's schedstat.
  CpuContention();
  // `path`: a file in schedstat's format ("" or unreadable: never contended). For tests.
  explicit CpuContention(const char* path);
  ~CpuContention();
  CpuContention(const CpuContention&) = delete;
  CpuContention& operator=(const CpuContention&) = delete;

  // True while the last interval's waiting share put the thread in the contended state.
  bool Contended(Clock::time_point now);

  // Whether the file could be read when this object was made.
  bool available() const { return fd_ >= 0; }

  // The run delay (second number) of a schedstat line "<on-cpu ns> <waited ns> <slices>";
  // nullopt when the text is not one. Pure.
  static std::optional<uint64_t> ParseRunDelay(std::string_view text);

  // The state after an interval of `wall_ns` in which the thread waited `waited_ns`, from
  // `contended` (the hysteresis rule). Pure.
  static bool NextState(bool contended, uint64_t waited_ns, uint64_t wall_ns);

 private:
  std::optional<uint64_t> Read() const;

  int fd_ = -1;
  bool contended_ = false;
  int64_t next_sample_ns_ = 0;
  int64_t last_ns_ = 0;
  uint64_t last_delay_ns_ = 0;
  bool have_last_ = false;
};

}  // namespace rdkv

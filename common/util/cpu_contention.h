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
// rises only when something competes for the CPUs this thread runs on (of any group, the
// server's own threads included), not for contention on other CPUs. It is re-read at most
// every kInterval, and judged only over intervals in which the thread was free to poll: from
// kHighShare of such an interval spent waiting the thread is contended and stops polling for
// a hold (kBaseHold, doubling up to kMaxHold while each probe after a hold finds it contended
// again, back to kBaseHold after a probe that does not). A thread that sleeps waits little even
// on a busy CPU, so judging its sleeping intervals would turn polling back on at once and
// flap. Without schedstat (or with a kernel that keeps no run delay) it is never contended.
//
// Thread-safety: none; each polling thread owns one, made on that thread (the default
// constructor opens the calling thread's file).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace rdkv {

class CpuContention {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr std::chrono::milliseconds kInterval{50};
  static constexpr double kHighShare = 0.20;  // contended from this share of the time waiting
  static constexpr std::chrono::milliseconds kBaseHold{500};
  static constexpr std::chrono::milliseconds kMaxHold{8000};
  static_assert(kInterval < kBaseHold && kBaseHold <= kMaxHold, "a hold spans intervals");
  static constexpr int64_t kBaseHoldNs = std::chrono::nanoseconds(kBaseHold).count();
  static constexpr int64_t kMaxHoldNs = std::chrono::nanoseconds(kMaxHold).count();

  // The verdict and its hold, in nanoseconds of the steady clock.
  struct State {
    bool contended = false;
    bool probing = false;  // free for one interval after a hold, to look again
    int64_t hold_until_ns = 0;
    int64_t hold_ns = kBaseHoldNs;
  };

  // The calling thread's schedstat: /proc/thread-self/schedstat, or on kernels before 3.17
  // (no /proc/thread-self) TaskSchedstatPath of the thread's id.
  CpuContention();
  // `path`: a file in schedstat's format ("" or unreadable: never contended). For tests.
  explicit CpuContention(const char* path);
  ~CpuContention();
  CpuContention(const CpuContention&) = delete;
  CpuContention& operator=(const CpuContention&) = delete;

  // True while the last interval's waiting share put the thread in the contended state.
  bool Contended(Clock::time_point now);

  // Whether the file could be read, and looked like schedstat, when this object was made (its
  // samples may still all be "0 0 0": a kernel that keeps no run delay; never contended then).
  bool available() const { return fd_ >= 0; }

  // How many holds Contended has begun (each stop of polling; a probe that doubles a hold
  // begins another). For the listener's busy_poll_holds counter.
  uint64_t holds() const { return holds_; }

  // "/proc/self/task/<tid>/schedstat": thread `tid`'s schedstat where /proc/thread-self is
  // missing. Pure.
  static std::string TaskSchedstatPath(int64_t tid);

  // The run delay (second number) of a schedstat line "<on-cpu ns> <waited ns> <slices>";
  // nullopt when the text is not one, or when its on-CPU time is 0 (a kernel that keeps no
  // schedstat prints "0 0 0"). Pure.
  static std::optional<uint64_t> ParseRunDelay(std::string_view text);
  // Whether `text` has schedstat's shape (three numbers), whatever their values. Pure.
  static bool IsSchedstat(std::string_view text);

  // The state at `now_ns`, after an interval of `wall_ns` in which the thread waited
  // `waited_ns`, from `s` (the rule above). Pure.
  static State Next(State s, uint64_t waited_ns, uint64_t wall_ns, int64_t now_ns);

 private:
  static constexpr size_t kReadBytes = 128;  // a schedstat line is under 64

  static bool ParseFields(std::string_view text, uint64_t fields[3]);
  void Open(const char* path);
  // The file's whole text in `buf`; nullopt when unreadable, empty or longer than the buffer.
  std::optional<std::string_view> ReadText(char (&buf)[kReadBytes]) const;
  // The run delay of a sample; nullopt when there is none (ReadText, ParseRunDelay).
  std::optional<uint64_t> Read() const;

  int fd_ = -1;
  uint64_t holds_ = 0;
  State state_;
  int64_t next_sample_ns_ = 0;
  int64_t last_ns_ = 0;
  uint64_t last_delay_ns_ = 0;
  bool have_last_ = false;
};

}  // namespace rdkv

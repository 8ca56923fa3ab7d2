// Progress of long work (recovery, snapshot restore, shard copies, kvbench load): the text of a
// progress line (done/total, rate, ETA) and the gate that lets one through at a steady interval.
//
//   ProgressMeter meter("load", total, std::chrono::seconds(1));
//   for (...) { ...; if (meter.Due(done)) print(meter.Line(done)); }
//
// Thread-safety: Due may be called from several threads at once (exactly one caller gets each
// due line); Line and the formatting functions are pure.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace rdkv {

// "4 s", "1 min 05 s", "2 h 03 min"; "?" for a negative or non-finite count.
std::string FormatEta(double seconds);
// "950", "12.3k", "4.56M": a count or rate with three significant digits.
std::string FormatCount(double n);

class ProgressMeter {
 public:
  using Clock = std::chrono::steady_clock;

  // `what`: the line's prefix ("recovery"); `unit`: what is counted ("keys"); total 0: unknown
  // (then the line shows no percentage and no ETA).
  ProgressMeter(std::string what, std::string unit, uint64_t total,
                std::chrono::milliseconds interval, Clock::time_point start = Clock::now());

  // True once per interval (the first time `interval` after the start); the caller then prints.
  bool Due(Clock::time_point now = Clock::now());

  // "recovery: 12.0k/50.0k keys (24%), 4.00k keys/s, ETA 10 s" (total known) or
  // "recovery: 12.0k keys, 4.00k keys/s" (total 0). `done` beyond total counts as total.
  std::string Line(uint64_t done, Clock::time_point now = Clock::now()) const;

  void set_total(uint64_t total) { total_.store(total, std::memory_order_relaxed); }
  uint64_t total() const { return total_.load(std::memory_order_relaxed); }
  Clock::time_point start() const { return start_; }

 private:
  const std::string what_, unit_;
  std::atomic<uint64_t> total_;
  const std::chrono::milliseconds interval_;
  const Clock::time_point start_;
  std::atomic<Clock::rep> next_;  // when the next line is due (Clock ticks)
};

// Prints a meter's lines to `out`: on a terminal one line rewritten in place ("\r", erase to the
// end of the line), otherwise (a log, a pipe) one plain line per interval. Finish prints the
// final line (and the newline a terminal line still needs). Not thread-safe.
class ProgressPrinter {
 public:
  ProgressPrinter(FILE* out, ProgressMeter* meter);
  ProgressPrinter(FILE* out, ProgressMeter* meter, bool terminal);
  void Update(uint64_t done);  // prints when the meter is Due
  void Print(uint64_t done);   // prints now (for a caller that keeps its own schedule)
  void Finish(uint64_t done);

 private:
  FILE* out_;
  ProgressMeter* meter_;
  bool terminal_;
};

}  // namespace rdkv

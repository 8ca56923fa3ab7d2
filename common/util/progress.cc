#include "common/util/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <utility>

namespace rdkv {

std::string FormatEta(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const uint64_t s = static_cast<uint64_t>(std::ceil(seconds));
  char buf[48];
  if (s < 60) {
    snprintf(buf, sizeof buf, "%llu s", static_cast<unsigned long long>(s));
  } else if (s < 3600) {
    snprintf(buf, sizeof buf, "%llu min %02llu s", static_cast<unsigned long long>(s / 60),
             static_cast<unsigned long long>(s % 60));
  } else {
    snprintf(buf, sizeof buf, "%llu h %02llu min", static_cast<unsigned long long>(s / 3600),
             static_cast<unsigned long long>(s / 60 % 60));
  }
  return buf;
}

std::string FormatCount(double n) {
  if (!std::isfinite(n) || n < 0) return "?";
  char buf[32];
  if (n < 1000) {
    snprintf(buf, sizeof buf, "%.0f", n);
    return buf;
  }
  static constexpr const char* kSuffix[] = {"k", "M", "G", "T", "P"};
  int i = -1;
  while (n >= 1000 && i < 4) {
    n /= 1000;
    ++i;
  }
  snprintf(buf, sizeof buf, n < 10 ? "%.2f%s" : n < 100 ? "%.1f%s" : "%.0f%s", n, kSuffix[i]);
  return buf;
}

ProgressMeter::ProgressMeter(std::string what, std::string unit, uint64_t total,
                             std::chrono::milliseconds interval, Clock::time_point start)
    : what_(std::move(what)),
      unit_(std::move(unit)),
      total_(total),
      interval_(interval),
      start_(start),
      next_((start + interval).time_since_epoch().count()) {}

bool ProgressMeter::Due(Clock::time_point now) {
  Clock::rep due = next_.load(std::memory_order_relaxed);
  if (now.time_since_epoch().count() < due) return false;
  // Only the caller that moves the mark on prints; the next line is due an interval from now.
  return next_.compare_exchange_strong(due, (now + interval_).time_since_epoch().count(),
                                       std::memory_order_relaxed);
}

std::string ProgressMeter::Line(uint64_t done, Clock::time_point now) const {
  const uint64_t total = this->total();
  if (total > 0) done = std::min(done, total);
  const double secs = std::chrono::duration<double>(now - start_).count();
  const double rate = secs > 0 ? done / secs : 0;
  std::string line = what_ + ": " + FormatCount(static_cast<double>(done));
  if (total > 0) {
    char pct[16];
    snprintf(pct, sizeof pct, "%.0f%%", 100.0 * static_cast<double>(done) / total);
    line += "/" + FormatCount(static_cast<double>(total)) + " " + unit_ + " (" + pct + ")";
  } else {
    line += " " + unit_;
  }
  line += ", " + FormatCount(rate) + " " + unit_ + "/s";
  if (total > 0) {
    if (done >= total) {
      line += ", done in " + FormatEta(secs);
    } else {
      line += ", ETA " + (rate > 0 ? FormatEta((total - done) / rate) : std::string("?"));
    }
  }
  return line;
}

ProgressPrinter::ProgressPrinter(FILE* out, ProgressMeter* meter)
    : ProgressPrinter(out, meter, isatty(fileno(out)) == 1) {}

ProgressPrinter::ProgressPrinter(FILE* out, ProgressMeter* meter, bool terminal)
    : out_(out), meter_(meter), terminal_(terminal) {}

void ProgressPrinter::Update(uint64_t done) {
  if (meter_->Due()) Print(done);
}

void ProgressPrinter::Print(uint64_t done) {
  const std::string line = meter_->Line(done);
  if (terminal_) {
    fprintf(out_, "\r%s\033[K", line.c_str());
  } else {
    fprintf(out_, "%s\n", line.c_str());
  }
  fflush(out_);
}

void ProgressPrinter::Finish(uint64_t done) {
  const std::string line = meter_->Line(done);
  if (terminal_) {
    fprintf(out_, "\r%s\033[K\n", line.c_str());
  } else {
    fprintf(out_, "%s\n", line.c_str());
  }
  fflush(out_);
}

}  // namespace rdkv

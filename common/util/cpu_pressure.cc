#include "common/util/cpu_pressure.h"

#include <fcntl.h>
#include <unistd.h>

#include <charconv>
#include <cstring>

namespace rdkv {

CpuPressure& CpuPressure::Machine() {
  static CpuPressure* machine = new CpuPressure("/proc/pressure/cpu");  // never destroyed
  return *machine;
}

CpuPressure::CpuPressure(const char* path) {
  if (path == nullptr || *path == '\0') return;
  fd_ = open(path, O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) return;
  char buf[256];
  ssize_t n = pread(fd_, buf, sizeof buf, 0);
  if (n <= 0 || !ParseSomeTotal(std::string_view(buf, static_cast<size_t>(n))).has_value()) {
    close(fd_);  // not a PSI file (or PSI disabled: reading fails with EOPNOTSUPP)
    fd_ = -1;
  }
}

CpuPressure::~CpuPressure() {
  if (fd_ >= 0) close(fd_);
}

std::optional<uint64_t> CpuPressure::ParseSomeTotal(std::string_view text) {
  // "some avg10=0.00 avg60=0.00 avg300=0.00 total=12345\nfull ..."
  size_t line = 0;
  while (line < text.size()) {
    size_t end = text.find('\n', line);
    if (end == std::string_view::npos) end = text.size();
    std::string_view l = text.substr(line, end - line);
    if (l.substr(0, 5) == "some ") {
      size_t at = l.find(" total=");
      if (at == std::string_view::npos) return std::nullopt;
      std::string_view digits = l.substr(at + 7);
      uint64_t v = 0;
      auto [p, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
      if (ec != std::errc() || p == digits.data()) return std::nullopt;
      if (p != digits.data() + digits.size() && *p != ' ') return std::nullopt;
      return v;
    }
    line = end + 1;
  }
  return std::nullopt;
}

bool CpuPressure::NextState(bool oversubscribed, uint64_t stalled_us, uint64_t wall_us) {
  if (wall_us == 0) return oversubscribed;
  const double share = static_cast<double>(stalled_us) / static_cast<double>(wall_us);
  return oversubscribed ? share >= kLowShare : share >= kHighShare;
}

bool CpuPressure::Oversubscribed(Clock::time_point now) {
  if (fd_ < 0) return false;
  const int64_t now_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch()).count();
  if (now_ns >= next_sample_ns_.load(std::memory_order_relaxed) &&
      !sampling_.exchange(true, std::memory_order_acquire)) {
    Sample(now_ns);
    sampling_.store(false, std::memory_order_release);
  }
  return oversubscribed_.load(std::memory_order_relaxed);
}

void CpuPressure::Sample(int64_t now_ns) {
  next_sample_ns_.store(
      now_ns + std::chrono::duration_cast<std::chrono::nanoseconds>(kInterval).count(),
      std::memory_order_relaxed);
  char buf[256];
  ssize_t n = pread(fd_, buf, sizeof buf, 0);
  std::optional<uint64_t> total;
  if (n > 0) total = ParseSomeTotal(std::string_view(buf, static_cast<size_t>(n)));
  if (!total.has_value()) return;  // keep the last verdict
  if (have_last_ && now_ns > last_ns_ && *total >= last_total_us_) {
    const auto wall_us = static_cast<uint64_t>((now_ns - last_ns_) / 1000);
    oversubscribed_.store(NextState(oversubscribed_.load(std::memory_order_relaxed),
                                    *total - last_total_us_, wall_us),
                          std::memory_order_relaxed);
  }
  last_ns_ = now_ns;
  last_total_us_ = *total;
  have_last_ = true;
}

}  // namespace rdkv

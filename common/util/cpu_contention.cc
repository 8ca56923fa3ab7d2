#include "common/util/cpu_contention.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>

namespace rdkv {

CpuContention::CpuContention() : CpuContention("/proc/thread-self/schedstat") {}

CpuContention::CpuContention(const char* path) {
  if (path == nullptr || *path == '\0') return;
  fd_ = open(path, O_RDONLY | O_CLOEXEC);  // /proc/thread-self resolves to this thread now
  if (fd_ >= 0 && !Read().has_value()) {
    close(fd_);  // not a schedstat file (or the kernel keeps no run delay)
    fd_ = -1;
  }
}

CpuContention::~CpuContention() {
  if (fd_ >= 0) close(fd_);
}

std::optional<uint64_t> CpuContention::ParseRunDelay(std::string_view text) {
  // "<ns on cpu> <ns waiting on a runqueue> <timeslices>\n"
  uint64_t fields[3];
  const char* p = text.data();
  const char* const end = text.data() + text.size();
  for (uint64_t& f : fields) {
    while (p < end && *p == ' ') ++p;
    auto [q, ec] = std::from_chars(p, end, f);
    if (ec != std::errc() || q == p) return std::nullopt;
    p = q;
  }
  while (p < end && std::isspace(static_cast<unsigned char>(*p))) ++p;
  if (p != end || fields[0] == 0) return std::nullopt;
  return fields[1];
}

CpuContention::State CpuContention::Next(State s, uint64_t waited_ns, uint64_t wall_ns,
                                         int64_t now_ns) {
  if (s.contended) {
    // Holding: what a sleeping thread waits says little. At the hold's end, probe.
    if (now_ns >= s.hold_until_ns) {
      s.contended = false;
      s.probing = true;
    }
    return s;
  }
  if (wall_ns == 0) return s;
  const double share = static_cast<double>(waited_ns) / static_cast<double>(wall_ns);
  if (share >= kHighShare) {
    const int64_t base = std::chrono::nanoseconds(kBaseHold).count();
    const int64_t max = std::chrono::nanoseconds(kMaxHold).count();
    s.hold_ns = s.probing ? std::min(2 * s.hold_ns, max) : base;
    s.hold_until_ns = now_ns + s.hold_ns;
    s.contended = true;
  } else {
    s.hold_ns = std::chrono::nanoseconds(kBaseHold).count();
  }
  s.probing = false;
  return s;
}

std::optional<uint64_t> CpuContention::Read() const {
  char buf[128];
  const ssize_t n = pread(fd_, buf, sizeof buf, 0);
  if (n <= 0 || static_cast<size_t>(n) == sizeof buf) return std::nullopt;  // none, or cut off
  return ParseRunDelay(std::string_view(buf, static_cast<size_t>(n)));
}

bool CpuContention::Contended(Clock::time_point now) {
  if (fd_ < 0) return false;
  const int64_t now_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch()).count();
  if (now_ns < next_sample_ns_) return state_.contended;
  next_sample_ns_ = now_ns + std::chrono::nanoseconds(kInterval).count();
  const std::optional<uint64_t> delay = Read();
  if (!delay.has_value()) return state_.contended;  // keep it; measure across the gap next
  if (have_last_ && now_ns > last_ns_ && *delay >= last_delay_ns_) {
    state_ =
        Next(state_, *delay - last_delay_ns_, static_cast<uint64_t>(now_ns - last_ns_), now_ns);
  }
  last_ns_ = now_ns;
  last_delay_ns_ = *delay;
  have_last_ = true;
  return state_.contended;
}

}  // namespace rdkv

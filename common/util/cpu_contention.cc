#include "common/util/cpu_contention.h"

#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>

namespace rdkv {

CpuContention::CpuContention() {
  Open("/proc/thread-self/schedstat");  // resolves to the calling thread when opened
  if (fd_ < 0) Open(TaskSchedstatPath(static_cast<int64_t>(syscall(SYS_gettid))).c_str());
}

CpuContention::CpuContention(const char* path) { Open(path); }

void CpuContention::Open(const char* path) {
  if (path == nullptr || *path == '\0') return;
  fd_ = open(path, O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) return;
  // Only the shape is judged here: a thread made a moment ago reads "0 0 0" until the kernel
  // first charges it its CPU time (at a tick or a switch), as a kernel without schedstat always
  // does. Either way such a sample is no sample (Read), not a reason to give up the file: the
  // NIC threads open theirs first thing, and once took that for "unavailable" for good.
  char buf[kReadBytes];
  const std::optional<std::string_view> text = ReadText(buf);
  if (!text.has_value() || !IsSchedstat(*text)) {
    close(fd_);  // not a schedstat file
    fd_ = -1;
  }
}

std::string CpuContention::TaskSchedstatPath(int64_t tid) {
  return "/proc/self/task/" + std::to_string(tid) + "/schedstat";
}

CpuContention::~CpuContention() {
  if (fd_ >= 0) close(fd_);
}

bool CpuContention::ParseFields(std::string_view text, uint64_t fields[3]) {
  // "<ns on cpu> <ns waiting on a runqueue> <timeslices>\n"
  const char* p = text.data();
  const char* const end = text.data() + text.size();
  for (int i = 0; i < 3; ++i) {
    while (p < end && *p == ' ') ++p;
    auto [q, ec] = std::from_chars(p, end, fields[i]);
    if (ec != std::errc() || q == p) return false;
    p = q;
  }
  while (p < end && std::isspace(static_cast<unsigned char>(*p))) ++p;
  return p == end;
}

bool CpuContention::IsSchedstat(std::string_view text) {
  uint64_t fields[3];
  return ParseFields(text, fields);
}

std::optional<uint64_t> CpuContention::ParseRunDelay(std::string_view text) {
  uint64_t fields[3];
  if (!ParseFields(text, fields) || fields[0] == 0) return std::nullopt;
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
    s.hold_ns = s.probing ? std::min(2 * s.hold_ns, kMaxHoldNs) : kBaseHoldNs;
    s.hold_until_ns = now_ns + s.hold_ns;
    s.contended = true;
  } else {
    s.hold_ns = kBaseHoldNs;
  }
  s.probing = false;
  return s;
}

std::optional<std::string_view> CpuContention::ReadText(char (&buf)[kReadBytes]) const {
  const ssize_t n = pread(fd_, buf, sizeof buf, 0);
  if (n <= 0 || static_cast<size_t>(n) == sizeof buf) return std::nullopt;  // none, or cut off
  return std::string_view(buf, static_cast<size_t>(n));
}

std::optional<uint64_t> CpuContention::Read() const {
  char buf[kReadBytes];
  const std::optional<std::string_view> text = ReadText(buf);
  if (!text.has_value()) return std::nullopt;
  return ParseRunDelay(*text);
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
    const bool was = state_.contended;
    state_ =
        Next(state_, *delay - last_delay_ns_, static_cast<uint64_t>(now_ns - last_ns_), now_ns);
    if (state_.contended && !was) ++holds_;
  }
  last_ns_ = now_ns;
  last_delay_ns_ = *delay;
  have_last_ = true;
  return state_.contended;
}

}  // namespace rdkv

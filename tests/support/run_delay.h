// Whether this kernel shows a run delay in /proc/thread-self/schedstat, read after the calling
// thread has certainly been charged some CPU time (a thread not yet charged reads "0 0 0", as
// does a kernel without schedstat). For tests of CpuContention that need the real signal.
#pragma once

#include <sched.h>

#include <chrono>
#include <fstream>
#include <iterator>
#include <string>

#include "common/util/cpu_contention.h"

namespace rdkv::testing {

inline bool KernelKeepsRunDelay() {
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(5);
  while (std::chrono::steady_clock::now() < end) {
  }
  sched_yield();
  std::ifstream f("/proc/thread-self/schedstat");
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return CpuContention::ParseRunDelay(text).has_value();
}

}  // namespace rdkv::testing

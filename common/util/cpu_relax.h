// A hint to the CPU inside a busy-wait loop (x86 PAUSE): saves power and lets a sibling
// hyperthread run. A no-op elsewhere.
#pragma once

namespace rdkv {

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

}  // namespace rdkv

#include "common/transport/tcp/region_registry.h"

#include <sys/random.h>

#include <cerrno>
#include <cstring>
#include <random>

namespace rdkv::transport::tcp {

namespace {

// A key an attacker cannot guess from the keys it has seen: from the kernel's CSPRNG.
uint32_t RandomKey() {
  uint32_t v = 0;
  for (;;) {
    ssize_t n = getrandom(&v, sizeof v, 0);
    if (n == static_cast<ssize_t>(sizeof v)) break;
    if (n < 0 && errno == EINTR) continue;
    // getrandom cannot fail for 4 bytes once the pool is initialized; never fall back to a
    // predictable generator silently.
    std::random_device rd;
    v = rd();
    break;
  }
  return v;
}

// [addr, addr+length) inside [base, base+size), without overflow.
bool Inside(uint64_t base, uint64_t size, uint64_t addr, uint64_t length) {
  if (length == 0 || addr < base) return false;
  uint64_t off = addr - base;
  return off <= size && length <= size - off;
}

}  // namespace

RegionRegistry::Keys RegionRegistry::Register(uint8_t* addr, size_t length, RegionAccess access) {
  WriterMutexLock lock(&mu_);
  Keys k;
  do {
    k.lkey = RandomKey();
  } while (k.lkey == 0 || by_lkey_.count(k.lkey) != 0 || by_rkey_.count(k.lkey) != 0);
  do {
    k.rkey = RandomKey();
  } while (k.rkey == 0 || k.rkey == k.lkey || by_lkey_.count(k.rkey) != 0 ||
           by_rkey_.count(k.rkey) != 0);
  Entry e{addr, length, access};
  by_lkey_.emplace(k.lkey, e);
  if (access == RegionAccess::kRemoteRead) by_rkey_.emplace(k.rkey, e);
  return k;
}

void RegionRegistry::Unregister(const Keys& keys) {
  WriterMutexLock lock(&mu_);  // waits for every copy in progress out of (or into) the region
  by_lkey_.erase(keys.lkey);
  by_rkey_.erase(keys.rkey);
}

const uint8_t* RegionRegistry::FindRemote(uint32_t rkey, uint64_t addr, uint64_t length) const {
  auto it = by_rkey_.find(rkey);
  if (it == by_rkey_.end()) return nullptr;
  const Entry& e = it->second;
  uint64_t base = reinterpret_cast<uint64_t>(e.addr);
  if (!Inside(base, e.length, addr, length)) return nullptr;
  return e.addr + (addr - base);
}

uint8_t* RegionRegistry::FindLocal(uint32_t lkey, const uint8_t* addr, uint64_t length) const {
  auto it = by_lkey_.find(lkey);
  if (it == by_lkey_.end()) return nullptr;
  const Entry& e = it->second;
  uint64_t base = reinterpret_cast<uint64_t>(e.addr);
  uint64_t a = reinterpret_cast<uint64_t>(addr);
  if (!Inside(base, e.length, a, length)) return nullptr;
  return e.addr + (a - base);
}

// Why this function is special:
//
// The software NIC copies region bytes into a connection's send buffer while the application
// may be writing those same bytes (a PUT updating a slot in place). On a real RDMA NIC this is a
// DMA read racing with CPU stores, and the READ may return a torn mix of old and new bytes; the
// key-value layer detects that with versions and checksums and retries. The tcp transport must
// behave the same, so this race is intended and must not be "fixed" with a lock.
//
// ThreadSanitizer would (correctly, by the C++ memory model) report it. So the function is
//   * excluded from TSan instrumentation (no_sanitize("thread")),
//   * never inlined into an instrumented caller (noinline), and
//   * copies with `rep movsb` instead of memcpy, because the sanitizer runtimes intercept the
//     libc memcpy symbol and would check the range anyway.
// The bounds were checked against the registry, under its lock, by the caller.
__attribute__((noinline, no_sanitize("thread"))) void DmaCopy(uint8_t* dst, const uint8_t* src,
                                                              size_t n) {
#if defined(__x86_64__)
  asm volatile("rep movsb" : "+D"(dst), "+S"(src), "+c"(n) : : "memory");
#else
  // Portable fallback: a volatile byte loop, which the optimizer cannot turn into a memcpy call.
  const volatile uint8_t* s = src;
  volatile uint8_t* d = dst;
  for (size_t i = 0; i < n; ++i) d[i] = s[i];
#endif
}

}  // namespace rdkv::transport::tcp

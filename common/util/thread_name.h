// NameThisThread: gives the calling thread a name that top -H, ps -L, perf and gdb show, so an
// operator can tell a server's NIC threads from its workers, persister and replication senders.
//
// Linux keeps at most 15 bytes of a thread's name: longer names are cut there. Names start with
// "rdkv-" so they stand apart from a host application's threads in a client process. Failure
// is ignored: a name is a diagnostic, never needed for correctness. Thread-safe; names only the
// calling thread.
#ifndef RDKV_COMMON_UTIL_THREAD_NAME_H_
#define RDKV_COMMON_UTIL_THREAD_NAME_H_

#include <pthread.h>

#include <string>

namespace rdkv::util {

// The most bytes of a thread name Linux keeps (TASK_COMM_LEN 16, less the terminating NUL).
inline constexpr size_t kMaxThreadNameBytes = 15;

inline void NameThisThread(std::string name) {
  if (name.size() > kMaxThreadNameBytes) name.resize(kMaxThreadNameBytes);
  (void)pthread_setname_np(pthread_self(), name.c_str());
}

}  // namespace rdkv::util

#endif  // RDKV_COMMON_UTIL_THREAD_NAME_H_

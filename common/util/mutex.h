// Mutexes the compiler can reason about: std::mutex and std::shared_mutex wrapped as clang
// capabilities (common/util/thread_annotations.h), with scoped locks and a condition variable.
// Use these for every mutex that guards members, and annotate the members GUARDED_BY.
//
//   Mutex mu_;
//   std::deque<Job> queue_ GUARDED_BY(mu_);
//   CondVar not_empty_;
//   ...
//   MutexLock l(&mu_);
//   while (queue_.empty()) not_empty_.Wait(&mu_);
//
// Thread-safety: as the std types they wrap. Not copyable, not movable.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <shared_mutex>
#include <thread>

#include "common/util/thread_annotations.h"

namespace rdkv {

class CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ACQUIRE() { mu_.lock(); }
  void Unlock() RELEASE() { mu_.unlock(); }
  bool TryLock() TRY_ACQUIRE(true) { return mu_.try_lock(); }
  // Tells the analysis that the caller holds this mutex (no run-time check).
  void AssertHeld() const ASSERT_CAPABILITY(this) {}

 private:
  friend class CondVar;
  std::mutex mu_;
};

// Many readers or one writer. Writers are not preferred (glibc): where a stream of readers
// must not hold a writer off, put a turnstile Mutex in front (server/cluster_state.h).
class CAPABILITY("shared_mutex") SharedMutex {
 public:
  SharedMutex() = default;
  SharedMutex(const SharedMutex&) = delete;
  SharedMutex& operator=(const SharedMutex&) = delete;

  void Lock() ACQUIRE() { mu_.lock(); }
  void Unlock() RELEASE() { mu_.unlock(); }
  void ReaderLock() ACQUIRE_SHARED() { mu_.lock_shared(); }
  void ReaderUnlock() RELEASE_SHARED() { mu_.unlock_shared(); }
  bool ReaderTryLock() TRY_ACQUIRE_SHARED(true) { return mu_.try_lock_shared(); }
  void AssertHeld() const ASSERT_CAPABILITY(this) {}
  void AssertReaderHeld() const ASSERT_SHARED_CAPABILITY(this) {}

 private:
  std::shared_mutex mu_;
};

// Holds a Mutex for its scope; Unlock()/Lock() release and retake it within the scope.
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ACQUIRE(mu) : mu_(mu) { mu_->Lock(); }
  // Takes over a mutex the caller already holds (e.g. after a successful TryLock).
  MutexLock(Mutex* mu, std::adopt_lock_t) REQUIRES(mu) : mu_(mu) {}
  ~MutexLock() RELEASE() {
    if (held_) mu_->Unlock();
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  void Unlock() RELEASE() {
    mu_->Unlock();
    held_ = false;
  }
  void Lock() ACQUIRE() {
    mu_->Lock();
    held_ = true;
  }

 private:
  Mutex* const mu_;
  bool held_ = true;
};

// Holds a SharedMutex exclusively for its scope.
class SCOPED_CAPABILITY WriterMutexLock {
 public:
  explicit WriterMutexLock(SharedMutex* mu) ACQUIRE(mu) : mu_(mu) { mu_->Lock(); }
  ~WriterMutexLock() RELEASE() { mu_->Unlock(); }
  WriterMutexLock(const WriterMutexLock&) = delete;
  WriterMutexLock& operator=(const WriterMutexLock&) = delete;

 private:
  SharedMutex* const mu_;
};

// Holds a SharedMutex shared for its scope.
class SCOPED_CAPABILITY ReaderMutexLock {
 public:
  explicit ReaderMutexLock(SharedMutex* mu) ACQUIRE_SHARED(mu) : mu_(mu) { mu_->ReaderLock(); }
  ~ReaderMutexLock() RELEASE() { mu_->ReaderUnlock(); }
  ReaderMutexLock(const ReaderMutexLock&) = delete;
  ReaderMutexLock& operator=(const ReaderMutexLock&) = delete;

 private:
  SharedMutex* const mu_;
};

// A lock of one atomic word for critical sections of a few instructions on paths where a
// Mutex's cost shows (a shared_ptr copy on every GET): taking it is one atomic exchange and
// giving it back one store, where std::mutex is two calls into libc with an atomic each.
// Waiters spin, then yield the CPU (the holder may have been preempted), then sleep 50 us at a
// time (a waiter of a higher real-time priority than the holder on the same CPU would otherwise
// never let it run). Never hold it across anything that blocks. Not usable with CondVar.
class CAPABILITY("mutex") SpinLock {
 public:
  SpinLock() = default;
  SpinLock(const SpinLock&) = delete;
  SpinLock& operator=(const SpinLock&) = delete;

  void Lock() ACQUIRE() {
    for (int spins = 0; held_.exchange(true, std::memory_order_acquire);) {
      while (held_.load(std::memory_order_relaxed)) {
        if (++spins > 256) {
          std::this_thread::sleep_for(std::chrono::microseconds(50));
        } else if (spins > 64) {
          std::this_thread::yield();
        } else {
#if defined(__x86_64__) || defined(__i386__)
          __builtin_ia32_pause();
#endif
        }
      }
    }
  }
  void Unlock() RELEASE() { held_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> held_{false};
};

class SCOPED_CAPABILITY SpinLockHold {
 public:
  explicit SpinLockHold(SpinLock* mu) ACQUIRE(mu) : mu_(mu) { mu_->Lock(); }
  ~SpinLockHold() RELEASE() { mu_->Unlock(); }
  SpinLockHold(const SpinLockHold&) = delete;
  SpinLockHold& operator=(const SpinLockHold&) = delete;

 private:
  SpinLock* const mu_;
};

// A condition variable for Mutex. Spurious wake-ups happen: wait in a loop on the condition.
class CondVar {
 public:
  CondVar() = default;
  CondVar(const CondVar&) = delete;
  CondVar& operator=(const CondVar&) = delete;

  void Wait(Mutex* mu) REQUIRES(mu) {
    std::unique_lock<std::mutex> l(mu->mu_, std::adopt_lock);
    cv_.wait(l);
    l.release();
  }
  // False when `deadline` passed (the condition may still have become true: check it).
  template <typename Clock, typename Duration>
  bool WaitUntil(Mutex* mu, std::chrono::time_point<Clock, Duration> deadline) REQUIRES(mu) {
    std::unique_lock<std::mutex> l(mu->mu_, std::adopt_lock);
    bool woken = cv_.wait_until(l, deadline) == std::cv_status::no_timeout;
    l.release();
    return woken;
  }
  template <typename Rep, typename Period>
  bool WaitFor(Mutex* mu, std::chrono::duration<Rep, Period> d) REQUIRES(mu) {
    return WaitUntil(mu, std::chrono::steady_clock::now() + d);
  }
  void Signal() { cv_.notify_one(); }
  void SignalAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

// A lock that any thread may release, not only the one that took it (a std::mutex must be
// unlocked by its owner): work that continues on another thread keeps it across the handoff
// (a replicated write holds its key's stripe until its backups answer, server/service.h).
// Not a capability for the analysis, which cannot follow a lock across threads: hold it
// through a TransferableHold. Waiters are woken in no particular order.
class TransferableLock {
 public:
  TransferableLock() = default;
  TransferableLock(const TransferableLock&) = delete;
  TransferableLock& operator=(const TransferableLock&) = delete;

  void Lock() {
    MutexLock l(&mu_);
    ++waiters_;
    while (held_) cv_.Wait(&mu_);
    --waiters_;
    held_ = true;
  }
  // Also fails while a thread waits in Lock(): a stream of TryLocks must not starve it.
  bool TryLock() {
    MutexLock l(&mu_);
    if (held_ || waiters_ > 0) return false;
    held_ = true;
    return true;
  }
  void Unlock() {
    MutexLock l(&mu_);
    held_ = false;
    if (waiters_ > 0) cv_.Signal();
  }
  // A thread waits in Lock() now.
  bool Contended() {
    MutexLock l(&mu_);
    return waiters_ > 0;
  }

 private:
  Mutex mu_;
  CondVar cv_;
  bool held_ GUARDED_BY(mu_) = false;
  int waiters_ GUARDED_BY(mu_) = 0;
};

// Holds a TransferableLock until destroyed or released; movable to another thread.
class TransferableHold {
 public:
  TransferableHold() = default;
  // Waits for the lock.
  static TransferableHold Take(TransferableLock* lock) {
    lock->Lock();
    return TransferableHold(lock);
  }
  // Holds nothing (false) when the lock is taken.
  static TransferableHold TryTake(TransferableLock* lock) {
    return lock->TryLock() ? TransferableHold(lock) : TransferableHold();
  }
  TransferableHold(TransferableHold&& o) noexcept : lock_(o.lock_) { o.lock_ = nullptr; }
  TransferableHold& operator=(TransferableHold&& o) noexcept {
    if (this != &o) {
      Release();
      lock_ = o.lock_;
      o.lock_ = nullptr;
    }
    return *this;
  }
  TransferableHold(const TransferableHold&) = delete;
  TransferableHold& operator=(const TransferableHold&) = delete;
  ~TransferableHold() { Release(); }

  explicit operator bool() const { return lock_ != nullptr; }
  void Release() {
    if (lock_ != nullptr) lock_->Unlock();
    lock_ = nullptr;
  }

 private:
  explicit TransferableHold(TransferableLock* lock) : lock_(lock) {}
  TransferableLock* lock_ = nullptr;
};

}  // namespace rdkv

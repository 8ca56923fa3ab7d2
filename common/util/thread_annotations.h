// Clang thread-safety annotations (-Wthread-safety), leveldb's style: a locking rule written
// as an annotation is checked by the compiler; one written in a comment is not.
//
//   Mutex mu_;
//   int count_ GUARDED_BY(mu_);          // read or written only with mu_ held
//   void Bump() REQUIRES(mu_);           // the caller holds mu_
//   void Drain() EXCLUDES(mu_);          // the caller must not hold mu_ (it takes it)
//
// Other compilers see empty macros. The `tsa` preset builds everything with clang and
// -Wthread-safety -Werror; CI runs it (tests/run-all.sh, stage tsa).
#pragma once

#if defined(__clang__)
#define RDKV_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define RDKV_THREAD_ANNOTATION(x)
#endif

#define CAPABILITY(x) RDKV_THREAD_ANNOTATION(capability(x))
#define SCOPED_CAPABILITY RDKV_THREAD_ANNOTATION(scoped_lockable)
#define GUARDED_BY(x) RDKV_THREAD_ANNOTATION(guarded_by(x))
#define PT_GUARDED_BY(x) RDKV_THREAD_ANNOTATION(pt_guarded_by(x))
#define ACQUIRED_BEFORE(...) RDKV_THREAD_ANNOTATION(acquired_before(__VA_ARGS__))
#define ACQUIRED_AFTER(...) RDKV_THREAD_ANNOTATION(acquired_after(__VA_ARGS__))
#define REQUIRES(...) RDKV_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define REQUIRES_SHARED(...) RDKV_THREAD_ANNOTATION(requires_shared_capability(__VA_ARGS__))
#define ACQUIRE(...) RDKV_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define ACQUIRE_SHARED(...) RDKV_THREAD_ANNOTATION(acquire_shared_capability(__VA_ARGS__))
#define RELEASE(...) RDKV_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define RELEASE_SHARED(...) RDKV_THREAD_ANNOTATION(release_shared_capability(__VA_ARGS__))
#define RELEASE_GENERIC(...) RDKV_THREAD_ANNOTATION(release_generic_capability(__VA_ARGS__))
#define TRY_ACQUIRE(...) RDKV_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
#define TRY_ACQUIRE_SHARED(...) RDKV_THREAD_ANNOTATION(try_acquire_shared_capability(__VA_ARGS__))
#define EXCLUDES(...) RDKV_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define ASSERT_CAPABILITY(x) RDKV_THREAD_ANNOTATION(assert_capability(x))
#define ASSERT_SHARED_CAPABILITY(x) RDKV_THREAD_ANNOTATION(assert_shared_capability(x))
#define RETURN_CAPABILITY(x) RDKV_THREAD_ANNOTATION(lock_returned(x))
#define NO_THREAD_SAFETY_ANALYSIS RDKV_THREAD_ANNOTATION(no_thread_safety_analysis)

// Must compile with -Wthread-safety -Werror: every access holds the lock the annotations name.
// The control for the *_bad.cc snippets (tests/util/thread_safety_test.sh).
#include "common/util/mutex.h"

namespace {

class Counter {
 public:
  void Add(int n) EXCLUDES(mu_) {
    rdkv::MutexLock l(&mu_);
    AddLocked(n);
    while (value_ < 0) cv_.Wait(&mu_);
  }
  int value() const EXCLUDES(mu_) {
    rdkv::MutexLock l(&mu_);
    return value_;
  }
  int shared_value() const EXCLUDES(smu_) {
    rdkv::ReaderMutexLock l(&smu_);
    return shared_;
  }
  void Both() EXCLUDES(mu_, smu_) {
    rdkv::MutexLock first(&mu_);  // in the declared order: mu_, then smu_
    rdkv::WriterMutexLock second(&smu_);
    shared_ = value_;
  }

 private:
  void AddLocked(int n) REQUIRES(mu_) { value_ += n; }

  mutable rdkv::Mutex mu_ ACQUIRED_BEFORE(smu_);
  rdkv::CondVar cv_;
  int value_ GUARDED_BY(mu_) = 0;
  mutable rdkv::SharedMutex smu_;
  int shared_ GUARDED_BY(smu_) = 0;
};

}  // namespace

int main() {
  Counter c;
  c.Add(1);
  c.Both();
  return c.value() + c.shared_value() == 2 ? 0 : 1;
}

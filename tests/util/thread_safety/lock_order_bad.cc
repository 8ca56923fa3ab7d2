// Must NOT compile with -Wthread-safety -Wthread-safety-beta -Werror: takes two mutexes against
// their declared order (ACQUIRED_BEFORE).
#include "common/util/mutex.h"

namespace {

class Pair {
 public:
  void Swap() {
    rdkv::MutexLock second(&second_);
    rdkv::MutexLock first(&first_);  // the error: first_ must be taken before second_
    ++count_;
  }

 private:
  rdkv::Mutex first_ ACQUIRED_BEFORE(second_);
  rdkv::Mutex second_;
  int count_ GUARDED_BY(first_) = 0;
};

}  // namespace

int main() {
  Pair p;
  p.Swap();
  return 0;
}

// Must NOT compile with -Wthread-safety -Werror: calls a REQUIRES(mu_) function without mu_.
#include "common/util/mutex.h"

namespace {

class Counter {
 public:
  void Add(int n) { AddLocked(n); }  // the error: mu_ is not held

 private:
  void AddLocked(int n) REQUIRES(mu_) { value_ += n; }

  rdkv::Mutex mu_;
  int value_ GUARDED_BY(mu_) = 0;
};

}  // namespace

int main() {
  Counter c;
  c.Add(1);
  return 0;
}

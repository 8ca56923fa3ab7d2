// Must NOT compile with -Wthread-safety -Werror: reads a GUARDED_BY member without its lock.
#include "common/util/mutex.h"

namespace {

class Counter {
 public:
  int value() const { return value_; }  // the error: mu_ is not held

 private:
  mutable rdkv::Mutex mu_;
  int value_ GUARDED_BY(mu_) = 0;
};

}  // namespace

int main() { return Counter().value(); }

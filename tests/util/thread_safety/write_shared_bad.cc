// Must NOT compile with -Wthread-safety -Werror: writes a member guarded by a SharedMutex while
// holding it only shared.
#include "common/util/mutex.h"

namespace {

class Table {
 public:
  void Set(int v) {
    rdkv::ReaderMutexLock l(&mu_);
    value_ = v;  // the error: a write needs mu_ exclusively
  }

 private:
  rdkv::SharedMutex mu_;
  int value_ GUARDED_BY(mu_) = 0;
};

}  // namespace

int main() {
  Table t;
  t.Set(1);
  return 0;
}

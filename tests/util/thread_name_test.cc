// NameThisThread: the name the kernel shows for the calling thread, cut at Linux's 15 bytes.
#include "common/util/thread_name.h"

#include <gtest/gtest.h>
#include <pthread.h>

#include <string>
#include <thread>

namespace rdkv::util {
namespace {

std::string NameOf(pthread_t t) {
  char name[32] = {};
  EXPECT_EQ(pthread_getname_np(t, name, sizeof name), 0);
  return name;
}

TEST(ThreadName, NamesTheCallingThreadOnly) {
  const std::string before = NameOf(pthread_self());
  std::string inside;
  std::thread t([&] {
    NameThisThread("rdkv-test");
    inside = NameOf(pthread_self());
  });
  t.join();
  EXPECT_EQ(inside, "rdkv-test");
  EXPECT_EQ(NameOf(pthread_self()), before);
}

TEST(ThreadName, ALongNameIsCutToWhatLinuxKeeps) {
  std::string inside;
  std::thread t([&] {
    NameThisThread("rdkv-a-name-longer-than-fifteen-bytes");
    inside = NameOf(pthread_self());
  });
  t.join();
  EXPECT_EQ(inside,
            std::string("rdkv-a-name-longer-than-fifteen-bytes").substr(0, kMaxThreadNameBytes));
  EXPECT_EQ(inside.size(), 15u);
}

}  // namespace
}  // namespace rdkv::util

// ParseByteSize: the sizes every size flag takes (--memory, --max_value_size, ...).
#include "common/util/units.h"

#include <gtest/gtest.h>

namespace rdkv {
namespace {

TEST(ParseByteSize, PlainNumbersAndEverySuffix) {
  EXPECT_EQ(*ParseByteSize("4096"), 4096u);
  EXPECT_EQ(*ParseByteSize("7b"), 7u);
  EXPECT_EQ(*ParseByteSize("2k"), 2048u);
  EXPECT_EQ(*ParseByteSize("64MiB"), 64ull << 20);
  EXPECT_EQ(*ParseByteSize("64mb"), 64ull << 20);
  EXPECT_EQ(*ParseByteSize("4GiB"), 4ull << 30);
  EXPECT_EQ(*ParseByteSize("3T"), 3ull << 40);
  EXPECT_EQ(*ParseByteSize("1PiB"), 1ull << 50);
  EXPECT_EQ(*ParseByteSize("2pb"), 2ull << 50);
}

TEST(ParseByteSize, BadTextIsRefusedWithAnExample) {
  for (const char* bad : {"", "MiB", "-1", "1.5GiB", "12 MiB", "1EiB", "1XB", "0x10"}) {
    Result<uint64_t> r = ParseByteSize(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find("is not a size"), std::string::npos)
        << bad << ": " << r.status().message();
  }
}

TEST(ParseByteSize, SizesBeyond64BitsSaySo) {
  Result<uint64_t> r = ParseByteSize("16384PiB");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("larger than a 64-bit byte count"), std::string::npos)
      << r.status().message();
  EXPECT_EQ(*ParseByteSize("16383PiB"), 16383ull << 50);
}

}  // namespace
}  // namespace rdkv

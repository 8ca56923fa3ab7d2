#include "rdkv/status.h"

#include <gtest/gtest.h>

namespace rdkv {
namespace {

Result<int> Half(int x) {
  if (x % 2 != 0) return Status::InvalidArgument("odd");
  return x / 2;
}

Status Quarter(int x, int* out) {
  RDKV_ASSIGN_OR_RETURN(int h, Half(x));
  RDKV_ASSIGN_OR_RETURN(int q, Half(h));
  *out = q;
  return Status::Ok();
}

TEST(StatusTest, OkAndErrors) {
  EXPECT_TRUE(Status::Ok().ok());
  EXPECT_EQ(Status::Ok().ToString(), "OK");
  Status s = Status::NotFound("key k");
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(s.Is(StatusCode::kNotFound));
  EXPECT_EQ(s.ToString(), "NotFound: key k");
  EXPECT_EQ(Status::FromErrno("open x", ENOENT).ToString(),
            "IoError: open x: No such file or directory");
}

TEST(StatusTest, ResultPropagates) {
  int out = 0;
  EXPECT_TRUE(Quarter(12, &out).ok());
  EXPECT_EQ(out, 3);
  Status s = Quarter(6, &out);  // 6 -> 3 -> odd
  EXPECT_TRUE(s.Is(StatusCode::kInvalidArgument));
  EXPECT_EQ(s.message(), "odd");
  Result<int> r = Half(3);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace rdkv

#include "common/kv/wire.h"

#include <gtest/gtest.h>

#include <cstring>

namespace rdkv::kv {
namespace {

TEST(WireTest, RequestRoundTrip) {
  std::vector<uint8_t> buf;
  EncodeRequest({Op::kCas, "key", "value", 99}, &buf);
  Result<Request> r = DecodeRequest(buf, WireLimits{});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->op, Op::kCas);
  EXPECT_EQ(r->key, "key");
  EXPECT_EQ(r->value, "value");
  EXPECT_EQ(r->expected_version, 99u);
}

TEST(WireTest, ResponseRoundTrip) {
  std::vector<uint8_t> buf;
  EncodeResponse(Status::VersionMismatch("current version is 5"), 5, "", &buf);
  Result<Response> r = DecodeResponse(buf);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status.code(), StatusCode::kVersionMismatch);
  EXPECT_EQ(r->status.message(), "current version is 5");
  EXPECT_EQ(r->version, 5u);
  EncodeResponse(Status::Ok(), 1, "{\"items\":1}", &buf);
  r = DecodeResponse(buf);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->status.ok());
  EXPECT_EQ(r->body, "{\"items\":1}");
}

TEST(WireTest, MalformedRequestsAreProtocolErrors) {
  std::vector<uint8_t> good;
  EncodeRequest({Op::kPut, "k", "v", 0}, &good);
  auto expect_code = [](std::vector<uint8_t> b, StatusCode code, const char* what) {
    Result<Request> r = DecodeRequest(b, WireLimits{});
    EXPECT_FALSE(r.ok()) << what;
    EXPECT_EQ(r.status().code(), code) << what << ": " << r.status().ToString();
  };
  expect_code({}, StatusCode::kProtocolError, "empty");
  expect_code(std::vector<uint8_t>(good.begin(), good.begin() + 10), StatusCode::kProtocolError, "short");
  auto b = good; b[0] ^= 1; expect_code(b, StatusCode::kProtocolError, "magic");
  b = good; b[2] = 9; expect_code(b, StatusCode::kProtocolError, "version");
  b = good; b[3] = 200; expect_code(b, StatusCode::kProtocolError, "op");
  b = good; b.push_back(0); expect_code(b, StatusCode::kProtocolError, "trailing byte");
  b = good; uint32_t huge = 0xffffffff; std::memcpy(b.data() + 4, &huge, 4);
  expect_code(b, StatusCode::kProtocolError, "key length past the end");
  b = good; b[12] = 1; expect_code(b, StatusCode::kProtocolError, "flags");
}

TEST(WireTest, LimitsAreInvalidArgument) {
  std::vector<uint8_t> buf;
  WireLimits limits{1024, 100};
  EncodeRequest({Op::kPut, "", "v", 0}, &buf);
  EXPECT_EQ(DecodeRequest(buf, limits).status().code(), StatusCode::kInvalidArgument);
  std::string long_key(1025, 'k');
  EncodeRequest({Op::kPut, long_key, "v", 0}, &buf);
  EXPECT_EQ(DecodeRequest(buf, limits).status().code(), StatusCode::kInvalidArgument);
  std::string big(101, 'v');
  EncodeRequest({Op::kPut, "k", big, 0}, &buf);
  EXPECT_EQ(DecodeRequest(buf, limits).status().code(), StatusCode::kInvalidArgument);
  EncodeRequest({Op::kPut, std::string(1024, 'k'), std::string(100, 'v'), 0}, &buf);
  EXPECT_TRUE(DecodeRequest(buf, limits).ok()) << "limits are inclusive";
}

}  // namespace
}  // namespace rdkv::kv

// Malformed and oversized requests reach a running server: each gets a clear error response,
// the server keeps serving, and a well-behaved client on another connection is unaffected.
#include <gtest/gtest.h>

#include <random>

#include "common/kv/wire.h"
#include "server/server.h"

namespace rdkv::server {
namespace {

using transport::Connection;

class BadInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerOptions o;
    o.port = 0;
    o.memory_bytes = 16 << 20;
    o.max_value_bytes = 4096;
    o.auth_token = "t";
    auto s = Server::Start(o);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    server_ = std::move(*s);
    auto f = transport::Fabric::Create({});
    ASSERT_TRUE(f.ok());
    fabric_ = std::move(*f);
  }
  std::unique_ptr<Connection> Connect() {
    transport::ConnectOptions co;
    co.host = "127.0.0.1";
    co.port = server_->port();
    co.auth_token = "t";
    auto c = fabric_->Connect(co);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::move(*c) : nullptr;
  }
  kv::Response Call(Connection& c, std::span<const uint8_t> req, std::vector<uint8_t>* buf) {
    Status s = c.Call(req, buf, std::chrono::seconds(5));
    EXPECT_TRUE(s.ok()) << s.ToString();
    Result<kv::Response> r = kv::DecodeResponse(*buf);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : kv::Response{Status::Internal("undecodable"), 0, {}};
  }
  std::unique_ptr<Server> server_;
  std::unique_ptr<transport::Fabric> fabric_;
};

TEST_F(BadInputTest, MalformedRequestsGetErrorsAndServingGoesOn) {
  auto bad = Connect();
  auto good = Connect();
  ASSERT_TRUE(bad && good);
  std::vector<uint8_t> req, buf;
  kv::EncodeRequest({kv::Op::kPut, "k", "v1", 0}, &req);
  kv::Response r = Call(*good, req, &buf);
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();

  std::mt19937 rng(7);
  int protocol_errors = 0;
  for (int i = 0; i < 500; ++i) {
    std::vector<uint8_t> junk(rng() % 64);
    for (auto& b : junk) b = static_cast<uint8_t>(rng());
    if (i % 3 == 0 && junk.size() >= 4) {  // a plausible header with lying lengths
      junk[0] = 0x52;
      junk[1] = 0x4b;
      junk[2] = 1;
      junk[3] = 1;
    }
    kv::Response e = Call(*bad, junk, &buf);
    EXPECT_FALSE(e.status.ok());
    protocol_errors += e.status.code() == StatusCode::kProtocolError;
  }
  EXPECT_GT(protocol_errors, 400);
  // Well-formed but over the limits: clear InvalidArgument messages.
  kv::EncodeRequest({kv::Op::kPut, std::string(2000, 'k'), "v", 0}, &req);
  r = Call(*bad, req, &buf);
  EXPECT_EQ(r.status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status.message().find("1024"), std::string::npos) << r.status.message();
  kv::EncodeRequest({kv::Op::kPut, "k", std::string(5000, 'v'), 0}, &req);
  r = Call(*bad, req, &buf);
  EXPECT_EQ(r.status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status.message().find("max_value_size"), std::string::npos) << r.status.message();

  // The good client and the server are unaffected; the stored value is intact.
  kv::EncodeRequest({kv::Op::kPut, "k2", "x", 0}, &req);
  EXPECT_TRUE(Call(*good, req, &buf).status.ok());
  EXPECT_EQ(server_->stats().protocol_errors, static_cast<uint64_t>(protocol_errors));
  EXPECT_EQ(server_->stats().items, 2u);
}

}  // namespace
}  // namespace rdkv::server

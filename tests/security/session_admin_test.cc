// Admin separation (docs/security.md): the Service refuses every admin op (kv::IsAdmin) to a
// session that is not kAdmin, and a whole server refuses a data-role client's admin requests
// while accepting them with the admin secret.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "common/kv/admin_wire.h"
#include "common/kv/ops.h"
#include "common/kv/wire.h"
#include "rdkv/admin.h"
#include "rdkv/client.h"
#include "server/server.h"
#include "server/service.h"
#include "server/store.h"

namespace rdkv {
namespace {

using namespace std::chrono_literals;
using transport::SessionRole;

class ServiceRoles : public ::testing::Test {
 protected:
  void SetUp() override {
    region_.assign(1 << 20, 0);
    auto s = server::Store::Format(region_.data(), region_.size(), {});
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    store_ = std::move(*s);
    service_ = std::make_unique<server::Service>(store_.get(), kv::WireLimits{});
  }
  kv::Response Send(const kv::Request& r, SessionRole role) {
    std::vector<uint8_t> req;
    kv::EncodeRequest(r, &req);
    service_->Handle(req, &buf_, role);
    auto d = kv::DecodeResponse(buf_);
    EXPECT_TRUE(d.ok()) << d.status().ToString();
    return d.ok() ? *d : kv::Response{Status::Internal("undecodable"), 0, {}};
  }
  std::vector<uint8_t> region_;
  std::unique_ptr<server::Store> store_;
  std::unique_ptr<server::Service> service_;
  std::vector<uint8_t> buf_;
};

TEST_F(ServiceRoles, EveryAdminOpIsRefusedToTheDataRoleAndNothingChanges) {
  ASSERT_TRUE(Send({kv::Op::kPut, "k", "v1", 0}, SessionRole::kData).status.ok());
  std::string s1, s2, s3, s4;
  const std::string ids = kv::EncodeAnsweredWrites({{7, 1, 1}});
  const std::string map = R"({"epoch":99,"shards":16,"servers":[{"id":1,"address":"6.6.6.6:1"}]})";
  const kv::Request admin_ops[] = {
      kv::EncodeSnapshot({"x"}),
      kv::EncodeMapInstall({map}),
      kv::EncodeShardScan({0, 0}, &s1),
      kv::EncodeImport({"k", "evil", 12345}),
      kv::EncodeDropShard({0, 1}, &s2),
      kv::EncodeReplicate({.key = "k", .value = "evil", .version = 1u << 20, .map_epoch = 1}),
      kv::EncodeShardIds({0, 0}, &s3),
      kv::EncodeRecordIds({0, ids}, &s4),
  };
  int checked = 0;
  for (const kv::Request& r : admin_ops) {
    ASSERT_TRUE(kv::IsAdmin(r.op)) << kv::OpName(r.op);
    kv::Response resp = Send(r, SessionRole::kData);
    EXPECT_EQ(resp.status.code(), StatusCode::kPermissionDenied)
        << kv::OpName(r.op) << ": " << resp.status.ToString();
    EXPECT_NE(resp.status.message().find("admin_token_file"), std::string::npos);
    EXPECT_NE(resp.status.message().find(std::string(kv::OpName(r.op))), std::string::npos);
    ++checked;
  }
  // Every admin op of the table is in the list above.
  int admin_in_table = 0;
  for (uint8_t n = 1; n <= kv::kMaxOp; ++n) admin_in_table += kv::IsAdmin(kv::kOpTable[n].op);
  EXPECT_EQ(checked, admin_in_table);
  // The data-role IMPORT changed nothing.
  uint64_t version = 0;
  auto got = store_->Get("k", &version);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, "v1");
  EXPECT_NE(version, 12345u);
  // The admin role gets past the check (standalone: each op's own answer, e.g. kNotSupported
  // for the cluster ops, never "denied").
  for (const kv::Request& r : admin_ops) {
    EXPECT_NE(Send(r, SessionRole::kAdmin).status.code(), StatusCode::kPermissionDenied)
        << kv::OpName(r.op);
  }
  // Data ops are untouched by roles.
  EXPECT_TRUE(Send({kv::Op::kPut, "k2", "v", 0}, SessionRole::kData).status.ok());
  EXPECT_TRUE(Send(kv::EncodeMapFetch({}), SessionRole::kData).status.ok());
}

server::ServerOptions SmallServer() {
  server::ServerOptions o;
  o.port = 0;
  o.transport = transport::TransportKind::kTcp;
  o.memory_bytes = 32ull << 20;
  o.huge_pages = false;
  return o;
}

TEST(ServerRoles, AdminRequestsNeedTheAdminSecretEndToEnd) {
  server::ServerOptions so = SmallServer();
  so.auth_token = "data-secret";
  so.admin_token = "admin-secret";
  auto server = server::Server::Start(so);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  ClientOptions o;
  o.seed = "127.0.0.1:" + std::to_string((*server)->port());
  o.transport = "tcp";
  o.auth_token = "data-secret";
  auto data = Client::Connect(o);
  ASSERT_TRUE(data.ok()) << data.status().ToString();
  ASSERT_TRUE((*data)->Put("k", "v").ok());
  auto snap = Admin(**data).Snapshot("s");
  ASSERT_FALSE(snap.ok());
  EXPECT_EQ(snap.status().code(), StatusCode::kPermissionDenied) << snap.status().ToString();

  o.admin_token = "wrong";
  auto bad = Client::Connect(o);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kPermissionDenied) << bad.status().ToString();

  o.admin_token = "admin-secret";
  auto admin = Client::Connect(o);
  ASSERT_TRUE(admin.ok()) << admin.status().ToString();
  snap = Admin(**admin).Snapshot("s");
  // durability=none: the server has nothing to snapshot, but it did not deny the request.
  EXPECT_NE(snap.status().code(), StatusCode::kPermissionDenied) << snap.status().ToString();
  EXPECT_TRUE((*admin)->Get("k").ok());  // the admin role may do everything the data role may
}

}  // namespace
}  // namespace rdkv

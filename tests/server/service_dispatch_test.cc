// The Service's dispatch: every op of the op table has a handler, and an op without one is
// answered with an error (never applied as some other op).
#include <gtest/gtest.h>

#include <vector>

#include "common/kv/admin_wire.h"
#include "common/kv/ops.h"
#include "common/kv/wire.h"
#include "server/service.h"
#include "server/store.h"

namespace rdkv::server {
namespace {

TEST(ServiceDispatchTest, EveryOpOfTheTableHasAHandler) {
  for (uint8_t n = 1; n <= kv::kMaxOp; ++n) {
    EXPECT_TRUE(Service::HasHandler(kv::kOpTable[n].op)) << kv::kOpTable[n].name;
  }
  EXPECT_FALSE(Service::HasHandler(kv::Op{0}));
  EXPECT_FALSE(Service::HasHandler(static_cast<kv::Op>(kv::kMaxOp + 1)));
  EXPECT_FALSE(Service::HasHandler(static_cast<kv::Op>(255)));
}

class ServiceDispatchServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    region_.assign(1 << 20, 0);
    Result<std::unique_ptr<Store>> s = Store::Format(region_.data(), region_.size(), {});
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    store_ = std::move(*s);
    service_ = std::make_unique<Service>(store_.get(), kv::WireLimits{});
  }
  kv::Response Decoded(const kv::Request& r) {
    service_->HandleDecoded(r, &buf_);
    Result<kv::Response> d = kv::DecodeResponse(buf_);
    EXPECT_TRUE(d.ok()) << d.status().ToString();
    return d.ok() ? *d : kv::Response{Status::Internal("undecodable"), 0, {}};
  }
  std::vector<uint8_t> region_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<Service> service_;
  std::vector<uint8_t> buf_;
};

TEST_F(ServiceDispatchServerTest, AnUnhandledOpIsRefusedNotApplied) {
  ASSERT_TRUE(Decoded({kv::Op::kPut, "k", "v", 0}).status.ok());
  // Numbers that are no op, carrying a key (the old dispatch deleted it).
  for (int n : {0, kv::kMaxOp + 1, 200, 255}) {
    kv::Response r = Decoded({static_cast<kv::Op>(n), "k", "", 0});
    EXPECT_EQ(r.status.code(), StatusCode::kNotSupported) << n << ": " << r.status.ToString();
    EXPECT_TRUE(store_->Get("k").ok()) << "op " << n << " changed the store";
  }
  EXPECT_EQ(service_->counters().deletes.load(), 0u);
  // On the wire the decoder refuses them first.
  std::vector<uint8_t> req;
  kv::EncodeRequest({static_cast<kv::Op>(200), "k", "", 0}, &req);
  service_->Handle(req, &buf_);
  Result<kv::Response> d = kv::DecodeResponse(buf_);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->status.code(), StatusCode::kProtocolError);
  EXPECT_TRUE(store_->Get("k").ok());
}

TEST_F(ServiceDispatchServerTest, AdminOpsOfAStandaloneServer) {
  // The map fetch is a query: a standalone server answers it, with no map.
  kv::Response r = Decoded(kv::EncodeMapFetch({}));
  EXPECT_TRUE(r.status.ok()) << r.status.ToString();
  EXPECT_EQ(r.version, 0u);
  EXPECT_TRUE(r.body.empty());
  // Installs and shard moves need a cluster.
  EXPECT_EQ(Decoded(kv::EncodeMapInstall({"{}"})).status.code(), StatusCode::kNotSupported);
  std::string scratch;
  EXPECT_EQ(Decoded(kv::EncodeShardScan({0, 0}, &scratch)).status.code(),
            StatusCode::kNotSupported);
  EXPECT_EQ(Decoded(kv::EncodeDropShard({0, 0}, &scratch)).status.code(),
            StatusCode::kNotSupported);
  // A malformed admin message is refused before anything else.
  EXPECT_EQ(Decoded({kv::Op::kShardScan, "01", "", 0}).status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Decoded({kv::Op::kInstallMap, "", "", 0}).status.code(), StatusCode::kProtocolError);
  EXPECT_EQ(Decoded({kv::Op::kClusterMap, "k", "", 0}).status.code(), StatusCode::kProtocolError);
  EXPECT_EQ(Decoded({kv::Op::kSnapshot, "s", "", 0}).status.code(), StatusCode::kNotSupported)
      << "no persister: nothing to snapshot";
}

}  // namespace
}  // namespace rdkv::server

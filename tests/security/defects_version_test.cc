// Issue #15, defect 7: item versions never wrap. An IMPORT with version 2^64-1 used to be
// accepted by a standalone server; the counter wrapped to 0, versions repeated and a stale CAS
// succeeded. Now versions above kv::kMaxItemVersion are refused by the decoders and the Store,
// and a counter at the maximum refuses writes instead of wrapping.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <vector>

#include "common/kv/admin_wire.h"
#include "common/kv/limits.h"
#include "common/kv/wire.h"
#include "server/server.h"
#include "server/store.h"

namespace rdkv {
namespace {

constexpr uint64_t kU64Max = std::numeric_limits<uint64_t>::max();

TEST(DefectsVersionTest, DecodersRefuseVersionsAboveTheMaximum) {
  for (uint64_t v : {kv::kMaxItemVersion + 1, kU64Max}) {
    Result<kv::ImportRequest> i = kv::DecodeImport({kv::Op::kImport, "k", "v", v});
    EXPECT_EQ(i.status().code(), StatusCode::kInvalidArgument) << v;
    EXPECT_NE(i.status().message().find(std::to_string(kv::kMaxItemVersion)), std::string::npos)
        << i.status().message();
    Result<kv::DropShardRequest> d = kv::DecodeDropShard({kv::Op::kDropShard, "0", "", v});
    EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument) << v;
  }
  EXPECT_TRUE(kv::DecodeImport({kv::Op::kImport, "k", "v", kv::kMaxItemVersion}).ok());
  EXPECT_TRUE(kv::DecodeDropShard({kv::Op::kDropShard, "0", "", kv::kMaxItemVersion}).ok());
  EXPECT_TRUE(kv::DecodeDropShard({kv::Op::kDropShard, "0", "", 0}).ok()) << "0: no floor";
}

class StoreVersionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    region_.resize(4 << 20);
    auto s = server::Store::Format(region_.data(), region_.size(), {});
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    store_ = std::move(*s);
  }
  std::vector<uint8_t> region_;
  std::unique_ptr<server::Store> store_;
};

TEST_F(StoreVersionTest, RestoreRefusesVersionsAboveTheMaximum) {
  EXPECT_EQ(store_->Restore("a", "v", kU64Max).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->Restore("a", "v", kv::kMaxItemVersion + 1).code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(store_->Restore("a", "v", kv::kMaxItemVersion).ok());
}

TEST_F(StoreVersionTest, CounterAtTheMaximumRefusesWritesInsteadOfWrapping) {
  Result<uint64_t> v1 = store_->Put("k", "old");
  ASSERT_TRUE(v1.ok());
  store_->EnsureVersionAbove(kU64Max);  // clamped
  EXPECT_EQ(store_->version_counter(), kv::kMaxItemVersion);
  Result<uint64_t> v2 = store_->Put("k", "new");
  EXPECT_EQ(v2.status().code(), StatusCode::kOutOfSpace) << "got version " << (v2.ok() ? *v2 : 0);
  EXPECT_EQ(store_->Put("other", "x").status().code(), StatusCode::kOutOfSpace);
  // Even a CAS that matches gets no version: nothing is written.
  EXPECT_EQ(store_->Cas("k", *v1, "new").status().code(), StatusCode::kOutOfSpace);
  uint64_t version = 0;
  Result<std::string> got = store_->Get("k", &version);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, "old");
  EXPECT_EQ(version, *v1);
  // Refused writes hand out nothing: the counter (persisted as max_version by a shard drop)
  // never reports more than the maximum, which recovery would refuse.
  EXPECT_EQ(store_->version_counter(), kv::kMaxItemVersion);
}

// The probe, end to end on a standalone server.
TEST(DefectsVersionServerTest, ImportNearTheMaximumCannotMakeAStaleCasSucceed) {
  server::ServerOptions o;
  o.port = 0;
  o.memory_bytes = 16 << 20;
  auto s = server::Server::Start(o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  std::unique_ptr<server::Server> server = std::move(*s);
  auto f = transport::Fabric::Create({});
  ASSERT_TRUE(f.ok());
  transport::ConnectOptions co;
  co.host = "127.0.0.1";
  co.port = server->port();
  auto c = (*f)->Connect(co);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  std::vector<uint8_t> req, buf;
  auto call = [&](const kv::Request& r) {
    kv::EncodeRequest(r, &req);
    Status st = (*c)->Call(req, &buf, std::chrono::seconds(5));
    EXPECT_TRUE(st.ok()) << st.ToString();
    Result<kv::Response> resp = kv::DecodeResponse(buf);
    EXPECT_TRUE(resp.ok());
    return resp.ok() ? *resp : kv::Response{Status::Internal("undecodable"), 0, {}};
  };
  kv::Response put = call({kv::Op::kPut, "k", "v1", 0});
  ASSERT_TRUE(put.status.ok()) << put.status.ToString();
  const uint64_t stale = put.version;
  kv::Response imp = call({kv::Op::kImport, "x", "y", kU64Max});
  EXPECT_EQ(imp.status.code(), StatusCode::kInvalidArgument) << imp.status.ToString();
  imp = call({kv::Op::kImport, "z", "y", kv::kMaxItemVersion});
  ASSERT_TRUE(imp.status.ok()) << imp.status.ToString();
  // k is rewritten after the import: its new version (if the server still has one to give)
  // is above the stale one, so a CAS with the stale version must fail.
  kv::Response rewrite = call({kv::Op::kPut, "k", "v2", 0});
  if (rewrite.status.ok()) {
    EXPECT_GT(rewrite.version, stale);
    EXPECT_LE(rewrite.version, kv::kMaxItemVersion);
  } else {
    EXPECT_EQ(rewrite.status.code(), StatusCode::kOutOfSpace) << rewrite.status.ToString();
  }
  for (int i = 0; i < 4; ++i) {  // before the fix: versions 0, 1, 2... were handed out again
    kv::Response w = call({kv::Op::kPut, "w" + std::to_string(i), "v", 0});
    if (w.status.ok()) {
      EXPECT_GT(w.version, stale);
    }
  }
  if (rewrite.status.ok()) {
    kv::Response cas = call({kv::Op::kCas, "k", "v3", stale});
    EXPECT_FALSE(cas.status.ok()) << "a stale CAS succeeded with version " << cas.version;
  }
}

}  // namespace
}  // namespace rdkv

// Shared set-up of the verbs-only tests: a server and a client Fabric on the Soft-RoCE device, a
// server region filled with a known pattern, a client buffer, a listener and a connection.
//
// On a machine without an RDMA device (the host) the tests are SKIPPED with the reason; with
// RDKV_REQUIRE_VERBS=1 they FAIL instead. RDKV_RXE_ADDR (set by tests/rxe/vm.sh) is the address
// to listen on and connect to.
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "common/transport/transport.h"
#include "common/transport/verbs/verbs_fabric.h"

namespace rdkv::transport::testing_env {

inline bool RequireVerbs() {
  const char* s = std::getenv("RDKV_REQUIRE_VERBS");
  return s != nullptr && std::string(s) == "1";
}

inline uint8_t RegionByte(uint64_t offset) {
  uint64_t x = offset * 0x9e3779b97f4a7c15ull;
  return static_cast<uint8_t>((x >> 29) ^ (x >> 47));
}

class VerbsEnv : public ::testing::Test {
 protected:
  static constexpr char kToken[] = "verbs-test-token";
  static constexpr size_t kRegionSize = (1u << 20) + 100;
  static constexpr size_t kLocalSize = 4u << 20;

  // False (with the reason in why_) when verbs cannot run here.
  bool OpenFabrics() {
    const char* addr = std::getenv("RDKV_RXE_ADDR");
    FabricOptions fo;
    fo.kind = TransportKind::kVerbs;
    auto s = Fabric::Create(fo);
    if (!s.ok()) {
      why_ = s.status().ToString();
      return false;
    }
    if (addr == nullptr || *addr == '\0') {
      why_ = "RDKV_RXE_ADDR is not set";
      return false;
    }
    auto c = Fabric::Create(fo);
    if (!c.ok()) {
      why_ = c.status().ToString();
      return false;
    }
    server_fabric_ = std::move(s).value();
    client_fabric_ = std::move(c).value();
    host_ = addr;
    return true;
  }

  void SetUp() override {
    if (!OpenFabrics()) {
      if (RequireVerbs()) GTEST_FAIL() << "RDKV_REQUIRE_VERBS=1 but verbs cannot run: " << why_;
      std::printf(
          "SKIPPED: no usable RDMA device (%s); run it inside the Soft-RoCE VM: "
          "tests/rxe/vm.sh -- <this test binary>\n",
          why_.c_str());
      GTEST_SKIP() << "SKIPPED: no usable RDMA device (" << why_ << ")";
    }
    auto region = server_fabric_->AllocateRegion(kRegionSize, RegionAccess::kRemoteRead);
    ASSERT_TRUE(region.ok()) << region.status().ToString();
    region_ = std::move(region).value();
    for (size_t i = 0; i < kRegionSize; ++i) region_->data()[i] = RegionByte(i);
    auto local = client_fabric_->AllocateRegion(kLocalSize, RegionAccess::kLocal);
    ASSERT_TRUE(local.ok()) << local.status().ToString();
    local_ = std::move(local).value();
  }

  void TearDown() override {
    conn_.reset();
    listener_.reset();
    local_.reset();
    region_.reset();
    client_fabric_.reset();
    server_fabric_.reset();
  }

  Status Listen(RequestHandler handler, uint32_t max_connections = 256, uint16_t port = 0,
                int workers = 2, uint32_t sessions_per_cq = 0) {
    ListenOptions lo;
    lo.host = host_;
    lo.port = port;
    lo.auth_token = kToken;
    lo.regions = {region_->Describe(3)};
    lo.handler = std::move(handler);
    lo.worker_threads = workers;
    lo.max_connections = max_connections;
    lo.verbs_sessions_per_cq = sessions_per_cq;
    auto l = server_fabric_->Listen(std::move(lo));
    if (!l.ok()) return l.status();
    listener_ = std::move(l).value();
    return Status::Ok();
  }

  static RequestHandler Echo() {
    return [](std::span<const uint8_t> p, ReplyHandle r) {
      r.session->Reply(r.request_id, p).IgnoreError();
    };
  }

  Result<std::unique_ptr<Connection>> Connect(ConnectOptions co = {}) {
    co.host = host_;
    co.port = listener_->port();
    if (co.auth_token.empty()) co.auth_token = kToken;
    return client_fabric_->Connect(co);
  }

  // One READ into the client buffer at `dst_offset`; returns its status.
  ReadStatus ReadOnce(Connection* c, uint64_t addr, uint32_t rkey, uint32_t length,
                      size_t dst_offset = 0) {
    ReadOp op;
    op.local = local_->data() + dst_offset;
    op.lkey = local_->lkey();
    op.remote_addr = addr;
    op.rkey = rkey;
    op.length = length;
    ReadOp* p = &op;
    Status s = c->ReadAndWait({&p, 1}, std::chrono::steady_clock::now() + std::chrono::seconds(30));
    EXPECT_TRUE(s.ok()) << s.ToString();
    return op.status.load();
  }

  // READs [offset, offset+length) of the server region and checks the bytes.
  ::testing::AssertionResult ReadAndCheck(Connection* c, uint64_t offset, uint32_t length) {
    const RegionDescriptor& r = c->regions().at(0);
    std::memset(local_->data(), 0xEE, length);
    ReadStatus st = ReadOnce(c, r.addr + offset, r.rkey, length);
    if (st != ReadStatus::kOk) {
      return ::testing::AssertionFailure() << "READ status " << static_cast<int>(st);
    }
    for (uint32_t i = 0; i < length; ++i) {
      if (local_->data()[i] != RegionByte(offset + i)) {
        return ::testing::AssertionFailure() << "byte " << i << " of a READ at " << offset;
      }
    }
    return ::testing::AssertionSuccess();
  }

  std::string why_;
  std::string host_;
  std::unique_ptr<Fabric> server_fabric_;
  std::unique_ptr<Fabric> client_fabric_;
  std::unique_ptr<MemoryRegion> region_;
  std::unique_ptr<MemoryRegion> local_;
  std::unique_ptr<Listener> listener_;
  std::unique_ptr<Connection> conn_;
};

}  // namespace rdkv::transport::testing_env

// One tcp listener holds several hundred connections at once (issue 14; the figures at 2,000
// connections come from bench/connection-scaling.sh): kConnections clients connect from
// kConnectThreads threads at once, every one is counted open by the listener, and every one
// then serves a READ (the right bytes) and a two-sided call. Kept to a few seconds.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/transport/transport.h"

namespace rdkv::transport {
namespace {

constexpr int kConnections = 300;
constexpr int kConnectThreads = 24;  // under the listener's 64 unfinished handshakes per source
constexpr size_t kRegionSize = 1 << 20;

TEST(TcpManyConnections, ThreeHundredConnectionsAllServe) {
  // Both ends of every connection live in this process: two descriptors each.
  rlimit nofile{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &nofile), 0);
  const rlim_t need = 2 * kConnections + 256;
  if (nofile.rlim_cur < need) {
    nofile.rlim_cur = std::min<rlim_t>(need, nofile.rlim_max);
    setrlimit(RLIMIT_NOFILE, &nofile);
    getrlimit(RLIMIT_NOFILE, &nofile);
  }
  if (nofile.rlim_cur < need) {
    GTEST_SKIP() << "SKIPPED: the open-file limit (" << nofile.rlim_cur << ", hard "
                 << nofile.rlim_max << ") is below the " << need << " this test needs";
  }

  auto server_fabric = Fabric::Create({});
  ASSERT_TRUE(server_fabric.ok()) << server_fabric.status().ToString();
  auto client_fabric = Fabric::Create({});
  ASSERT_TRUE(client_fabric.ok()) << client_fabric.status().ToString();
  auto region = (*server_fabric)->AllocateRegion(kRegionSize, RegionAccess::kRemoteRead);
  ASSERT_TRUE(region.ok()) << region.status().ToString();
  for (size_t i = 0; i < kRegionSize; ++i) (*region)->data()[i] = static_cast<uint8_t>(i * 7 + 3);

  ListenOptions lo;
  lo.host = "127.0.0.1";
  lo.port = 0;
  lo.auth_token = "many-connections";
  lo.regions = {(*region)->Describe(1)};
  lo.max_connections = kConnections + 8;
  lo.handler = [](std::span<const uint8_t> payload, ReplyHandle reply) {
    reply.session->Reply(reply.request_id, payload).IgnoreError();  // echo
  };
  auto listener = (*server_fabric)->Listen(std::move(lo));
  ASSERT_TRUE(listener.ok()) << listener.status().ToString();

  std::vector<std::unique_ptr<Connection>> conns(kConnections);
  std::atomic<int> next{0};
  std::mutex error_mu;
  std::string first_error;
  std::vector<std::thread> threads;
  for (int t = 0; t < kConnectThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = next.fetch_add(1); i < kConnections; i = next.fetch_add(1)) {
        ConnectOptions co;
        co.host = "127.0.0.1";
        co.port = (*listener)->port();
        co.auth_token = "many-connections";
        co.max_outstanding_reads = 4;
        co.max_outstanding_calls = 2;
        auto c = (*client_fabric)->Connect(co);
        if (c.ok()) {
          conns[i] = std::move(*c);
        } else {
          std::lock_guard<std::mutex> l(error_mu);
          if (first_error.empty()) first_error = c.status().ToString();
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  ASSERT_TRUE(first_error.empty()) << first_error;
  EXPECT_EQ((*listener)->stats().connections_open, uint64_t{kConnections});

  auto local = (*client_fabric)->AllocateRegion(64 * 1024, RegionAccess::kLocal);
  ASSERT_TRUE(local.ok()) << local.status().ToString();
  for (int i = 0; i < kConnections; ++i) {
    Connection& c = *conns[i];
    ASSERT_TRUE(c.alive()) << i;
    const RegionDescriptor r = c.regions().at(0);
    const uint64_t offset = (uint64_t{static_cast<uint64_t>(i)} * 4093) % (kRegionSize - 64);
    ReadOp op;
    op.local = (*local)->data();
    op.lkey = (*local)->lkey();
    op.remote_addr = r.addr + offset;
    op.rkey = r.rkey;
    op.length = 64;
    ReadOp* ops[] = {&op};
    ASSERT_TRUE(
        c.ReadAndWait(ops, std::chrono::steady_clock::now() + std::chrono::seconds(10)).ok())
        << i;
    ASSERT_EQ(op.status.load(), ReadStatus::kOk) << i;
    ASSERT_EQ(std::memcmp((*local)->data(), (*region)->data() + offset, 64), 0) << i;
    const std::string msg = "conn " + std::to_string(i);
    std::vector<uint8_t> response;
    ASSERT_TRUE(
        c.Call(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(msg.data()), msg.size()),
               &response, std::chrono::seconds(10))
            .ok())
        << i;
    EXPECT_EQ(std::string(response.begin(), response.end()), msg);
  }
  EXPECT_EQ((*listener)->stats().connections_open, uint64_t{kConnections});
  conns.clear();
}

}  // namespace
}  // namespace rdkv::transport

// The tcp NIC threads' polling gate, as the listener wires it (docs/transport-tcp.md "Polling
// only while no thread waits for the CPU"): a listener whose threads share their one CPU with a
// spinning thread stops busy-polling while clients keep it busy, and counts each hold in
// ListenerStats::busy_poll_holds; with busy_poll_always it polls regardless and counts none.
// The listener is made on a thread pinned to one CPU, so that its NIC threads inherit the pin;
// the client runs unpinned. Skips, saying why, where a thread cannot be pinned or the kernel
// keeps no run delay.
#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <thread>

#include "common/transport/transport.h"
#include "common/util/cpu_contention.h"
#include "tests/support/run_delay.h"

namespace rdkv::transport {
namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kRegionSize = 1 << 16;

// As in conformance_test.cc: with TZ unset, glog's time stamps make glibc free and re-copy its
// zone on every line, which TSan reports as a race between two logging threads. With TZ set
// glibc keeps its copy. Runs before main(), before any thread exists.
[[maybe_unused]] const bool kTzPinned = [] {
  setenv("TZ", ":/etc/localtime", /*overwrite=*/0);
  tzset();
  return true;
}();

using testing::KernelKeepsRunDelay;

struct Outcome {
  std::string skip;  // why the run could not happen; empty when it did
  uint64_t holds = 0;
  uint64_t reads = 0;
};

// Runs a listener pinned with a spinner to one CPU, READs from it for up to `run_for`
// (stopping early once a hold is counted when `stop_at_first_hold`), and reports its holds.
Outcome RunPinnedListener(bool busy_poll_always, Clock::duration run_for, bool stop_at_first_hold) {
  Outcome out;
  if (!KernelKeepsRunDelay()) {
    out.skip = "no readable run delay in this thread's schedstat on this kernel";
    return out;
  }
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) {
    out.skip = "sched_getaffinity failed";
    return out;
  }
  int cpu = 0;
  while (cpu < CPU_SETSIZE && !CPU_ISSET(cpu, &allowed)) ++cpu;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);

  auto client_fabric = Fabric::Create({});
  if (!client_fabric.ok()) {
    out.skip = client_fabric.status().ToString();
    return out;
  }
  std::unique_ptr<Fabric> server_fabric;
  std::unique_ptr<MemoryRegion> region;
  std::unique_ptr<Listener> listener;
  std::atomic<bool> stop{false};
  std::thread spinner;
  std::string setup_error;
  // The listener's threads are made here, on a thread pinned to `cpu`: they inherit the pin.
  std::thread maker([&] {
    const int rc = pthread_setaffinity_np(pthread_self(), sizeof one, &one);
    if (rc != 0) {
      out.skip = "cannot pin a thread to CPU " + std::to_string(cpu) + " here (error " +
                 std::to_string(rc) + ")";
      return;
    }
    auto f = Fabric::Create({});
    if (!f.ok()) {
      setup_error = f.status().ToString();
      return;
    }
    server_fabric = std::move(*f);
    auto r = server_fabric->AllocateRegion(kRegionSize, RegionAccess::kRemoteRead);
    if (!r.ok()) {
      setup_error = r.status().ToString();
      return;
    }
    region = std::move(*r);
    ListenOptions lo;
    lo.host = "127.0.0.1";
    lo.port = 0;
    lo.auth_token = "busy-poll";
    lo.regions = {region->Describe(1)};
    lo.busy_poll = std::chrono::microseconds(2000);  // keeps polling between the client's READs
    lo.busy_poll_always = busy_poll_always;
    lo.handler = [](std::span<const uint8_t> p, ReplyHandle r) {
      r.session->Reply(r.request_id, p).IgnoreError();
    };
    auto l = server_fabric->Listen(std::move(lo));
    if (!l.ok()) {
      setup_error = l.status().ToString();
      return;
    }
    listener = std::move(*l);
    spinner = std::thread([&] {  // inherits the one-CPU mask
      while (!stop.load(std::memory_order_relaxed)) {
      }
    });
  });
  maker.join();
  // Whatever happens below (an exception included), the spinner stops and is joined.
  struct StopSpinner {
    std::atomic<bool>& stop;
    std::thread& spinner;
    ~StopSpinner() {
      stop.store(true);
      if (spinner.joinable()) spinner.join();
    }
  } stop_spinner{stop, spinner};
  if (!out.skip.empty()) return out;
  EXPECT_EQ(setup_error, "");
  if (listener == nullptr) return out;

  ConnectOptions co;
  co.host = "127.0.0.1";
  co.port = listener->port();
  co.auth_token = "busy-poll";
  auto conn = (*client_fabric)->Connect(co);
  EXPECT_TRUE(conn.ok()) << conn.status().ToString();
  if (conn.ok()) {
    const RegionDescriptor rd = (*conn)->regions().at(0);
    auto local = (*client_fabric)->AllocateRegion(4096, RegionAccess::kLocal);
    EXPECT_TRUE(local.ok());
    ReadOp op;
    const Clock::time_point end = Clock::now() + run_for;
    while (local.ok() && Clock::now() < end) {
      op.Reset();
      op.local = (*local)->data();
      op.lkey = (*local)->lkey();
      op.rkey = rd.rkey;
      op.length = 64;
      op.remote_addr = rd.addr + (out.reads * 64) % (kRegionSize - 64);
      ReadOp* p = &op;
      Status s = (*conn)->ReadAndWait({&p, 1}, Clock::now() + std::chrono::seconds(5));
      EXPECT_TRUE(s.ok()) << s.ToString();
      if (!s.ok()) break;
      ++out.reads;
      if (stop_at_first_hold && (out.reads & 63) == 0 && listener->stats().busy_poll_holds > 0) {
        break;
      }
    }
  }
  out.holds = listener->stats().busy_poll_holds;
  return out;
}

TEST(TcpBusyPoll, NicThreadsSharingTheirCpuWithASpinnerStopPollingAndCountTheHold) {
  const Outcome o = RunPinnedListener(false, std::chrono::seconds(5), true);
  if (!o.skip.empty()) GTEST_SKIP() << "SKIPPED: " << o.skip;
  EXPECT_GT(o.reads, 0u);
  EXPECT_GT(o.holds, 0u) << "the NIC threads shared one CPU with a spinner for " << o.reads
                         << " READs and never stopped polling";
}

TEST(TcpBusyPoll, BusyPollAlwaysNeverHolds) {
  const Outcome o = RunPinnedListener(true, std::chrono::seconds(1), false);
  if (!o.skip.empty()) GTEST_SKIP() << "SKIPPED: " << o.skip;
  EXPECT_GT(o.reads, 0u);
  EXPECT_EQ(o.holds, 0u);
}

}  // namespace
}  // namespace rdkv::transport

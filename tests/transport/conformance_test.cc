// Transport conformance: the behaviour common/transport/transport.h promises, checked the same
// way for every transport kind.
//
//   tcp    runs here, over 127.0.0.1.
//   verbs  runs inside the Soft-RoCE VM (tests/rxe), which sets RDKV_RXE_ADDR (the address to
//          listen on and connect to) and RDKV_REQUIRE_VERBS=1. Elsewhere, when the verbs fabric
//          cannot be created, the verbs instances are SKIPPED with the reason; with
//          RDKV_REQUIRE_VERBS=1 they FAIL instead.
//
// RDKV_TEST_SCALE (default 1.0) scales iteration counts down for slow machines (the emulated VM);
// the thousands-of-outstanding-READs test keeps at least 2048 READs in flight at any scale.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <deque>
#include <functional>
#include <future>
#include <limits>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/transport/transport.h"

namespace rdkv::transport {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// glog stamps every line using mktime(), which makes glibc re-read TZ each time and, when TZ is
// unset, free and re-strdup its cached copy under a lock TSan cannot see: two threads logging at
// once then show up as a data race inside glibc. With TZ set (to the same local zone) glibc keeps
// its cache and never frees it. Runs before main(), before any thread exists.
[[maybe_unused]] const bool kTzPinned = [] {
  setenv("TZ", ":/etc/localtime", /*overwrite=*/0);
  tzset();
  return true;
}();

constexpr char kToken[] = "conformance-secret-token";
// Deliberately not a multiple of the page size: bytes past the end share the last page with
// registered bytes, and a READ of them must still be refused.
constexpr size_t kRegionSize = (4u << 20) + 1000;
constexpr size_t kLocalSize = 16u << 20;

double Scale() {
  const char* s = std::getenv("RDKV_TEST_SCALE");
  double v = s != nullptr ? std::atof(s) : 1.0;
  return v > 0 ? v : 1.0;
}
size_t Scaled(size_t n, size_t at_least = 1) {
  return std::max(at_least, static_cast<size_t>(static_cast<double>(n) * Scale()));
}
bool RequireVerbs() {
  const char* s = std::getenv("RDKV_REQUIRE_VERBS");
  return s != nullptr && std::string(s) == "1";
}

uint64_t SplitMix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
// The byte the server region holds at `offset` (a position-dependent, non-repeating pattern: a
// READ that returns the right bytes from the wrong place fails the comparison).
uint8_t PatternByte(uint64_t offset) {
  return static_cast<uint8_t>(SplitMix(offset >> 3) >> ((offset & 7) * 8));
}
void FillPattern(uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; ++i) p[i] = PatternByte(i);
}

// The handler's transformation for 'E' requests: reversed and xor-ed, so an echo of the wrong
// request or a misrouted response cannot pass.
std::vector<uint8_t> Transform(std::span<const uint8_t> request) {
  std::vector<uint8_t> out;
  out.reserve(request.size());
  out.push_back('e');
  for (size_t i = request.size(); i > 1; --i) out.push_back(request[i - 1] ^ 0x5A);
  return out;
}

std::vector<uint8_t> MakeRequest(char op, size_t size, uint64_t seed) {
  std::vector<uint8_t> r(std::max<size_t>(size, 1));
  r[0] = static_cast<uint8_t>(op);
  for (size_t i = 1; i < r.size(); ++i)
    r[i] = static_cast<uint8_t>(SplitMix(seed + i / 8) >> (i % 8));
  return r;
}

// A 'B' request asks for a response of `size` bytes: 'B' | u32 size | u8 seed.
std::vector<uint8_t> BigResponseFor(uint32_t size, uint8_t seed) {
  std::vector<uint8_t> out(size);
  for (uint32_t i = 0; i < size; ++i) out[i] = static_cast<uint8_t>(i * 31 + seed);
  return out;
}

// Joins a thread when the scope ends, also when an ASSERT returns early: the destructor of a
// joinable std::thread would terminate the whole test binary instead of failing one test.
// `stop` runs first and must make the thread finish soon.
class Joiner {
 public:
  Joiner(std::thread& thread, std::function<void()> stop)
      : thread_(thread), stop_(std::move(stop)) {}
  ~Joiner() {
    if (!thread_.joinable()) return;
    stop_();
    thread_.join();
  }

 private:
  std::thread& thread_;
  std::function<void()> stop_;
};

bool IsConnectionFailure(const Status& s) {
  return s.Is(StatusCode::kConnectionLost) || s.Is(StatusCode::kUnavailable);
}

class TransportConformance : public testing::TestWithParam<TransportKind> {
 protected:
  void SetUp() override {
    kind_ = GetParam();
    std::string why;
    if (kind_ == TransportKind::kVerbs) {
      if (!CreateFabrics(&why)) {
        std::string device_why;
        RdmaDeviceAvailable(&device_why);
        why += "; " + device_why;
      } else {
        const char* addr = std::getenv("RDKV_RXE_ADDR");
        if (addr == nullptr || *addr == '\0') {
          why = "RDKV_RXE_ADDR is not set";
          server_fabric_.reset();
          client_fabric_.reset();
        } else {
          host_ = addr;
        }
      }
      if (!server_fabric_) {
        if (RequireVerbs()) {
          FAIL() << "RDKV_REQUIRE_VERBS=1 but the verbs transport cannot run: " << why;
        }
        GTEST_SKIP() << "SKIPPED: no RDMA device (" << why
                     << "); the verbs suite runs inside the Soft-RoCE VM via tests/rxe";
      }
    } else {
      host_ = "127.0.0.1";
      ASSERT_TRUE(CreateFabrics(&why)) << why;
    }

    auto region = server_fabric_->AllocateRegion(kRegionSize, RegionAccess::kRemoteRead);
    ASSERT_TRUE(region.ok()) << region.status().ToString();
    region_ = std::move(region).value();
    FillPattern(region_->data(), region_->size());
    auto local = client_fabric_->AllocateRegion(kLocalSize, RegionAccess::kLocal);
    ASSERT_TRUE(local.ok()) << local.status().ToString();
    local_ = std::move(local).value();

    ASSERT_TRUE(StartListener(0).ok());
    auto conn = Connect();
    ASSERT_TRUE(conn.ok()) << conn.status().ToString();
    conn_ = std::move(conn).value();
    ASSERT_EQ(conn_->regions().size(), 1u);
    remote_ = conn_->regions()[0];
    EXPECT_EQ(remote_.length, kRegionSize);
    EXPECT_EQ(remote_.layout_version, 7u);
  }

  void TearDown() override {
    conn_.reset();
    listener_.reset();
    {
      std::lock_guard lock(mu_);
      deferred_.clear();
    }
    local_.reset();
    region_.reset();
    client_fabric_.reset();
    server_fabric_.reset();
  }

  bool CreateFabrics(std::string* why) {
    FabricOptions fo;
    fo.kind = kind_;
    auto s = Fabric::Create(fo);
    if (!s.ok()) {
      *why = s.status().ToString();
      return false;
    }
    auto c = Fabric::Create(fo);
    if (!c.ok()) {
      *why = c.status().ToString();
      return false;
    }
    server_fabric_ = std::move(s).value();
    client_fabric_ = std::move(c).value();
    return true;
  }

  Status StartListener(uint16_t port) {
    ListenOptions lo;
    lo.host = host_;
    lo.port = port;
    lo.auth_token = kToken;
    lo.regions = {region_->Describe(7)};
    lo.worker_threads = 2;
    lo.handler = [this](std::span<const uint8_t> payload, ReplyHandle reply) {
      Handle(payload, std::move(reply));
    };
    auto l = server_fabric_->Listen(std::move(lo));
    if (!l.ok()) return l.status();
    listener_ = std::move(l).value();
    return Status::Ok();
  }

  Result<std::unique_ptr<Connection>> Connect(ConnectOptions co = {}) {
    co.host = host_;
    co.port = listener_->port();
    if (co.auth_token.empty()) co.auth_token = kToken;
    return client_fabric_->Connect(co);
  }

  // Runs on the listener's worker threads.
  void Handle(std::span<const uint8_t> payload, ReplyHandle reply) {
    handled_.fetch_add(1);
    if (payload.empty()) {
      reply.session->Reply(reply.request_id, {}).IgnoreError();
      return;
    }
    switch (payload[0]) {
      case 'E': {
        std::vector<uint8_t> out = Transform(payload);
        reply.session->Reply(reply.request_id, out).IgnoreError();  // the client may be gone
        return;
      }
      case 'B': {
        uint32_t size = 0;
        std::memcpy(&size, payload.data() + 1, 4);
        std::vector<uint8_t> out = BigResponseFor(size, payload[5]);
        Status s = reply.session->Reply(reply.request_id, out);
        if (!s.ok()) ADD_FAILURE() << "Reply of " << size << " bytes: " << s.ToString();
        return;
      }
      case 'O': {  // a response twice the request's size (past a small client's limit)
        std::vector<uint8_t> out(payload.size() * 2, 'o');
        Status s = reply.session->Reply(reply.request_id, out);
        std::lock_guard lock(mu_);
        oversize_reply_ = s;
        return;
      }
      case 'D': {
        std::lock_guard lock(mu_);
        deferred_.push_back(
            {std::move(reply), std::vector<uint8_t>(payload.begin(), payload.end())});
        deferred_cv_.notify_all();
        return;
      }
      default:
        reply.session->Reply(reply.request_id, payload).IgnoreError();
    }
  }

  struct Deferred {
    ReplyHandle reply;
    std::vector<uint8_t> payload;
  };
  // Waits until `n` deferred requests are held.
  bool WaitDeferred(size_t n, std::chrono::milliseconds timeout) {
    std::unique_lock lock(mu_);
    return deferred_cv_.wait_for(lock, timeout, [&] { return deferred_.size() >= n; });
  }

  // A READ through `conn` (default conn_), with that connection's own descriptor: on verbs with
  // memory windows each connection's rkey is its own and works on its queue pair only.
  void Prep(ReadOp& op, uint8_t* dst, uint64_t offset, uint32_t length,
            const Connection* conn = nullptr) {
    const RegionDescriptor& r = conn != nullptr ? conn->regions().at(0) : remote_;
    op.Reset();
    op.local = dst;
    op.lkey = local_->lkey();
    op.remote_addr = r.addr + offset;
    op.rkey = r.rkey;
    op.length = length;
  }

  Clock::time_point Deadline() const { return Clock::now() + 30s; }

  // One READ of [offset, offset+length) into local memory, checked against the pattern.
  void ReadAndCheck(Connection* conn, uint64_t offset, uint32_t length) {
    ReadOp op;
    uint8_t* dst = local_->data() + 3;
    std::memset(dst, 0xEE, length);
    Prep(op, dst, offset, length, conn);
    ReadOp* p = &op;
    Status s = conn->ReadAndWait({&p, 1}, Deadline());
    ASSERT_TRUE(s.ok()) << s.ToString();
    ASSERT_EQ(op.status.load(), ReadStatus::kOk);
    for (uint32_t i = 0; i < length; ++i) {
      ASSERT_EQ(dst[i], PatternByte(offset + i)) << "offset " << offset << " byte " << i;
    }
  }

  // Stops the test's listener and gives the options of a new one (on the same region), with
  // `workers` worker threads and no handler yet.
  ListenOptions OptionsForANewListener(int workers) {
    listener_.reset();
    ListenOptions lo;
    lo.host = host_;
    lo.auth_token = kToken;
    lo.regions = {region_->Describe(7)};
    lo.worker_threads = workers;
    return lo;
  }

  // Makes the listener of `lo` the test's listener.
  Status StartListener(ListenOptions lo) {
    auto l = server_fabric_->Listen(std::move(lo));
    if (!l.ok()) return l.status();
    listener_ = std::move(*l);
    return Status::Ok();
  }

  void CallAndCheck(Connection* conn, size_t size, uint64_t seed) {
    std::vector<uint8_t> request = MakeRequest('E', size, seed);
    std::vector<uint8_t> response;
    Status s = conn->Call(request, &response, 10s);
    ASSERT_TRUE(s.ok()) << s.ToString();
    ASSERT_EQ(response, Transform(request));
  }

  TransportKind kind_ = TransportKind::kTcp;
  std::string host_;
  std::unique_ptr<Fabric> server_fabric_;
  std::unique_ptr<Fabric> client_fabric_;
  std::unique_ptr<MemoryRegion> region_;
  std::unique_ptr<MemoryRegion> local_;
  std::unique_ptr<Listener> listener_;
  std::unique_ptr<Connection> conn_;
  RegionDescriptor remote_;
  std::atomic<uint64_t> handled_{0};
  std::mutex mu_;
  Status oversize_reply_;  // what the last 'O' request's Reply returned
  std::condition_variable deferred_cv_;
  std::deque<Deferred> deferred_;
};

// ---- one-sided READs -------------------------------------------------------------------------

TEST_P(TransportConformance, ReadsRegisteredMemoryAtManyOffsetsAndSizes) {
  const uint32_t sizes[] = {1,  2,   3,    7,    8,    9,     63,    64,
                            65, 511, 4095, 4096, 4097, 65535, 65537, 1u << 20};
  std::mt19937_64 rng(42);
  const size_t guard = 16;
  for (uint32_t size : sizes) {
    std::vector<uint64_t> offsets = {0,
                                     1,
                                     3,
                                     7,
                                     8,
                                     4093,
                                     65539,
                                     kRegionSize - size,
                                     kRegionSize - size - 5,
                                     rng() % (kRegionSize - size)};
    if (size == (1u << 20)) offsets.resize(6);  // keep the batch inside the local buffer
    std::vector<ReadOp> ops(offsets.size());
    std::vector<ReadOp*> ptrs;
    std::vector<uint8_t*> dsts;
    size_t cursor = 5;  // unaligned destinations
    for (size_t i = 0; i < offsets.size(); ++i) {
      uint8_t* dst = local_->data() + cursor;
      ASSERT_LE(cursor + size + guard, kLocalSize);
      std::memset(dst, 0xEE, size + guard);
      Prep(ops[i], dst, offsets[i], size);
      ptrs.push_back(&ops[i]);
      dsts.push_back(dst);
      cursor += size + guard + 3;
    }
    Status s = conn_->ReadAndWait(ptrs, Deadline());
    ASSERT_TRUE(s.ok()) << "size " << size << ": " << s.ToString();
    for (size_t i = 0; i < offsets.size(); ++i) {
      ASSERT_EQ(ops[i].status.load(), ReadStatus::kOk)
          << "size " << size << " offset " << offsets[i];
      for (uint32_t b = 0; b < size; ++b) {
        ASSERT_EQ(dsts[i][b], PatternByte(offsets[i] + b))
            << "size " << size << " offset " << offsets[i] << " byte " << b;
      }
      for (size_t b = 0; b < guard; ++b) {
        ASSERT_EQ(dsts[i][size + b], 0xEE)
            << "READ wrote past its destination (size " << size << ")";
      }
    }
  }
}

TEST_P(TransportConformance, BadRkeyAndOutOfBoundsReadsFailAndTheConnectionSurvives) {
  // A region of the server's fabric that is registered but not remotely readable.
  auto local_only = server_fabric_->AllocateRegion(4096, RegionAccess::kLocal);
  ASSERT_TRUE(local_only.ok());
  uint64_t end = remote_.addr + remote_.length;
  struct Case {
    const char* what;
    uint64_t addr;
    uint32_t rkey;
    uint32_t length;
  };
  uint32_t bad_rkey = remote_.rkey ^ 0x5A5A5A5Au;
  std::vector<Case> cases = {
      {"bad rkey", remote_.addr, bad_rkey, 64},
      {"start at the end", end, remote_.rkey, 8},
      {"start beyond the end", end + 4096, remote_.rkey, 8},
      {"straddling the end", end - 10, remote_.rkey, 20},
      {"one byte past the end", end - 63, remote_.rkey, 64},
      {"before the start", remote_.addr - 8, remote_.rkey, 16},
      {"wrapping the address space", std::numeric_limits<uint64_t>::max() - 3, remote_.rkey, 16},
      {"a region without remote access", reinterpret_cast<uint64_t>((*local_only)->data()),
       (*local_only)->rkey(), 64},
  };
  uint64_t refused_before = listener_->stats().reads_refused;
  for (const Case& c : cases) {
    ReadOp op;
    op.local = local_->data();
    op.lkey = local_->lkey();
    op.remote_addr = c.addr;
    op.rkey = c.rkey;
    op.length = c.length;
    ReadOp* p = &op;
    Status s = conn_->ReadAndWait({&p, 1}, Deadline());
    ASSERT_TRUE(s.ok()) << c.what << ": " << s.ToString();
    EXPECT_EQ(op.status.load(), ReadStatus::kRemoteAccessError) << c.what;
    // The connection still works: a good READ and a Call right after.
    ReadAndCheck(conn_.get(), 4096 + 17, 333);
    EXPECT_TRUE(conn_->alive()) << c.what;
  }
  CallAndCheck(conn_.get(), 100, 1);
  // The last byte of the region is readable, exactly.
  ReadAndCheck(conn_.get(), kRegionSize - 1, 1);
  ReadAndCheck(conn_.get(), kRegionSize - 64, 64);
  if (kind_ == TransportKind::kTcp) {
    EXPECT_EQ(listener_->stats().reads_refused - refused_before, cases.size());
  }
}

TEST_P(TransportConformance, InvalidReadsAreRejectedWithoutPosting) {
  ReadOp op;
  Prep(op, local_->data(), 0, 0);
  ReadOp* p = &op;
  EXPECT_TRUE(conn_->PostReads({&p, 1}).Is(StatusCode::kInvalidArgument)) << "zero-length READ";
  Prep(op, local_->data(), 0, static_cast<uint32_t>(ConnectOptions{}.max_message_size + 1));
  EXPECT_TRUE(conn_->PostReads({&p, 1}).Is(StatusCode::kInvalidArgument)) << "oversize READ";
  EXPECT_EQ(op.status.load(), ReadStatus::kPending);
  // A batch larger than max_outstanding_reads can never be posted whole.
  ConnectOptions co;
  co.max_outstanding_reads = 4;
  auto small = Connect(co);
  ASSERT_TRUE(small.ok()) << small.status().ToString();
  std::vector<ReadOp> ops(5);
  std::vector<ReadOp*> ptrs;
  for (size_t i = 0; i < ops.size(); ++i) {
    Prep(ops[i], local_->data() + i * 64, i * 64, 64, small->get());
    ptrs.push_back(&ops[i]);
  }
  EXPECT_TRUE((*small)->PostReads(ptrs).Is(StatusCode::kInvalidArgument));
  // ReadAndWait takes any number and posts as slots free up.
  Status s = (*small)->ReadAndWait(ptrs, Deadline());
  ASSERT_TRUE(s.ok()) << s.ToString();
  for (size_t i = 0; i < ops.size(); ++i) {
    ASSERT_EQ(ops[i].status.load(), ReadStatus::kOk);
    for (size_t b = 0; b < 64; ++b) ASSERT_EQ(local_->data()[i * 64 + b], PatternByte(i * 64 + b));
  }
}

TEST_P(TransportConformance, ThousandsOfOutstandingReadsAllComplete) {
  const size_t n = Scale() < 1.0 ? 2048 : 4096;
  const size_t batch = 256;
  const uint32_t max_len = 1024;
  ConnectOptions co;
  co.max_outstanding_reads = static_cast<uint32_t>(n);
  auto conn = Connect(co);
  ASSERT_TRUE(conn.ok()) << conn.status().ToString();
  std::vector<ReadOp> ops(n);
  std::vector<ReadOp*> ptrs(n);
  std::vector<uint64_t> offsets(n);
  std::mt19937_64 rng(7);
  for (size_t i = 0; i < n; ++i) {
    uint32_t len = 1 + static_cast<uint32_t>(rng() % max_len);
    offsets[i] = rng() % (kRegionSize - len);
    uint8_t* dst = local_->data() + i * (max_len + 8) + (i % 7);
    Prep(ops[i], dst, offsets[i], len, conn->get());
    ptrs[i] = &ops[i];
  }
  // Everything is posted before anything is waited for.
  for (size_t i = 0; i < n; i += batch) {
    size_t m = std::min(batch, n - i);
    Status s = (*conn)->PostReads(std::span<ReadOp* const>(ptrs.data() + i, m));
    ASSERT_TRUE(s.ok()) << "batch at " << i << ": " << s.ToString();
  }
  size_t polled = 0;
  Clock::time_point deadline = Deadline();
  auto all_done = [&] {
    return std::all_of(ops.begin(), ops.end(), [](const ReadOp& op) { return op.done(); });
  };
  while (!all_done()) {
    polled += (*conn)->PollReads();
    ASSERT_LT(Clock::now(), deadline) << "only " << polled << " of " << n << " READs completed";
    std::this_thread::yield();
  }
  polled += (*conn)->PollReads();
  EXPECT_EQ(polled, n) << "PollReads must account for every completion once";
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(ops[i].status.load(), ReadStatus::kOk) << "READ " << i;
    for (uint32_t b = 0; b < ops[i].length; ++b) {
      ASSERT_EQ(ops[i].local[b], PatternByte(offsets[i] + b)) << "READ " << i << " byte " << b;
    }
  }
  // The slots are all free again: a full-size batch posts at once.
  for (size_t i = 0; i < batch; ++i) ptrs[i]->Reset();
  Status s = (*conn)->ReadAndWait(std::span<ReadOp* const>(ptrs.data(), batch), Deadline());
  ASSERT_TRUE(s.ok()) << s.ToString();
}

// One ReadAndWait whose READ requests alone outgrow the socket buffers (tcp: 262,144 requests
// are 9 MiB on the wire, their answers 23 MiB). The server stops taking requests while its
// answers pile up unread, so the posting thread must read the answers while it waits for room
// to send (with no receive thread, nobody else would: the send stalled and the connection
// failed after 5 s).
TEST_P(TransportConformance, AReadBatchLargerThanTheSocketBuffersCompletes) {
  if (kind_ != TransportKind::kTcp) {
    GTEST_SKIP() << "SKIPPED: a tcp property (socket buffers); a verbs QP bounds its own queue";
  }
  const size_t n = 262144;
  const uint32_t len = 64;
  ConnectOptions co;
  co.max_outstanding_reads = 1u << 20;
  auto conn = Connect(co);
  ASSERT_TRUE(conn.ok()) << conn.status().ToString();
  std::vector<ReadOp> ops(n);
  std::vector<ReadOp*> ptrs(n);
  for (size_t i = 0; i < n; ++i) {
    const uint64_t offset = (i * 4099) % (kRegionSize - len);
    Prep(ops[i], local_->data() + i * len, offset, len, conn->get());
    ptrs[i] = &ops[i];
  }
  static_assert(262144 * 64 <= kLocalSize);
  Status s = (*conn)->ReadAndWait(ptrs, Clock::now() + std::chrono::seconds(60));
  ASSERT_TRUE(s.ok()) << s.ToString();
  for (size_t i = 0; i < n; i += 97) {
    ASSERT_EQ(ops[i].status.load(), ReadStatus::kOk) << "READ " << i;
    const uint64_t offset = (i * 4099) % (kRegionSize - len);
    for (uint32_t b = 0; b < len; ++b) {
      ASSERT_EQ(ops[i].local[b], PatternByte(offset + b)) << "READ " << i << " byte " << b;
    }
  }
  EXPECT_TRUE((*conn)->alive());
}

// WaitReads waits for READs already posted, on two connections whose batches are in flight
// together (how a MultiGet fans out to several servers), and returns at once when all are done.
TEST_P(TransportConformance, WaitReadsWaitsForBatchesPostedOnSeveralConnections) {
  auto second = Connect();
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  Connection* conns[2] = {conn_.get(), second->get()};
  constexpr size_t kPer = 64;
  constexpr uint32_t kLen = 200;
  std::vector<ReadOp> ops(2 * kPer);
  std::vector<ReadOp*> ptrs(2 * kPer);
  for (size_t i = 0; i < ops.size(); ++i) {
    Prep(ops[i], local_->data() + i * 256, (i * 997) % (kRegionSize - kLen), kLen, conns[i / kPer]);
    ptrs[i] = &ops[i];
  }
  for (size_t c = 0; c < 2; ++c) {
    Status s = conns[c]->PostReads(std::span<ReadOp* const>(ptrs.data() + c * kPer, kPer));
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  for (size_t c = 0; c < 2; ++c) {
    Status s =
        conns[c]->WaitReads(std::span<ReadOp* const>(ptrs.data() + c * kPer, kPer), Deadline());
    ASSERT_TRUE(s.ok()) << s.ToString();
    for (size_t i = c * kPer; i < (c + 1) * kPer; ++i) {
      ASSERT_TRUE(ops[i].done()) << "READ " << i;
      ASSERT_EQ(ops[i].status.load(), ReadStatus::kOk) << "READ " << i;
      const uint64_t offset = (i * 997) % (kRegionSize - kLen);
      for (uint32_t b = 0; b < kLen; ++b) {
        ASSERT_EQ(ops[i].local[b], PatternByte(offset + b)) << "READ " << i << " byte " << b;
      }
    }
  }
  // All done: returns OK even with a deadline already past.
  EXPECT_TRUE(conn_->WaitReads(std::span<ReadOp* const>(ptrs.data(), kPer), Clock::now()).ok());
}

TEST_P(TransportConformance, ReadsRacingAWriterSeeOnlyOldOrNewBytes) {
  // The writer rewrites a hot area generation after generation in 8-byte words; the byte at
  // position p of generation g is base[p] + g (mod 256). A READ issued while generation g_lo was
  // complete and finished while g_hi was complete may see, at each byte, any generation in
  // [g_lo, g_hi + 1] (torn words are fine, as with a NIC's DMA) but never anything else.
  const size_t hot = 256u << 10;
  std::vector<uint8_t> base(hot);
  for (size_t p = 0; p < hot; ++p) base[p] = PatternByte(p * 3 + 1);
  uint8_t* area = region_->data();
  std::memcpy(area, base.data(), hot);
  std::atomic<uint64_t> generation{0};
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    const uint64_t lo7 = 0x7f7f7f7f7f7f7f7full, hi1 = 0x8080808080808080ull;
    for (uint64_t g = 1; !stop.load(std::memory_order_relaxed); ++g) {
      uint64_t add = (g & 0xff) * 0x0101010101010101ull;
      for (size_t w = 0; w < hot / 8; ++w) {
        uint64_t b;
        std::memcpy(&b, base.data() + w * 8, 8);
        uint64_t v = ((b & lo7) + (add & lo7)) ^ ((b ^ add) & hi1);  // bytewise b + g
        std::memcpy(area + w * 8, &v, 8);
      }
      generation.store(g, std::memory_order_release);
    }
  });
  Joiner join_writer(writer, [&] { stop = true; });
  const size_t iterations = Scaled(2000, 100);
  std::mt19937_64 rng(99);
  size_t checked = 0, spanning = 0;
  for (size_t it = 0; it < iterations && !HasFatalFailure(); ++it) {
    uint32_t len = 1 + static_cast<uint32_t>(rng() % 16384);
    uint64_t off = rng() % (hot - len);
    ReadOp op;
    uint8_t* dst = local_->data() + 1 + (it % 64);
    Prep(op, dst, off, len);
    ReadOp* p = &op;
    uint64_t g_lo = generation.load(std::memory_order_acquire);
    Status s = conn_->ReadAndWait({&p, 1}, Deadline());
    uint64_t g_hi = generation.load(std::memory_order_acquire);
    ASSERT_TRUE(s.ok()) << s.ToString();
    ASSERT_EQ(op.status.load(), ReadStatus::kOk);
    uint64_t span = g_hi + 1 - g_lo;
    if (span >= 255) continue;  // every byte value is possible: nothing to check
    ++checked;
    if (g_hi != g_lo) ++spanning;
    for (uint32_t b = 0; b < len; ++b) {
      uint8_t d = static_cast<uint8_t>(dst[b] - base[off + b]);
      uint8_t rel = static_cast<uint8_t>(d - static_cast<uint8_t>(g_lo));
      ASSERT_LE(rel, span) << "byte " << b << " of a READ at " << off
                           << " is from no generation in [" << g_lo << ", " << g_hi + 1 << "]";
    }
  }
  stop = true;
  writer.join();
  EXPECT_GT(checked, iterations / 2) << "the writer outran the READs; nothing was checked";
  RecordProperty("reads_spanning_generations", static_cast<int>(spanning));
}

// ---- two-sided calls -------------------------------------------------------------------------

TEST_P(TransportConformance, ConcurrentCallsEachGetTheirOwnResponse) {
  const int threads = 4;
  const size_t calls = Scaled(300, 20);
  std::atomic<int> failures{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      std::mt19937_64 rng(t);
      std::vector<uint8_t> response;
      for (size_t i = 0; i < calls && failures.load() == 0; ++i) {
        std::vector<uint8_t> request = MakeRequest('E', 1 + rng() % 3000, (uint64_t(t) << 32) | i);
        Status s = conn_->Call(request, &response, 20s);
        if (!s.ok() || response != Transform(request)) {
          failures.fetch_add(1);
          ADD_FAILURE() << "thread " << t << " call " << i << ": " << s.ToString()
                        << (s.ok() ? " (wrong response)" : "");
        }
      }
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(handled_.load(), threads * calls);
}

TEST_P(TransportConformance, DeferredRepliesFromAnotherThreadInAnyOrder) {
  std::vector<uint8_t> r1 = MakeRequest('D', 40, 1), r2 = MakeRequest('D', 50, 2);
  std::vector<uint8_t> resp1, resp2;
  Status s1, s2;
  std::thread c1([&] { s1 = conn_->Call(r1, &resp1, 20s); });
  Joiner join_c1(c1, [&] { listener_.reset(); });  // on failure: end the call now
  ASSERT_TRUE(WaitDeferred(1, 10s));
  std::thread c2([&] { s2 = conn_->Call(r2, &resp2, 20s); });
  Joiner join_c2(c2, [&] { listener_.reset(); });
  ASSERT_TRUE(WaitDeferred(2, 10s));
  // While two replies are deferred the workers keep serving.
  CallAndCheck(conn_.get(), 10, 3);
  std::this_thread::sleep_for(50ms);
  std::deque<Deferred> held;
  {
    std::lock_guard lock(mu_);
    held.swap(deferred_);
  }
  // Reply to the second request first, from this (non-worker) thread.
  for (auto it = held.rbegin(); it != held.rend(); ++it) {
    std::vector<uint8_t> out = Transform(it->payload);
    Status s = it->reply.session->Reply(it->reply.request_id, out);
    EXPECT_TRUE(s.ok()) << s.ToString();
  }
  c1.join();
  c2.join();
  ASSERT_TRUE(s1.ok()) << s1.ToString();
  ASSERT_TRUE(s2.ok()) << s2.ToString();
  EXPECT_EQ(resp1, Transform(r1));
  EXPECT_EQ(resp2, Transform(r2));
}

// StartCall sends and returns without waiting: one thread has calls on two connections in
// flight together (the server holds both replies until both requests are there), then finishes
// them in the order it likes. A StartCall that waited for its answer would time out here.
TEST_P(TransportConformance, OneThreadHasCallsOnTwoConnectionsInFlightTogether) {
  auto second = Connect();
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  std::vector<uint8_t> r1 = MakeRequest('D', 30, 11), r2 = MakeRequest('D', 70, 12);
  std::vector<uint8_t> resp1, resp2;
  PendingCall call1, call2;
  ASSERT_TRUE(conn_->StartCall(r1, &resp1, 5s, &call1).ok());
  std::thread replier([&] {
    if (!WaitDeferred(2, 10s)) return;  // the test fails below: the calls time out
    std::deque<Deferred> held;
    {
      std::lock_guard lock(mu_);
      held.swap(deferred_);
    }
    for (Deferred& d : held) {
      d.reply.session->Reply(d.reply.request_id, Transform(d.payload)).IgnoreError();
    }
  });
  Joiner join_replier(replier, [&] { listener_.reset(); });
  const Clock::time_point started = Clock::now();
  Status s2 = (*second)->StartCall(r2, &resp2, 2s, &call2);
  EXPECT_LT(Clock::now() - started, 1s) << "StartCall waited for the answer";
  ASSERT_TRUE(s2.ok()) << s2.ToString();
  Status f2 = (*second)->FinishCall(&call2);
  Status f1 = conn_->FinishCall(&call1);
  ASSERT_TRUE(f1.ok()) << f1.ToString();
  ASSERT_TRUE(f2.ok()) << f2.ToString();
  EXPECT_EQ(resp1, Transform(r1));
  EXPECT_EQ(resp2, Transform(r2));
  // The connections' call slots are free again: plain calls work on both.
  CallAndCheck(conn_.get(), 20, 13);
  CallAndCheck(second->get(), 20, 14);
}

// ReplyBatch: replies given on a thread while one lives reach their clients, each with its own
// answer, once the outermost batch ends. tcp holds them until then (one write per connection
// for all of them), so no answer arrives earlier, or until SendHeldNow; verbs sends at once.
TEST_P(TransportConformance, RepliesUnderAReplyBatchGoOutTogetherWhenItEnds) {
  auto second = Connect();
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  std::vector<uint8_t> r1 = MakeRequest('D', 30, 21), r2 = MakeRequest('D', 45, 22),
                       r3 = MakeRequest('D', 60, 23);
  std::vector<uint8_t> resp1, resp2, resp3;
  PendingCall call1, call2, call3;
  ASSERT_TRUE(conn_->StartCall(r1, &resp1, 20s, &call1).ok());
  ASSERT_TRUE(conn_->StartCall(r2, &resp2, 20s, &call2).ok());
  ASSERT_TRUE((*second)->StartCall(r3, &resp3, 20s, &call3).ok());
  ASSERT_TRUE(WaitDeferred(3, 10s));
  // Holding is best effort: the tcp NIC thread's receive pass that queued a request flushes
  // its session's output when it ends, and a reply that lands before that end goes out with
  // it. Let those passes end first (a few microseconds; far less than this even under ASan),
  // so that what follows sees only the batch's holding.
  std::this_thread::sleep_for(100ms);
  std::deque<Deferred> held;
  {
    std::lock_guard lock(mu_);
    held.swap(deferred_);
  }
  {
    ReplyBatch outer;
    {
      ReplyBatch inner;  // nested: its end sends nothing yet
      for (Deferred& d : held) {
        Status s = d.reply.session->Reply(d.reply.request_id, Transform(d.payload));
        EXPECT_TRUE(s.ok()) << s.ToString();
      }
    }
    if (kind_ == TransportKind::kTcp) {
      const Clock::time_point until = Clock::now() + 300ms;
      EXPECT_FALSE(conn_->WaitCall(&call1, until))
          << "a held reply went out before the batch ended";
      EXPECT_FALSE(conn_->WaitCall(&call2, until))
          << "a held reply went out before the batch ended";
      EXPECT_FALSE((*second)->WaitCall(&call3, until))
          << "a held reply went out before the batch ended";
      // SendHeldNow sends what is held while the batch stays open (code about to wait).
      ReplyBatch::SendHeldNow();
      const Clock::time_point soon = Clock::now() + 10s;
      EXPECT_TRUE(conn_->WaitCall(&call1, soon)) << "SendHeldNow did not send";
      EXPECT_TRUE(conn_->WaitCall(&call2, soon)) << "SendHeldNow did not send";
      EXPECT_TRUE((*second)->WaitCall(&call3, soon)) << "SendHeldNow did not send";
    }
  }
  Status f1 = conn_->FinishCall(&call1);
  Status f2 = conn_->FinishCall(&call2);
  Status f3 = (*second)->FinishCall(&call3);
  ASSERT_TRUE(f1.ok()) << f1.ToString();
  ASSERT_TRUE(f2.ok()) << f2.ToString();
  ASSERT_TRUE(f3.ok()) << f3.ToString();
  EXPECT_EQ(resp1, Transform(r1));
  EXPECT_EQ(resp2, Transform(r2));
  EXPECT_EQ(resp3, Transform(r3));
  // A reply outside any batch goes out at once again.
  CallAndCheck(conn_.get(), 20, 24);
}

// tcp: ListenOptions::inline_handler answers requests on the receiving thread; what it leaves
// goes to the workers as before, and it is not called while the workers are paused.
TEST_P(TransportConformance, AnInlineHandlerAnswersWhatItTakesOnTheReceivingThread) {
  if (kind_ != TransportKind::kTcp) GTEST_SKIP() << "SKIPPED: inline handlers are tcp only";
  std::atomic<int> inline_calls{0};
  std::mutex ids_mu;
  std::set<std::thread::id> inline_threads, worker_threads;
  ListenOptions lo = OptionsForANewListener(2);
  lo.handler = [&](std::span<const uint8_t> payload, ReplyHandle reply) {
    {
      std::lock_guard lock(ids_mu);
      worker_threads.insert(std::this_thread::get_id());
    }
    if (!payload.empty() && payload[0] == 'I') {  // one the inline handler could not take
      handled_.fetch_add(1);
      reply.session->Reply(reply.request_id, Transform(payload)).IgnoreError();
      return;
    }
    Handle(payload, std::move(reply));
  };
  lo.inline_handler = [&](std::span<const uint8_t> payload, std::vector<uint8_t>* response,
                          ReplyHandle*) {
    if (payload.empty() || payload[0] != 'I') return false;
    inline_calls.fetch_add(1);
    {
      std::lock_guard lock(ids_mu);
      inline_threads.insert(std::this_thread::get_id());
    }
    *response = Transform(payload);
    return true;
  };
  Status listening = StartListener(std::move(lo));
  ASSERT_TRUE(listening.ok()) << listening.ToString();
  auto conn = Connect();
  ASSERT_TRUE(conn.ok()) << conn.status().ToString();
  // One caller: nothing of its connection waits for a worker, so every 'I' is answered inline.
  for (int i = 0; i < 50; ++i) {
    std::vector<uint8_t> request = MakeRequest('I', 10 + i, 5000 + i);
    std::vector<uint8_t> response;
    ASSERT_TRUE((*conn)->Call(request, &response, 10s).ok());
    ASSERT_EQ(response, Transform(request));
  }
  EXPECT_EQ(inline_calls.load(), 50);
  EXPECT_EQ(listener_->stats().requests_inline, 50u);
  EXPECT_EQ(handled_.load(), 0u);
  // Four threads calling at once, `calls` each; op(i) picks the i-th call's kind. Returns the
  // calls that failed or got a wrong answer.
  auto call_from_threads = [&](int calls, auto op, uint64_t seed) {
    std::vector<std::thread> callers;
    std::atomic<int> wrong{0};
    for (int t = 0; t < 4; ++t) {
      callers.emplace_back([&, t] {
        for (int i = 0; i < calls; ++i) {
          std::vector<uint8_t> request = MakeRequest(op(i), 10 + i, seed + t * 1000 + i);
          std::vector<uint8_t> response;
          Status s = (*conn)->Call(request, &response, 10s);
          if (!s.ok() || response != Transform(request)) ++wrong;
        }
      });
    }
    for (std::thread& c : callers) c.join();
    return wrong.load();
  };
  // Many threads at once, 'I' only: nothing is ever queued, so all of them are answered inline,
  // and the answers of one receive pass go out together, each to its caller.
  EXPECT_EQ(call_from_threads(
                100, [](int) { return 'I'; }, 7000),
            0);
  EXPECT_EQ(inline_calls.load(), 450);
  EXPECT_EQ(handled_.load(), 0u);
  // Mixed: an 'I' behind a request of its connection still with a worker goes to the workers.
  EXPECT_EQ(call_from_threads(
                200, [](int i) { return i % 2 == 0 ? 'I' : 'E'; }, 0),
            0);
  const int answered_inline = inline_calls.load();
  EXPECT_GE(answered_inline, 450);
  EXPECT_EQ(handled_.load() + answered_inline, 1250u) << "the workers took what was left";
  EXPECT_EQ(listener_->stats().requests_inline, static_cast<uint64_t>(answered_inline));
  for (const std::thread::id& id : inline_threads) {
    EXPECT_EQ(worker_threads.count(id), 0u) << "an inline answer ran on a worker thread";
  }
  EXPECT_EQ(listener_->stats().requests, 1250u);
  // Paused workers: the inline handler does not answer either (the call times out).
  listener_->PauseWorkers(true);
  std::vector<uint8_t> response;
  EXPECT_TRUE((*conn)->Call(MakeRequest('I', 10, 1), &response, 300ms).Is(StatusCode::kTimedOut));
  listener_->PauseWorkers(false);
  EXPECT_EQ(inline_calls.load(), answered_inline);
  conn->reset();
  listener_.reset();  // its workers may still run the queued call, which uses this test's sets
}

// tcp: the inline handler does not overtake a request of the same connection that is still
// with a worker (a write that timed out at the client and the write after it must apply in the
// order they were sent); another connection's requests are still answered inline meanwhile.
TEST_P(TransportConformance, AnInlineAnswerDoesNotOvertakeItsConnectionsQueuedRequest) {
  if (kind_ != TransportKind::kTcp) GTEST_SKIP() << "SKIPPED: inline handlers are tcp only";
  std::mutex order_mu;
  std::vector<uint8_t> finished;  // each request's second byte, in the order it was answered
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<bool> slow_started{false};
  ListenOptions lo = OptionsForANewListener(1);
  lo.handler = [&](std::span<const uint8_t> payload, ReplyHandle reply) {
    if (!payload.empty() && payload[0] == 'W') {
      slow_started.store(true);
      released.wait();
    }
    {
      std::lock_guard lock(order_mu);
      finished.push_back(payload.size() > 1 ? payload[1] : 0);
    }
    reply.session->Reply(reply.request_id, Transform(payload)).IgnoreError();
  };
  lo.inline_handler = [&](std::span<const uint8_t> payload, std::vector<uint8_t>* response,
                          ReplyHandle*) {
    if (payload.empty() || payload[0] != 'I') return false;
    {
      std::lock_guard lock(order_mu);
      finished.push_back(payload.size() > 1 ? payload[1] : 0);
    }
    *response = Transform(payload);
    return true;
  };
  Status listening = StartListener(std::move(lo));
  ASSERT_TRUE(listening.ok()) << listening.ToString();
  auto conn = Connect();
  ASSERT_TRUE(conn.ok()) << conn.status().ToString();
  auto other = Connect();
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  const std::vector<uint8_t> slow = {'W', 1, 0, 0}, quick = {'I', 2, 0, 0}, elsewhere = {'I', 3};
  std::vector<uint8_t> slow_response, quick_response, elsewhere_response;
  Status slow_status;
  std::thread slow_caller([&] { slow_status = (*conn)->Call(slow, &slow_response, 20s); });
  Joiner join_slow(slow_caller, [&] {
    release.set_value();
    listener_.reset();
  });
  const Clock::time_point wait_until = Clock::now() + 10s;
  while (!slow_started.load() && Clock::now() < wait_until) std::this_thread::sleep_for(1ms);
  ASSERT_TRUE(slow_started.load()) << "the worker never took the slow request";
  PendingCall quick_call;
  ASSERT_TRUE((*conn)->StartCall(quick, &quick_response, 20s, &quick_call).ok());
  // The other connection has nothing queued: answered inline at once.
  ASSERT_TRUE((*other)->Call(elsewhere, &elsewhere_response, 10s).ok());
  EXPECT_EQ(elsewhere_response, Transform(elsewhere));
  // The listener has the quick request: counted when queued, or after an inline answer (which
  // the inline handler put in `finished` first).
  while (listener_->stats().requests < 3 && Clock::now() < wait_until) {
    std::this_thread::sleep_for(1ms);
  }
  ASSERT_GE(listener_->stats().requests, 3u) << "the quick request never reached the listener";
  {
    std::lock_guard lock(order_mu);
    EXPECT_EQ(finished, std::vector<uint8_t>({3})) << "answered before its connection's earlier "
                                                      "request";
  }
  release.set_value();
  slow_caller.join();
  ASSERT_TRUE(slow_status.ok()) << slow_status.ToString();
  Status q = (*conn)->FinishCall(&quick_call);
  ASSERT_TRUE(q.ok()) << q.ToString();
  EXPECT_EQ(quick_response, Transform(quick));
  std::lock_guard lock(order_mu);
  EXPECT_EQ(finished, std::vector<uint8_t>({3, 1, 2}));
}

TEST_P(TransportConformance, ReplyAfterTheListenerIsGoneReportsConnectionLost) {
  std::vector<uint8_t> response;
  Status call;
  std::thread c([&] { call = conn_->Call(MakeRequest('D', 8, 1), &response, 20s); });
  Joiner join_c(c, [&] { listener_.reset(); });
  ASSERT_TRUE(WaitDeferred(1, 10s));
  Deferred d;
  {
    std::lock_guard lock(mu_);
    d = std::move(deferred_.front());
    deferred_.pop_front();
  }
  listener_.reset();
  c.join();
  EXPECT_TRUE(IsConnectionFailure(call)) << call.ToString();
  Status s = d.reply.session->Reply(d.reply.request_id, d.payload);
  EXPECT_TRUE(s.Is(StatusCode::kConnectionLost)) << s.ToString();
}

TEST_P(TransportConformance, OneMebibyteRequestAndResponse) {
  CallAndCheck(conn_.get(), 1u << 20, 11);
  std::vector<uint8_t> request = {'B', 0, 0, 0, 0, 77};
  uint32_t size = 1u << 20;
  std::memcpy(request.data() + 1, &size, 4);
  std::vector<uint8_t> response;
  Status s = conn_->Call(request, &response, 20s);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(response, BigResponseFor(size, 77));
}

TEST_P(TransportConformance, OversizeRequestIsRefusedWithoutSending) {
  uint64_t before = handled_.load();
  std::vector<uint8_t> request = MakeRequest('E', ConnectOptions{}.max_message_size + 1, 5);
  std::vector<uint8_t> response;
  Status s = conn_->Call(request, &response, 5s);
  EXPECT_TRUE(s.Is(StatusCode::kInvalidArgument)) << s.ToString();
  EXPECT_TRUE(conn_->alive());
  CallAndCheck(conn_.get(), ConnectOptions{}.max_message_size, 6);  // the largest allowed
  EXPECT_EQ(handled_.load(), before + 1) << "the oversize request reached the server";
}

// A response larger than the client's max_message_size is not sent; the client's Call fails at
// once with the server's reason (tcp: a CALL_ERROR frame; verbs: an error response) instead of
// timing out, and the connection stays usable.
TEST_P(TransportConformance, ResponseLargerThanTheClientAcceptsFailsFast) {
  ConnectOptions co;
  co.max_message_size = 1000;
  auto c = Connect(co);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  std::vector<uint8_t> request(600, 'O'), response;
  const auto t0 = Clock::now();
  Status s = (*c)->Call(request, &response, 20s);
  EXPECT_TRUE(s.Is(StatusCode::kInvalidArgument)) << s.ToString();
  EXPECT_LT(Clock::now() - t0, 10s) << "timed out instead of failing fast";
  // The handler records Reply's status after Reply returns, which may be after the client
  // already has the error: wait for it.
  Status reply_status;
  for (const auto until = Clock::now() + 5s; Clock::now() < until;) {
    {
      std::lock_guard lock(mu_);
      reply_status = oversize_reply_;
    }
    if (!reply_status.ok()) break;
    std::this_thread::sleep_for(1ms);
  }
  EXPECT_TRUE(reply_status.Is(StatusCode::kInvalidArgument)) << reply_status.ToString();
  EXPECT_TRUE((*c)->alive());
  request.resize(400);
  ASSERT_TRUE((*c)->Call(request, &response, 20s).ok());
  EXPECT_EQ(response.size(), 800u);
}

TEST_P(TransportConformance, PausedWorkersTimeCallsOutWhileReadsStillComplete) {
  listener_->PauseWorkers(true);
  std::vector<uint8_t> request = MakeRequest('E', 64, 21), response;
  Clock::time_point t0 = Clock::now();
  Status s = conn_->Call(request, &response, 300ms);
  auto waited = Clock::now() - t0;
  EXPECT_TRUE(s.Is(StatusCode::kTimedOut)) << s.ToString();
  EXPECT_GE(waited, 290ms);
  EXPECT_LT(waited, 5s);
  // The server's CPU (its workers) is not needed for READs.
  uint64_t served_before = listener_->stats().reads_served;
  for (int i = 0; i < 20; ++i) ReadAndCheck(conn_.get(), 1000 + i * 4099, 100 + i * 50);
  if (kind_ == TransportKind::kTcp) {
    EXPECT_EQ(listener_->stats().reads_served - served_before, 20u);
  }
  EXPECT_EQ(handled_.load(), 0u);
  // Two more requests time out while paused; then a call is in flight (on tcp, in the very slot
  // the timed-out calls used) when the workers resume and answer all of them. The late responses
  // must be dropped: the waiting call gets its own.
  for (uint64_t seed : {22, 23}) {
    std::vector<uint8_t> late = MakeRequest('E', 64, seed);
    s = conn_->Call(late, &response, 100ms);
    EXPECT_TRUE(s.Is(StatusCode::kTimedOut)) << s.ToString();
  }
  std::vector<uint8_t> fresh = MakeRequest('E', 64, 24), fresh_response;
  Status fresh_status;
  std::thread c([&] { fresh_status = conn_->Call(fresh, &fresh_response, 20s); });
  Joiner join_c(c, [&] { listener_->PauseWorkers(false); });
  std::this_thread::sleep_for(100ms);
  listener_->PauseWorkers(false);
  c.join();
  ASSERT_TRUE(fresh_status.ok()) << fresh_status.ToString();
  EXPECT_EQ(fresh_response, Transform(fresh)) << "a late response reached a later call";
  CallAndCheck(conn_.get(), 64, 25);
  Clock::time_point deadline = Clock::now() + 5s;
  while (handled_.load() < 5 && Clock::now() < deadline) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(handled_.load(), 5u);
}

// ---- connection life cycle -------------------------------------------------------------------

TEST_P(TransportConformance, PeerDeathIsDetected) {
  listener_->PauseWorkers(true);
  Status call;
  Clock::duration call_time{};
  std::thread c([&] {
    std::vector<uint8_t> response;
    Clock::time_point t0 = Clock::now();
    call = conn_->Call(MakeRequest('E', 32, 1), &response, 20s);
    call_time = Clock::now() - t0;
  });
  std::this_thread::sleep_for(100ms);
  Clock::time_point killed = Clock::now();
  listener_.reset();
  c.join();
  EXPECT_TRUE(IsConnectionFailure(call)) << call.ToString();
  EXPECT_LT(call_time, 10s);
  while (conn_->alive() && Clock::now() - killed < 10s) std::this_thread::sleep_for(5ms);
  EXPECT_FALSE(conn_->alive());
  EXPECT_LT(Clock::now() - killed, 5s) << "the dead peer was not noticed quickly";
  ReadOp op;
  Prep(op, local_->data(), 0, 64);
  ReadOp* p = &op;
  Status s = conn_->PostReads({&p, 1});
  if (s.ok()) {
    while (!op.done()) conn_->PollReads();
    EXPECT_EQ(op.status.load(), ReadStatus::kConnectionLost);
  } else {
    EXPECT_TRUE(IsConnectionFailure(s)) << s.ToString();
  }
  std::vector<uint8_t> response;
  s = conn_->Call(MakeRequest('E', 8, 2), &response, 2s);
  EXPECT_TRUE(IsConnectionFailure(s)) << s.ToString();
}

TEST_P(TransportConformance, ClientReconnectsAfterTheServerRestartsOnTheSamePort) {
  uint16_t port = listener_->port();
  ReadAndCheck(conn_.get(), 0, 100);
  std::unique_ptr<Connection> old = std::move(conn_);
  listener_.reset();
  Clock::time_point t0 = Clock::now();
  while (old->alive() && Clock::now() - t0 < 10s) std::this_thread::sleep_for(5ms);
  EXPECT_FALSE(old->alive());
  Status started;
  for (int i = 0; i < 100; ++i) {  // the port may take a moment to be free again
    started = StartListener(port);
    if (started.ok()) break;
    std::this_thread::sleep_for(50ms);
  }
  ASSERT_TRUE(started.ok()) << started.ToString();
  ASSERT_EQ(listener_->port(), port);
  auto conn = Connect();
  ASSERT_TRUE(conn.ok()) << conn.status().ToString();
  conn_ = std::move(conn).value();
  ReadAndCheck(conn_.get(), 12345, 4000);
  CallAndCheck(conn_.get(), 500, 9);
  std::vector<uint8_t> response;
  Status s = old->Call(MakeRequest('E', 8, 2), &response, 2s);
  EXPECT_TRUE(IsConnectionFailure(s)) << s.ToString();
}

// A server checks its port before long start-up work (recovery, a restore): the fabric's
// probe finds a port another listener holds (tcp: a TCP bind; verbs: an rdma_cm bind, its own
// port space), and says the port is free once that listener is gone.
TEST_P(TransportConformance, CheckListenPortFindsAPortInUseWithoutListening) {
  const uint16_t port = listener_->port();
  Status busy = server_fabric_->CheckListenPort("--port", host_, port);
  ASSERT_FALSE(busy.ok()) << "a port a listener holds was reported free";
  EXPECT_TRUE(busy.Is(StatusCode::kUnavailable)) << busy.ToString();
  EXPECT_NE(busy.message().find("in use"), std::string::npos) << busy.ToString();
  EXPECT_NE(busy.message().find(std::to_string(port)), std::string::npos) << busy.ToString();
  EXPECT_TRUE(server_fabric_->CheckListenPort("--port", host_, 0).ok());
  // The probe itself holds nothing: the listener still serves, and once it is gone the port
  // is free (it may take a moment to be released).
  ReadAndCheck(conn_.get(), 0, 100);
  conn_.reset();
  listener_.reset();
  Status free_now;
  for (int i = 0; i < 100; ++i) {
    free_now = server_fabric_->CheckListenPort("--port", host_, port);
    if (free_now.ok()) break;
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_TRUE(free_now.ok()) << free_now.ToString();
  ASSERT_TRUE(StartListener(port).ok()) << "the probe kept the port";
}

TEST_P(TransportConformance, WrongAuthTokenIsRefusedAndTheServerKeepsServing) {
  ConnectOptions co;
  co.auth_token = "not-the-token";
  auto bad = Connect(co);
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(bad.status().Is(StatusCode::kPermissionDenied)) << bad.status().ToString();
  EXPECT_FALSE(bad.status().message().empty());
  co.auth_token = std::string(kToken) + "x";  // a longer token with the right prefix
  bad = Connect(co);
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(bad.status().Is(StatusCode::kPermissionDenied)) << bad.status().ToString();
  // Both fabrics: the client refuses the server's proof and hangs up; the server counts that
  // when it sees the hang-up (tcp) or tears the unproven session down (verbs), a moment later.
  for (int i = 0; i < 1500 && listener_->stats().connections_refused < 2; ++i) {
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_GE(listener_->stats().connections_refused, 2u);
  // The existing client and a new correct one are served.
  CallAndCheck(conn_.get(), 10, 1);
  auto good = Connect();
  ASSERT_TRUE(good.ok()) << good.status().ToString();
  ReadAndCheck(good->get(), 777, 777);
  CallAndCheck(good->get(), 10, 2);
}

std::string KindName(const testing::TestParamInfo<TransportKind>& info) {
  return std::string(TransportKindName(info.param));
}

INSTANTIATE_TEST_SUITE_P(Transports, TransportConformance,
                         testing::Values(TransportKind::kTcp, TransportKind::kVerbs), KindName);

}  // namespace
}  // namespace rdkv::transport

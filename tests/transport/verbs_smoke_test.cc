// Verbs transport: wire formats (run anywhere) and the verbs-specific behaviour on a real RDMA
// device (Soft-RoCE in the VM: tests/rxe/vm.sh -- build/.../verbs_smoke_test). The behaviour
// common to every transport is in conformance_test.cc.
#include <gtest/gtest.h>

#include <sys/resource.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "common/transport/auth.h"
#include "common/transport/verbs/verbs_wire.h"
#include "tests/transport/verbs_test_env.h"

namespace rdkv::transport {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using testing_env::VerbsEnv;

double Scale() {
  const char* s = std::getenv("RDKV_TEST_SCALE");
  double v = s != nullptr ? std::atof(s) : 1.0;
  return v > 0 ? v : 1.0;
}
size_t Scaled(size_t n, size_t at_least = 1) {
  return std::max(at_least, static_cast<size_t>(static_cast<double>(n) * Scale()));
}

std::span<const uint8_t> Bytes(std::string_view s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

// ---- wire formats: no device needed ------------------------------------------------------------

TEST(VerbsWire, HandshakeRoundTripsAndFitsRdmaCmLimits) {
  verbs::ConnectRequestData req;
  req.role = SessionRole::kAdmin;
  req.credits = 64;
  req.max_message = 12345;
  for (size_t i = 0; i < req.client_nonce.size(); ++i)
    req.client_nonce[i] = static_cast<uint8_t>(i);
  auto blob = verbs::EncodeConnectRequest(req);
  static_assert(blob.size() <= verbs::kMaxConnectData);
  std::vector<uint8_t> padded(blob.begin(), blob.end());
  padded.resize(verbs::kMaxConnectData, 0);  // IB pads the REQ private data
  verbs::ConnectRequestData back;
  ASSERT_TRUE(verbs::DecodeConnectRequest(padded, &back).ok());
  EXPECT_EQ(back.role, SessionRole::kAdmin);
  EXPECT_EQ(back.credits, 64u);
  EXPECT_EQ(back.max_message, 12345u);
  EXPECT_EQ(back.client_nonce, req.client_nonce);
  auto bad = blob;
  bad[0] ^= 1;
  EXPECT_TRUE(verbs::DecodeConnectRequest(bad, &back).Is(StatusCode::kProtocolError));
  bad = blob;
  bad[4] = 1;  // version 1 (the token digest): refused with a clear reason
  Status old = verbs::DecodeConnectRequest(bad, &back);
  EXPECT_TRUE(old.Is(StatusCode::kNotSupported)) << old.ToString();
  EXPECT_NE(old.message().find("version 1"), std::string::npos) << old.ToString();
  bad = blob;
  bad[6] = 3;  // unknown role
  EXPECT_TRUE(verbs::DecodeConnectRequest(bad, &back).Is(StatusCode::kProtocolError));
  bad = blob;
  bad[7] = 1;  // reserved
  EXPECT_TRUE(verbs::DecodeConnectRequest(bad, &back).Is(StatusCode::kProtocolError));
  EXPECT_FALSE(verbs::DecodeConnectRequest(std::span(blob).first(40), &back).ok());

  verbs::AcceptData acc;
  acc.flags = verbs::kAcceptFlagMemoryWindows;
  acc.credits = 32;
  acc.max_message = 99;
  acc.session_id = 7;
  acc.server_nonce.fill(0x5a);
  acc.server_proof.fill(0xa5);
  auto a = verbs::EncodeAccept(acc);
  static_assert(a.size() <= verbs::kMaxAcceptData);
  std::vector<uint8_t> apad(a.begin(), a.end());
  apad.resize(verbs::kMaxAcceptData, 0);
  verbs::AcceptData acc2;
  ASSERT_TRUE(verbs::DecodeAccept(apad, &acc2).ok());
  EXPECT_EQ(acc2.flags, verbs::kAcceptFlagMemoryWindows);
  EXPECT_EQ(acc2.session_id, 7u);
  EXPECT_EQ(acc2.server_nonce, acc.server_nonce);
  EXPECT_EQ(acc2.server_proof, acc.server_proof);
  EXPECT_FALSE(verbs::DecodeAccept(std::span(a).first(60), &acc2).ok());

  // The transcript is the request and the accept minus its proof: changing any byte of either
  // changes the proofs (tests/security/session_auth_test.cc covers ComputeProof itself).
  auto t = verbs::HandshakeTranscript(
      std::span<const uint8_t, verbs::kConnectRequestSize>(blob),
      std::span<const uint8_t, verbs::kAcceptHeadSize>(a.data(), verbs::kAcceptHeadSize));
  EXPECT_TRUE(std::equal(blob.begin(), blob.end(), t.begin()));
  EXPECT_TRUE(std::equal(a.begin(), a.begin() + verbs::kAcceptHeadSize, t.begin() + blob.size()));
  auth::Nonce nc{}, ns{};
  const auth::Mac p1 = auth::ComputeProof(auth::Side::kClient, "k", SessionRole::kData, nc, ns, t);
  t[10] ^= 1;  // e.g. the credits changed in flight
  EXPECT_FALSE(auth::ProofsEqual(
      p1, auth::ComputeProof(auth::Side::kClient, "k", SessionRole::kData, nc, ns, t)));

  verbs::WelcomeData w;
  w.flags = verbs::kAcceptFlagMemoryWindows;
  w.keepalive_s = 100;
  for (uint32_t i = 0; i < 9; ++i)
    w.regions.push_back({0x1000u * (i + 1), 4096u + i, 0xabc0u + i, i});
  std::vector<uint8_t> wb = verbs::EncodeWelcome(w);
  EXPECT_LE(wb.size(), verbs::kMaxFragmentPayload);
  verbs::WelcomeData w2;
  ASSERT_TRUE(verbs::DecodeWelcome(wb, &w2).ok());
  ASSERT_EQ(w2.regions.size(), 9u);
  EXPECT_EQ(w2.flags, verbs::kAcceptFlagMemoryWindows);
  EXPECT_EQ(w2.keepalive_s, 100u);
  EXPECT_EQ(w2.regions[6].rkey, 0xabc6u);
  EXPECT_EQ(w2.regions[6].length, 4102u);
  wb.push_back(0);
  EXPECT_FALSE(verbs::DecodeWelcome(wb, &w2).ok());
  EXPECT_EQ(verbs::KeepAliveSeconds(std::chrono::milliseconds(0)), 0u);
  EXPECT_EQ(verbs::KeepAliveSeconds(std::chrono::milliseconds(300'000)), 100u);
  EXPECT_EQ(verbs::KeepAliveSeconds(std::chrono::milliseconds(1'000)), 1u);
  EXPECT_EQ(verbs::KeepAliveSeconds(std::chrono::hours(1000)), 65535u);

  std::vector<uint8_t> ref = verbs::EncodeAuthRefused(StatusCode::kPermissionDenied, "no");
  Status r = verbs::DecodeAuthRefused(ref, "h:1");
  EXPECT_TRUE(r.Is(StatusCode::kPermissionDenied)) << r.ToString();
  EXPECT_NE(r.message().find("no"), std::string::npos);
  EXPECT_TRUE(verbs::DecodeAuthRefused({}, "h:1").Is(StatusCode::kProtocolError));
  ref[0] = 0;  // "OK" is never a refusal
  EXPECT_TRUE(verbs::DecodeAuthRefused(ref, "h:1").Is(StatusCode::kProtocolError));

  verbs::RejectData rej;
  rej.reason = verbs::RejectReason::kBadToken;
  rej.text = "the admin role needs an admin secret";
  std::vector<uint8_t> rb = verbs::EncodeReject(rej);
  EXPECT_LE(rb.size(), verbs::kMaxRejectData);
  rb.resize(verbs::kMaxRejectData, 0);
  verbs::RejectData rej2;
  ASSERT_TRUE(verbs::DecodeReject(rb, &rej2));
  EXPECT_EQ(rej2.text, rej.text);
  EXPECT_TRUE(verbs::RejectToStatus(rej2, "h:1").Is(StatusCode::kPermissionDenied));
  std::vector<uint8_t> zeros(148, 0);  // rdma_cm's own reject (no listener): not ours
  EXPECT_FALSE(verbs::DecodeReject(zeros, &rej2));
}

TEST(VerbsWire, FragmentHeadersAreValidated) {
  uint8_t buf[verbs::kChunkSize] = {};
  verbs::FragmentHeader h;
  h.type = verbs::MsgType::kRequest;
  h.credits = 3;
  h.id = 0x123456789;
  h.total = 20000;
  h.offset = 16320;
  h.length = 3680;
  verbs::EncodeFragmentHeader(h, buf);
  verbs::FragmentHeader out;
  const char* why = nullptr;
  ASSERT_TRUE(
      verbs::DecodeFragmentHeader(buf, verbs::kFragmentHeaderSize + 3680, 1 << 20, &out, &why))
      << why;
  EXPECT_EQ(out.id, h.id);
  EXPECT_EQ(out.credits, 3u);
  EXPECT_EQ(out.offset, 16320u);
  // Byte count disagreeing with the header, a fragment past the message end, a message over the
  // receiver's limit, a foreign buffer: all refused.
  EXPECT_FALSE(
      verbs::DecodeFragmentHeader(buf, verbs::kFragmentHeaderSize + 3679, 1 << 20, &out, &why));
  EXPECT_FALSE(
      verbs::DecodeFragmentHeader(buf, verbs::kFragmentHeaderSize + 3680, 19999, &out, &why));
  h.offset = 16321;
  verbs::EncodeFragmentHeader(h, buf);
  EXPECT_FALSE(
      verbs::DecodeFragmentHeader(buf, verbs::kFragmentHeaderSize + 3680, 1 << 20, &out, &why));
  buf[28] ^= 0xFF;
  EXPECT_FALSE(
      verbs::DecodeFragmentHeader(buf, verbs::kFragmentHeaderSize + 3680, 1 << 20, &out, &why));
  EXPECT_FALSE(verbs::DecodeFragmentHeader(buf, 10, 1 << 20, &out, &why));
  verbs::FragmentHeader credit;
  credit.type = verbs::MsgType::kCredit;
  credit.credits = 16;
  verbs::EncodeFragmentHeader(credit, buf);
  EXPECT_TRUE(verbs::DecodeFragmentHeader(buf, verbs::kFragmentHeaderSize, 100, &out, &why));
  EXPECT_FALSE(verbs::DecodeFragmentHeader(buf, verbs::kFragmentHeaderSize + 1, 100, &out, &why));
}

TEST(VerbsWire, NoDeviceMeansUnavailable) {
  std::string why;
  if (RdmaDeviceAvailable(&why)) GTEST_SKIP() << "an RDMA device exists here: " << why;
  FabricOptions fo;
  fo.kind = TransportKind::kVerbs;
  auto f = Fabric::Create(fo);
  ASSERT_FALSE(f.ok());
  EXPECT_TRUE(f.status().Is(StatusCode::kUnavailable)) << f.status().ToString();
}

// ---- on a device
// ---------------------------------------------------------------------------------

class VerbsSmoke : public VerbsEnv {
 protected:
  // Every connection, on a thread of its own, makes `calls` echo calls of a multi-fragment
  // request (20 KB, three fragments) at once; returns how many failed (each is reported).
  int ConcurrentMultiFragmentCalls(std::vector<std::unique_ptr<Connection>>& conns, int calls) {
    std::atomic<int> failures{0};
    std::vector<std::thread> ts;
    for (size_t i = 0; i < conns.size(); ++i) {
      ts.emplace_back([&, i] {
        std::vector<uint8_t> request(20000 + i, static_cast<uint8_t>(i)), response;
        for (int k = 0; k < calls; ++k) {
          Status s = conns[i]->Call(request, &response, 60s);
          if (!s.ok() || response != request) {
            failures.fetch_add(1);
            ADD_FAILURE() << "connection " << i << ": " << s.ToString();
          }
        }
      });
    }
    for (auto& t : ts) t.join();
    return failures.load();
  }
};

TEST_F(VerbsSmoke, ConnectReadAndCall) {
  EXPECT_EQ(server_fabric_->kind(), TransportKind::kVerbs);
  EXPECT_EQ(server_fabric_->Describe().rfind("verbs ", 0), 0u) << server_fabric_->Describe();
  ASSERT_TRUE(Listen(Echo()).ok());
  auto c = Connect();
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  conn_ = std::move(c).value();
  EXPECT_TRUE(conn_->alive());
  EXPECT_EQ(conn_->peer().rfind("verbs ", 0), 0u);
  ASSERT_EQ(conn_->regions().size(), 1u);
  const RegionDescriptor r = conn_->regions()[0];
  EXPECT_EQ(r.addr, reinterpret_cast<uint64_t>(region_->data()));
  EXPECT_EQ(r.length, kRegionSize);
  // Type-2 windows (rxe has them): this connection's own rkey, never the MR's.
  if (dynamic_cast<VerbsConnection*>(conn_.get())->per_connection_windows()) {
    EXPECT_NE(r.rkey, region_->rkey());
  } else {
    EXPECT_EQ(r.rkey, region_->rkey());
  }
  EXPECT_EQ(r.layout_version, 3u);

  // One batch of three READs, one doorbell, reaped with PollReads.
  ReadOp ops[3];
  const uint64_t offsets[3] = {0, 777, kRegionSize - 64};
  const uint32_t lengths[3] = {64, 5000, 64};
  ReadOp* ptrs[3];
  for (int i = 0; i < 3; ++i) {
    ops[i].local = local_->data() + i * 8192;
    ops[i].lkey = local_->lkey();
    ops[i].remote_addr = r.addr + offsets[i];
    ops[i].rkey = r.rkey;
    ops[i].length = lengths[i];
    ptrs[i] = &ops[i];
  }
  ASSERT_TRUE(conn_->PostReads(ptrs).ok());
  size_t reaped = 0;
  const auto deadline = Clock::now() + 30s;
  while (reaped < 3 && Clock::now() < deadline) reaped += conn_->PollReads();
  ASSERT_EQ(reaped, 3u);
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(ops[i].status.load(), ReadStatus::kOk);
    for (uint32_t b = 0; b < lengths[i]; ++b) {
      ASSERT_EQ(ops[i].local[b], testing_env::RegionByte(offsets[i] + b)) << i << " " << b;
    }
  }

  std::vector<uint8_t> response;
  for (size_t size : {size_t{0}, size_t{1}, size_t{8160}, size_t{8161}, size_t{100000}}) {
    std::vector<uint8_t> request(size);
    for (size_t i = 0; i < size; ++i) request[i] = static_cast<uint8_t>(i * 13 + size);
    Status s = conn_->Call(request, &response, 20s);
    ASSERT_TRUE(s.ok()) << size << ": " << s.ToString();
    EXPECT_EQ(response, request) << size;
  }
  EXPECT_EQ(listener_->stats().requests, 5u);
  EXPECT_EQ(listener_->stats().connections_accepted, 1u);
}

TEST_F(VerbsSmoke, WrongTokenIsPermissionDeniedBeforeAnythingIsRevealed) {
  ASSERT_TRUE(Listen(Echo()).ok());
  ConnectOptions co;
  co.auth_token = "wrong";
  auto bad = Connect(co);
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(bad.status().Is(StatusCode::kPermissionDenied)) << bad.status().ToString();
  // The client refused the server's proof and left; the server counts the unproven session as
  // refused when it tears it down.
  const auto until = Clock::now() + 15s;
  while (listener_->stats().connections_refused < 1 && Clock::now() < until) {
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_EQ(listener_->stats().connections_refused, 1u);
  EXPECT_EQ(listener_->stats().connections_accepted, 0u);
  auto good = Connect();
  ASSERT_TRUE(good.ok()) << good.status().ToString();
  EXPECT_TRUE(ReadAndCheck(good->get(), 100, 100));
}

TEST_F(VerbsSmoke, NoListenerIsUnavailable) {
  ASSERT_TRUE(Listen(Echo()).ok());
  ConnectOptions co;
  co.host = host_;
  co.port = static_cast<uint16_t>(listener_->port() + 1);
  co.auth_token = kToken;
  co.connect_timeout = 5s;
  auto c = client_fabric_->Connect(co);
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(c.status().Is(StatusCode::kUnavailable)) << c.status().ToString();
}

TEST_F(VerbsSmoke, ReadsOutsideTheRegionsAreRefusedLocallyAndTheConnectionLives) {
  ASSERT_TRUE(Listen(Echo()).ok());
  auto c = Connect();
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const RegionDescriptor r = (*c)->regions()[0];
  EXPECT_EQ(ReadOnce(c->get(), r.addr, r.rkey ^ 0x100, 8), ReadStatus::kRemoteAccessError);
  EXPECT_EQ(ReadOnce(c->get(), r.addr + r.length - 4, r.rkey, 8), ReadStatus::kRemoteAccessError);
  EXPECT_TRUE((*c)->alive());
  EXPECT_TRUE(ReadAndCheck(c->get(), r.length - 8, 8));
}

TEST_F(VerbsSmoke, ReadRefusedByTheNicKillsOnlyThatConnection) {
  ASSERT_TRUE(Listen(Echo()).ok());
  auto victim = Connect();
  auto bystander = Connect();
  ASSERT_TRUE(victim.ok() && bystander.ok());
  auto* hooks = dynamic_cast<VerbsConnection*>(victim->get());
  ASSERT_NE(hooks, nullptr);
  hooks->SetLocalReadCheckForTest(false);  // let the NIC see the bad READ
  const RegionDescriptor r = (*victim)->regions()[0];
  // Past the end of the registration: the responder NAKs it (remote access error), and on RC
  // that moves the requester's queue pair to the error state.
  EXPECT_EQ(ReadOnce(victim->get(), r.addr + r.length - 4, r.rkey, 64),
            ReadStatus::kRemoteAccessError);
  EXPECT_FALSE((*victim)->alive());
  ReadOp op;
  op.local = local_->data();
  op.lkey = local_->lkey();
  op.remote_addr = r.addr;
  op.rkey = r.rkey;
  op.length = 8;
  ReadOp* p = &op;
  EXPECT_TRUE((*victim)->PostReads({&p, 1}).Is(StatusCode::kConnectionLost));
  std::vector<uint8_t> resp;
  EXPECT_TRUE((*victim)->Call(Bytes("x"), &resp, 2s).Is(StatusCode::kConnectionLost));
  // Other connections, and new ones, are untouched.
  EXPECT_TRUE(ReadAndCheck(bystander->get(), 0, 4096));
  ASSERT_TRUE((*bystander)->Call(Bytes("still here"), &resp, 10s).ok());
  auto fresh = Connect();
  ASSERT_TRUE(fresh.ok()) << fresh.status().ToString();
  EXPECT_TRUE(ReadAndCheck(fresh->get(), 12345, 3000));
}

TEST_F(VerbsSmoke, CreditsHoldUnderConcurrentMultiFragmentCalls) {
  ASSERT_TRUE(Listen(Echo(), 256, 0, 3).ok());
  auto c = Connect();
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  conn_ = std::move(c).value();
  const int threads = 6;
  const size_t calls = Scaled(60, 8);
  std::atomic<int> failures{0};
  std::atomic<bool> stop_reads{false};
  std::thread reader([&] {
    // READs share the send queue and the CQ with the SENDs: keep some in flight throughout.
    while (!stop_reads.load() && failures.load() == 0) {
      if (!ReadAndCheck(conn_.get(), 4096, 2048)) failures.fetch_add(1);
    }
  });
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      std::mt19937_64 rng(t * 7 + 1);
      std::vector<uint8_t> response;
      for (size_t i = 0; i < calls && failures.load() == 0; ++i) {
        // Mostly small, sometimes many fragments (up to ~20 per message).
        size_t size = rng() % 4 == 0 ? rng() % 160000 : rng() % 2000;
        std::vector<uint8_t> request(size);
        for (size_t b = 0; b < size; ++b) request[b] = static_cast<uint8_t>(rng());
        Status s = conn_->Call(request, &response, 60s);
        if (!s.ok() || response != request) {
          failures.fetch_add(1);
          ADD_FAILURE() << "thread " << t << " call " << i << " (" << size
                        << " bytes): " << s.ToString();
        }
      }
    });
  }
  for (auto& t : ts) t.join();
  stop_reads = true;
  reader.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_TRUE(conn_->alive());
  EXPECT_EQ(listener_->stats().protocol_errors, 0u);
}

TEST_F(VerbsSmoke, ManyConnectionsGrowTheSharedReceiveQueue) {
  ASSERT_TRUE(Listen(Echo()).ok());
  const size_t n = Scaled(24, 8);
  std::vector<std::unique_ptr<Connection>> conns;
  for (size_t i = 0; i < n; ++i) {
    auto c = Connect();
    ASSERT_TRUE(c.ok()) << i << ": " << c.status().ToString();
    conns.push_back(std::move(c).value());
  }
  // Every connection sends a multi-fragment request at once: each uses its own credits, all
  // backed by the one SRQ.
  EXPECT_EQ(ConcurrentMultiFragmentCalls(conns, 3), 0);
  EXPECT_EQ(listener_->stats().connections_accepted, n);
}

TEST_F(VerbsSmoke, ConnectionLimitAndSlotsComeBackAfterDisconnect) {
  ASSERT_TRUE(Listen(Echo(), /*max_connections=*/3).ok());
  std::vector<std::unique_ptr<Connection>> conns;
  for (int i = 0; i < 3; ++i) {
    auto c = Connect();
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    conns.push_back(std::move(c).value());
  }
  auto extra = Connect();
  ASSERT_FALSE(extra.ok());
  EXPECT_TRUE(extra.status().Is(StatusCode::kUnavailable)) << extra.status().ToString();
  conns.clear();  // disconnect all three; the server tears their sessions down
  Status last;
  for (int i = 0; i < 3; ++i) {
    Result<std::unique_ptr<Connection>> c = Status::Unavailable("not tried");
    for (int attempt = 0; attempt < 100; ++attempt) {
      c = Connect();
      if (c.ok()) break;
      std::this_thread::sleep_for(100ms);
    }
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    EXPECT_TRUE(ReadAndCheck(c->get(), 10, 10));
    conns.push_back(std::move(c).value());
  }
}

// More sessions than one CQ holds go to several receive groups (a CQ and an SRQ each): every
// session serves calls of several fragments and READs, concurrently across the groups, and a
// group's places come back after its sessions leave.
TEST_F(VerbsSmoke, SessionsSpreadOverSeveralCqsAllServe) {
  constexpr int kConns = 7;
  ASSERT_TRUE(Listen(Echo(), kConns, 0, /*workers=*/2, /*sessions_per_cq=*/2).ok());
  auto round = [&](std::vector<std::unique_ptr<Connection>>& conns) {
    // Three fragments per call, so the reposts of one worker batch span several groups; 30
    // calls: each group's buffers go round its SRQ (64 for two sessions) more than once.
    int failures = ConcurrentMultiFragmentCalls(conns, 30);
    for (int i = 0; i < kConns; ++i) {  // one at a time: ReadAndCheck shares one local buffer
      ::testing::AssertionResult read = ReadAndCheck(conns[i].get(), 4096 * i + 8, 128);
      if (!read) {
        ++failures;
        ADD_FAILURE() << "connection " << i << ": " << read.message();
      }
    }
    return failures;
  };
  std::vector<std::unique_ptr<Connection>> conns;
  for (int i = 0; i < kConns; ++i) {
    auto c = Connect();
    ASSERT_TRUE(c.ok()) << "connection " << i << ": " << c.status().ToString();
    conns.push_back(std::move(c).value());
  }
  EXPECT_EQ(round(conns), 0);
  auto extra = Connect();
  ASSERT_FALSE(extra.ok());
  EXPECT_TRUE(extra.status().Is(StatusCode::kUnavailable)) << extra.status().ToString();
  conns.clear();  // every group empties; their sessions are torn down
  for (int i = 0; i < kConns; ++i) {
    Result<std::unique_ptr<Connection>> c = Status::Unavailable("not tried");
    for (int attempt = 0; attempt < 100; ++attempt) {
      c = Connect();
      if (c.ok()) break;
      std::this_thread::sleep_for(100ms);
    }
    ASSERT_TRUE(c.ok()) << "reconnect " << i << ": " << c.status().ToString();
    conns.push_back(std::move(c).value());
  }
  EXPECT_EQ(round(conns), 0);
}

// A listener takes as many connections as the device's CQs allow in up to 64 groups, and says
// what it would need beyond that.
TEST_F(VerbsSmoke, MaxConnectionsBeyondOneCqStartsAndBeyondAllCqsIsRefused) {
  ASSERT_TRUE(Listen(Echo(), /*max_connections=*/4000).ok());  // rxe: about 667 per CQ
  auto c = Connect();
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(ReadAndCheck(c->get(), 100, 100));
  c->reset();
  listener_.reset();
  Status s = Listen(Echo(), /*max_connections=*/100000000);
  EXPECT_TRUE(s.Is(StatusCode::kInvalidArgument)) << s.ToString();
  EXPECT_NE(s.message().find("CQs"), std::string::npos) << s.ToString();
}

TEST_F(VerbsSmoke, ResponseLargerThanTheClientAcceptsFailsFast) {
  ASSERT_TRUE(Listen([](std::span<const uint8_t> p, ReplyHandle r) {
                std::vector<uint8_t> big(p.size() * 2, 1);
                Status s = r.session->Reply(r.request_id, big);
                if (p.size() > 500 && !s.Is(StatusCode::kInvalidArgument)) {
                  ADD_FAILURE() << "Reply over the client's limit: " << s.ToString();
                }
              }).ok());
  ConnectOptions co;
  co.max_message_size = 1000;
  auto c = Connect(co);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  std::vector<uint8_t> req(600, 2), resp;
  const auto t0 = Clock::now();
  Status s = (*c)->Call(req, &resp, 20s);
  EXPECT_TRUE(s.Is(StatusCode::kInvalidArgument)) << s.ToString();
  EXPECT_LT(Clock::now() - t0, 10s);
  req.resize(400);
  ASSERT_TRUE((*c)->Call(req, &resp, 20s).ok());
  EXPECT_EQ(resp.size(), 800u);
}

TEST_F(VerbsSmoke, IdleFabricsListenerAndConnectionBurnNoCpu) {
  ASSERT_TRUE(Listen(Echo(), 256, 0, /*workers=*/4).ok());
  auto c = Connect();
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  std::vector<uint8_t> resp;
  ASSERT_TRUE((*c)->Call(Bytes("warm up"), &resp, 10s).ok());
  std::this_thread::sleep_for(200ms);  // let the spinning waiter settle into its blocking wait
  auto cpu = [] {
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);  // every thread of the process
    return std::chrono::seconds(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
           std::chrono::microseconds(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
  };
  const auto before = cpu();
  std::this_thread::sleep_for(2s);
  const auto used = cpu() - before;
  // Two fabric threads, a cm thread and four workers, all idle: they sleep in poll()/condition
  // variables. A spinning thread would use about 2 s here.
  EXPECT_LT(used, 300ms) << "idle transport threads used "
                         << std::chrono::duration_cast<std::chrono::milliseconds>(used).count()
                         << " ms";
  ASSERT_TRUE((*c)->Call(Bytes("still works"), &resp, 10s).ok());
}

}  // namespace
}  // namespace rdkv::transport

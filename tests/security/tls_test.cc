// TLS for the tcp transport (docs/security.md "TLS (tcp)"): round trips of calls and one-sided
// READs inside TLS, plaintext/TLS mismatches both ways, a CA that did not sign the server, mutual
// TLS, and a socket that never starts (or never finishes) TLS being cut at the handshake
// deadline while a good client still gets in. The PKI is made at test time by
// tls_make_certs.sh (the openssl CLI) in a temporary directory.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "common/transport/transport.h"
#include "tests/security/session_raw_client.h"

namespace rdkv::transport {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr char kSecret[] = "tls-test-data-secret";

class TlsTransport : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    char tmpl[] = "/tmp/rdkv-tls-test.XXXXXX";
    const char* dir = mkdtemp(tmpl);
    ASSERT_NE(dir, nullptr);
    dir_ = new std::string(dir);
    std::string cmd = std::string(RDKV_TLS_CERTS_SCRIPT) + " " + *dir_ + " >/dev/null 2>&1";
    certs_ok_ = std::system(cmd.c_str()) == 0;
  }
  static void TearDownTestSuite() {
    if (dir_ != nullptr) std::filesystem::remove_all(*dir_);
    delete dir_;
    dir_ = nullptr;
  }

  void SetUp() override {
    if (!certs_ok_) {
      GTEST_SKIP() << "SKIPPED: could not make the test certificates with the openssl CLI ("
                   << RDKV_TLS_CERTS_SCRIPT << ")";
    }
    auto f = Fabric::Create({TransportKind::kTcp, "", false});
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    fabric_ = std::move(f).value();
    auto r = fabric_->AllocateRegion(4 << 20, RegionAccess::kRemoteRead);
    ASSERT_TRUE(r.ok());
    region_ = std::move(r).value();
    for (size_t i = 0; i < region_->size(); ++i) region_->data()[i] = static_cast<uint8_t>(i * 7);
    auto l = fabric_->AllocateRegion(4 << 20, RegionAccess::kLocal);
    ASSERT_TRUE(l.ok());
    local_ = std::move(l).value();
  }
  void TearDown() override { listener_.reset(); }

  static std::string File(const char* name) { return *dir_ + "/" + name; }
  static TlsOptions ServerTls() {
    TlsOptions t;
    t.cert_file = File("server.pem");
    t.key_file = File("server.key");
    return t;
  }
  static TlsOptions ClientTls(const char* ca = "ca.pem") {
    TlsOptions t;
    t.ca_file = File(ca);
    return t;
  }

  void Listen(TlsOptions tls, std::chrono::milliseconds handshake_timeout = 2000ms,
              uint32_t max_handshakes = 256) {
    ListenOptions lo;
    lo.host = "127.0.0.1";
    lo.auth_token = kSecret;
    lo.tls = std::move(tls);
    lo.handshake_timeout = handshake_timeout;
    lo.max_handshakes = max_handshakes;
    lo.regions = {region_->Describe(1)};
    lo.handler = [](std::span<const uint8_t> p, ReplyHandle r) {
      // The answer is the request with every byte incremented: shows it was read, not echoed
      // by something in between.
      std::vector<uint8_t> out(p.begin(), p.end());
      for (uint8_t& b : out) ++b;
      r.session->Reply(r.request_id, out).IgnoreError();
    };
    auto l = fabric_->Listen(std::move(lo));
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    listener_ = std::move(l).value();
  }

  Result<std::unique_ptr<Connection>> Connect(TlsOptions tls, std::string host = "127.0.0.1") {
    ConnectOptions co;
    co.host = std::move(host);
    co.port = listener_->port();
    co.auth_token = kSecret;
    co.tls = std::move(tls);
    co.connect_timeout = 5s;
    return fabric_->Connect(co);
  }

  // A call and a READ batch on `c`, checked byte for byte.
  void RoundTrip(Connection* c, size_t call_bytes) {
    std::vector<uint8_t> req(call_bytes), resp;
    for (size_t i = 0; i < req.size(); ++i) req[i] = static_cast<uint8_t>(i * 13 + 1);
    Status s = c->Call(req, &resp, 10s);
    ASSERT_TRUE(s.ok()) << s.ToString();
    ASSERT_EQ(resp.size(), req.size());
    for (size_t i = 0; i < req.size(); ++i) {
      ASSERT_EQ(resp[i], static_cast<uint8_t>(req[i] + 1)) << "byte " << i;
    }
    const RegionDescriptor& rd = c->regions().at(0);
    constexpr int kReads = 8;
    constexpr uint32_t kLen = 64 << 10;
    ReadOp ops[kReads];
    ReadOp* ptrs[kReads];
    for (int i = 0; i < kReads; ++i) {
      ops[i].local = local_->data() + i * kLen;
      ops[i].lkey = local_->lkey();
      ops[i].remote_addr = rd.addr + 4096 + i * 3 * kLen;
      ops[i].rkey = rd.rkey;
      ops[i].length = kLen;
      ptrs[i] = &ops[i];
    }
    s = c->ReadAndWait(ptrs, Clock::now() + 10s);
    ASSERT_TRUE(s.ok()) << s.ToString();
    for (int i = 0; i < kReads; ++i) {
      ASSERT_EQ(ops[i].status.load(), ReadStatus::kOk);
      ASSERT_EQ(0, std::memcmp(ops[i].local, region_->data() + 4096 + i * 3 * kLen, kLen));
    }
  }

  static std::string* dir_;
  static bool certs_ok_;
  std::unique_ptr<Fabric> fabric_;
  std::unique_ptr<MemoryRegion> region_;
  std::unique_ptr<MemoryRegion> local_;
  std::unique_ptr<Listener> listener_;
};

std::string* TlsTransport::dir_ = nullptr;
bool TlsTransport::certs_ok_ = false;

TEST_F(TlsTransport, CallsAndReadsRoundTripInsideTls) {
  Listen(ServerTls());
  auto c = Connect(ClientTls());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_NE((*c)->peer().find("tls"), std::string::npos) << (*c)->peer();
  RoundTrip(c->get(), 100);
  RoundTrip(c->get(), 1000000);  // many TLS records, partial writes on both sides
  // By DNS name too (the certificate has DNS:localhost).
  auto by_name = Connect(ClientTls(), "localhost");
  ASSERT_TRUE(by_name.ok()) << by_name.status().ToString();
  RoundTrip(by_name->get(), 1000);
  EXPECT_EQ(listener_->stats().connections_accepted, 2u);
}

// Senders on several threads while one of the waiting callers reads: the TLS stream is shared.
TEST_F(TlsTransport, ConcurrentCallsAndReadsOnOneTlsConnection) {
  Listen(ServerTls());
  auto c = Connect(ClientTls());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  Connection* conn = c->get();
  const RegionDescriptor rd = conn->regions().at(0);
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) {
        std::vector<uint8_t> req(1 + (i * 997 + t) % 20000, static_cast<uint8_t>(t)), resp;
        if (!conn->Call(req, &resp, 10s).ok() || resp.size() != req.size() ||
            resp[0] != static_cast<uint8_t>(t + 1)) {
          bad.fetch_add(1);
        }
        ReadOp op;
        op.local = local_->data() + t * 8192;
        op.lkey = local_->lkey();
        op.remote_addr = rd.addr + i * 100;
        op.rkey = rd.rkey;
        op.length = 4096;
        ReadOp* p = &op;
        if (!conn->ReadAndWait({&p, 1}, Clock::now() + 10s).ok() ||
            op.status.load() != ReadStatus::kOk ||
            std::memcmp(op.local, region_->data() + i * 100, 4096) != 0) {
          bad.fetch_add(1);
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
}

TEST_F(TlsTransport, APlaintextClientIsToldTheServerRequiresTls) {
  Listen(ServerTls());
  auto plain = Connect({});
  ASSERT_FALSE(plain.ok());
  EXPECT_EQ(plain.status().code(), StatusCode::kUnavailable) << plain.status().ToString();
  EXPECT_NE(plain.status().message().find("requires TLS"), std::string::npos)
      << plain.status().ToString();
  std::printf("plaintext client to a TLS server: %s\n", plain.status().ToString().c_str());
  auto good = Connect(ClientTls());  // the server serves on
  ASSERT_TRUE(good.ok()) << good.status().ToString();
  RoundTrip(good->get(), 10);
}

TEST_F(TlsTransport, ATlsClientIsToldTheServerSpeaksPlaintext) {
  Listen({});
  auto tls = Connect(ClientTls());
  ASSERT_FALSE(tls.ok());
  EXPECT_EQ(tls.status().code(), StatusCode::kUnavailable) << tls.status().ToString();
  EXPECT_NE(tls.status().message().find("plaintext"), std::string::npos) << tls.status().ToString();
  std::printf("TLS client to a plaintext server: %s\n", tls.status().ToString().c_str());
  auto good = Connect({});
  ASSERT_TRUE(good.ok()) << good.status().ToString();
  RoundTrip(good->get(), 10);
}

TEST_F(TlsTransport, AServerTheCaDidNotSignIsRefused) {
  Listen(ServerTls());
  auto wrong = Connect(ClientTls("other-ca.pem"));
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(wrong.status().message().find("certificate verify failed"), std::string::npos)
      << wrong.status().ToString();
  std::printf("a CA that did not sign the server: %s\n", wrong.status().ToString().c_str());
  auto good = Connect(ClientTls());
  ASSERT_TRUE(good.ok()) << good.status().ToString();
}

// A certificate from the right CA, but for another name than the address connected to: the
// name check refuses it.
TEST_F(TlsTransport, ACertificateForAnotherNameIsRefused) {
  TlsOptions wrong_name;
  wrong_name.cert_file = File("wrongname.pem");
  wrong_name.key_file = File("wrongname.key");
  Listen(wrong_name);
  auto impostor = Connect(ClientTls());
  ASSERT_FALSE(impostor.ok());
  EXPECT_NE(impostor.status().message().find("mismatch"), std::string::npos)
      << impostor.status().ToString();
  std::printf("a certificate for another name: %s\n", impostor.status().ToString().c_str());
  auto by_name = Connect(ClientTls(), "localhost");
  ASSERT_FALSE(by_name.ok());
  EXPECT_NE(by_name.status().message().find("mismatch"), std::string::npos)
      << by_name.status().ToString();
}

TEST_F(TlsTransport, MutualTlsRequiresAClientCertificateFromTheCa) {
  TlsOptions server = ServerTls();
  server.ca_file = File("ca.pem");
  server.require_client_cert = true;
  Listen(server);
  auto without = Connect(ClientTls());
  EXPECT_FALSE(without.ok());
  TlsOptions wrong = ClientTls();
  wrong.cert_file = File("other.pem");  // signed by the other CA
  wrong.key_file = File("other.key");
  auto with_wrong = Connect(wrong);
  EXPECT_FALSE(with_wrong.ok());
  TlsOptions with = ClientTls();
  with.cert_file = File("client.pem");
  with.key_file = File("client.key");
  auto good = Connect(with);
  ASSERT_TRUE(good.ok()) << good.status().ToString();
  RoundTrip(good->get(), 100);
}

// Reads until EOF or an error (the server cut the socket) or the deadline.
bool CutBefore(int fd, Clock::time_point deadline) {
  while (Clock::now() < deadline) {
    uint8_t buf[256];
    ssize_t n = recv(fd, buf, sizeof buf, 0);  // RawConnect sets a receive timeout
    if (n == 0) return true;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return true;
  }
  return false;
}

TEST_F(TlsTransport, ASocketThatNeverFinishesTlsIsCutAtTheHandshakeDeadline) {
  Listen(ServerTls(), 500ms);
  // One opens TCP and sends nothing; one starts a TLS record and stops.
  int silent = tcp::rawtest::RawConnect(listener_->port(), nullptr, 1);
  int partial = tcp::rawtest::RawConnect(listener_->port(), nullptr, 1);
  ASSERT_GE(silent, 0);
  ASSERT_GE(partial, 0);
  const uint8_t start[] = {0x16, 0x03, 0x01, 0x01, 0x00, 0x01};
  ASSERT_EQ(send(partial, start, sizeof start, MSG_NOSIGNAL), static_cast<ssize_t>(sizeof start));
  auto good = Connect(ClientTls());  // gets in while they hang
  ASSERT_TRUE(good.ok()) << good.status().ToString();
  RoundTrip(good->get(), 10);
  const auto deadline = Clock::now() + 15s;
  EXPECT_TRUE(CutBefore(silent, deadline));
  EXPECT_TRUE(CutBefore(partial, deadline));
  EXPECT_GE(listener_->stats().handshakes_timed_out, 2u);
  close(silent);
  close(partial);
  EXPECT_TRUE(good->get()->alive());
  RoundTrip(good->get(), 10);
}

// Sockets in the TLS handshake count against max_handshakes: a flood of them is evicted
// oldest first and a good client still gets in.
TEST_F(TlsTransport, SocketsInTheTlsHandshakeCountAgainstTheHandshakeLimit) {
  Listen(ServerTls(), 10s, /*max_handshakes=*/4);
  std::vector<int> fds;
  for (int i = 0; i < 12; ++i) {
    int fd = tcp::rawtest::RawConnect(listener_->port(), nullptr, 1);
    ASSERT_GE(fd, 0);
    fds.push_back(fd);
  }
  auto good = Connect(ClientTls());
  ASSERT_TRUE(good.ok()) << good.status().ToString();
  RoundTrip(good->get(), 10);
  // The accept thread has taken in at least the 12 before the good one.
  EXPECT_GE(listener_->stats().handshakes_evicted, 12u - 4u + 1u - 1u);
  EXPECT_TRUE(CutBefore(fds.front(), Clock::now() + 5s));  // the oldest was evicted
  for (int fd : fds) close(fd);
}

TEST_F(TlsTransport, BadFilesAreClearErrors) {
  ListenOptions lo;
  lo.handler = [](std::span<const uint8_t>, ReplyHandle) {};
  lo.tls.cert_file = File("server.pem");
  lo.tls.key_file = File("client.key");  // not this certificate's key
  auto l = fabric_->Listen(lo);
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(l.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(l.status().message().find("does not match"), std::string::npos)
      << l.status().ToString();
  lo.tls.key_file = File("missing.key");
  l = fabric_->Listen(lo);
  ASSERT_FALSE(l.ok());
  EXPECT_NE(l.status().message().find("missing.key"), std::string::npos) << l.status().ToString();
  lo.tls = {};
  lo.tls.ca_file = File("ca.pem");  // a CA alone does not make a TLS server
  EXPECT_FALSE(fabric_->Listen(lo).ok());
  Listen(ServerTls());
  TlsOptions missing_ca;
  missing_ca.ca_file = File("nope.pem");
  auto c = Connect(missing_ca);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("nope.pem"), std::string::npos) << c.status().ToString();
}

}  // namespace
}  // namespace rdkv::transport

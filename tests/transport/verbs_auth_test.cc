// Session security of the verbs transport, on a real verbs device (the Soft-RoCE VM):
//   * the handshake is a mutual challenge-response (docs/security.md "The handshake (verbs)"):
//     a replayed or forged proof, a wrong secret and an impostor server are all refused, and the
//     server keeps serving;
//   * roles (data/admin) are granted as on tcp;
//   * per-connection type-2 memory windows (ReDMArk): each connection's rkey works on its own
//     queue pair only, dies with its connection, and the region's MR rkey reads nothing; a
//     client that has not proved itself can READ nothing at all;
//   * admission: unproven sessions limited per source, idle sessions closed (a client that only
//     READs keeps its session by keep-alives);
//   * revocation: rotating a secret closes the sessions that proved it, and their rkeys read
//     nothing.
// SKIPPED without an RDMA device (FAILS with RDKV_REQUIRE_VERBS=1): tests/rxe/vm.sh.
#include <infiniband/verbs.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "tests/transport/verbs_test_env.h"

namespace rdkv::transport {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using testing_env::RegionByte;

class VerbsAuth : public testing_env::VerbsEnv {
 protected:
  // Listens with a data and an admin secret; the handler records each request's session role.
  Status ListenWithRoles(const std::string& data, const std::string& admin, bool loopback_admin,
                         std::chrono::milliseconds handshake_timeout = 2000ms,
                         const std::function<void(ListenOptions&)>& tweak = {}) {
    ListenOptions lo;
    lo.host = host_;
    lo.auth_token = data;
    lo.admin_token = admin;
    lo.loopback_admin = loopback_admin;
    lo.handshake_timeout = handshake_timeout;
    if (tweak) tweak(lo);
    lo.regions = {region_->Describe(3)};
    lo.handler = [this](std::span<const uint8_t> p, ReplyHandle r) {
      {
        std::lock_guard<std::mutex> lk(roles_mu_);
        roles_.push_back(r.session->role());
      }
      r.session->Reply(r.request_id, p).IgnoreError();
    };
    auto l = server_fabric_->Listen(std::move(lo));
    if (!l.ok()) return l.status();
    listener_ = std::move(l).value();
    return Status::Ok();
  }

  ConnectOptions Options(const std::string& secret, SessionRole role = SessionRole::kData) {
    ConnectOptions co;
    co.host = host_;
    co.port = listener_->port();
    co.auth_token = secret;
    co.role = role;
    co.connect_timeout = 10s;
    return co;
  }

  // The role the server recorded for one request over c.
  Result<SessionRole> RoleOf(Connection* c) {
    std::vector<uint8_t> resp;
    const std::vector<uint8_t> req = {42};
    RDKV_RETURN_IF_ERROR(c->Call(req, &resp, 10s));
    std::lock_guard<std::mutex> lk(roles_mu_);
    if (roles_.empty()) return Status::Internal("no role recorded");
    return roles_.back();
  }

  // A READ of `length` bytes at addr/rkey over c with the client's own region check off, so the
  // NIC decides. The local buffer is poisoned first; returns the status and whether any byte of
  // the buffer changed.
  ReadStatus RawRead(Connection* c, uint64_t addr, uint32_t rkey, uint32_t length,
                     bool* buffer_changed) {
    dynamic_cast<VerbsConnection*>(c)->SetLocalReadCheckForTest(false);
    std::memset(local_->data(), 0xEE, length);
    const ReadStatus st = ReadOnce(c, addr, rkey, length);
    *buffer_changed = false;
    for (uint32_t i = 0; i < length; ++i) *buffer_changed |= local_->data()[i] != 0xEE;
    return st;
  }

  // Waits until the listener reports `n` sessions past the handshake.
  bool WaitForOpen(uint64_t n) {
    const auto until = Clock::now() + 15s;
    while (listener_->stats().connections_open != n) {
      if (Clock::now() > until) return false;
      std::this_thread::sleep_for(20ms);
    }
    return true;
  }

  bool Windows(Connection* c) {
    return dynamic_cast<VerbsConnection*>(c)->per_connection_windows();
  }
  // Windows are what rxe offers; a device without them is reported (SKIPPED), not hidden.
  bool RequireWindows(Connection* c) {
    if (Windows(c)) return true;
    if (testing_env::RequireVerbs()) {
      ADD_FAILURE() << "the device has no type-2 memory windows (IBV_DEVICE_MEM_WINDOW_TYPE_2B)";
    } else {
      std::printf("SKIPPED: the device has no type-2 memory windows\n");
    }
    return false;
  }

  // `n` half-open connections that never prove (what a client without the secret holds); fewer
  // when a connect failed (reported).
  std::vector<std::unique_ptr<Connection>> SilentHandshakes(int n) {
    std::vector<std::unique_ptr<Connection>> silent;
    for (int i = 0; i < n; ++i) {
      VerbsHandshakeTap tap;
      tap.stop_before_proof = true;
      tap.ignore_server_proof = true;
      auto c = ConnectVerbsForTest(client_fabric_.get(), Options("no-secret"), &tap);
      if (!c.ok()) {
        ADD_FAILURE() << "silent connect " << i << ": " << c.status().ToString();
        break;
      }
      silent.push_back(std::move(c).value());
    }
    return silent;
  }

  std::mutex roles_mu_;
  std::vector<SessionRole> roles_;
};

// ---- the handshake -------------------------------------------------------------------------

TEST_F(VerbsAuth, AReplayedHandshakeIsRefusedAndTheServerKeepsServing) {
  ASSERT_TRUE(Listen(Echo()).ok());
  // A legitimate connect, recorded by an eavesdropper: its nonce and its proof.
  VerbsHandshakeTap seen;
  auto legit = ConnectVerbsForTest(client_fabric_.get(), Options(kToken), &seen);
  ASSERT_TRUE(legit.ok()) << legit.status().ToString();
  EXPECT_TRUE(ReadAndCheck(legit->get(), 0, 64));

  // The replay: same connect request (same client nonce), same proof, without the secret.
  VerbsHandshakeTap replay;
  replay.client_nonce = seen.sent_client_nonce;
  replay.proof = seen.sent_proof;
  replay.ignore_server_proof = true;
  const uint64_t refused_before = listener_->stats().connections_refused;
  auto r = ConnectVerbsForTest(client_fabric_.get(), Options("not-the-secret"), &replay);
  ASSERT_FALSE(r.ok()) << "a replayed proof was accepted";
  EXPECT_TRUE(r.status().Is(StatusCode::kPermissionDenied)) << r.status().ToString();
  EXPECT_EQ(listener_->stats().connections_refused, refused_before + 1);

  // The server serves on: the old connection and a new one read and call.
  EXPECT_TRUE(ReadAndCheck(legit->get(), 4096, 256));
  auto fresh = Connect();
  ASSERT_TRUE(fresh.ok()) << fresh.status().ToString();
  EXPECT_TRUE(ReadAndCheck(fresh->get(), 100, 100));
  std::vector<uint8_t> resp;
  ASSERT_TRUE((*fresh)->Call(std::vector<uint8_t>{1, 2, 3}, &resp, 10s).ok());
  EXPECT_EQ(listener_->stats().connections_accepted, 2u);
}

// A client that ignores flow control (sends without credits, returns none of the server's) is
// cut off by the server, and its neighbours, whose receives share the server's buffers, are
// served throughout.
TEST_F(VerbsAuth, AClientThatIgnoresItsCreditsIsCutOffAndOthersAreServed) {
  // A long stall timeout: the flooder, whose answers also wait for credits it never returns,
  // must be cut off by the credit count, not by the stall timeout.
  ASSERT_TRUE(ListenWithRoles(kToken, "", true, 2000ms, [](ListenOptions& lo) {
                lo.output_stall_timeout = 60s;
              }).ok());
  auto honest = Connect();
  ASSERT_TRUE(honest.ok()) << honest.status().ToString();
  VerbsHandshakeTap tap;
  tap.flood = true;
  ConnectOptions co = Options(kToken);
  co.max_outstanding_calls = 1024;
  auto flooder = ConnectVerbsForTest(client_fabric_.get(), co, &tap);
  ASSERT_TRUE(flooder.ok()) << flooder.status().ToString();
  // 600 small requests, none waiting for another, sent as fast as send slots free up (the
  // waits in FinishCall poll the flooder's completions, which frees them). The server answers
  // the first 64 or so and returns credits with them; then the flooder's own credits to the
  // server are spent (it returns none), no credit can come back, and every request after the
  // next 32 is beyond what the flooder was ever granted.
  std::string flood_end;  // the first error the flooder's calls ended with
  std::thread flood([&] {
    const std::vector<uint8_t> small(100, 7);
    constexpr int kCalls = 600;
    std::vector<std::vector<uint8_t>> responses(kCalls);
    std::vector<PendingCall> calls(kCalls);
    std::vector<bool> started(kCalls, false);
    for (int i = 0; i < kCalls; ++i) {
      started[i] = (*flooder)->StartCall(small, &responses[i], 20s, &calls[i]).ok();
      if (!started[i]) break;
    }
    for (int i = 0; i < kCalls; ++i) {
      if (!started[i]) continue;
      Status s = (*flooder)->FinishCall(&calls[i]);
      if (!s.ok() && flood_end.empty()) flood_end = s.ToString();
    }
  });
  // Meanwhile and after, the honest client's calls are answered.
  std::atomic<bool> stop{false};
  std::atomic<int> answered{0}, failed{0};
  std::thread neighbour([&] {
    std::vector<uint8_t> req(3000, 1), resp;
    while (!stop.load()) {
      Status s = (*honest)->Call(req, &resp, 20s);
      if (s.ok() && resp == req) {
        answered.fetch_add(1);
      } else {
        failed.fetch_add(1);
        ADD_FAILURE() << "the honest client: " << s.ToString();
        return;
      }
    }
  });
  const auto until = Clock::now() + 30s;
  while (listener_->stats().protocol_errors == 0 && Clock::now() < until) {
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_GE(listener_->stats().protocol_errors, 1u) << "the flooder was not cut off";
  while ((*flooder)->alive() && Clock::now() < until) std::this_thread::sleep_for(20ms);
  EXPECT_FALSE((*flooder)->alive());
  flood.join();
  std::printf("the flooder's calls ended with: %s\n", flood_end.c_str());  // why it was cut
  const int before = answered.load();
  std::this_thread::sleep_for(300ms);
  stop.store(true);
  neighbour.join();
  EXPECT_EQ(failed.load(), 0);
  EXPECT_GT(answered.load(), before) << "the honest client was not served after the flood";
}

// A client that takes no answers (returns none of the server's credits) is cut off once an
// answer has waited output_stall_timeout for its credits, and the server keeps serving others.
TEST_F(VerbsAuth, AClientThatTakesNoAnswersIsCutOffAfterTheStallTimeout) {
  ASSERT_TRUE(ListenWithRoles(kToken, "", true, 2000ms, [](ListenOptions& lo) {
                lo.output_stall_timeout = 1s;
              }).ok());
  VerbsHandshakeTap tap;
  tap.withhold_credits = true;
  auto stuck = ConnectVerbsForTest(client_fabric_.get(), Options(kToken), &tap);
  ASSERT_TRUE(stuck.ok()) << stuck.status().ToString();
  // A 1 MiB echo: its answer needs 129 of the client's credits, which never come back after
  // the first 64.
  const std::vector<uint8_t> big(1 << 20, 3);
  std::vector<uint8_t> resp;
  const auto t0 = Clock::now();
  Status s = (*stuck)->Call(big, &resp, 20s);
  EXPECT_FALSE(s.ok()) << "an answer went out without the client's credits";
  EXPECT_LT(Clock::now() - t0, 10s) << s.ToString();
  EXPECT_GE(listener_->stats().slow_readers_cut, 1u) << s.ToString();
  auto other = Connect();
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  EXPECT_TRUE(ReadAndCheck(other->get(), 0, 64));
}

// Answers waiting for a client's credits are capped in bytes: beyond max(64 MiB, four largest
// messages) the session is cut off at once, not after the stall timeout, and the cut counted.
TEST_F(VerbsAuth, AnswersWaitingForCreditsAreCappedInBytes) {
  const std::vector<uint8_t> answer(1 << 20, 5);
  ListenOptions lo;
  lo.host = host_;
  lo.auth_token = kToken;
  lo.regions = {region_->Describe(3)};
  lo.output_stall_timeout = 60s;
  lo.max_message_size = 1 << 21;  // the cap: max(64 MiB, 4 x 2 MiB) = 64 MiB
  lo.handler = [&answer](std::span<const uint8_t>, ReplyHandle r) {
    r.session->Reply(r.request_id, answer).IgnoreError();  // 1 MiB whatever was asked
  };
  auto l = server_fabric_->Listen(std::move(lo));
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  listener_ = std::move(l).value();
  VerbsHandshakeTap tap;
  tap.withhold_credits = true;
  ConnectOptions co = Options(kToken);
  co.max_message_size = 1 << 21;
  co.max_outstanding_calls = 128;
  auto stuck = ConnectVerbsForTest(client_fabric_.get(), co, &tap);
  ASSERT_TRUE(stuck.ok()) << stuck.status().ToString();
  // 72 small requests, 72 answers of 1 MiB: all but the first 64 fragments wait.
  constexpr int kCalls = 72;
  std::vector<std::vector<uint8_t>> responses(kCalls);
  std::vector<PendingCall> calls(kCalls);
  std::vector<bool> started(kCalls, false);
  const std::vector<uint8_t> small(16, 1);
  const auto t0 = Clock::now();
  for (int i = 0; i < kCalls; ++i) {
    started[i] = (*stuck)->StartCall(small, &responses[i], 30s, &calls[i]).ok();
  }
  for (int i = 0; i < kCalls; ++i) {
    if (started[i]) (*stuck)->FinishCall(&calls[i]).IgnoreError();
  }
  EXPECT_FALSE((*stuck)->alive());
  EXPECT_LT(Clock::now() - t0, 20s) << "cut off only by a timeout, not by the byte cap";
  const auto until = Clock::now() + 5s;
  while (listener_->stats().slow_readers_cut == 0 && Clock::now() < until) {
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_EQ(listener_->stats().slow_readers_cut, 1u) << "the cut was not counted";
}

TEST_F(VerbsAuth, AForgedProofIsRefused) {
  ASSERT_TRUE(Listen(Echo()).ok());
  VerbsHandshakeTap forged;
  forged.proof = std::array<uint8_t, 32>{};  // all zeros
  forged.ignore_server_proof = true;
  auto r = ConnectVerbsForTest(client_fabric_.get(), Options("guess"), &forged);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(r.status().Is(StatusCode::kPermissionDenied)) << r.status().ToString();
  EXPECT_NE(r.status().message().find("authentication failed"), std::string::npos)
      << r.status().ToString();
  auto good = Connect();
  ASSERT_TRUE(good.ok()) << good.status().ToString();
  EXPECT_TRUE(ReadAndCheck(good->get(), 0, 64));
}

TEST_F(VerbsAuth, AWrongSecretIsRefusedByTheClientBeforeItProves) {
  ASSERT_TRUE(Listen(Echo()).ok());
  // The client checks the server's proof first: with a wrong secret that check fails and the
  // client sends no proof (nothing the server could use to guess the client's secret offline).
  auto bad = client_fabric_->Connect(Options("wrong"));
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(bad.status().Is(StatusCode::kPermissionDenied)) << bad.status().ToString();
  EXPECT_NE(bad.status().message().find("could not prove"), std::string::npos)
      << bad.status().ToString();
  EXPECT_EQ(listener_->stats().connections_accepted, 0u);
  auto good = Connect();
  ASSERT_TRUE(good.ok()) << good.status().ToString();
  EXPECT_TRUE(ReadAndCheck(good->get(), 100, 100));
}

TEST_F(VerbsAuth, AClientThatNeverProvesReadsNothingAndIsCutAtTheDeadline) {
  ASSERT_TRUE(ListenWithRoles(kToken, "", true, 500ms).ok());
  // The attacker holds a connected QP but no secret; it knows (or guesses: rxe's keys are
  // predictable) the region's address and the MR's own rkey.
  VerbsHandshakeTap half;
  half.stop_before_proof = true;
  half.ignore_server_proof = true;
  auto c = ConnectVerbsForTest(client_fabric_.get(), Options("no-secret"), &half);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE((*c)->regions().empty()) << "regions revealed before the proof";
  bool changed = true;
  const ReadStatus st =
      RawRead(c->get(), reinterpret_cast<uint64_t>(region_->data()), region_->rkey(), 64, &changed);
  EXPECT_NE(st, ReadStatus::kOk) << "an unauthenticated queue pair READ the region";
  EXPECT_FALSE(changed) << "bytes of the region reached an unauthenticated client";
  // Cut at the handshake deadline even if it stays silent.
  VerbsHandshakeTap silent;
  silent.stop_before_proof = true;
  silent.ignore_server_proof = true;
  auto s = ConnectVerbsForTest(client_fabric_.get(), Options("no-secret"), &silent);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  const auto until = Clock::now() + 10s;
  while ((*s)->alive() && Clock::now() < until) {
    (*s)->PollReads();
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_FALSE((*s)->alive()) << "a silent handshake outlived the 500 ms deadline";
  auto good = client_fabric_->Connect(Options(kToken));
  ASSERT_TRUE(good.ok()) << good.status().ToString();
  EXPECT_TRUE(ReadAndCheck(good->get(), 0, 64));
}

TEST_F(VerbsAuth, TheClientRefusesAServerThatDoesNotKnowTheSecret) {
  ASSERT_TRUE(ListenWithRoles("the-impostor-guessed-this", "", false).ok());
  auto c = client_fabric_->Connect(Options(kToken));
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(c.status().Is(StatusCode::kPermissionDenied)) << c.status().ToString();
  EXPECT_NE(c.status().message().find("could not prove"), std::string::npos);
  EXPECT_EQ(listener_->stats().connections_accepted, 0u);
}

// ---- roles ---------------------------------------------------------------------------------

TEST_F(VerbsAuth, RolesAreGrantedAsOnTcp) {
  ASSERT_TRUE(ListenWithRoles("data-secret", "admin-secret", true).ok());
  auto admin = client_fabric_->Connect(Options("admin-secret", SessionRole::kAdmin));
  ASSERT_TRUE(admin.ok()) << admin.status().ToString();
  auto role = RoleOf(admin->get());
  ASSERT_TRUE(role.ok()) << role.status().ToString();
  EXPECT_EQ(*role, SessionRole::kAdmin);

  auto data = client_fabric_->Connect(Options("data-secret", SessionRole::kData));
  ASSERT_TRUE(data.ok()) << data.status().ToString();
  role = RoleOf(data->get());
  ASSERT_TRUE(role.ok());
  EXPECT_EQ(*role, SessionRole::kData) << "an admin secret is configured: data stays data";

  // The data secret does not open the admin role, nor the admin secret the data role.
  auto up = client_fabric_->Connect(Options("data-secret", SessionRole::kAdmin));
  ASSERT_FALSE(up.ok());
  EXPECT_TRUE(up.status().Is(StatusCode::kPermissionDenied)) << up.status().ToString();
  auto cross = client_fabric_->Connect(Options("admin-secret", SessionRole::kData));
  ASSERT_FALSE(cross.ok());
  EXPECT_TRUE(cross.status().Is(StatusCode::kPermissionDenied)) << cross.status().ToString();
}

TEST_F(VerbsAuth, WithoutAnAdminSecretOnlyThisHostGetsAdmin) {
  // Protected mode: the VM's client is on the server's host (same rxe address).
  ASSERT_TRUE(ListenWithRoles("data-secret", "", true).ok());
  auto local = client_fabric_->Connect(Options("data-secret"));
  ASSERT_TRUE(local.ok()) << local.status().ToString();
  auto role = RoleOf(local->get());
  ASSERT_TRUE(role.ok());
  EXPECT_EQ(*role, SessionRole::kAdmin);
  local->reset();
  listener_.reset();

  // Every peer treated as remote: data only, and asking for admin is refused at the connect.
  ASSERT_TRUE(ListenWithRoles("data-secret", "", false).ok());
  auto remote = client_fabric_->Connect(Options("data-secret"));
  ASSERT_TRUE(remote.ok()) << remote.status().ToString();
  role = RoleOf(remote->get());
  ASSERT_TRUE(role.ok());
  EXPECT_EQ(*role, SessionRole::kData);
  auto admin = client_fabric_->Connect(Options("data-secret", SessionRole::kAdmin));
  ASSERT_FALSE(admin.ok());
  EXPECT_TRUE(admin.status().Is(StatusCode::kPermissionDenied)) << admin.status().ToString();
  EXPECT_NE(admin.status().message().find("admin"), std::string::npos);
}

// ---- per-connection memory windows ---------------------------------------------------------

TEST_F(VerbsAuth, EachConnectionHasItsOwnRkeyAndTheMrsRkeyReadsNothing) {
  ASSERT_TRUE(Listen(Echo()).ok());
  auto a = Connect();
  auto b = Connect();
  ASSERT_TRUE(a.ok() && b.ok());
  if (!RequireWindows(a->get())) return;
  const RegionDescriptor ra = (*a)->regions().at(0), rb = (*b)->regions().at(0);
  EXPECT_NE(ra.rkey, rb.rkey);
  EXPECT_NE(ra.rkey, region_->rkey());
  EXPECT_NE(rb.rkey, region_->rkey());
  EXPECT_TRUE(ReadAndCheck(a->get(), 0, 4096));
  EXPECT_TRUE(ReadAndCheck(b->get(), kRegionSize - 100, 100));

  // The MR's own rkey (guessable on rxe) grants no remote access at all.
  bool changed = true;
  EXPECT_EQ(RawRead(b->get(), rb.addr, region_->rkey(), 64, &changed),
            ReadStatus::kRemoteAccessError);
  EXPECT_FALSE(changed);
  // RC: that refusal killed b's queue pair, nobody else's.
  EXPECT_FALSE((*b)->alive());
  EXPECT_TRUE(ReadAndCheck(a->get(), 64, 64));
}

TEST_F(VerbsAuth, AnotherConnectionsRkeyReadsNothingOnThisQueuePair) {
  ASSERT_TRUE(Listen(Echo()).ok());
  auto victim = Connect();
  auto thief = Connect();
  ASSERT_TRUE(victim.ok() && thief.ok());
  if (!RequireWindows(victim->get())) return;
  const RegionDescriptor rv = (*victim)->regions().at(0);
  // The victim's window is bound to the victim's QP: the thief's QP cannot use it.
  bool changed = true;
  EXPECT_EQ(RawRead(thief->get(), rv.addr, rv.rkey, 64, &changed), ReadStatus::kRemoteAccessError);
  EXPECT_FALSE(changed);
  EXPECT_TRUE(ReadAndCheck(victim->get(), 0, 64));  // the victim is unaffected
}

TEST_F(VerbsAuth, AClosedConnectionsRkeyReadsNothing) {
  ASSERT_TRUE(Listen(Echo()).ok());
  auto first = Connect();
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  if (!RequireWindows(first->get())) return;
  const RegionDescriptor old = (*first)->regions().at(0);
  EXPECT_TRUE(ReadAndCheck(first->get(), 0, 64));
  first->reset();  // disconnect: the server deallocates (invalidates) its window
  ASSERT_TRUE(WaitForOpen(0)) << "the closed session was not torn down";

  // New connections, some of which may get the recycled window object (a new key byte), try
  // the old rkey: none reads a byte.
  for (int i = 0; i < 3; ++i) {
    auto c = Connect();
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    EXPECT_TRUE(ReadAndCheck(c->get(), 128, 128));
    if ((*c)->regions().at(0).rkey == old.rkey) {
      // rkeys have an 8-bit key byte: 1 in 256 new windows may carry the old value, and then
      // it is this connection's own key, bound to its own QP (which is what makes that safe).
      std::printf("note: connection %d got the old key value for its own window\n", i);
      continue;
    }
    bool changed = true;
    EXPECT_EQ(RawRead(c->get(), old.addr, old.rkey, 64, &changed), ReadStatus::kRemoteAccessError)
        << "connection " << i;
    EXPECT_FALSE(changed);
  }
  auto last = Connect();
  ASSERT_TRUE(last.ok());
  EXPECT_TRUE(ReadAndCheck(last->get(), 0, 64));
}

// ---- admission --------------------------------------------------------------------------

TEST_F(VerbsAuth, UnprovenSessionsAreLimitedPerSourceOldestFirst) {
  ASSERT_TRUE(ListenWithRoles(kToken, "", true, 20s, [](ListenOptions& lo) {
                lo.max_handshakes_per_source = 2;
              }).ok());
  // Three silent half-open connections from this one address: the third evicts the first.
  std::vector<std::unique_ptr<Connection>> silent = SilentHandshakes(3);
  ASSERT_EQ(silent.size(), 3u);
  const auto until = Clock::now() + 10s;
  while (silent[0]->alive() && Clock::now() < until) {
    silent[0]->PollReads();
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_FALSE(silent[0]->alive()) << "the oldest unproven session of the source was not cut";
  EXPECT_TRUE(silent[2]->alive());
  EXPECT_GE(listener_->stats().handshakes_evicted, 1u);
  // A client that proves at once still gets in (its own connect evicts the oldest silent one).
  auto good = client_fabric_->Connect(Options(kToken));
  ASSERT_TRUE(good.ok()) << good.status().ToString();
  EXPECT_TRUE(ReadAndCheck(good->get(), 0, 64));
}

// A silent handshake evicted to make room frees its place at once: with every place taken by
// connects that never prove, a client that proves still gets in (its connect evicts the oldest
// of its source). Before, the evicted session counted until its QP was torn down, so the
// connect that evicted it was refused "too many connections", and renewed silent connects kept
// every client out.
TEST_F(VerbsAuth, AnEvictedSilentHandshakeMakesRoomAtOnce) {
  ASSERT_TRUE(ListenWithRoles(kToken, "", true, 20s, [](ListenOptions& lo) {
                lo.max_connections = 4;
                lo.max_handshakes_per_source = 4;
              }).ok());
  std::vector<std::unique_ptr<Connection>> silent = SilentHandshakes(4);
  ASSERT_EQ(silent.size(), 4u);
  auto good = client_fabric_->Connect(Options(kToken));
  ASSERT_TRUE(good.ok()) << good.status().ToString();
  EXPECT_TRUE(ReadAndCheck(good->get(), 0, 64));
  EXPECT_GE(listener_->stats().handshakes_evicted, 1u);
}

TEST_F(VerbsAuth, IdleSessionsAreClosedButAClientThatOnlyReadsStays) {
  // Idle timeout 3 s: the WELCOME asks for a keep-alive every second.
  ASSERT_TRUE(ListenWithRoles(kToken, "", true, 2000ms, [](ListenOptions& lo) {
                lo.idle_timeout = 3s;
              }).ok());
  auto reader = client_fabric_->Connect(Options(kToken));
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  auto quiet = client_fabric_->Connect(Options(kToken));
  ASSERT_TRUE(quiet.ok()) << quiet.status().ToString();
  ASSERT_TRUE(WaitForOpen(2));
  // The reader only READs (which the server never sees) for 6 s; the other does nothing.
  const auto until = Clock::now() + 6s;
  while (Clock::now() < until) {
    ASSERT_TRUE(ReadAndCheck(reader->get(), 0, 64)) << "the reading client was cut";
    (*quiet)->PollReads();
    std::this_thread::sleep_for(100ms);
  }
  EXPECT_TRUE((*reader)->alive());
  EXPECT_FALSE((*quiet)->alive()) << "a session silent for 6 s outlived a 3 s idle timeout";
  EXPECT_EQ(listener_->stats().idle_closed, 1u);
  EXPECT_EQ(listener_->stats().connections_open, 1u);
}

// ---- revocation -------------------------------------------------------------------------

TEST_F(VerbsAuth, RotatingASecretRevokesItsSessionsAndTheirRkeysReadNothing) {
  ASSERT_TRUE(ListenWithRoles(kToken, "admin-secret", false).ok());
  auto data = client_fabric_->Connect(Options(kToken));
  ASSERT_TRUE(data.ok()) << data.status().ToString();
  auto admin = client_fabric_->Connect(Options("admin-secret", SessionRole::kAdmin));
  ASSERT_TRUE(admin.ok()) << admin.status().ToString();
  if (!RequireWindows(data->get())) return;
  const RegionDescriptor old = (*data)->regions().at(0);
  ASSERT_TRUE(ReadAndCheck(data->get(), 0, 64));

  // The data secret changes: its one session is revoked, the admin session stays.
  Result<uint64_t> revoked = listener_->RotateSecrets("new-data-secret", "admin-secret");
  ASSERT_TRUE(revoked.ok()) << revoked.status().ToString();
  EXPECT_EQ(*revoked, 1u);
  // The revoked session's rkey reads nothing: the READ fails and no byte arrives.
  dynamic_cast<VerbsConnection*>(data->get())->SetLocalReadCheckForTest(false);
  std::memset(local_->data(), 0xEE, 64);
  ReadOp op;
  op.local = local_->data();
  op.lkey = local_->lkey();
  op.remote_addr = old.addr;
  op.rkey = old.rkey;
  op.length = 64;
  ReadOp* p = &op;
  Status s = (*data)->ReadAndWait({&p, 1}, Clock::now() + 10s);
  EXPECT_TRUE(!s.ok() || op.status.load() != ReadStatus::kOk) << "a revoked session READ";
  bool changed = false;
  for (int i = 0; i < 64; ++i) changed |= local_->data()[i] != 0xEE;
  EXPECT_FALSE(changed) << "bytes reached a revoked session";
  Result<SessionRole> admin_role = RoleOf(admin->get());
  ASSERT_TRUE(admin_role.ok()) << "the admin session was closed although its secret did not "
                                  "change: "
                               << admin_role.status().ToString();
  EXPECT_EQ(*admin_role, SessionRole::kAdmin);

  // The old secret is refused; the new one gets in, and the old rkey reads nothing on it.
  auto stale = client_fabric_->Connect(Options(kToken));
  ASSERT_FALSE(stale.ok());
  EXPECT_EQ(stale.status().code(), StatusCode::kPermissionDenied) << stale.status().ToString();
  auto fresh = client_fabric_->Connect(Options("new-data-secret"));
  ASSERT_TRUE(fresh.ok()) << fresh.status().ToString();
  EXPECT_TRUE(ReadAndCheck(fresh->get(), 0, 64));
  if ((*fresh)->regions().at(0).rkey != old.rkey) {
    EXPECT_EQ(RawRead(fresh->get(), old.addr, old.rkey, 64, &changed),
              ReadStatus::kRemoteAccessError);
    EXPECT_FALSE(changed);
  }
  // Now the admin secret: the admin session goes, the new data session stays.
  revoked = listener_->RotateSecrets("new-data-secret", "new-admin-secret");
  ASSERT_TRUE(revoked.ok()) << revoked.status().ToString();
  EXPECT_EQ(*revoked, 1u);
  std::vector<uint8_t> resp;
  EXPECT_FALSE((*admin)->Call(std::vector<uint8_t>{1}, &resp, 5s).ok());
  auto fresh2 = client_fabric_->Connect(Options("new-data-secret"));
  ASSERT_TRUE(fresh2.ok()) << fresh2.status().ToString();
  EXPECT_TRUE(ReadAndCheck(fresh2->get(), 0, 64));
}

}  // namespace
}  // namespace rdkv::transport

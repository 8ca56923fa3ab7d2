// rdkv_etcd against a real etcd (tests/support/etcd_fixture.h): KV calls, binary safety, PutIf
// races, lease expiry and the LeaseKeeper's deadline, the watch across restarts and failed
// members, and kUnavailable while etcd is down. The parser and codec tests need no etcd.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <chrono>
#include <cstdio>
#include <set>
#include <thread>
#include <vector>

#include "common/etcd/codec.h"
#include "common/etcd/etcd_client.h"
#include "common/etcd/http.h"
#include "common/etcd/lease_keeper.h"
#include "common/etcd/watch.h"
#include "common/util/mutex.h"
#include "tests/support/etcd_fixture.h"
#include "tests/support/free_port.h"

namespace rdkv::etcd {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using testing::EtcdCluster;

double MsSince(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

// Polls `pred` every 10 ms until it holds or `limit` passes; returns whether it held.
template <typename Pred>
bool WaitFor(Pred pred, milliseconds limit) {
  auto deadline = Clock::now() + limit;
  while (Clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(milliseconds(10));
  }
  return pred();
}

std::unique_ptr<EtcdClient> NewClient(const EtcdCluster& etcd,
                                      milliseconds timeout = milliseconds(2000)) {
  auto c = EtcdClient::Create({.endpoints = etcd.endpoints(), .request_timeout = timeout});
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? std::move(c).value() : nullptr;
}

// Events a watch delivered, in order, and errors.
struct Recorder {
  Mutex mu;
  std::vector<WatchEvent> events GUARDED_BY(mu);
  std::vector<Status> errors GUARDED_BY(mu);
  Watch::Callback callback() {
    return [this](const Result<WatchEvent>& e) {
      MutexLock l(&mu);
      if (e.ok()) {
        events.push_back(e.value());
      } else {
        errors.push_back(e.status());
      }
    };
  }
  size_t count() {
    MutexLock l(&mu);
    return events.size();
  }
};

// ---- no etcd needed ----

TEST(EtcdEndpoints, ParsesAndNormalizes) {
  auto r = ParseEndpoints("127.0.0.1:2379,http://10.0.0.2:2380/, etcd-0.local:1");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, (std::vector<std::string>{"http://127.0.0.1:2379", "http://10.0.0.2:2380",
                                          "http://etcd-0.local:1"}));
  auto v6 = ParseEndpoints("[::1]:2379");
  ASSERT_TRUE(v6.ok());
  EXPECT_EQ((*v6)[0], "http://[::1]:2379");
}

TEST(EtcdEndpoints, RejectsBadItemsNamingThem) {
  for (const char* bad : {"", "a:1,", "host", "host:", "host:x", "host:0", "host:70000",
                          "https://h:1,http://h:2", "ftp://h:1", "h:1/v3", ":2379", "::1:2379"}) {
    auto r = ParseEndpoints(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_TRUE(r.status().Is(StatusCode::kInvalidArgument)) << bad;
    EXPECT_NE(r.status().message().find("--etcd"), std::string::npos) << r.status().message();
  }
  auto c = EtcdClient::Create({.endpoints = {}});
  EXPECT_TRUE(c.status().Is(StatusCode::kInvalidArgument));
}

TEST(EtcdEndpoints, HttpsIsKeptAndItsTlsFilesAreChecked) {
  auto r = ParseEndpoints("https://10.0.0.1:2379/, https://h:2380");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, (std::vector<std::string>{"https://10.0.0.1:2379", "https://h:2380"}));
  // TLS files with http:// endpoints, a certificate without its key, an unreadable file.
  auto c = EtcdClient::Create({.endpoints = {"h:1"}, .ca_file = "/etc/hostname"});
  EXPECT_TRUE(c.status().Is(StatusCode::kInvalidArgument));
  EXPECT_NE(c.status().message().find("https://"), std::string::npos) << c.status().message();
  c = EtcdClient::Create({.endpoints = {"https://h:1"}, .cert_file = "/etc/hostname"});
  EXPECT_TRUE(c.status().Is(StatusCode::kInvalidArgument));
  EXPECT_NE(c.status().message().find("--etcd_key"), std::string::npos) << c.status().message();
  c = EtcdClient::Create({.endpoints = {"https://h:1"}, .ca_file = "/nonexistent/ca.pem"});
  EXPECT_TRUE(c.status().Is(StatusCode::kInvalidArgument));
  EXPECT_NE(c.status().message().find("/nonexistent/ca.pem"), std::string::npos);
  EXPECT_TRUE(EtcdClient::Create({.endpoints = {"https://h:1"}, .ca_file = "/etc/hostname"}).ok());
}

TEST(EtcdCodec, Base64RoundTripsEveryByteAndRejectsGarbage) {
  std::string all;
  for (int i = 0; i < 256; ++i) all += static_cast<char>(i);
  for (size_t n = 0; n <= all.size(); ++n) {
    std::string s = all.substr(0, n);
    auto d = internal::Base64Decode(internal::Base64Encode(s));
    ASSERT_TRUE(d.ok());
    ASSERT_EQ(*d, s) << n;
  }
  EXPECT_EQ(internal::Base64Encode("foobar"), "Zm9vYmFy");
  EXPECT_EQ(internal::Base64Encode("fo"), "Zm8=");
  EXPECT_FALSE(internal::Base64Decode("Zm9").ok());
  EXPECT_FALSE(internal::Base64Decode("Zm*=").ok());
}

TEST(EtcdCodec, PrefixRangeEnd) {
  EXPECT_EQ(internal::PrefixRangeEnd("a/"), "a0");
  EXPECT_EQ(internal::PrefixRangeEnd(std::string("a\xff", 2)), "b");
  EXPECT_EQ(internal::PrefixRangeEnd(std::string("\xff\xff", 2)), std::string(1, '\0'));
  EXPECT_EQ(internal::PrefixRangeEnd(""), std::string(1, '\0'));
}

// A watch stream's messages, well formed and not: nothing throws (a field of an unexpected type
// used to throw from nlohmann's value() on the watch's thread, which ends the process).
TEST(EtcdCodec, WatchMessagesOfAnyShapeParseWithoutThrowing) {
  using internal::ParseWatchMessage;
  internal::WatchMessage m =
      ParseWatchMessage(R"({"result":{"header":{"revision":"9"},"created":true}})");
  EXPECT_FALSE(m.ignored);
  EXPECT_TRUE(m.created);
  ASSERT_TRUE(m.header_revision.has_value());
  EXPECT_EQ(*m.header_revision, 9);
  m = ParseWatchMessage(R"({"result":{"canceled":true,"compact_revision":"5"}})");
  EXPECT_TRUE(m.canceled);
  EXPECT_EQ(m.compact_revision, 5);
  m = ParseWatchMessage(
      R"({"result":{"events":[{"kv":{"key":"!!"}},)"
      R"({"type":"DELETE","kv":{"key":"YQ==","mod_revision":"3"}},7,{"type":"PUT"},)"
      R"({"kv":{"key":"Yg==","value":"Yw==","mod_revision":4}}]}})");
  ASSERT_EQ(m.events.size(), 3u) << "a non-object and an event without kv are skipped";
  EXPECT_EQ(m.events[0].status().code(), StatusCode::kProtocolError);
  ASSERT_TRUE(m.events[1].ok());
  EXPECT_EQ(m.events[1]->type, WatchEvent::Type::kDelete);
  EXPECT_EQ(m.events[1]->kv.key, "a");
  EXPECT_EQ(m.events[1]->kv.mod_revision, 3);
  ASSERT_TRUE(m.events[2].ok());
  EXPECT_EQ(m.events[2]->type, WatchEvent::Type::kPut);
  EXPECT_EQ(m.events[2]->kv.value, "c");
  // Fields of the wrong type.
  m = ParseWatchMessage(R"({"result":{"created":"yes","canceled":1,"header":{"revision":[]}}})");
  EXPECT_FALSE(m.ignored);
  EXPECT_FALSE(m.created);
  EXPECT_FALSE(m.canceled);
  EXPECT_FALSE(m.header_revision.has_value());
  m = ParseWatchMessage(R"({"result":{"events":[{"type":5,"kv":{"key":"YQ=="}}]}})");
  ASSERT_EQ(m.events.size(), 1u);
  ASSERT_TRUE(m.events[0].ok());
  EXPECT_EQ(m.events[0]->type, WatchEvent::Type::kPut);
  // A field nested a million levels deep is ignored, not a stack overflow (an int64 field of
  // another type is quoted in its error, and writing JSON out recurses once per level).
  m = ParseWatchMessage(R"({"result":{"compact_revision":)" + std::string(1'000'000, '[') +
                        std::string(1'000'000, ']') + "}}");
  EXPECT_TRUE(m.ignored);
  // What the watch ignores: errors, other shapes, garbage.
  for (const char* line : {R"({"error":{"grpc_code":14}})", "[1]", "not json", "",
                           R"({"result":[]})", R"({"result":{"events":{}}})"}) {
    m = ParseWatchMessage(line);
    EXPECT_TRUE(m.ignored || m.events.empty()) << line;
  }
}

TEST(EtcdCodec, Int64FieldsOutOfRangeOrMalformedAreErrors) {
  using internal::Int64Field;
  auto parse = [](const char* text) { return Int64Field(nlohmann::json::parse(text), "x"); };
  EXPECT_EQ(*parse(R"({"x":"9223372036854775807"})"), INT64_MAX);
  EXPECT_EQ(*parse(R"({"x":9223372036854775807})"), INT64_MAX);
  EXPECT_EQ(*parse(R"({"x":-5})"), -5);
  EXPECT_EQ(*parse(R"({})"), 0);
  // Beyond int64 as a JSON number would wrap to a negative revision.
  EXPECT_FALSE(parse(R"({"x":18446744073709551615})").ok());
  EXPECT_FALSE(parse(R"({"x":9223372036854775808})").ok());
  for (const char* bad : {R"({"x":"9223372036854775808"})", R"({"x":" 5"})", R"({"x":"5 "})",
                          R"({"x":"+5"})", R"({"x":""})", R"({"x":"0x10"})", R"({"x":1.5})",
                          R"({"x":true})"}) {
    auto r = parse(bad);
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), StatusCode::kProtocolError) << bad;
    }
  }
}

TEST(EtcdErrors, ErrorBodiesBecomeStatuses) {
  Status s = StatusFromErrorBody(
      "http://h:1", "/v3/lease/revoke",
      R"({"error":"etcdserver: requested lease not found","message":"etcdserver: requested )"
      R"(lease not found","code":5})",
      404);
  EXPECT_TRUE(s.Is(StatusCode::kNotFound)) << s.ToString();
  EXPECT_NE(s.message().find("requested lease not found"), std::string::npos);
  EXPECT_NE(s.message().find("http://h:1"), std::string::npos);
  // The streaming endpoints' form.
  s = StatusFromErrorBody(
      "e", "/v3/watch", R"({"error":{"grpc_code":14,"http_code":503,"message":"no leader"}})", 503);
  EXPECT_TRUE(s.Is(StatusCode::kUnavailable)) << s.ToString();
  s = StatusFromErrorBody("e", "/v3/kv/range", R"({"code":11,"message":"compacted"})", 400);
  EXPECT_TRUE(s.Is(StatusCode::kInvalidArgument)) << s.ToString();
  s = StatusFromErrorBody("e", "/v3/kv/range", "<html>bad gateway</html>", 502);
  EXPECT_TRUE(s.Is(StatusCode::kProtocolError)) << s.ToString();
  EXPECT_NE(s.message().find("HTTP 502"), std::string::npos);
}

TEST(EtcdClientDown, UnreachableIsUnavailableNamingEndpoints) {
  uint16_t p1 = testing::FreePort(), p2 = testing::FreePort();
  auto c = EtcdClient::Create(
      {.endpoints = {"127.0.0.1:" + std::to_string(p1), "127.0.0.1:" + std::to_string(p2)},
       .request_timeout = milliseconds(1000)});
  ASSERT_TRUE(c.ok());
  auto t0 = Clock::now();
  auto r = (*c)->Get("k");
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(r.status().Is(StatusCode::kUnavailable)) << r.status().ToString();
  EXPECT_NE(r.status().message().find(std::to_string(p1)), std::string::npos);
  EXPECT_NE(r.status().message().find(std::to_string(p2)), std::string::npos);
  EXPECT_LT(MsSince(t0), 1000);
}

TEST(EtcdClientDown, EachAttemptGetsAShareOfTheBudget) {
  using internal::AttemptBudget;
  EXPECT_EQ(AttemptBudget(milliseconds(2000), 1), milliseconds(2000));
  EXPECT_EQ(AttemptBudget(milliseconds(2000), 2), milliseconds(1000));
  EXPECT_EQ(AttemptBudget(milliseconds(1500), 3), milliseconds(500));
  // Not under 200 ms while that much is left, and never more than is left.
  EXPECT_EQ(AttemptBudget(milliseconds(300), 3), milliseconds(200));
  EXPECT_EQ(AttemptBudget(milliseconds(150), 3), milliseconds(150));
}

// A listener on 127.0.0.1 that never accepts: the kernel completes connections into its
// backlog and takes the request bytes, and no answer ever comes, as from an etcd member whose
// process is stopped or whose disk has stalled.
class SilentMember {
 public:
  SilentMember() {
    fd_ = testing::ListenLoopback(&port_);
  }
  ~SilentMember() {
    if (fd_ >= 0) close(fd_);
  }
  bool ok() const { return fd_ >= 0; }
  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port_); }

 private:
  uint16_t port_ = 0;
  int fd_ = -1;
};

// An HTTP endpoint that plays a script per connection: what a wrong, broken or hostile member
// can send. Each connection gets its index (0, 1, ...) and its socket; the request is read
// (headers and the small body) before the script runs.
class FakeMember {
 public:
  using Script = std::function<void(int index, int fd)>;
  explicit FakeMember(Script script) : script_(std::move(script)) {
    fd_ = testing::ListenLoopback(&port_, 16);
    if (fd_ >= 0) accepter_ = std::thread([this] { Accept(); });
  }
  ~FakeMember() {
    stop_.store(true);
    if (accepter_.joinable()) accepter_.join();
    for (std::thread& t : connections_) t.join();
    if (fd_ >= 0) close(fd_);
  }
  bool ok() const { return fd_ >= 0; }
  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port_); }
  int connections() const { return accepted_.load(); }
  bool stopping() const { return stop_.load(); }

  static void SendText(int fd, const std::string& text) {
    size_t done = 0;
    while (done < text.size()) {
      const ssize_t n = send(fd, text.data() + done, text.size() - done, MSG_NOSIGNAL);
      if (n <= 0) return;
      done += static_cast<size_t>(n);
    }
  }
  static void SendChunk(int fd, const std::string& data) {
    char size[32];
    std::snprintf(size, sizeof size, "%zx\r\n", data.size());
    SendText(fd, size + data + "\r\n");
  }
  static constexpr const char* kStreamHeader =
      "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";

 private:
  void Accept() {
    while (!stop_.load()) {
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, 50) <= 0) continue;
      const int c = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) continue;
      const int index = accepted_.fetch_add(1);
      connections_.emplace_back([this, c, index] {
        char buf[4096];
        std::string request;
        while (request.find("\r\n\r\n") == std::string::npos) {
          const ssize_t n = recv(c, buf, sizeof buf, 0);
          if (n <= 0) break;
          request.append(buf, static_cast<size_t>(n));
        }
        script_(index, c);
        close(c);
      });
    }
  }

  Script script_;
  uint16_t port_ = 0;
  int fd_ = -1;
  std::atomic<bool> stop_{false};
  std::atomic<int> accepted_{0};
  std::vector<std::thread> connections_;  // accept thread only, then the destructor
  std::thread accepter_;
};

// A watch stream the member cancels for a reason other than compaction (it lost its leader,
// a permission changed) carries nothing more, though the connection may stay open: the watch
// opens another instead of waiting on it for ever.
TEST(EtcdWatchFake, AStreamCanceledWithoutCompactionIsReplaced) {
  FakeMember member([&member](int index, int fd) {
    FakeMember::SendText(fd, FakeMember::kStreamHeader);
    FakeMember::SendChunk(fd, R"({"result":{"header":{"revision":"5"},"created":true}})"
                              "\n");
    if (index == 0) {
      FakeMember::SendChunk(fd, R"({"result":{"header":{"revision":"5"},"canceled":true,)"
                                R"("cancel_reason":"no leader"}})"
                                "\n");
    }
    while (!member.stopping()) {  // hold the connection open
      pollfd p{fd, POLLIN, 0};
      if (poll(&p, 1, 50) > 0) {
        char b[256];
        if (recv(fd, b, sizeof b, 0) <= 0) return;
      }
    }
  });
  ASSERT_TRUE(member.ok());
  Recorder rec;
  auto w = Watch::Start({.endpoints = {member.endpoint()}}, {.key = "/x", .start_revision = 1},
                        rec.callback());
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_TRUE(WaitFor([&] { return (*w)->reconnects() >= 1; }, milliseconds(3000)))
      << "the watch stayed on the canceled stream (" << member.connections()
      << " connections)";
  EXPECT_FALSE((*w)->ended());
  w->reset();
}

// A member that answers with more than any reply can hold, or a watch line without end, is cut
// off at internal::kMaxReplyBytes instead of filling the process's memory.
TEST(EtcdWatchFake, RepliesBeyondTheLimitAreCutNotBuffered) {
  const std::string mib(1 << 20, 'x');
  FakeMember member([&](int index, int fd) {
    (void)index;
    FakeMember::SendText(fd, FakeMember::kStreamHeader);
    for (size_t sent = 0; sent <= internal::kMaxReplyBytes + (2u << 20); sent += mib.size()) {
      if (member.stopping()) return;
      FakeMember::SendChunk(fd, mib);
    }
  });
  ASSERT_TRUE(member.ok());
  auto c = EtcdClient::Create({.endpoints = {member.endpoint()}, .request_timeout = milliseconds(10000)});
  ASSERT_TRUE(c.ok());
  auto got = (*c)->Get("/k");
  ASSERT_FALSE(got.ok());
  EXPECT_NE(got.status().message().find("larger than"), std::string::npos)
      << got.status().ToString();

  Recorder rec;
  auto w = Watch::Start({.endpoints = {member.endpoint()}}, {.key = "/x", .start_revision = 1},
                        rec.callback());
  ASSERT_TRUE(w.ok());
  EXPECT_TRUE(WaitFor(
      [&] {
        MutexLock l(&rec.mu);
        return std::any_of(rec.errors.begin(), rec.errors.end(), [](const Status& s) {
          return s.message().find("longer than") != std::string::npos;
        });
      },
      milliseconds(10000)));
  w->reset();
}

// ---- against a real etcd ----

class EtcdTest : public ::testing::Test {
 protected:
  EtcdCluster etcd_{1};
};

TEST_F(EtcdTest, PutGetPrefixDelete) {
  RDKV_REQUIRE_ETCD(etcd_);
  auto c = NewClient(etcd_);
  auto missing = c->Get("/a/none");
  ASSERT_TRUE(missing.ok()) << missing.status().ToString();
  EXPECT_FALSE(missing->kv.has_value());
  EXPECT_GT(missing->revision, 0);

  auto r1 = c->Put("/a/1", "one");
  ASSERT_TRUE(r1.ok()) << r1.status().ToString();
  auto r2 = c->Put("/a/2", "two");
  ASSERT_TRUE(r2.ok());
  ASSERT_TRUE(c->Put("/b/1", "other").ok());
  auto r3 = c->Put("/a/1", "uno");
  ASSERT_TRUE(r3.ok());
  EXPECT_LT(*r1, *r2);
  EXPECT_LT(*r2, *r3);

  auto g = c->Get("/a/1");
  ASSERT_TRUE(g.ok());
  ASSERT_TRUE(g->kv.has_value());
  EXPECT_EQ(g->kv->key, "/a/1");
  EXPECT_EQ(g->kv->value, "uno");
  EXPECT_EQ(g->kv->create_revision, *r1);
  EXPECT_EQ(g->kv->mod_revision, *r3);
  EXPECT_EQ(g->kv->version, 2);
  EXPECT_EQ(g->kv->lease, 0);

  auto p = c->GetPrefix("/a/");
  ASSERT_TRUE(p.ok());
  ASSERT_EQ(p->kvs.size(), 2u);
  EXPECT_EQ(p->kvs[0].key, "/a/1");
  EXPECT_EQ(p->kvs[1].value, "two");
  auto all = c->GetPrefix("");
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->kvs.size(), 3u);

  auto d = c->Delete("/a/1");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->deleted, 1);
  EXPECT_GT(d->revision, *r3);
  EXPECT_FALSE(c->Get("/a/1")->kv.has_value());
  EXPECT_EQ(c->Delete("/a/1")->deleted, 0);
  EXPECT_EQ(c->GetPrefix("/a/")->kvs.size(), 1u);
}

TEST_F(EtcdTest, KeysAndValuesAreBinarySafe) {
  RDKV_REQUIRE_ETCD(etcd_);
  auto c = NewClient(etcd_);
  std::string all;
  for (int i = 0; i < 256; ++i) all += static_cast<char>(i);
  const std::string prefix("\xff\x00p", 3);
  std::vector<std::string> keys = {prefix + std::string("\x00", 1), prefix + "\xff\xfe",
                                   prefix + all.substr(1, 40)};
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSERT_TRUE(c->Put(keys[i], all + std::to_string(i)).ok());
  }
  ASSERT_TRUE(c->Put(std::string("\xff\x00q", 3), "outside").ok());
  for (size_t i = 0; i < keys.size(); ++i) {
    auto g = c->Get(keys[i]);
    ASSERT_TRUE(g.ok() && g->kv.has_value());
    EXPECT_EQ(g->kv->key, keys[i]);
    EXPECT_EQ(g->kv->value, all + std::to_string(i));
  }
  auto p = c->GetPrefix(prefix);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->kvs.size(), keys.size());
  ASSERT_TRUE(c->Put("empty", "").ok());
  EXPECT_EQ(c->Get("empty")->kv->value, "");
}

TEST_F(EtcdTest, GuardedPutIfFailsOnceTheGuardKeyIsGoneOrCreatedAgain) {
  RDKV_REQUIRE_ETCD(etcd_);
  auto c = NewClient(etcd_);
  auto leader = c->PutIf("/election", "a", 0);
  ASSERT_TRUE(leader.ok() && leader->succeeded);
  const CreateGuard guard{"/election", leader->revision};
  auto first = c->PutIfGuarded("/map", "m1", 0, guard);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_TRUE(first->succeeded);
  // The map's revision check still applies.
  auto stale = c->PutIfGuarded("/map", "m-stale", 0, guard);
  ASSERT_TRUE(stale.ok());
  EXPECT_FALSE(stale->succeeded);
  EXPECT_EQ(stale->current->value, "m1");
  // Deposed: the election key was deleted and created again by another holder.
  ASSERT_TRUE(c->Delete("/election").ok());
  auto gone = c->PutIfGuarded("/map", "m2", first->revision, guard);
  ASSERT_TRUE(gone.ok());
  EXPECT_FALSE(gone->succeeded);
  ASSERT_TRUE(c->PutIf("/election", "b", 0)->succeeded);
  auto other = c->PutIfGuarded("/map", "m2", first->revision, guard);
  ASSERT_TRUE(other.ok());
  EXPECT_FALSE(other->succeeded);
  EXPECT_EQ(c->Get("/map")->kv->value, "m1");
  EXPECT_EQ(c->PutIfGuarded("/map", "x", 0, CreateGuard{"/election", 0}).status().code(),
            StatusCode::kInvalidArgument);
}

TEST_F(EtcdTest, PutIfCreatesOnceAndExactlyOneRacerWins) {
  RDKV_REQUIRE_ETCD(etcd_);
  auto c = NewClient(etcd_);
  auto created = c->PutIf("/lock", "first", 0);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  EXPECT_TRUE(created->succeeded);
  auto again = c->PutIf("/lock", "second", 0);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->succeeded);
  ASSERT_TRUE(again->current.has_value());
  EXPECT_EQ(again->current->value, "first");
  EXPECT_EQ(again->current->mod_revision, created->revision);

  constexpr int kThreads = 8;
  const int64_t expected = created->revision;
  std::vector<Result<PutIfResult>> results(kThreads, Status::Internal("not run"));
  std::atomic<int> ready{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      ready.fetch_add(1);
      while (ready.load() < kThreads) {
      }
      results[i] = c->PutIf("/lock", "racer" + std::to_string(i), expected);
    });
  }
  for (auto& t : threads) t.join();
  int winners = 0, winner = -1;
  for (int i = 0; i < kThreads; ++i) {
    ASSERT_TRUE(results[i].ok()) << results[i].status().ToString();
    if (results[i]->succeeded) {
      ++winners;
      winner = i;
    }
  }
  ASSERT_EQ(winners, 1);
  const std::string won = "racer" + std::to_string(winner);
  for (int i = 0; i < kThreads; ++i) {
    if (i == winner) continue;
    ASSERT_TRUE(results[i]->current.has_value());
    EXPECT_EQ(results[i]->current->value, won);
    EXPECT_EQ(results[i]->current->mod_revision, results[winner]->revision);
  }
  EXPECT_EQ(c->Get("/lock")->kv->value, won);
  // The absent case of a failed PutIf: current is nullopt.
  auto absent = c->PutIf("/nobody", "x", 5);
  ASSERT_TRUE(absent.ok());
  EXPECT_FALSE(absent->succeeded);
  EXPECT_FALSE(absent->current.has_value());
}

// A server's registration is written only over the lease it replaces: a write of an older
// registration (its lease since replaced) that etcd applies late cannot bind the key again.
TEST_F(EtcdTest, PutIfLeaseAppliesOnlyOverTheExpectedLease) {
  RDKV_REQUIRE_ETCD(etcd_);
  auto c = NewClient(etcd_);
  auto l1 = c->LeaseGrant(30);
  auto l2 = c->LeaseGrant(30);
  ASSERT_TRUE(l1.ok() && l2.ok());
  // Absent: compares as lease 0.
  auto r = c->PutIfLease("/reg", "a", l1->id, l2->id);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->succeeded);
  EXPECT_FALSE(r->current.has_value());
  r = c->PutIfLease("/reg", "a", l1->id, 0);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->succeeded);
  // Re-registered under l2 over l1.
  r = c->PutIfLease("/reg", "b", l2->id, l1->id);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->succeeded);
  // A late write of the l1 registration (it expected l1, or what was there before it).
  for (int64_t expected : {l1->id, int64_t{0}}) {
    r = c->PutIfLease("/reg", "stale", l1->id, expected);
    ASSERT_TRUE(r.ok());
    EXPECT_FALSE(r->succeeded);
    ASSERT_TRUE(r->current.has_value());
    EXPECT_EQ(r->current->lease, l2->id);
    EXPECT_EQ(r->current->value, "b");
  }
  // Writes under the current lease go on.
  r = c->PutIfLease("/reg", "c", l2->id, l2->id);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->succeeded);
  auto g = c->Get("/reg");
  ASSERT_TRUE(g.ok() && g->kv.has_value());
  EXPECT_EQ(g->kv->value, "c");
  EXPECT_EQ(g->kv->lease, l2->id);
}

TEST_F(EtcdTest, LeaseExpiresAndThenIsUnknown) {
  RDKV_REQUIRE_ETCD(etcd_);
  auto c = NewClient(etcd_);
  auto lease = c->LeaseGrant(1);
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  EXPECT_EQ(lease->ttl_seconds, 1);
  auto t0 = Clock::now();
  ASSERT_TRUE(c->Put("/ephemeral", "x", lease->id).ok());
  EXPECT_EQ(c->Get("/ephemeral")->kv->lease, lease->id);
  auto ka = c->LeaseKeepAlive(lease->id);
  ASSERT_TRUE(ka.ok()) << ka.status().ToString();
  EXPECT_EQ(*ka, 1);
  ASSERT_TRUE(WaitFor([&] { return !c->Get("/ephemeral")->kv.has_value(); }, milliseconds(3000)))
      << "the key of a TTL 1 lease is still there after 3 s";
  std::printf("lease TTL 1 s: key gone %.0f ms after its last keepalive\n", MsSince(t0));
  auto after = c->LeaseKeepAlive(lease->id);
  EXPECT_TRUE(after.status().Is(StatusCode::kNotFound)) << after.status().ToString();
  EXPECT_TRUE(c->LeaseRevoke(lease->id).Is(StatusCode::kNotFound));
  auto put = c->Put("/ephemeral", "y", lease->id);
  EXPECT_TRUE(put.status().Is(StatusCode::kNotFound)) << put.status().ToString();
}

TEST_F(EtcdTest, LeaseKeeperKeepsAliveAndValidUntilPrecedesRealExpiry) {
  RDKV_REQUIRE_ETCD(etcd_);
  auto c = NewClient(etcd_);
  std::atomic<int> lost{0};
  auto k = LeaseKeeper::Start({.endpoints = etcd_.endpoints()},
                              {.ttl_seconds = 1, .revoke_on_close = false},
                              [&](const Status&) { lost.fetch_add(1); });
  ASSERT_TRUE(k.ok()) << k.status().ToString();
  ASSERT_TRUE(c->Put("/owned", "x", (*k)->lease_id()).ok());
  std::this_thread::sleep_for(milliseconds(2500));  // 2.5 TTLs: alive only if renewed
  ASSERT_TRUE(c->Get("/owned")->kv.has_value());
  EXPECT_GE((*k)->renewals(), 5);
  EXPECT_EQ(lost.load(), 0);
  EXPECT_GT((*k)->valid_until(), Clock::now());
  // Stop renewing (no revoke) and watch etcd expire the lease on its own.
  Clock::time_point valid_until = (*k)->valid_until();
  k->reset();
  Clock::time_point last_present = Clock::now();
  Clock::time_point gone;
  ASSERT_TRUE(WaitFor(
      [&] {
        auto t = Clock::now();
        if (c->Get("/owned")->kv.has_value()) {
          last_present = t;
          return false;
        }
        gone = Clock::now();
        return true;
      },
      milliseconds(4000)));
  auto ms = [](Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); };
  std::printf(
      "valid_until is %.0f ms before the key was last seen and %.0f ms before it was "
      "seen gone\n",
      ms(last_present - valid_until), ms(gone - valid_until));
  EXPECT_LE(valid_until, gone);
  // Not uselessly conservative either: within a TTL of the real expiry.
  EXPECT_LT(ms(gone - valid_until), 1500);
}

TEST_F(EtcdTest, LeaseKeeperReportsLossWhenEtcdIsDown) {
  RDKV_REQUIRE_ETCD(etcd_);
  Mutex mu;
  Status why;  // guarded by mu
  std::atomic<int> lost{0};
  std::atomic<int64_t> lost_at{0};
  auto k = LeaseKeeper::Start({.endpoints = etcd_.endpoints()}, {.ttl_seconds = 1},
                              [&](const Status& s) {
                                MutexLock l(&mu);
                                why = s;
                                lost_at.store(Clock::now().time_since_epoch().count());
                                lost.fetch_add(1);
                              });
  ASSERT_TRUE(k.ok()) << k.status().ToString();
  std::this_thread::sleep_for(milliseconds(700));
  auto stopped = Clock::now();
  ASSERT_TRUE(etcd_.Stop(0));
  Clock::time_point valid_until = (*k)->valid_until();
  // Every confirmed keepalive was sent before etcd stopped: the deadline is within a TTL of it.
  EXPECT_LE(valid_until, stopped + std::chrono::seconds(1));
  ASSERT_TRUE(WaitFor([&] { return lost.load() > 0; }, milliseconds(3000)))
      << "no lost callback 3 s after etcd stopped (TTL 1 s)";
  EXPECT_TRUE((*k)->lost());
  auto at = Clock::time_point(Clock::duration(lost_at.load()));
  EXPECT_GE(at, valid_until);  // not before the deadline passed
  {
    MutexLock l(&mu);
    std::printf("lost %.0f ms after etcd stopped, %.0f ms after valid_until: %s\n",
                std::chrono::duration<double, std::milli>(at - stopped).count(),
                std::chrono::duration<double, std::milli>(at - valid_until).count(),
                why.ToString().c_str());
    EXPECT_FALSE(why.ok());
  }
  ASSERT_TRUE(etcd_.Start(0));
  std::this_thread::sleep_for(milliseconds(500));
  EXPECT_EQ(lost.load(), 1);  // once
}

// A member that takes requests and never answers, listed first, costs each request only its
// share of the budget, and the next requests go to the member that answers.
TEST_F(EtcdTest, AMemberThatNeverAnswersIsPassedOverInTime) {
  RDKV_REQUIRE_ETCD(etcd_);
  SilentMember silent;
  ASSERT_TRUE(silent.ok());
  const std::vector<std::string> endpoints = {silent.endpoint(), etcd_.endpoint(0)};
  auto c = EtcdClient::Create({.endpoints = endpoints, .request_timeout = milliseconds(2000)});
  ASSERT_TRUE(c.ok());
  auto t0 = Clock::now();
  auto put = (*c)->Put("/silent", "v");
  ASSERT_TRUE(put.ok()) << put.status().ToString();
  const double first_ms = MsSince(t0);
  EXPECT_LT(first_ms, 1900);
  EXPECT_EQ((*c)->current_endpoint(), etcd_.endpoint(0));
  t0 = Clock::now();
  auto got = (*c)->Get("/silent");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ASSERT_TRUE(got->kv.has_value());
  const double second_ms = MsSince(t0);
  EXPECT_LT(second_ms, 500);
  std::printf("silent member first: first request %.0f ms, the next %.0f ms\n", first_ms,
              second_ms);

  // A lease kept through those endpoints, with a budget of a third of its 2 s TTL per renewal,
  // stays alive: each renewal that meets the silent member still reaches the live one.
  std::atomic<int> lost{0};
  auto k = LeaseKeeper::Start({.endpoints = endpoints}, {.ttl_seconds = 2},
                              [&](const Status&) { lost.fetch_add(1); });
  ASSERT_TRUE(k.ok()) << k.status().ToString();
  ASSERT_TRUE((*c)->Put("/silent-owned", "x", (*k)->lease_id()).ok());
  std::this_thread::sleep_for(milliseconds(5000));
  EXPECT_EQ(lost.load(), 0);
  EXPECT_FALSE((*k)->lost());
  auto owned = (*c)->Get("/silent-owned");
  ASSERT_TRUE(owned.ok()) << owned.status().ToString();
  EXPECT_TRUE(owned->kv.has_value()) << "the lease expired at etcd";
}

TEST_F(EtcdTest, RequestsFailUnavailableWhileDownAndRecover) {
  RDKV_REQUIRE_ETCD(etcd_);
  auto c = NewClient(etcd_, milliseconds(1000));
  ASSERT_TRUE(c->Put("/k", "v").ok());
  ASSERT_TRUE(etcd_.Stop(0));
  for (int i = 0; i < 3; ++i) {
    auto t0 = Clock::now();
    auto r = c->Get("/k");
    double took = MsSince(t0);
    ASSERT_FALSE(r.ok());
    EXPECT_TRUE(r.status().Is(StatusCode::kUnavailable)) << r.status().ToString();
    EXPECT_NE(r.status().message().find(etcd_.endpoint(0)), std::string::npos)
        << r.status().message();
    EXPECT_LT(took, 1100);
    if (i == 0) std::printf("while down: %s after %.1f ms\n", r.status().ToString().c_str(), took);
  }
  EXPECT_FALSE(c->Put("/k", "w").ok());
  ASSERT_TRUE(etcd_.Start(0));
  auto g = c->Get("/k");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->kv->value, "v");
  EXPECT_TRUE(c->Put("/k", "w").ok());
}

// Puts `n` values "<first>".."<first+n-1>" under `prefix`, retrying each for up to 10 s (a
// restart or an election in between); returns false when one never succeeded. A retried put
// whose first try applied after all (its reply was lost) appears twice in etcd's history.
bool PutSeries(EtcdClient* c, const std::string& prefix, int first, int n,
               milliseconds pause = milliseconds(0)) {
  for (int i = first; i < first + n; ++i) {
    auto deadline = Clock::now() + std::chrono::seconds(10);
    while (true) {
      auto r = c->Put(prefix + std::to_string(i % 7), std::to_string(i));
      if (r.ok()) break;
      if (Clock::now() > deadline) {
        ADD_FAILURE() << "put " << i << ": " << r.status().ToString();
        return false;
      }
      std::this_thread::sleep_for(milliseconds(20));
    }
    if (pause.count() > 0) std::this_thread::sleep_for(pause);
  }
  return true;
}

std::string LastValue(Recorder& rec) {
  MutexLock l(&rec.mu);
  return rec.events.empty() ? "" : rec.events.back().kv.value;
}

// What `rec` got is exactly etcd's history of `prefix` from `start_revision` up to the put of
// value `last` (n = last + 1 puts): the same events as a second watch that replays it in one
// stream, with strictly increasing revisions and every value 0..last in order (a value may repeat
// only as a genuine second put, at its own revision).
void ExpectHistory(Recorder& rec, const EtcdCluster& etcd, const std::string& prefix,
                   int64_t start_revision, int last) {
  Recorder truth;
  auto w = Watch::Start({.endpoints = etcd.endpoints()},
                        {.key = prefix, .prefix = true, .start_revision = start_revision},
                        truth.callback());
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(
      WaitFor([&] { return LastValue(truth) == std::to_string(last); }, milliseconds(5000)));
  w->reset();
  MutexLock l(&rec.mu);
  MutexLock lt(&truth.mu);
  EXPECT_TRUE(rec.errors.empty()) << rec.errors.front().ToString();
  ASSERT_EQ(rec.events.size(), truth.events.size());
  int64_t prev_rev = start_revision - 1;
  int next_value = 0;
  for (size_t i = 0; i < rec.events.size(); ++i) {
    const WatchEvent& e = rec.events[i];
    ASSERT_EQ(e.kv.mod_revision, truth.events[i].kv.mod_revision) << "event " << i;
    ASSERT_EQ(e.kv.value, truth.events[i].kv.value) << "event " << i;
    ASSERT_EQ(e.type, WatchEvent::Type::kPut);
    ASSERT_GT(e.kv.mod_revision, prev_rev) << "event " << i;
    prev_rev = e.kv.mod_revision;
    int v = std::stoi(e.kv.value);
    ASSERT_TRUE(v == next_value || v == next_value - 1) << "event " << i << " value " << v;
    if (v == next_value) ++next_value;
  }
  EXPECT_EQ(next_value, last + 1);
}

TEST_F(EtcdTest, WatchSeesEveryPutInOrderAcrossRestart) {
  RDKV_REQUIRE_ETCD(etcd_);
  auto c = NewClient(etcd_);
  auto start = c->Get("/w/");
  ASSERT_TRUE(start.ok());
  Recorder rec;
  auto w = Watch::Start({.endpoints = etcd_.endpoints()},
                        {.key = "/w/", .prefix = true, .start_revision = start->revision + 1},
                        rec.callback());
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  ASSERT_TRUE(c->Put("/x", "not watched").ok());
  // A writer puts 300 values, spread out, retrying through the outage; etcd stops and restarts
  // (same data dir) in the middle, while the writer runs and the watch streams.
  std::atomic<bool> writer_ok{false};
  std::thread writer([&] { writer_ok = PutSeries(c.get(), "/w/", 0, 300, milliseconds(3)); });
  ASSERT_TRUE(WaitFor([&] { return rec.count() >= 100; }, milliseconds(5000)));
  size_t at_stop = rec.count();
  ASSERT_TRUE(etcd_.Stop(0));
  std::this_thread::sleep_for(milliseconds(300));
  ASSERT_TRUE(etcd_.Start(0));
  size_t at_restart = rec.count();
  writer.join();
  ASSERT_TRUE(writer_ok.load());
  ASSERT_TRUE(WaitFor([&] { return LastValue(rec) == "299"; }, milliseconds(10000)))
      << "only " << rec.count() << " events";
  std::this_thread::sleep_for(milliseconds(200));  // nothing extra arrives
  ExpectHistory(rec, etcd_, "/w/", start->revision + 1, 299);
  EXPECT_GE((*w)->reconnects(), 1);
  std::printf(
      "watch: %zu events (%zu when etcd stopped, %zu when it served again), in order, "
      "%lld reconnect(s), next revision %lld\n",
      rec.count(), at_stop, at_restart, static_cast<long long>((*w)->reconnects()),
      static_cast<long long>((*w)->next_revision()));
  auto t0 = Clock::now();
  w->reset();
  EXPECT_LT(MsSince(t0), 500) << "the watch did not stop promptly";
}

TEST_F(EtcdTest, WatchDeletesAndCompaction) {
  RDKV_REQUIRE_ETCD(etcd_);
  auto c = NewClient(etcd_);
  Recorder rec;
  auto w = Watch::Start({.endpoints = etcd_.endpoints()}, {.key = "/one"}, rec.callback());
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(WaitFor([&] { return (*w)->connected(); }, milliseconds(3000)));
  auto put = c->Put("/one", "v");
  ASSERT_TRUE(put.ok());
  ASSERT_TRUE(c->Put("/one-not", "v").ok());
  auto del = c->Delete("/one");
  ASSERT_TRUE(del.ok());
  ASSERT_TRUE(WaitFor([&] { return rec.count() >= 2; }, milliseconds(3000)));
  {
    MutexLock l(&rec.mu);
    ASSERT_EQ(rec.events.size(), 2u);
    EXPECT_EQ(rec.events[0].type, WatchEvent::Type::kPut);
    EXPECT_EQ(rec.events[0].kv.mod_revision, *put);
    EXPECT_EQ(rec.events[1].type, WatchEvent::Type::kDelete);
    EXPECT_EQ(rec.events[1].kv.key, "/one");
    EXPECT_EQ(rec.events[1].kv.mod_revision, del->revision);
  }
  // Compact past a watch's start revision: reported once as an error, then the watch ends.
  ASSERT_TRUE(c->Put("/one", "w").ok());
  auto compacted =
      c->Call("/v3/kv/compaction", "{\"revision\":\"" + std::to_string(del->revision + 1) + "\"}");
  ASSERT_TRUE(compacted.ok()) << compacted.status().ToString();
  Recorder old;
  auto w2 = Watch::Start({.endpoints = etcd_.endpoints()}, {.key = "/one", .start_revision = *put},
                         old.callback());
  ASSERT_TRUE(w2.ok());
  ASSERT_TRUE(WaitFor([&] { return (*w2)->ended(); }, milliseconds(3000)));
  MutexLock l(&old.mu);
  ASSERT_EQ(old.errors.size(), 1u);
  EXPECT_TRUE(old.errors[0].Is(StatusCode::kNotFound));
  EXPECT_NE(old.errors[0].message().find("compacted"), std::string::npos);
  EXPECT_TRUE(old.events.empty());
}

TEST(EtcdThreeMembers, ClientAndWatchSurviveAKilledMember) {
  EtcdCluster etcd(3);
  RDKV_REQUIRE_ETCD(etcd);
  auto c = NewClient(etcd);
  auto start = c->Get("/w/");
  ASSERT_TRUE(start.ok());
  Recorder rec;
  // The watch and the client both start on member 0: killing it forces both to fail over.
  auto w = Watch::Start({.endpoints = etcd.endpoints()},
                        {.key = "/w/", .prefix = true, .start_revision = start->revision + 1},
                        rec.callback());
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(PutSeries(c.get(), "/w/", 0, 50));
  ASSERT_EQ(c->current_endpoint(), etcd.endpoint(0));
  ASSERT_TRUE(WaitFor([&] { return rec.count() >= 50; }, milliseconds(5000)));
  ASSERT_TRUE(etcd.Kill(0));
  auto t0 = Clock::now();
  ASSERT_TRUE(PutSeries(c.get(), "/w/", 50, 50));
  std::printf("3 members, member 0 killed: 50 puts via %s in %.0f ms\n",
              c->current_endpoint().c_str(), MsSince(t0));
  EXPECT_NE(c->current_endpoint(), etcd.endpoint(0));
  ASSERT_TRUE(WaitFor([&] { return LastValue(rec) == "99"; }, milliseconds(10000)))
      << "only " << rec.count() << " events";
  std::this_thread::sleep_for(milliseconds(200));
  ExpectHistory(rec, etcd, "/w/", start->revision + 1, 99);
  EXPECT_GE((*w)->reconnects(), 1);
  auto g = c->Get("/w/0");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  // The killed member comes back on its data dir and catches up.
  ASSERT_TRUE(etcd.Start(0)) << etcd.error();
}

// A member that lost its raft leader (here: the other two are gone; in a partition, the side
// without a quorum) keeps a plain watch stream open and silent, while the majority may take
// writes elsewhere. The watch asks for a leader (etcd's "hasleader" metadata), so the member
// ends the stream: the watch is seen disconnected and tries the others.
TEST(EtcdThreeMembers, AWatchOnAMemberWithoutALeaderIsEnded) {
  EtcdCluster etcd(3);
  RDKV_REQUIRE_ETCD(etcd);
  auto c = NewClient(etcd);
  auto start = c->Get("/l/");
  ASSERT_TRUE(start.ok());
  Recorder rec;
  auto w = Watch::Start({.endpoints = {etcd.endpoint(0)}},
                        {.key = "/l/", .prefix = true, .start_revision = start->revision + 1},
                        rec.callback());
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(WaitFor([&] { return (*w)->connected(); }, milliseconds(5000)));
  ASSERT_TRUE(etcd.Kill(1));
  ASSERT_TRUE(etcd.Kill(2));
  auto t0 = Clock::now();
  const bool cut = WaitFor([&] { return !(*w)->connected(); }, milliseconds(10000));
  std::printf("member 0 alone: its watch stream %s after %.0f ms\n",
              cut ? "was ended" : "stayed open", MsSince(t0));
  EXPECT_TRUE(cut) << "the watch stayed on a member without a leader";
  // With a quorum again, the watch is back and delivers what is written.
  ASSERT_TRUE(etcd.Start(1)) << etcd.error();
  ASSERT_TRUE(WaitFor([&] { return c->Put("/l/after", "1").ok(); }, milliseconds(10000)));
  EXPECT_TRUE(WaitFor([&] { return LastValue(rec) == "1"; }, milliseconds(10000)));
  ASSERT_TRUE(etcd.Start(2)) << etcd.error();
}

}  // namespace
}  // namespace rdkv::etcd

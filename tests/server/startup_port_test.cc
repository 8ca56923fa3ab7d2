// A port another process holds is found before the data dir is loaded or restored: a restore
// replaces the database, and a recovery can take minutes, so both must not run for a start
// that cannot listen anyway.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "server/server.h"
#include "tests/support/free_port.h"

namespace rdkv {
namespace {

namespace fs = std::filesystem;

// A TCP socket listening on 127.0.0.1 on a free port (testing::FreePort), for the test's life.
class HeldPort {
 public:
  HeldPort() : port_(testing::FreePort()) {
    fd_ = testing::BindLoopback(port_, /*reuse=*/true);  // beside FreePort's reservation
    EXPECT_GE(fd_, 0);
    EXPECT_EQ(listen(fd_, 4), 0);
  }
  ~HeldPort() { close(fd_); }
  uint16_t port() const { return port_; }

 private:
  const uint16_t port_;
  int fd_ = -1;
};

class StartupPortTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/rdkv-port-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  server::ServerOptions Options() const {
    server::ServerOptions o;
    o.host = "127.0.0.1";
    o.port = 0;
    o.memory_bytes = 16ull << 20;
    o.huge_pages = false;
    o.transport = transport::TransportKind::kTcp;
    o.persist.durability = server::persistence::Durability::kSync;
    o.persist.data_dir = dir_ + "/data";
    return o;
  }
  std::string dir_;
};

TEST_F(StartupPortTest, ABusyPortIsFoundBeforeTheDataDirIsRestored) {
  {
    auto s = server::Server::Start(Options());  // a database in the data dir
    ASSERT_TRUE(s.ok()) << s.status().ToString();
  }
  HeldPort held;
  server::ServerOptions o = Options();
  o.port = held.port();
  // Not a snapshot: a start that got as far as the restore would fail on that instead.
  o.persist.restore_from = dir_ + "/no-such-snapshot";
  auto s = server::Server::Start(o);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kUnavailable) << s.status().ToString();
  EXPECT_NE(s.status().message().find("--port 127.0.0.1:" + std::to_string(held.port()) +
                                      " is in use by another process"),
            std::string::npos)
      << s.status().ToString();
}

TEST_F(StartupPortTest, ABusyMetricsPortIsFoundBeforeTheDataDirIsRestored) {
  HeldPort held;
  server::ServerOptions o = Options();
  o.metrics_port = held.port();
  o.persist.restore_from = dir_ + "/no-such-snapshot";
  auto s = server::Server::Start(o);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kUnavailable) << s.status().ToString();
  EXPECT_NE(s.status().message().find("--metrics_port"), std::string::npos)
      << s.status().ToString();
}

TEST_F(StartupPortTest, AMetricsPortEqualToTheServersPortIsRefusedBeforeTheLoad) {
  const uint16_t port = testing::FreePort();
  server::ServerOptions o = Options();
  o.port = port;
  o.metrics_port = port;
  o.persist.restore_from = dir_ + "/no-such-snapshot";
  auto s = server::Server::Start(o);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument) << s.status().ToString();
  EXPECT_NE(s.status().message().find("is this server's own --port"), std::string::npos)
      << s.status().ToString();
}

TEST_F(StartupPortTest, AFreePortStarts) {
  const uint16_t port = testing::FreePort();
  server::ServerOptions o = Options();
  o.port = port;
  auto s = server::Server::Start(o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ((*s)->port(), port);
}

}  // namespace
}  // namespace rdkv

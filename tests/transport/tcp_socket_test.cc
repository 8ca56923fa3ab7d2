// The tcp transport's socket helpers: a socket connected to itself (TCP simultaneous open) is
// recognised, a normal connection is not, and ConnectTo to a port with no listener fails cleanly.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>

#include "common/transport/tcp/socket_util.h"

namespace rdkv::transport::tcp {
namespace {

sockaddr_in Loopback(uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return a;
}

// A socket bound to 127.0.0.1:P (P chosen by the kernel) connected to 127.0.0.1:P: what a client
// gets when its ephemeral port happens to equal the port it connects to.
TEST(TcpSocket, SelfConnectIsDetected) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in any = Loopback(0);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&any), sizeof any), 0) << strerror(errno);
  uint16_t port = LocalPort(fd);
  ASSERT_NE(port, 0);
  sockaddr_in self = Loopback(port);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&self), sizeof self), 0) << strerror(errno);
  EXPECT_TRUE(IsSelfConnected(fd));
  EXPECT_EQ(PeerName(fd), "127.0.0.1:" + std::to_string(port));
  close(fd);
}

TEST(TcpSocket, NormalConnectionIsNotSelf) {
  auto listener = ListenOn("127.0.0.1", 0, 4);
  ASSERT_TRUE(listener.ok()) << listener.status().ToString();
  uint16_t port = LocalPort(*listener);
  auto fd = ConnectTo("127.0.0.1", port, Clock::now() + std::chrono::seconds(5));
  ASSERT_TRUE(fd.ok()) << fd.status().ToString();
  EXPECT_FALSE(IsSelfConnected(*fd));
  close(*fd);
  close(*listener);
}

TEST(TcpSocket, UnconnectedSocketIsNotSelf) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  EXPECT_FALSE(IsSelfConnected(fd));
  close(fd);
}

}  // namespace
}  // namespace rdkv::transport::tcp

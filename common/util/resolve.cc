#include "common/util/resolve.h"

#include <netdb.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/util/units.h"

namespace rdkv {

Result<std::vector<ResolvedAddress>> ResolveStream(const std::string& host, uint16_t port,
                                                   bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  addrinfo* head = nullptr;
  const std::string service = std::to_string(port);
  int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &head);
  if (rc != 0) {
    return Status::Unavailable("cannot resolve " + FormatHostPort(host, port) + ": " +
                               gai_strerror(rc));
  }
  std::vector<ResolvedAddress> out;
  for (const addrinfo* ai = head; ai != nullptr; ai = ai->ai_next) {
    ResolvedAddress a;
    a.family = ai->ai_family;
    a.socktype = ai->ai_socktype;
    a.protocol = ai->ai_protocol;
    a.length = static_cast<socklen_t>(std::min<size_t>(ai->ai_addrlen, sizeof(a.addr)));
    std::memcpy(&a.addr, ai->ai_addr, a.length);
    out.push_back(a);
  }
  freeaddrinfo(head);
  if (out.empty()) {
    return Status::Unavailable("cannot resolve " + FormatHostPort(host, port) + ": no address");
  }
  return out;
}

Status CheckTcpPortFree(const std::string& what, const std::string& host, uint16_t port) {
  if (port == 0) return Status::Ok();
  RDKV_ASSIGN_OR_RETURN(std::vector<ResolvedAddress> addresses, ResolveStream(host, port, true));
  int error = 0;
  for (const ResolvedAddress& ai : addresses) {
    const int fd = socket(ai.family, ai.socktype | SOCK_CLOEXEC, ai.protocol);
    if (fd < 0) {
      error = errno;
      continue;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);  // as the listeners do
    const bool bound = bind(fd, ai.sockaddr_ptr(), ai.length) == 0;
    error = bound ? 0 : errno;
    close(fd);
    if (bound) return Status::Ok();
  }
  const std::string where = FormatHostPort(host.empty() ? "0.0.0.0" : host, port);
  if (error == EADDRINUSE) {
    return Status::Unavailable(what + " " + where +
                               " is in use by another process (checked before the data dir "
                               "is loaded); choose another port or stop that process");
  }
  return Status::FromErrno(what + ": bind " + where, error);
}

}  // namespace rdkv

#include "common/util/resolve.h"

#include <netdb.h>

#include <algorithm>
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

}  // namespace rdkv

#include "client/seed.h"

#include "common/util/units.h"

namespace rdkv::client {

std::string ServerAddress::ToString() const {
  std::string h = host.find(':') != std::string::npos ? "[" + host + "]" : host;
  return h + ":" + std::to_string(port);
}

Result<ServerAddress> ParseServerAddress(std::string_view text) {
  ServerAddress a;
  RDKV_RETURN_IF_ERROR(ParseHostPort(text, &a.host, &a.port));
  return a;
}

}  // namespace rdkv::client

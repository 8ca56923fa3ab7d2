// Parsing of server addresses ("host:port") given to the client. Pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "rdkv/status.h"

namespace rdkv::client {

struct ServerAddress {
  std::string host;   // a name or an address; IPv6 without the brackets
  uint16_t port = 0;  // 1..65535
  // "host:port" again ("[v6]:port" for IPv6), for messages.
  std::string ToString() const;
};

// Accepts "host:port", "[ipv6]:port". kInvalidArgument with a message that quotes the input
// and says what is wrong (empty, no port, port not a number or out of range, ...).
Result<ServerAddress> ParseServerAddress(std::string_view text);

}  // namespace rdkv::client

#include "client/seed.h"

#include <charconv>

namespace rdkv::client {

std::string ServerAddress::ToString() const {
  std::string h = host.find(':') != std::string::npos ? "[" + host + "]" : host;
  return h + ":" + std::to_string(port);
}

Result<ServerAddress> ParseServerAddress(std::string_view text) {
  auto bad = [&](std::string_view why) {
    return Status::InvalidArgument("server address '" + std::string(text) + "' " +
                                   std::string(why) + " (expected host:port, e.g. 10.0.0.5:7400)");
  };
  if (text.empty()) return bad("is empty");
  std::string_view host, port;
  if (text.front() == '[') {
    size_t close = text.find(']');
    if (close == std::string_view::npos) return bad("has an unclosed '['");
    host = text.substr(1, close - 1);
    std::string_view rest = text.substr(close + 1);
    if (rest.empty() || rest.front() != ':') return bad("has no ':port' after the ']'");
    port = rest.substr(1);
  } else {
    size_t colon = text.rfind(':');
    if (colon == std::string_view::npos) return bad("has no ':port'");
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
    if (host.find(':') != std::string_view::npos) {
      return bad("has more than one ':' (write IPv6 addresses as [addr]:port)");
    }
  }
  if (host.empty()) return bad("has an empty host");
  for (char c : host) {
    if (c == ' ' || c == '\t' || c == '/' || c == '[' || c == ']') {
      return bad("has an invalid character in its host");
    }
  }
  if (port.empty()) return bad("has an empty port");
  unsigned value = 0;
  auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (ec != std::errc() || end != port.data() + port.size()) return bad("has a port that is not a number");
  if (value == 0 || value > 65535) return bad("has a port outside 1..65535");
  return ServerAddress{std::string(host), static_cast<uint16_t>(value)};
}

}  // namespace rdkv::client

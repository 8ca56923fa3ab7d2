#include "common/util/units.h"

#include <cctype>
#include <charconv>
#include <string>

namespace rdkv {

Result<uint64_t> ParseByteSize(std::string_view text) {
  auto bad = [&] {
    return Status::InvalidArgument("'" + std::string(text) +
                                   "' is not a size (examples: 4096, 64MiB, 4GiB)");
  };
  uint64_t n = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  if (ec != std::errc() || p == text.data()) return bad();
  std::string suffix;
  for (const char* q = p; q != text.data() + text.size(); ++q) {
    suffix += static_cast<char>(std::tolower(static_cast<unsigned char>(*q)));
  }
  int shift = 0;
  if (suffix.empty() || suffix == "b")
    shift = 0;
  else if (suffix == "k" || suffix == "kb" || suffix == "kib")
    shift = 10;
  else if (suffix == "m" || suffix == "mb" || suffix == "mib")
    shift = 20;
  else if (suffix == "g" || suffix == "gb" || suffix == "gib")
    shift = 30;
  else if (suffix == "t" || suffix == "tb" || suffix == "tib")
    shift = 40;
  else if (suffix == "p" || suffix == "pb" || suffix == "pib")
    shift = 50;
  else
    return bad();
  if (shift > 0 && n > (UINT64_MAX >> shift)) {
    return Status::InvalidArgument("'" + std::string(text) +
                                   "' is larger than a 64-bit byte count (16 EiB)");
  }
  return n << shift;
}

Status ParseHostPort(std::string_view text, std::string* host_out, uint16_t* port_out) {
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
  if (ec != std::errc() || end != port.data() + port.size()) {
    return bad("has a port that is not a number");
  }
  if (value == 0 || value > 65535) return bad("has a port outside 1..65535");
  *host_out = std::string(host);
  *port_out = static_cast<uint16_t>(value);
  return Status::Ok();
}

std::string FormatHostPort(std::string_view host, uint16_t port) {
  std::string out;
  if (host.find(':') != std::string_view::npos) {
    out.append("[").append(host).append("]");
  } else {
    out.append(host);
  }
  return out + ":" + std::to_string(port);
}

}  // namespace rdkv

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
  if (suffix.empty() || suffix == "b") shift = 0;
  else if (suffix == "k" || suffix == "kb" || suffix == "kib") shift = 10;
  else if (suffix == "m" || suffix == "mb" || suffix == "mib") shift = 20;
  else if (suffix == "g" || suffix == "gb" || suffix == "gib") shift = 30;
  else if (suffix == "t" || suffix == "tb" || suffix == "tib") shift = 40;
  else return bad();
  if (shift > 0 && n > (UINT64_MAX >> shift)) return bad();
  return n << shift;
}

Status ParseHostPort(std::string_view text, std::string* host, uint16_t* port) {
  size_t colon = text.rfind(':');
  if (colon == std::string_view::npos || colon == 0 || colon + 1 == text.size()) {
    return Status::InvalidArgument("'" + std::string(text) + "' is not host:port");
  }
  unsigned value = 0;
  std::string_view ps = text.substr(colon + 1);
  auto [p, ec] = std::from_chars(ps.data(), ps.data() + ps.size(), value);
  if (ec != std::errc() || p != ps.data() + ps.size() || value == 0 || value > 65535) {
    return Status::InvalidArgument("'" + std::string(ps) + "' in '" + std::string(text) +
                                   "' is not a port (1..65535)");
  }
  *host = std::string(text.substr(0, colon));
  *port = static_cast<uint16_t>(value);
  return Status::Ok();
}

}  // namespace rdkv

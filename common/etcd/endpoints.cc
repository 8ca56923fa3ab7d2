// ParseEndpoints: the --etcd flag's value to normalized client URLs.
#include <charconv>

#include "common/etcd/etcd_client.h"

namespace rdkv::etcd {
namespace {

Result<std::string> ParseOne(std::string_view item, std::string_view flag) {
  auto bad = [&](std::string_view why) {
    return Status::InvalidArgument("--etcd '" + std::string(flag) + "': endpoint '" +
                                   std::string(item) + "' " + std::string(why) +
                                   "; write host:port, http://host:port or https://host:port, "
                                   "comma-separated");
  };
  std::string_view rest = item;
  while (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
  while (!rest.empty() && rest.back() == ' ') rest.remove_suffix(1);
  if (rest.empty()) return bad("is empty");
  std::string scheme = "http://";
  if (rest.starts_with("https://")) {
    scheme = "https://";
    rest.remove_prefix(8);
  } else if (rest.starts_with("http://")) {
    rest.remove_prefix(7);
  }
  if (rest.find("://") != std::string_view::npos) return bad("has an unknown scheme");
  if (!rest.empty() && rest.back() == '/') rest.remove_suffix(1);
  if (rest.find('/') != std::string_view::npos) return bad("has a path");
  size_t colon = rest.rfind(':');
  if (colon == std::string_view::npos) return bad("has no port");
  std::string_view host = rest.substr(0, colon);
  std::string_view port = rest.substr(colon + 1);
  if (host.empty()) return bad("has no host");
  if (host.find(':') != std::string_view::npos && !(host.front() == '[' && host.back() == ']')) {
    return bad("has an IPv6 address without [brackets]");
  }
  unsigned value = 0;
  auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (port.empty() || ec != std::errc() || end != port.data() + port.size()) {
    return bad("has a port that is not a number");
  }
  if (value == 0 || value > 65535) return bad("has a port outside 1..65535");
  return scheme + std::string(host) + ":" + std::to_string(value);
}

}  // namespace

Result<std::vector<std::string>> ParseEndpoints(std::string_view flag) {
  if (flag.empty()) {
    return Status::InvalidArgument(
        "--etcd is empty: give the etcd client URLs, e.g. --etcd=10.0.0.1:2379,10.0.0.2:2379");
  }
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    size_t comma = flag.find(',', start);
    std::string_view item = flag.substr(
        start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    RDKV_ASSIGN_OR_RETURN(std::string url, ParseOne(item, flag));
    if (!out.empty() && url.starts_with("https://") != out.front().starts_with("https://")) {
      return Status::InvalidArgument("--etcd '" + std::string(flag) +
                                     "': mixes http:// and https:// endpoints; one etcd cluster "
                                     "serves clients one way");
    }
    out.push_back(std::move(url));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return out;
}

}  // namespace rdkv::etcd

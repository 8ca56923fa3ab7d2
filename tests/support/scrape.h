// Scraping a Prometheus /metrics endpoint in tests: a plain HTTP GET on 127.0.0.1 and a parser
// of the text exposition format that fails the test on a line not in it.
//
//   Scrape s = ParseExposition(HttpGet(port, "/metrics"));
//   s.at("rdkv_items"); s.types["rdkv_requests_total"] == "counter";
//
// Header-only; needs GoogleTest.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <map>
#include <regex>
#include <sstream>
#include <string>

namespace rdkv::testing {

// GET http://127.0.0.1:<port><path>; the body, or "" on any failure (no 200 answer).
inline std::string HttpGet(uint16_t port, const std::string& path) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string response;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
    const std::string request =
        "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    if (write(fd, request.data(), request.size()) == static_cast<ssize_t>(request.size())) {
      char buf[65536];
      ssize_t n;
      while ((n = read(fd, buf, sizeof buf)) > 0) response.append(buf, static_cast<size_t>(n));
    }
  }
  close(fd);
  if (response.rfind("HTTP/1.", 0) != 0 || response.find(" 200 ") == std::string::npos) return "";
  size_t body = response.find("\r\n\r\n");
  return body == std::string::npos ? "" : response.substr(body + 4);
}

// One scrape: every sample by its series (name and labels as printed) and every family's type.
struct Scrape {
  std::map<std::string, double> samples;     // `rdkv_items` or `rdkv_requests_total{op="put",...}`
  std::map<std::string, std::string> types;  // family name -> counter, gauge, histogram, ...

  // The sample's value; -1 when the series is absent.
  double at(const std::string& series) const {
    auto it = samples.find(series);
    return it == samples.end() ? -1 : it->second;
  }
};

// Parses the text exposition format, failing the test on a line that is not in it.
inline Scrape ParseExposition(const std::string& text) {
  Scrape s;
  static const std::regex kSample(R"(^([a-zA-Z_:][a-zA-Z0-9_:]*(\{[^}]*\})?) (\S+)$)");
  static const std::regex kType(R"(^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (\w+)$)");
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    std::smatch m;
    if (line.empty() || line.rfind("# HELP ", 0) == 0) continue;
    if (std::regex_match(line, m, kType)) {
      s.types[m[1]] = m[2];
    } else if (std::regex_match(line, m, kSample)) {
      s.samples[m[1]] = std::strtod(m[3].str().c_str(), nullptr);
    } else {
      ADD_FAILURE() << "not exposition format: '" << line << "'";
    }
  }
  return s;
}

}  // namespace rdkv::testing

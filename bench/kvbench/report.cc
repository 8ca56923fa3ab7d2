#include "bench/kvbench/report.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

namespace rdkv::kvbench {

namespace {

const char* const kReturnOrder[] = {"OK", "NOT_FOUND", "ERROR"};

void Line(std::string* out, const std::string& section, const std::string& metric,
          const std::string& value) {
  *out += "[" + section + "], " + metric + ", " + value + "\n";
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r'))
    s.remove_suffix(1);
  return s;
}

}  // namespace

OpSummary OpSummary::FromHistogram(const std::string& name, const Histogram& h) {
  OpSummary s;
  s.name = name;
  s.operations = h.count();
  s.average_us = h.mean() / 1000.0;
  s.min_us = static_cast<double>(h.min()) / 1000.0;
  s.max_us = static_cast<double>(h.max()) / 1000.0;
  s.p50_us = h.Percentile(50) / 1000.0;
  s.p95_us = h.Percentile(95) / 1000.0;
  s.p99_us = h.Percentile(99) / 1000.0;
  s.p999_us = h.Percentile(99.9) / 1000.0;
  return s;
}

std::string FormatNumber(double v, int decimals) {
  if (!std::isfinite(v)) return "0";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  std::string s = buf;
  if (s.find('.') != std::string::npos) {
    while (s.back() == '0') s.pop_back();
    if (s.back() == '.') s.pop_back();
  }
  if (s == "-0") s = "0";
  return s;
}

std::string FormatText(const Report& r) {
  std::string out;
  Line(&out, "OVERALL", "RunTime(ms)", FormatNumber(std::round(r.runtime_ms), 0));
  Line(&out, "OVERALL", "Throughput(ops/sec)", FormatNumber(r.throughput, 3));
  Line(&out, "OVERALL", "Operations", std::to_string(r.operations));
  for (const OpSummary& op : r.ops) {
    Line(&out, op.name, "Operations", std::to_string(op.operations));
    Line(&out, op.name, "AverageLatency(us)", FormatNumber(op.average_us));
    Line(&out, op.name, "MinLatency(us)", FormatNumber(op.min_us));
    Line(&out, op.name, "MaxLatency(us)", FormatNumber(op.max_us));
    Line(&out, op.name, "50thPercentileLatency(us)", FormatNumber(op.p50_us));
    Line(&out, op.name, "95thPercentileLatency(us)", FormatNumber(op.p95_us));
    Line(&out, op.name, "99thPercentileLatency(us)", FormatNumber(op.p99_us));
    Line(&out, op.name, "99.9thPercentileLatency(us)", FormatNumber(op.p999_us));
    for (const char* code : kReturnOrder) {
      auto it = op.returns.find(code);
      if (it != op.returns.end() && it->second > 0) {
        Line(&out, op.name, std::string("Return=") + code, std::to_string(it->second));
      }
    }
  }
  for (const auto& [name, value] : r.backend_values) {
    Line(&out, r.backend_section, name, FormatNumber(value));
  }
  for (const auto& [kind, n] : r.errors) Line(&out, "ERRORS", kind, std::to_string(n));
  return out;
}

std::string FormatJson(const Report& r) {
  nlohmann::ordered_json j;
  j["phase"] = r.phase;
  j["db"] = r.db;
  j["threads"] = r.threads;
  j["target_ops_sec"] = r.target;
  j["latency_from"] = r.target > 0 ? "intended_start" : "actual_start";
  j["overall"] = {{"runtime_ms", std::round(r.runtime_ms)},
                  {"throughput_ops_sec", r.throughput},
                  {"operations", r.operations}};
  nlohmann::ordered_json ops = nlohmann::ordered_json::object();
  for (const OpSummary& op : r.ops) {
    nlohmann::ordered_json o;
    o["operations"] = op.operations;
    o["average_us"] = op.average_us;
    o["min_us"] = op.min_us;
    o["max_us"] = op.max_us;
    o["p50_us"] = op.p50_us;
    o["p95_us"] = op.p95_us;
    o["p99_us"] = op.p99_us;
    o["p99_9_us"] = op.p999_us;
    nlohmann::ordered_json ret = nlohmann::ordered_json::object();
    for (const char* code : kReturnOrder) {
      auto it = op.returns.find(code);
      if (it != op.returns.end() && it->second > 0) ret[code] = it->second;
    }
    o["return"] = ret;
    ops[op.name] = o;
  }
  j["operations"] = ops;
  j["errors"] = r.errors;
  if (!r.backend_section.empty()) {
    nlohmann::ordered_json b = nlohmann::ordered_json::object();
    for (const auto& [name, value] : r.backend_values) b[name] = value;
    j[r.db] = b;
  }
  j["properties"] = r.properties;
  return j.dump(2) + "\n";
}

std::vector<YcsbLine> ParseYcsbText(const std::string& text) {
  std::vector<YcsbLine> lines;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) nl = text.size();
    std::string_view line(text.data() + pos, nl - pos);
    pos = nl + 1;
    line = Trim(line);
    if (line.size() < 3 || line[0] != '[') continue;
    const size_t close = line.find("], ");
    if (close == std::string_view::npos) continue;
    const size_t comma = line.find(", ", close + 3);
    if (comma == std::string_view::npos) continue;
    YcsbLine l;
    l.section = std::string(line.substr(1, close - 1));
    l.metric = std::string(line.substr(close + 3, comma - close - 3));
    const std::string_view num = Trim(line.substr(comma + 2));
    auto [p, ec] = std::from_chars(num.data(), num.data() + num.size(), l.value);
    if (ec != std::errc() || p != num.data() + num.size()) continue;
    lines.push_back(std::move(l));
  }
  return lines;
}

std::optional<double> FindMetric(const std::vector<YcsbLine>& lines, const std::string& section,
                                 const std::string& metric) {
  for (const auto& l : lines) {
    if (l.section == section && l.metric == metric) return l.value;
  }
  return std::nullopt;
}

}  // namespace rdkv::kvbench

// kvbench's results: YCSB's text format and one JSON object, and a parser of the text format.
//
// Text, one "[SECTION], Metric, value" line each, as YCSB prints them:
//   [OVERALL], RunTime(ms), 10110
//   [OVERALL], Throughput(ops/sec), 98911.97
//   [OVERALL], Operations, 1000000            (kvbench adds this line)
//   [READ], Operations, 496
//   [READ], AverageLatency(us), 456.23
//   [READ], MinLatency(us), 123
//   [READ], MaxLatency(us), 12345
//   [READ], 50thPercentileLatency(us), 401
//   [READ], 95thPercentileLatency(us), 789
//   [READ], 99thPercentileLatency(us), 1234
//   [READ], 99.9thPercentileLatency(us), 2345
//   [READ], Return=OK, 496
//   [READ], Return=NOT_FOUND, 3               (only when some occurred; likewise ERROR)
//   [READ-FAILED], ...                        (latencies of the failed ones, as YCSB does)
//   [RDKV], READsPerGET, 1.02                 (the backend's own figures)
//   [ERRORS], TimedOut, 2                     (failed operations by kind)
// Latencies are microseconds; min, max and percentiles print with up to 3 decimals (YCSB
// prints whole microseconds, which cannot show 1 % at 1 us). Sections of op types that did not
// run are left out.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "bench/kvbench/histogram.h"
#include "rdkv/status.h"

namespace rdkv::kvbench {

struct OpSummary {
  std::string name;  // "READ", "READ-FAILED", ...
  uint64_t operations = 0;
  double average_us = 0, min_us = 0, max_us = 0;
  double p50_us = 0, p95_us = 0, p99_us = 0, p999_us = 0;
  // "OK", "NOT_FOUND", "ERROR" -> count; printed in that order, only non-zero ones.
  std::map<std::string, uint64_t> returns;

  static OpSummary FromHistogram(const std::string& name, const Histogram& h);
};

struct Report {
  std::string phase;  // "load" or "run"
  std::string db;
  int threads = 1;
  double target = 0;  // ops/s; > 0: latencies count from the intended start times
  double runtime_ms = 0;
  uint64_t operations = 0;
  double throughput = 0;  // operations / runtime, ops/s
  std::vector<OpSummary> ops;
  std::map<std::string, uint64_t> errors;  // kind -> count
  std::string backend_section;             // "RDKV"
  std::vector<std::pair<std::string, double>> backend_values;
  std::map<std::string, std::string> properties;  // the effective workload properties
};

std::string FormatText(const Report& r);
std::string FormatJson(const Report& r);

// Numbers as kvbench prints them: integers without a fraction, else up to `decimals` decimals
// (trailing zeros dropped).
std::string FormatNumber(double v, int decimals = 3);

// One parsed "[SECTION], Metric, value" line.
struct YcsbLine {
  std::string section;  // without the brackets
  std::string metric;
  double value = 0;
};
// Parses YCSB text output; lines that are not "[X], Y, number" (e.g. status lines) are skipped.
std::vector<YcsbLine> ParseYcsbText(const std::string& text);
std::optional<double> FindMetric(const std::vector<YcsbLine>& lines, const std::string& section,
                                 const std::string& metric);

}  // namespace rdkv::kvbench

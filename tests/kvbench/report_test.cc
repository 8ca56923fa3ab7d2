// kvbench's output: YCSB's text format (parsed back) and the JSON object.
#include "bench/kvbench/report.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace rdkv::kvbench {
namespace {

Report Sample() {
  Report r;
  r.phase = "run";
  r.db = "rdkv";
  r.threads = 4;
  r.runtime_ms = 10110.4;
  r.operations = 1000;
  r.throughput = 98.91196834817013;
  OpSummary read;
  read.name = "READ";
  read.operations = 496;
  read.average_us = 456.2317;
  read.min_us = 1.5;
  read.max_us = 12345;
  read.p50_us = 401;
  read.p95_us = 789.25;
  read.p99_us = 1234;
  read.p999_us = 2345.678;
  read.returns = {{"OK", 496}, {"NOT_FOUND", 3}, {"ERROR", 0}};
  OpSummary upd = read;
  upd.name = "UPDATE";
  upd.operations = 501;
  upd.returns = {{"OK", 501}, {"ERROR", 2}};
  OpSummary failed = read;
  failed.name = "UPDATE-FAILED";
  failed.operations = 2;
  failed.returns.clear();
  r.ops = {read, upd, failed};
  r.errors = {{"TimedOut", 2}};
  r.backend_section = "RDKV";
  r.backend_values = {{"READsPerGET", 1.0627}, {"GETRetries", 3}};
  r.properties = {{"recordcount", "1000"}};
  return r;
}

TEST(Report, YcsbTextLines) {
  const std::string t = FormatText(Sample());
  const char* expected =
      "[OVERALL], RunTime(ms), 10110\n"
      "[OVERALL], Throughput(ops/sec), 98.912\n"
      "[OVERALL], Operations, 1000\n"
      "[READ], Operations, 496\n"
      "[READ], AverageLatency(us), 456.232\n"
      "[READ], MinLatency(us), 1.5\n"
      "[READ], MaxLatency(us), 12345\n"
      "[READ], 50thPercentileLatency(us), 401\n"
      "[READ], 95thPercentileLatency(us), 789.25\n"
      "[READ], 99thPercentileLatency(us), 1234\n"
      "[READ], 99.9thPercentileLatency(us), 2345.678\n"
      "[READ], Return=OK, 496\n"
      "[READ], Return=NOT_FOUND, 3\n"
      "[UPDATE], Operations, 501\n";
  EXPECT_EQ(t.substr(0, std::string(expected).size()), expected);
  EXPECT_NE(t.find("[UPDATE], Return=ERROR, 2\n"), std::string::npos);
  EXPECT_NE(t.find("[UPDATE-FAILED], Operations, 2\n"), std::string::npos);
  EXPECT_NE(t.find("[RDKV], READsPerGET, 1.063\n"), std::string::npos);  // 3 decimals
  EXPECT_NE(t.find("[ERRORS], TimedOut, 2\n"), std::string::npos);
  EXPECT_EQ(t.find("Return=ERROR, 0"), std::string::npos);  // zero counts are left out
}

TEST(Report, TextParsesBack) {
  const Report r = Sample();
  const auto lines =
      ParseYcsbText("2026-01-01 00:00:10:000 10 sec: 1000 operations; 98.9 current ops/sec;\n" +
                    FormatText(r) + "not a result line\n");
  EXPECT_EQ(FindMetric(lines, "OVERALL", "RunTime(ms)"), 10110.0);
  EXPECT_NEAR(*FindMetric(lines, "OVERALL", "Throughput(ops/sec)"), r.throughput, 1e-3);
  EXPECT_EQ(FindMetric(lines, "OVERALL", "Operations"), 1000.0);
  for (const OpSummary& op : r.ops) {
    EXPECT_EQ(FindMetric(lines, op.name, "Operations"), double(op.operations)) << op.name;
    EXPECT_NEAR(*FindMetric(lines, op.name, "AverageLatency(us)"), op.average_us, 1e-3);
    EXPECT_EQ(FindMetric(lines, op.name, "MinLatency(us)"), op.min_us);
    EXPECT_EQ(FindMetric(lines, op.name, "MaxLatency(us)"), op.max_us);
    EXPECT_EQ(FindMetric(lines, op.name, "50thPercentileLatency(us)"), op.p50_us);
    EXPECT_EQ(FindMetric(lines, op.name, "95thPercentileLatency(us)"), op.p95_us);
    EXPECT_EQ(FindMetric(lines, op.name, "99thPercentileLatency(us)"), op.p99_us);
    EXPECT_EQ(FindMetric(lines, op.name, "99.9thPercentileLatency(us)"), op.p999_us);
    for (const auto& [code, n] : op.returns) {
      if (n > 0) {
        EXPECT_EQ(FindMetric(lines, op.name, "Return=" + code), double(n)) << code;
      }
    }
  }
  EXPECT_EQ(FindMetric(lines, "ERRORS", "TimedOut"), 2.0);
  EXPECT_EQ(FindMetric(lines, "RDKV", "GETRetries"), 3.0);
  EXPECT_FALSE(FindMetric(lines, "READ", "Return=ERROR").has_value());
}

TEST(Report, ParsesYcsbsOwnOutput) {
  // As the Java YCSB client prints it.
  const std::string ycsb =
      "[OVERALL], RunTime(ms), 2206\n"
      "[OVERALL], Throughput(ops/sec), 453.30915684496824\n"
      "[TOTAL_GCS_PS_Scavenge], Count, 1\n"
      "[READ], Operations, 511\n"
      "[READ], AverageLatency(us), 727.2309197651663\n"
      "[READ], 95thPercentileLatency(us), 1476\n"
      "[READ], Return=OK, 511\n";
  const auto lines = ParseYcsbText(ycsb);
  EXPECT_EQ(lines.size(), 7u);
  EXPECT_NEAR(*FindMetric(lines, "OVERALL", "Throughput(ops/sec)"), 453.309, 1e-3);
  EXPECT_EQ(FindMetric(lines, "READ", "Return=OK"), 511.0);
}

TEST(Report, Json) {
  const auto j = nlohmann::json::parse(FormatJson(Sample()));
  EXPECT_EQ(j["phase"], "run");
  EXPECT_EQ(j["db"], "rdkv");
  EXPECT_EQ(j["overall"]["operations"], 1000);
  EXPECT_EQ(j["overall"]["runtime_ms"], 10110.0);
  EXPECT_EQ(j["operations"]["READ"]["operations"], 496);
  EXPECT_EQ(j["operations"]["READ"]["p99_9_us"], 2345.678);
  EXPECT_EQ(j["operations"]["READ"]["return"]["OK"], 496);
  EXPECT_EQ(j["operations"]["READ"]["return"]["NOT_FOUND"], 3);
  EXPECT_FALSE(j["operations"]["READ"]["return"].contains("ERROR"));
  EXPECT_EQ(j["errors"]["TimedOut"], 2);
  EXPECT_EQ(j["rdkv"]["READsPerGET"], 1.0627);
  EXPECT_EQ(j["latency_from"], "actual_start");
  EXPECT_EQ(j["properties"]["recordcount"], "1000");
}

TEST(Report, FormatNumber) {
  EXPECT_EQ(FormatNumber(12), "12");
  EXPECT_EQ(FormatNumber(12.5), "12.5");
  EXPECT_EQ(FormatNumber(1.23456), "1.235");
  EXPECT_EQ(FormatNumber(0.0004), "0");
  EXPECT_EQ(FormatNumber(1234.5678, 2), "1234.57");
}

TEST(Report, FromHistogramInMicroseconds) {
  Histogram h;
  for (uint64_t v = 1; v <= 100; ++v) h.Record(v * 1000);  // 1..100 us
  const OpSummary s = OpSummary::FromHistogram("READ", h);
  EXPECT_EQ(s.operations, 100u);
  EXPECT_EQ(s.min_us, 1.0);
  EXPECT_EQ(s.max_us, 100.0);
  EXPECT_DOUBLE_EQ(s.average_us, 50.5);
  EXPECT_NEAR(s.p50_us, 50, 0.5);
  EXPECT_NEAR(s.p95_us, 95, 0.95);
  EXPECT_NEAR(s.p99_us, 99, 0.99);
  EXPECT_EQ(s.p999_us, 100.0);
}

}  // namespace
}  // namespace rdkv::kvbench

// ProgressMeter: the progress line's text (done/total, rate, ETA) and the interval gate.
#include "common/util/progress.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

namespace rdkv {
namespace {

using namespace std::chrono_literals;
using Clock = ProgressMeter::Clock;

TEST(Progress, FormatEta) {
  EXPECT_EQ(FormatEta(0), "0 s");
  EXPECT_EQ(FormatEta(4.2), "5 s");
  EXPECT_EQ(FormatEta(65), "1 min 05 s");
  EXPECT_EQ(FormatEta(2 * 3600 + 3 * 60 + 10), "2 h 03 min");
  EXPECT_EQ(FormatEta(-1), "?");
}

TEST(Progress, FormatCount) {
  EXPECT_EQ(FormatCount(950), "950");
  EXPECT_EQ(FormatCount(12345), "12.3k");
  EXPECT_EQ(FormatCount(4560000), "4.56M");
  EXPECT_EQ(FormatCount(100000), "100k");
}

TEST(Progress, LineWithTotal) {
  Clock::time_point t0{};
  ProgressMeter m("recovery", "keys", 50000, 1s, t0);
  EXPECT_EQ(m.Line(12000, t0 + 3s), "recovery: 12.0k/50.0k keys (24%), 4.00k keys/s, ETA 10 s");
  EXPECT_EQ(m.Line(50000, t0 + 12s),
            "recovery: 50.0k/50.0k keys (100%), 4.17k keys/s, done in 12 s");
  // More than the (estimated) total counts as the total.
  EXPECT_EQ(m.Line(60000, t0 + 12s), m.Line(50000, t0 + 12s));
  // Nothing done yet: no rate, so no ETA.
  EXPECT_EQ(m.Line(0, t0), "recovery: 0/50.0k keys (0%), 0 keys/s, ETA ?");
}

TEST(Progress, LineWithoutTotal) {
  Clock::time_point t0{};
  ProgressMeter m("copy", "items", 0, 1s, t0);
  EXPECT_EQ(m.Line(500, t0 + 2s), "copy: 500 items, 250 items/s");
  m.set_total(1000);
  EXPECT_EQ(m.Line(500, t0 + 2s), "copy: 500/1.00k items (50%), 250 items/s, ETA 2 s");
}

TEST(Progress, DueOncePerInterval) {
  Clock::time_point t0{};
  ProgressMeter m("load", "records", 100, 2s, t0);
  EXPECT_FALSE(m.Due(t0));
  EXPECT_FALSE(m.Due(t0 + 1999ms));
  EXPECT_TRUE(m.Due(t0 + 2s));
  EXPECT_FALSE(m.Due(t0 + 2s));  // the same interval: one line only
  EXPECT_FALSE(m.Due(t0 + 3s));
  EXPECT_TRUE(m.Due(t0 + 4s));
  // A long pause gives one line, not a burst of the missed ones.
  EXPECT_TRUE(m.Due(t0 + 60s));
  EXPECT_FALSE(m.Due(t0 + 61s));
}

std::string Printed(bool terminal) {
  char* buf = nullptr;
  size_t size = 0;
  FILE* f = open_memstream(&buf, &size);
  ProgressMeter m("load", "records", 10, 0ms, Clock::now() - 1s);
  ProgressPrinter p(f, &m, terminal);
  p.Update(3);
  p.Update(6);
  p.Finish(10);
  fclose(f);
  std::string out(buf, size);
  free(buf);
  return out;
}

TEST(Progress, PrinterOnTerminalRewritesOneLine) {
  std::string out = Printed(true);
  EXPECT_EQ(out.find("\r"), 0u) << out;
  EXPECT_NE(out.find("\033[K"), std::string::npos);
  EXPECT_EQ(out.find('\n'), out.size() - 1) << out;  // one newline, at the end
  EXPECT_NE(out.find("10/10 records (100%)"), std::string::npos) << out;
}

TEST(Progress, PrinterElsewherePrintsPlainLines) {
  std::string out = Printed(false);
  EXPECT_EQ(out.find('\r'), std::string::npos) << out;
  EXPECT_EQ(out.find('\033'), std::string::npos) << out;
  int lines = 0;
  for (char c : out) lines += c == '\n';
  EXPECT_EQ(lines, 3) << out;
  EXPECT_NE(out.find("load: 3/10 records (30%)"), std::string::npos) << out;
}

}  // namespace
}  // namespace rdkv

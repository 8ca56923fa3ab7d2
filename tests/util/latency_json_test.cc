// HistogramQuantile (common/util/histogram.h) and the STATS latency object
// (common/util/latency_json.h): percentiles from buckets, an interval's buckets from two
// readings, and the merge that sums servers.
#include "common/util/latency_json.h"

#include <gtest/gtest.h>

#include <vector>

namespace rdkv {
namespace {

const std::vector<double> kBounds = {10, 100, 1000};  // 4 buckets: ..10, ..100, ..1000, above

TEST(HistogramQuantile, InterpolatesWithinTheBucketOfTheRank) {
  // 100 samples, all in (10, 100]: p50 is halfway through that bucket, p99 near its top.
  EXPECT_DOUBLE_EQ(HistogramQuantile(kBounds, {0, 100, 0, 0}, 0.5), 55.0);
  EXPECT_DOUBLE_EQ(HistogramQuantile(kBounds, {0, 100, 0, 0}, 0.99), 10 + 90 * 0.99);
  // 90 fast, 10 slow: p50 among the fast, p99 among the slow.
  EXPECT_LE(HistogramQuantile(kBounds, {90, 0, 10, 0}, 0.5), 10.0);
  EXPECT_GT(HistogramQuantile(kBounds, {90, 0, 10, 0}, 0.99), 100.0);
  // The first bucket starts at 0.
  EXPECT_DOUBLE_EQ(HistogramQuantile(kBounds, {4, 0, 0, 0}, 0.5), 5.0);
}

TEST(HistogramQuantile, EmptyIsZeroAndTheOverflowBucketGivesTheTopBound) {
  EXPECT_EQ(HistogramQuantile(kBounds, {0, 0, 0, 0}, 0.5), 0.0);
  EXPECT_EQ(HistogramQuantile(kBounds, {}, 0.5), 0.0);
  EXPECT_EQ(HistogramQuantile(kBounds, {0, 0, 0, 7}, 0.5), 1000.0);
}

TEST(HistogramQuantile, IsMonotoneInQ) {
  const std::vector<uint64_t> counts = {3, 17, 5, 1};
  double last = 0;
  for (double q = 0.01; q < 1.0; q += 0.01) {
    double v = HistogramQuantile(kBounds, counts, q);
    EXPECT_GE(v, last) << "q=" << q;
    last = v;
  }
}

HistogramSnapshot Snap(std::vector<uint64_t> counts) {
  HistogramSnapshot h;
  h.upper_bounds = {10e-6, 100e-6, 1000e-6};  // seconds: 10 us, 100 us, 1 ms
  h.counts = std::move(counts);
  for (uint64_t c : h.counts) h.count += c;
  return h;
}

TEST(LatencyJson, AddLatencyOpWritesMicrosecondsAndPercentiles) {
  nlohmann::json lat = nlohmann::json::object();
  AddLatencyOp(&lat, "put", Snap({0, 100, 0, 0}));
  ASSERT_EQ(lat["bounds_us"].size(), 3u);
  EXPECT_NEAR(lat["bounds_us"][0].get<double>(), 10.0, 1e-9);
  EXPECT_NEAR(lat["bounds_us"][2].get<double>(), 1000.0, 1e-9);
  const nlohmann::json& put = lat["ops"]["put"];
  EXPECT_EQ(put["count"].get<uint64_t>(), 100u);
  EXPECT_NEAR(put["p50_us"].get<double>(), 55.0, 1e-6);
  EXPECT_LE(put["p50_us"].get<double>(), put["p99_us"].get<double>());
  EXPECT_EQ(put["buckets"].get<std::vector<uint64_t>>(), (std::vector<uint64_t>{0, 100, 0, 0}));
}

TEST(LatencyJson, BucketsSinceIsTheIntervalAcrossOps) {
  nlohmann::json before = nlohmann::json::object(), now = nlohmann::json::object();
  AddLatencyOp(&before, "put", Snap({1, 2, 0, 0}));
  AddLatencyOp(&now, "put", Snap({1, 5, 4, 0}));
  AddLatencyOp(&now, "cas", Snap({2, 0, 0, 0}));  // not in `before`: all of it is new
  EXPECT_EQ(LatencyBucketsSince(now, before, {"put"}), (std::vector<uint64_t>{0, 3, 4, 0}));
  EXPECT_EQ(LatencyBucketsSince(now, before, {"put", "cas", "delete"}),
            (std::vector<uint64_t>{2, 3, 4, 0}));
  // A server that restarted (a bucket went down) counts from 0 again.
  EXPECT_EQ(LatencyBucketsSince(before, now, {"put"}), (std::vector<uint64_t>{1, 2, 0, 0}));
  // No latency in the stats (an older server): nothing.
  EXPECT_TRUE(LatencyBucketsSince(nlohmann::json(), before, {"put"}).empty());
}

TEST(LatencyJson, MergeAddsBucketsAndRecomputesPercentiles) {
  nlohmann::json a = nlohmann::json::object(), b = nlohmann::json::object();
  AddLatencyOp(&a, "put", Snap({100, 0, 0, 0}));  // fast server
  AddLatencyOp(&b, "put", Snap({0, 0, 100, 0}));  // slow server
  AddLatencyOp(&b, "cas", Snap({0, 1, 0, 0}));
  nlohmann::json total;
  MergeLatency(&total, a);
  MergeLatency(&total, b);
  const nlohmann::json& put = total["ops"]["put"];
  EXPECT_EQ(put["count"].get<uint64_t>(), 200u);
  EXPECT_EQ(put["buckets"].get<std::vector<uint64_t>>(), (std::vector<uint64_t>{100, 0, 100, 0}));
  // Not the sum of the two servers' p50s: the p50 of all 200 samples.
  EXPECT_NEAR(put["p50_us"].get<double>(), HistogramQuantile(kBounds, {100, 0, 100, 0}, 0.5), 1e-6);
  EXPECT_GT(put["p99_us"].get<double>(), 100.0);
  EXPECT_EQ(total["ops"]["cas"]["count"].get<uint64_t>(), 1u);
}

// Client::Stats and kvcli stats --all sum the servers' STATS with SumStats. A field whose
// type differs between servers (another build), or sums past int64, must not throw or wrap:
// the reader is an application.
TEST(LatencyJson, SumStatsAddsNumbersAndSkipsFieldsOfAnotherType) {
  nlohmann::json total = nlohmann::json::object();
  SumStats(&total, nlohmann::json::parse(
                       R"({"puts": 2, "rate": 0.5, "store": {"items": 3}, "mode": "x", "odd": 1,
                           "big": 9223372036854775000, "small": -9223372036854775000})"));
  SumStats(&total, nlohmann::json::parse(
                       R"({"puts": 5, "rate": 0.25, "store": {"items": 4}, "mode": "y",
                           "odd": {"nested": 1}, "big": 1000, "small": -1000})"));
  SumStats(&total, nlohmann::json::parse(R"({"store": 7, "puts": "many", "rate": {"a": 1}})"));
  EXPECT_EQ(total["puts"].get<int64_t>(), 7);
  EXPECT_DOUBLE_EQ(total["rate"].get<double>(), 0.75);
  EXPECT_EQ(total["store"]["items"].get<int64_t>(), 7);
  EXPECT_EQ(total["odd"].get<int64_t>(), 1) << "the first server's type is kept";
  EXPECT_FALSE(total.contains("mode")) << "strings are not summed";
  EXPECT_EQ(total["big"].get<int64_t>(), INT64_MAX) << "sums saturate";
  EXPECT_EQ(total["small"].get<int64_t>(), INT64_MIN);
}

}  // namespace
}  // namespace rdkv

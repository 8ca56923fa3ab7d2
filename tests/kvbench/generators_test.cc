// kvbench's YCSB generators against their definitions.
#include "bench/kvbench/generators.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <thread>
#include <vector>

namespace rdkv::kvbench {
namespace {

// Binomial tolerance: `sigmas` standard deviations of a frequency p over n draws.
double Tol(double p, double n, double sigmas = 5) { return sigmas * std::sqrt(p * (1 - p) / n); }

TEST(FnvHash64, KnownValues) {
  // FNV-1a over the 8 little-endian bytes, offset basis 0xCBF29CE484222325, prime
  // 1099511628211, then the absolute value of the signed result (values computed independently).
  EXPECT_EQ(FnvHash64(0), 6284781860667377211LL);
  EXPECT_EQ(FnvHash64(1), 8517097267634966620LL);
  EXPECT_EQ(FnvHash64(2), 1820151046732198393LL);
  EXPECT_EQ(FnvHash64(42), 55488592825689361LL);
  EXPECT_EQ(FnvHash64(1000), 5952875239596136740LL);
  EXPECT_EQ(FnvHash64(123456789), 2350796791908741607LL);
  EXPECT_EQ(FnvHash64(-1), 8289690350564177859LL);
  for (int64_t v = -1000; v < 1000; ++v) EXPECT_GE(FnvHash64(v), 0) << v;
}

TEST(JavaAbs, MinValueStaysNegative) {
  EXPECT_EQ(JavaAbs(-5), 5);
  EXPECT_EQ(JavaAbs(INT64_MIN), INT64_MIN);
}

TEST(Zeta, SumsAndIncrements) {
  EXPECT_DOUBLE_EQ(Zeta(1, 0.99), 1.0);
  EXPECT_DOUBLE_EQ(Zeta(2, 0.99), 1.0 + std::pow(0.5, 0.99));
  EXPECT_NEAR(ZetaIncrement(100, 250, 0.99, Zeta(100, 0.99)), Zeta(250, 0.99), 1e-12);
}

TEST(Zeta, LargeMatchesYcsbConstantAndExactSums) {
  // YCSB's precomputed zeta for its 10^10-item scrambled zipfian.
  EXPECT_NEAR(ZetaLarge(10000000000ull, 0.99), ScrambledZipfianGenerator::kZetan, 1e-8);
  for (double theta : {0.5, 0.8, 0.99}) {
    EXPECT_NEAR(ZetaLarge(200000, theta), Zeta(200000, theta), 1e-9 * Zeta(200000, theta)) << theta;
  }
}

TEST(Uniform, RangeAndMean) {
  Rng rng(1);
  UniformGenerator g(10, 19);
  std::map<int64_t, int> seen;
  const int n = 200000;
  for (int i = 0; i < n; ++i) ++seen[g.NextValue(rng)];
  ASSERT_EQ(seen.size(), 10u);
  EXPECT_EQ(seen.begin()->first, 10);
  EXPECT_EQ(seen.rbegin()->first, 19);
  for (auto [v, c] : seen) EXPECT_NEAR(c / double(n), 0.1, Tol(0.1, n)) << v;
}

// The probability the Gray et al. generator gives rank k (0-based) of n items, from its formula:
// rank 0 for u < 1/zetan, rank 1 for u < (1 + 0.5^theta)/zetan, else
// k = floor(n (eta u - eta + 1)^alpha), i.e. rank >= k iff u >= 1 + ((k/n)^(1-theta) - 1)/eta.
double GrayProbability(int64_t k, int64_t n, double theta) {
  const double zetan = Zeta(n, theta);
  const double eta = (1 - std::pow(2.0 / n, 1 - theta)) / (1 - Zeta(2, theta) / zetan);
  if (k == 0) return 1 / zetan;
  if (k == 1) return std::pow(0.5, theta) / zetan;
  const double lo = (1 + std::pow(0.5, theta)) / zetan;
  auto cut = [&](int64_t r) {
    return std::max(lo, 1 + (std::pow(double(r) / n, 1 - theta) - 1) / eta);
  };
  return std::min(1.0, cut(k + 1)) - std::min(1.0, cut(k));
}

TEST(Zipfian, TopRanksFollowZipfsLaw) {
  const int64_t items = 1000;
  const double theta = 0.99;
  ZipfianGenerator g(0, items - 1, theta);
  EXPECT_NEAR(g.zetan(), Zeta(items, theta), 1e-12);
  Rng rng(7);
  const int n = 2000000;
  std::vector<int> count(items + 1, 0);
  for (int i = 0; i < n; ++i) {
    const int64_t v = g.NextValue(rng);
    ASSERT_GE(v, 0);
    ASSERT_LT(v, items);
    ++count[v];
  }
  const double zetan = Zeta(items, theta);
  // Ranks 0 and 1 are exact in Gray's method: 1 / ((i+1)^theta zeta(n)).
  for (int i = 0; i < 2; ++i) {
    const double want = 1.0 / (std::pow(i + 1, theta) * zetan);
    EXPECT_NEAR(count[i] / double(n), want, Tol(want, n)) << "rank " << i;
  }
  // Further ranks follow the generator's own formula, an approximation of Zipf's law: 17 % above
  // 1/((i+1)^theta zeta) at rank 2, within 4 % from rank 10 on (for n = 1000).
  for (int i = 2; i < 50; ++i) {
    const double want = GrayProbability(i, items, theta);
    EXPECT_NEAR(count[i] / double(n), want, Tol(want, n)) << "rank " << i;
    const double zipf = 1.0 / (std::pow(i + 1, theta) * zetan);
    EXPECT_NEAR(want / zipf, 1.0, i < 10 ? 0.2 : 0.04) << "rank " << i;
  }
}

TEST(Zipfian, OtherConstant) {
  const int64_t items = 500;
  const double theta = 0.5;
  ZipfianGenerator g(100, 100 + items - 1, theta);
  Rng rng(9);
  const int n = 1000000;
  int top = 0, second = 0;
  for (int i = 0; i < n; ++i) {
    const int64_t v = g.NextValue(rng);
    ASSERT_GE(v, 100);
    ASSERT_LT(v, 100 + items);
    top += v == 100;
    second += v == 101;
  }
  const double p0 = 1 / Zeta(items, theta), p1 = std::pow(0.5, theta) / Zeta(items, theta);
  EXPECT_NEAR(top / double(n), p0, Tol(p0, n));
  EXPECT_NEAR(second / double(n), p1, Tol(p1, n));
}

TEST(Zipfian, ZetaGrowsIncrementallyWithTheItemCount) {
  ZipfianGenerator g(0, 99, 0.99);
  Rng rng(3);
  (void)g.NextLong(rng, 300);
  EXPECT_NEAR(g.zetan(), Zeta(300, 0.99), 1e-12);
  const double eta300 = (1 - std::pow(2.0 / 300, 0.01)) / (1 - Zeta(2, 0.99) / Zeta(300, 0.99));
  EXPECT_NEAR(g.eta(), eta300, 1e-12);
  for (int i = 0; i < 100000; ++i) {
    const int64_t v = g.NextLong(rng, 300);
    ASSERT_GE(v, 0);
    ASSERT_LT(v, 300);
  }
}

TEST(ScrambledZipfian, RangeAndHotKeys) {
  const int64_t lo = 1000, hi = 1999, items = hi - lo + 1;
  ScrambledZipfianGenerator g(lo, hi);
  EXPECT_EQ(g.itemcount(), items);
  Rng rng(11);
  const int n = 1000000;
  std::map<int64_t, int> count;
  for (int i = 0; i < n; ++i) {
    const int64_t v = g.NextValue(rng);
    ASSERT_GE(v, lo);
    ASSERT_LE(v, hi);
    ++count[v];
  }
  // The zipfian's rank 0 and 1 over 10^10 items land on fnvhash64(0) % n and fnvhash64(1) % n.
  const int64_t hot0 = lo + FnvHash64(0) % items, hot1 = lo + FnvHash64(1) % items;
  ASSERT_NE(hot0, hot1);
  const double p0 = 1 / ScrambledZipfianGenerator::kZetan;
  const double p1 = std::pow(0.5, 0.99) / ScrambledZipfianGenerator::kZetan;
  // Other ranks hash onto these keys too: about 1/items of the remaining mass each.
  const double rest = (1 - p0 - p1) / items;
  EXPECT_NEAR(count[hot0] / double(n), p0 + rest, Tol(p0, n) + 2 * rest);
  EXPECT_NEAR(count[hot1] / double(n), p1 + rest, Tol(p1, n) + 2 * rest);
  int64_t most = 0;
  for (auto [v, c] : count) most = c > count[most] ? v : most;
  EXPECT_EQ(most, hot0);
  EXPECT_GT(count.size(), static_cast<size_t>(items * 9 / 10));  // spread over the key space
}

TEST(ScrambledZipfian, OtherConstantUsesComputedZeta) {
  ScrambledZipfianGenerator g(0, 99, 0.9);
  Rng rng(5);
  for (int i = 0; i < 10000; ++i) {
    const int64_t v = g.NextValue(rng);
    ASSERT_GE(v, 0);
    ASSERT_LE(v, 99);
  }
}

TEST(Hotspot, HotSetGetsItsShare) {
  HotspotGenerator g(0, 999, 0.2, 0.8);
  EXPECT_EQ(g.hot_interval(), 200);
  Rng rng(13);
  const int n = 500000;
  int hot = 0;
  for (int i = 0; i < n; ++i) {
    const int64_t v = g.NextValue(rng);
    ASSERT_GE(v, 0);
    ASSERT_LE(v, 999);
    hot += v < 200;
  }
  EXPECT_NEAR(hot / double(n), 0.8, Tol(0.8, n));
}

TEST(AcknowledgedCounter, LimitAdvancesOverContiguousAcks) {
  AcknowledgedCounterGenerator c(1000);
  EXPECT_EQ(c.LastValue(), 999);
  EXPECT_EQ(c.NextValue(), 1000);
  EXPECT_EQ(c.NextValue(), 1001);
  EXPECT_EQ(c.NextValue(), 1002);
  EXPECT_TRUE(c.Acknowledge(1001));
  EXPECT_EQ(c.LastValue(), 999);  // 1000 still outstanding
  EXPECT_TRUE(c.Acknowledge(1000));
  EXPECT_EQ(c.LastValue(), 1001);
  EXPECT_TRUE(c.Acknowledge(1002));
  EXPECT_EQ(c.LastValue(), 1002);
  EXPECT_FALSE(c.Acknowledge(1002 + AcknowledgedCounterGenerator::kWindow + 1));
}

TEST(AcknowledgedCounter, ConcurrentInsertsAllCounted) {
  AcknowledgedCounterGenerator c(0);
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t) {
    ts.emplace_back([&] {
      for (int i = 0; i < 20000; ++i) ASSERT_TRUE(c.Acknowledge(c.NextValue()));
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(c.LastValue(), 80000 - 1);
}

TEST(SkewedLatest, FavoursTheLatestAcknowledgedInserts) {
  AcknowledgedCounterGenerator basis(1000);  // records 0..999 loaded
  SkewedLatestGenerator g(&basis, 0.99);
  Rng rng(17);
  const int n = 500000;
  auto draw = [&](int64_t max, std::map<int64_t, int>* count) {
    for (int i = 0; i < n; ++i) {
      const int64_t v = g.NextValue(rng);
      ASSERT_LE(v, max);
      ASSERT_GE(v, 0);
      ++(*count)[v];
    }
  };
  std::map<int64_t, int> before;
  draw(999, &before);
  // max - zipf(max): the latest record is zipf's rank 0, P = 1/zeta(999).
  const double p0 = 1 / Zeta(999, 0.99);
  EXPECT_NEAR(before[999] / double(n), p0, Tol(p0, n));
  EXPECT_GT(before[998], before[990]);

  // 100 inserts finish: the new ones take over as the most popular.
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(basis.Acknowledge(basis.NextValue()));
  ASSERT_EQ(basis.LastValue(), 1099);
  std::map<int64_t, int> after;
  draw(1099, &after);
  const double q0 = 1 / Zeta(1099, 0.99);
  EXPECT_NEAR(after[1099] / double(n), q0, Tol(q0, n));
  int recent = 0;
  for (auto [v, c] : after) recent += v >= 1000 ? c : 0;
  // Ranks 0..99 of a zipfian over 1099 items: well over half of the draws.
  EXPECT_GT(recent / double(n), 0.6);
  // A not-yet-acknowledged insert is never chosen.
  (void)basis.NextValue();  // 1100 outstanding
  for (int i = 0; i < 10000; ++i) ASSERT_LE(g.NextValue(rng), 1099);
}

TEST(Discrete, Proportions) {
  DiscreteGenerator d;
  d.Add(0.5, 1);
  d.Add(0.3, 2);
  d.Add(0.2, 3);
  Rng rng(19);
  const int n = 300000;
  std::map<int, int> c;
  for (int i = 0; i < n; ++i) ++c[d.Next(rng)];
  EXPECT_NEAR(c[1] / double(n), 0.5, Tol(0.5, n));
  EXPECT_NEAR(c[2] / double(n), 0.3, Tol(0.3, n));
  EXPECT_NEAR(c[3] / double(n), 0.2, Tol(0.2, n));
}

TEST(Rng, DoubleInUnitInterval) {
  Rng rng(23);
  double sum = 0;
  for (int i = 0; i < 100000; ++i) {
    const double d = rng.NextDouble();
    ASSERT_GE(d, 0.0);
    ASSERT_LT(d, 1.0);
    sum += d;
  }
  EXPECT_NEAR(sum / 100000, 0.5, 0.01);
}

}  // namespace
}  // namespace rdkv::kvbench

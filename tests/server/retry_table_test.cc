// The retry table (server/retry_table.h): answers found by request id, the newest answer kept,
// the oldest dropped at capacity and after the retention, checked against a plain model through
// a long random run of records (the index's deletions are where an open-addressing table
// goes wrong), and concurrent use (run under TSan in CI).
#include "server/retry_table.h"

#include <gtest/gtest.h>

#include <chrono>
#include <deque>
#include <map>
#include <random>
#include <set>
#include <thread>
#include <utility>
#include <vector>

namespace rdkv::server {
namespace {

using namespace std::chrono_literals;

TEST(RetryTableTest, FindsWhatWasRecordedAndNothingElse) {
  RetryTable t;
  EXPECT_FALSE(t.Find(7, 1).has_value());
  t.Record(0, 7, 1, {StatusCode::kOk, 42});
  t.Record(0, 7, 2, {StatusCode::kVersionMismatch, 9});
  auto a = t.Find(7, 1);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->code, StatusCode::kOk);
  EXPECT_EQ(a->version, 42u);
  auto b = t.Find(7, 2);
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->code, StatusCode::kVersionMismatch);
  EXPECT_EQ(b->version, 9u);
  EXPECT_FALSE(t.Find(7, 3).has_value());
  EXPECT_FALSE(t.Find(8, 1).has_value());
  EXPECT_EQ(t.size(), 2u);
  EXPECT_EQ(t.hits(), 2u);
}

TEST(RetryTableTest, ClientZeroIsNeverRecorded) {
  RetryTable t;
  t.Record(0, 0, 5, {StatusCode::kOk, 1});
  EXPECT_FALSE(t.Find(0, 5).has_value());
  EXPECT_EQ(t.size(), 0u);
}

TEST(RetryTableTest, ASecondRecordKeepsTheAnswerWithTheHigherVersion) {
  RetryTable t;
  t.Record(0, 3, 4, {StatusCode::kOk, 10});
  t.Record(0, 3, 4, {StatusCode::kAlreadyExists, 9});  // older: ignored
  auto a = t.Find(3, 4);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->code, StatusCode::kOk);
  EXPECT_EQ(a->version, 10u);
  t.Record(0, 3, 4, {StatusCode::kOk, 12});  // the write again above a newer version
  a = t.Find(3, 4);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->version, 12u);
  EXPECT_EQ(t.size(), 1u);
}

TEST(RetryTableTest, OneStripeDropsTheOldestAtCapacity) {
  RetryTable t(/*capacity=*/100, 120s, /*stripes=*/1);
  for (uint64_t seq = 1; seq <= 250; ++seq) t.Record(0, 1, seq, {StatusCode::kOk, seq});
  EXPECT_EQ(t.size(), 100u);
  for (uint64_t seq = 1; seq <= 150; ++seq) EXPECT_FALSE(t.Find(1, seq).has_value()) << seq;
  for (uint64_t seq = 151; seq <= 250; ++seq) {
    auto a = t.Find(1, seq);
    ASSERT_TRUE(a.has_value()) << seq;
    EXPECT_EQ(a->version, seq);
  }
}

TEST(RetryTableTest, StripesKeepAtMostTheCapacityInAll) {
  RetryTable t(/*capacity=*/64 * 8, 120s);
  for (uint64_t seq = 1; seq <= 100000; ++seq)
    t.Record(0, seq % 13 + 1, seq, {StatusCode::kOk, seq});
  EXPECT_LE(t.size(), 64u * 8);
  EXPECT_GT(t.size(), 64u * 8 / 2);  // the stripes fill about evenly
  // The newest of all is always kept.
  auto a = t.Find(100000 % 13 + 1, 100000);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->version, 100000u);
}

TEST(RetryTableTest, AnswersExpireAfterTheRetention) {
  RetryTable t(/*capacity=*/1000, 50ms, /*stripes=*/1);
  t.Record(0, 1, 1, {StatusCode::kOk, 1});
  t.Record(0, 1, 2, {StatusCode::kOk, 2});
  ASSERT_TRUE(t.Find(1, 1).has_value());
  std::this_thread::sleep_for(120ms);
  EXPECT_FALSE(t.Find(1, 1).has_value());
  t.Record(0, 1, 3, {StatusCode::kOk, 3});  // a record drops what has expired
  EXPECT_EQ(t.size(), 1u);
  EXPECT_TRUE(t.Find(1, 3).has_value());
  EXPECT_FALSE(t.Find(1, 2).has_value());
}

// A stripe's ring grows from 64 entries by doubling; growing after expiry has moved the ring's
// head (so that its entries wrap around) keeps every entry and its order.
TEST(RetryTableTest, GrowingKeepsEveryEntryInOrder) {
  RetryTable t(/*capacity=*/1000, 100ms, /*stripes=*/1);
  for (uint64_t seq = 1; seq <= 40; ++seq) t.Record(0, 1, seq, {StatusCode::kOk, seq});
  std::this_thread::sleep_for(200ms);
  // The first record drops the 40 expired ones: the head moves to position 40 of 64.
  for (uint64_t seq = 41; seq <= 300; ++seq) t.Record(0, 1, seq, {StatusCode::kOk, seq});
  EXPECT_EQ(t.size(), 260u);
  for (uint64_t seq = 1; seq <= 40; ++seq) EXPECT_FALSE(t.Find(1, seq).has_value()) << seq;
  for (uint64_t seq = 41; seq <= 300; ++seq) {
    auto a = t.Find(1, seq);
    ASSERT_TRUE(a.has_value()) << seq;
    EXPECT_EQ(a->version, seq);
  }
  // Still one FIFO: at 1000, the oldest go first.
  for (uint64_t seq = 301; seq <= 1100; ++seq) t.Record(0, 1, seq, {StatusCode::kOk, seq});
  EXPECT_EQ(t.size(), 1000u);
  EXPECT_FALSE(t.Find(1, 100).has_value());
  EXPECT_TRUE(t.Find(1, 101).has_value());
}

// Against a model: one stripe is one FIFO of `capacity` ids (in the order of their first
// records), each with the answer of its highest version (here its latest record). Ids
// come from a small space so that duplicates and collisions in the index are frequent, and
// every drop runs the index's backward-shift deletion.
TEST(RetryTableTest, ARandomRunMatchesTheModel) {
  for (size_t capacity : {1u, 2u, 7u, 64u, 1000u}) {
    RetryTable t(capacity, 3600s, /*stripes=*/1);
    std::deque<std::pair<uint64_t, uint64_t>> order;         // oldest first
    std::map<std::pair<uint64_t, uint64_t>, uint64_t> kept;  // id -> newest version
    std::mt19937_64 rng(capacity);
    const uint64_t space = capacity * 3 + 5;
    for (uint64_t step = 1; step <= 60000; ++step) {
      const uint64_t client = 1 + rng() % 3, seq = rng() % space;
      const auto id = std::make_pair(client, seq);
      t.Record(0, client, seq, {StatusCode::kOk, step});
      if (!kept.count(id)) {
        if (order.size() == capacity) {
          kept.erase(order.front());
          order.pop_front();
        }
        order.push_back(id);
      }
      kept[id] = step;
      // A few lookups per step, present and absent alike.
      for (int probe = 0; probe < 3; ++probe) {
        const uint64_t c = 1 + rng() % 3, s = rng() % space;
        auto want = kept.find({c, s});
        auto got = t.Find(c, s);
        ASSERT_EQ(got.has_value(), want != kept.end())
            << "capacity " << capacity << " step " << step << " id " << c << "/" << s;
        if (got) {
          ASSERT_EQ(got->version, want->second) << "capacity " << capacity << " step " << step;
        }
      }
    }
    EXPECT_EQ(t.size(), kept.size());
  }
}

TEST(RetryTableTest, ConcurrentRecordsAndFinds) {
  RetryTable t(/*capacity=*/1 << 16, 120s);
  constexpr int kThreads = 4;
  constexpr uint64_t kPerThread = 20000;
  std::vector<std::thread> threads;
  std::atomic<int> missing{0};
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, client = uint64_t(i + 1)] {
      for (uint64_t seq = 1; seq <= kPerThread; ++seq) {
        t.Record(static_cast<uint32_t>(client), client, seq, {StatusCode::kOk, seq});
        // Its own latest record is there (4 x 20000 ids fit the capacity of 65536 only in
        // part: a recent one is always kept).
        auto a = t.Find(client, seq);
        if (!a || a->version != seq) missing.fetch_add(1);
      }
    });
  }
  // A copy's scan beside them: every id it returns is one of theirs (shard = client).
  std::atomic<bool> done{false};
  std::atomic<int> foreign{0};
  std::thread scanner([&] {
    while (!done) {
      uint64_t cursor = 0;
      do {
        std::vector<RetryTable::Kept> got;
        cursor = t.ScanShard(2, cursor, 64, &got);
        for (const RetryTable::Kept& k : got) foreign.fetch_add(k.client_id != 2);
      } while (cursor != RetryTable::kScanEnd);
    }
  });
  for (auto& th : threads) th.join();
  done = true;
  scanner.join();
  EXPECT_EQ(foreign.load(), 0);
  EXPECT_EQ(missing.load(), 0);
  EXPECT_LE(t.size(), size_t{1} << 16);
}

// Every id of a shard kept from a scan's start to its end is in what the scan returned, with
// the version of one of its records, and nothing of another shard is: ids are recorded between
// the pages, so the stripes grow and then drop their oldest under the scan's cursor.
TEST(RetryTableTest, AShardScanSeesEveryIdKeptThroughGrowthAndDrops) {
  // Pages of 1, 7 and 32 ids. Starting with 500 records, 1,400 during the scan (spread over
  // its first pages) make the stripes grow and then drop; starting full (1,500), 600 during
  // the scan drop an entry at every record.
  struct Run {
    size_t page;
    int start, per_call, budget;
  };
  for (Run run : {Run{1, 500, 16, 1400}, Run{7, 500, 80, 1400}, Run{32, 500, 350, 1400},
                  Run{1, 1500, 6, 600}, Run{7, 1500, 40, 600}, Run{32, 1500, 150, 600}}) {
    const size_t page = run.page;
    const int per_call = run.per_call;
    int budget = run.budget;
    RetryTable t(/*capacity=*/4 * 300, 3600s, /*stripes=*/4);
    std::map<std::pair<uint64_t, uint64_t>, uint32_t> shard_of;
    std::map<std::pair<uint64_t, uint64_t>, std::set<uint64_t>> versions;
    std::mt19937_64 rng(page);
    uint64_t next_seq = 1, version = 0;
    auto record_some = [&](int n) {
      for (int i = 0; i < n; ++i) {
        // Mostly new ids, some again (a new version for one kept).
        uint64_t seq = rng() % 4 == 0 && next_seq > 1 ? 1 + rng() % (next_seq - 1) : next_seq++;
        const auto id = std::make_pair(uint64_t{9}, seq);
        const uint32_t shard = shard_of.count(id) ? shard_of[id] : static_cast<uint32_t>(rng() % 3);
        shard_of[id] = shard;
        versions[id].insert(++version);
        t.Record(shard, 9, seq, {StatusCode::kOk, version});
      }
    };
    record_some(run.start);
    std::set<std::pair<uint64_t, uint64_t>> at_start;
    for (const auto& [id, shard] : shard_of) {
      if (shard == 1 && t.Find(id.first, id.second)) at_start.insert(id);
    }
    std::map<std::pair<uint64_t, uint64_t>, uint64_t> scanned;
    uint64_t cursor = 0;
    int calls = 0;
    do {
      std::vector<RetryTable::Kept> got;
      const uint64_t next = t.ScanShard(1, cursor, page, &got);
      ASSERT_LE(got.size(), page);
      ASSERT_TRUE(next == RetryTable::kScanEnd || next > cursor) << "the cursor must advance";
      for (const RetryTable::Kept& k : got) {
        const auto id = std::make_pair(k.client_id, k.seq);
        ASSERT_EQ(shard_of.at(id), 1u) << "an id of another shard";
        EXPECT_TRUE(versions.at(id).count(k.version)) << "a version never recorded";
        scanned[id] = k.version;
      }
      cursor = next;
      // Past the capacity during the scan: the oldest are dropped.
      const int n = std::min(per_call, budget);
      record_some(n);
      budget -= n;
      ASSERT_LT(++calls, 100000);
    } while (cursor != RetryTable::kScanEnd);
    size_t still = 0;
    for (const auto& id : at_start) {
      if (!t.Find(id.first, id.second)) continue;  // dropped during the scan: may be missed
      ++still;
      EXPECT_TRUE(scanned.count(id)) << "page " << page << ": id " << id.second << " was kept "
                                     << "throughout and not returned";
    }
    EXPECT_GT(still, 10u) << "the test must keep some ids through the scan";
    EXPECT_LT(still, at_start.size()) << "the test must drop some ids during the scan";
  }
}

// Only answers kept now, and only kOk ones; a call visits at most kMaxScanVisits entries and
// still advances, so a shard whose ids lie behind many of other shards' takes several calls.
TEST(RetryTableTest, AShardScanSkipsExpiredAndFailedAnswersAndBoundsItsVisits) {
  {
    RetryTable t(/*capacity=*/100, 1s, /*stripes=*/1);
    t.Record(2, 1, 1, {StatusCode::kOk, 5});
    std::this_thread::sleep_for(1200ms);
    t.Find(1, 1);  // no effect on what is kept
    t.Record(2, 1, 2, {StatusCode::kOk, 6});
    t.Record(2, 1, 3, {StatusCode::kAlreadyExists, 7});
    std::vector<RetryTable::Kept> got;
    EXPECT_EQ(t.ScanShard(2, 0, 10, &got), RetryTable::kScanEnd);
    ASSERT_EQ(got.size(), 1u);
    EXPECT_EQ(got[0].seq, 2u);
    EXPECT_EQ(got[0].version, 6u);
  }
  {
    const size_t others = RetryTable::kMaxScanVisits + 1000;
    RetryTable t(/*capacity=*/others + 10, 3600s, /*stripes=*/1);
    for (uint64_t seq = 1; seq <= others; ++seq) t.Record(0, 3, seq, {StatusCode::kOk, seq});
    for (uint64_t seq = 1; seq <= 5; ++seq) t.Record(7, 4, seq, {StatusCode::kOk, seq});
    std::vector<RetryTable::Kept> got;
    const uint64_t next = t.ScanShard(7, 0, 128, &got);
    EXPECT_TRUE(got.empty());
    ASSERT_NE(next, RetryTable::kScanEnd);
    EXPECT_EQ(t.ScanShard(7, next, 128, &got), RetryTable::kScanEnd);
    EXPECT_EQ(got.size(), 5u);
  }
}

// A shard's ids forgotten (its copy dropped): no longer found or scanned, others untouched, and
// a later record of one of them is a new answer (a lower version too).
TEST(RetryTableTest, ForgettingAShardHidesItsIdsUntilOneIsRecordedAgain) {
  RetryTable t(/*capacity=*/1000, 3600s, /*stripes=*/4);
  for (uint64_t seq = 1; seq <= 100; ++seq) {
    t.Record(static_cast<uint32_t>(seq % 2), 8, seq, {StatusCode::kOk, 1000 + seq});
  }
  EXPECT_EQ(t.ForgetShard(1), 50u);
  for (uint64_t seq = 1; seq <= 100; ++seq) {
    EXPECT_EQ(t.Find(8, seq).has_value(), seq % 2 == 0) << seq;
  }
  std::vector<RetryTable::Kept> got;
  EXPECT_EQ(t.ScanShard(1, 0, 128, &got), RetryTable::kScanEnd);
  EXPECT_TRUE(got.empty());
  EXPECT_EQ(t.ScanShard(0, 0, 128, &got), RetryTable::kScanEnd);
  EXPECT_EQ(got.size(), 50u);
  t.Record(1, 8, 3, {StatusCode::kOk, 5});
  auto again = t.Find(8, 3);
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->version, 5u);
  got.clear();
  EXPECT_EQ(t.ScanShard(1, 0, 128, &got), RetryTable::kScanEnd);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].seq, 3u);
  EXPECT_EQ(t.ForgetShard(1), 1u);
}

}  // namespace
}  // namespace rdkv::server

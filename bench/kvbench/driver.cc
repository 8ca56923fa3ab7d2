#include "bench/kvbench/driver.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <ctime>
#include <map>
#include <memory>
#include <thread>
#include <vector>

#include "common/util/mutex.h"
#include "common/util/progress.h"
#include "common/util/thread_annotations.h"

namespace rdkv::kvbench {

namespace {

using Clock = std::chrono::steady_clock;

// Display order of the measured operations.
enum Measure { kMRead = 0, kMUpdate, kMInsert, kMReadModifyWrite, kNumMeasures };
const char* const kMeasureNames[kNumMeasures] = {"READ", "UPDATE", "INSERT", "READ-MODIFY-WRITE"};

struct OpMeasurement {
  Histogram ok;                     // OK and NOT_FOUND (YCSB's [READ])
  Histogram failed;                 // errors (YCSB's [READ-FAILED])
  uint64_t returns[3] = {0, 0, 0};  // OK, NOT_FOUND, ERROR
};

// One thread's figures. The histograms are the thread's own; the interval counters are read by
// the status line.
struct ThreadStats {
  std::array<OpMeasurement, kNumMeasures> ops;
  std::map<std::string, uint64_t> errors;
  struct Interval {
    std::atomic<uint64_t> count{0};
    std::atomic<uint64_t> sum_ns{0};
  };
  std::array<Interval, kNumMeasures> interval;
  std::atomic<uint64_t> done{0};

  void Measure(Measure m, Clock::time_point start, Clock::time_point end, const OpStatus& s) {
    const auto ns = static_cast<uint64_t>(std::max<int64_t>(
        0, std::chrono::duration_cast<std::chrono::nanoseconds>(end - start).count()));
    OpMeasurement& op = ops[m];
    if (s.code == OpStatus::kError) {
      op.failed.Record(ns);
      ++errors[s.kind];
    } else {
      op.ok.Record(ns);
    }
    ++op.returns[s.code];
    interval[m].count.fetch_add(1, std::memory_order_relaxed);
    interval[m].sum_ns.fetch_add(ns, std::memory_order_relaxed);
  }
};

struct Shared {
  std::atomic<bool> stop{false};
  rdkv::Mutex mu;
  rdkv::CondVar cv;
  int running GUARDED_BY(mu) = 0;
};

class Worker {
 public:
  Worker(CoreWorkload& w, std::unique_ptr<DB> db, ThreadStats* stats, Shared* shared, Phase phase,
         int64_t ops /* < 0: until stopped */, double tick_ns, Clock::time_point deadline,
         bool has_deadline)
      : w_(w),
        db_(std::move(db)),
        stats_(stats),
        shared_(shared),
        phase_(phase),
        ops_(ops),
        tick_ns_(tick_ns),
        deadline_(deadline),
        has_deadline_(has_deadline),
        ts_(w.NewThread(FreshSeed())) {}

  void Run(Clock::time_point start) {
    for (int64_t i = 0; ops_ < 0 || i < ops_; ++i) {
      if (shared_->stop.load(std::memory_order_relaxed)) break;
      Clock::time_point op_start;
      if (tick_ns_ > 0) {
        op_start = start + std::chrono::nanoseconds(
                               static_cast<int64_t>(tick_ns_ * static_cast<double>(i)));
        if (has_deadline_ && op_start >= deadline_) break;
        if (!SleepUntil(op_start)) break;
      } else {
        op_start = Clock::now();
        if (has_deadline_ && op_start >= deadline_) break;
      }
      if (phase_ == Phase::kLoad) {
        DoInsert(w_.NextLoadKeynum(), op_start, /*acknowledge=*/false);
      } else {
        switch (ts_->NextOp()) {
          case OpType::kRead:
            DoRead(op_start);
            break;
          case OpType::kUpdate:
            DoUpdate(op_start);
            break;
          case OpType::kInsert:
            DoInsert(w_.NextInsertKeynum(), op_start, /*acknowledge=*/true);
            break;
          case OpType::kReadModifyWrite:
            DoReadModifyWrite(op_start);
            break;
          case OpType::kScan:
            break;  // refused before the run starts
        }
      }
      stats_->done.fetch_add(1, std::memory_order_relaxed);
    }
  }

 private:
  // Waits until t, so that a stop is noticed. False when stopped. Sleeps until shortly before t
  // and yields the rest: a timer wake-up can be late by tens of microseconds, and with a target
  // that lateness would count as latency of the operation.
  bool SleepUntil(Clock::time_point t) {
    constexpr auto kSpin = std::chrono::microseconds(100);
    while (true) {
      const auto now = Clock::now();
      if (now >= t) return true;
      if (shared_->stop.load(std::memory_order_relaxed)) return false;
      if (t - now > kSpin) {
        std::this_thread::sleep_until(std::min(t - kSpin, now + std::chrono::milliseconds(100)));
      } else {
        std::this_thread::yield();
      }
    }
  }

  OpStatus Read(Clock::time_point start) {
    OpStatus s = db_->Read(key_, &read_buf_);
    if (s.ok() && !w_.CheckValue(key_, read_buf_)) s = OpStatus::Error("wrong_value");
    stats_->Measure(kMRead, start, Clock::now(), s);
    return s;
  }

  OpStatus Update() {
    w_.BuildValue(key_, ts_->rng(), &value_);
    const auto start = Clock::now();
    OpStatus s = db_->Update(key_, value_);
    stats_->Measure(kMUpdate, start, Clock::now(), s);
    return s;
  }

  void DoRead(Clock::time_point start) {
    key_ = w_.BuildKeyName(ts_->NextKeynum());
    (void)Read(start);
  }

  void DoUpdate(Clock::time_point start) {
    key_ = w_.BuildKeyName(ts_->NextKeynum());
    w_.BuildValue(key_, ts_->rng(), &value_);
    OpStatus s = db_->Update(key_, value_);
    stats_->Measure(kMUpdate, start, Clock::now(), s);
  }

  void DoInsert(int64_t keynum, Clock::time_point start, bool acknowledge) {
    key_ = w_.BuildKeyName(keynum);
    w_.BuildValue(key_, ts_->rng(), &value_);
    OpStatus s = db_->Insert(key_, value_);
    stats_->Measure(kMInsert, start, Clock::now(), s);
    // YCSB acknowledges in a finally block: a failed insert is acknowledged too.
    if (acknowledge) w_.AcknowledgeInsert(keynum);
  }

  void DoReadModifyWrite(Clock::time_point start) {
    key_ = w_.BuildKeyName(ts_->NextKeynum());
    const OpStatus r = Read(start);
    const OpStatus u = Update();
    OpStatus whole = r.code == OpStatus::kError ? r : u.code == OpStatus::kError ? u : r;
    stats_->Measure(kMReadModifyWrite, start, Clock::now(), whole);
  }

  CoreWorkload& w_;
  std::unique_ptr<DB> db_;
  ThreadStats* stats_;
  Shared* shared_;
  Phase phase_;
  int64_t ops_;
  double tick_ns_;
  Clock::time_point deadline_;
  bool has_deadline_;
  std::unique_ptr<CoreWorkload::ThreadState> ts_;
  std::string key_, value_, read_buf_;
};

std::string WallClockLabel() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  char out[80];
  std::snprintf(out, sizeof out, "%s:%03d", buf, static_cast<int>(ms));
  return out;
}

// YCSB's status line: "<date> 10 sec: 12345 operations; 1234.57 current ops/sec;
// est completion in 20 seconds [READ AverageLatency(us)=123.45] [UPDATE ...]".
class StatusPrinter {
 public:
  StatusPrinter(std::FILE* out, const std::vector<std::unique_ptr<ThreadStats>>& stats,
                int64_t total_ops, Clock::time_point start)
      : out_(out), stats_(stats), total_ops_(total_ops), start_(start), last_time_(start) {}

  void Print() {
    if (!out_) return;
    const auto now = Clock::now();
    uint64_t done = 0;
    std::array<uint64_t, kNumMeasures> count{}, sum{};
    for (const auto& s : stats_) {
      done += s->done.load(std::memory_order_relaxed);
      for (int m = 0; m < kNumMeasures; ++m) {
        count[m] += s->interval[m].count.load(std::memory_order_relaxed);
        sum[m] += s->interval[m].sum_ns.load(std::memory_order_relaxed);
      }
    }
    const double elapsed = std::chrono::duration<double>(now - start_).count();
    const double window = std::chrono::duration<double>(now - last_time_).count();
    const double rate = window > 0 ? static_cast<double>(done - last_done_) / window : 0;
    std::string line = WallClockLabel() + " " + std::to_string(static_cast<int64_t>(elapsed)) +
                       " sec: " + std::to_string(done) + " operations; " + FormatNumber(rate, 2) +
                       " current ops/sec;";
    if (total_ops_ > 0 && rate > 0 && done < static_cast<uint64_t>(total_ops_)) {
      line += " est completion in " +
              std::to_string(static_cast<int64_t>(
                  static_cast<double>(total_ops_ - static_cast<int64_t>(done)) / rate)) +
              " seconds";
    }
    for (int m = 0; m < kNumMeasures; ++m) {
      const uint64_t n = count[m] - last_count_[m];
      if (n == 0) continue;
      const double avg_us =
          static_cast<double>(sum[m] - last_sum_[m]) / static_cast<double>(n) / 1000.0;
      line += std::string(" [") + kMeasureNames[m] +
              " AverageLatency(us)=" + FormatNumber(avg_us, 2) + "]";
    }
    std::fprintf(out_, "%s\n", line.c_str());
    std::fflush(out_);
    last_time_ = now;
    last_done_ = done;
    last_count_ = count;
    last_sum_ = sum;
  }

 private:
  std::FILE* out_;
  const std::vector<std::unique_ptr<ThreadStats>>& stats_;
  int64_t total_ops_;
  Clock::time_point start_, last_time_;
  uint64_t last_done_ = 0;
  std::array<uint64_t, kNumMeasures> last_count_{}, last_sum_{};
};

// Whether status and progress lines share one stream (then a terminal progress line is cleared
// before a status line).
bool progress_out_same(const DriverOptions& o) {
  return o.status_out != nullptr && o.status_out == o.progress_out;
}

}  // namespace

int64_t ThreadOpCount(int64_t count, int threads, int thread_index) {
  int64_t n = count / threads;
  if (thread_index < count % threads) ++n;
  return n;
}

Result<Report> RunPhase(CoreWorkload& workload, Backend& backend, const DriverOptions& options) {
  const WorkloadConfig& c = workload.config();
  const int threads = c.threadcount;
  const int64_t total = options.phase == Phase::kLoad ? c.insertcount : c.operationcount;
  if (options.phase == Phase::kRun && total == 0 && c.maxexecutiontime <= 0) {
    return Status::InvalidArgument(
        "operationcount=0 runs until maxexecutiontime, which is not set");
  }

  // Run by time: every thread goes on until maxexecutiontime.
  const bool unlimited = options.phase == Phase::kRun && total == 0;

  // Every thread's connection is opened before the clock starts (rdkv: a client's further
  // connections per server open on the first operation of a thread that uses them).
  std::vector<std::unique_ptr<DB>> dbs;
  for (int t = 0; t < threads; ++t) {
    auto db = backend.NewDB();
    if (!db.ok()) return db.status();
    dbs.push_back(std::move(*db));
  }
  std::vector<std::unique_ptr<ThreadStats>> stats;
  for (int t = 0; t < threads; ++t) stats.push_back(std::make_unique<ThreadStats>());

  // Warm-up: operations of the same mix on one more connection, before the clock and the
  // backend's counters start (e.g. to fill a client's location cache); nothing is reported.
  if (options.phase == Phase::kRun && c.warmupoperationcount > 0) {
    auto db = backend.NewDB();
    if (!db.ok()) return db.status();
    ThreadStats warm_stats;
    Shared warm_shared;
    Worker warm(workload, std::move(*db), &warm_stats, &warm_shared, Phase::kRun,
                c.warmupoperationcount, 0, Clock::time_point{}, false);
    warm.Run(Clock::now());
  }

  Shared shared;
  const double tick_ns = c.target > 0 ? 1e9 * threads / c.target : 0;
  backend.PhaseStart();
  const Clock::time_point start = Clock::now();
  const bool has_deadline = c.maxexecutiontime > 0;
  const Clock::time_point deadline = start + std::chrono::duration_cast<Clock::duration>(
                                                 std::chrono::duration<double>(c.maxexecutiontime));
  std::vector<std::unique_ptr<Worker>> workers;
  for (int t = 0; t < threads; ++t) {
    workers.push_back(std::make_unique<Worker>(
        workload, std::move(dbs[t]), stats[t].get(), &shared, options.phase,
        unlimited ? -1 : ThreadOpCount(total, threads, t), tick_ns, deadline, has_deadline));
  }
  {
    rdkv::MutexLock lock(&shared.mu);
    shared.running = threads;
  }
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      workers[t]->Run(start);
      rdkv::MutexLock lock(&shared.mu);
      if (--shared.running == 0) shared.cv.SignalAll();
    });
  }

  StatusPrinter status(options.status_out, stats, total, start);
  const bool status_on = c.status_interval > 0;
  const auto interval =
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(c.status_interval));
  Clock::time_point next_status = start + interval;
  // Load progress: records done of insertcount, rate, ETA.
  const bool progress_on =
      options.phase == Phase::kLoad && options.progress_out != nullptr && total > 0;
  const bool progress_tty = progress_on && isatty(fileno(options.progress_out)) == 1;
  double progress_secs = options.progress_interval > 0 ? options.progress_interval
                         : progress_tty                ? 1.0
                                                       : c.status_interval;
  if (progress_secs <= 0) progress_secs = 10;
  const auto progress_every =
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(progress_secs));
  rdkv::ProgressMeter meter("load", "records", static_cast<uint64_t>(std::max<int64_t>(total, 0)),
                            std::chrono::duration_cast<std::chrono::milliseconds>(progress_every),
                            start);
  rdkv::ProgressPrinter progress(progress_on ? options.progress_out : stderr, &meter, progress_tty);
  Clock::time_point next_progress = start + progress_every;
  auto records_done = [&stats] {
    uint64_t done = 0;
    for (const auto& s : stats) done += s->done.load(std::memory_order_relaxed);
    return done;
  };
  {
    rdkv::MutexLock lock(&shared.mu);
    while (shared.running > 0) {
      Clock::time_point wake = Clock::time_point::max();
      if (status_on) wake = next_status;
      if (progress_on) wake = std::min(wake, next_progress);
      if (has_deadline && !shared.stop.load()) wake = std::min(wake, deadline);
      if (wake == Clock::time_point::max()) {
        while (shared.running != 0) shared.cv.Wait(&shared.mu);
        break;
      }
      while (shared.running != 0 && shared.cv.WaitUntil(&shared.mu, wake)) {
      }
      if (shared.running == 0) break;
      const auto now = Clock::now();
      if (has_deadline && now >= deadline) shared.stop.store(true);
      if (status_on && now >= next_status) {
        lock.Unlock();
        // A status line after a terminal progress line starts on a fresh line.
        if (progress_tty && progress_out_same(options)) std::fputs("\r\033[K", options.status_out);
        status.Print();
        lock.Lock();
        while (next_status <= now) next_status += interval;
      }
      if (progress_on && now >= next_progress) {
        lock.Unlock();
        progress.Print(records_done());
        lock.Lock();
        while (next_progress <= now) next_progress += progress_every;
      }
    }
  }
  for (auto& t : ts) t.join();
  const Clock::time_point end = Clock::now();
  if (progress_on) progress.Finish(records_done());
  if (status_on) status.Print();  // YCSB prints a last status line at the end too

  Report r;
  r.phase = options.phase == Phase::kLoad ? "load" : "run";
  r.db = backend.name();
  r.threads = threads;
  r.target = c.target;
  r.runtime_ms = std::chrono::duration<double, std::milli>(end - start).count();
  for (const auto& s : stats) r.operations += s->done.load();
  r.throughput = r.runtime_ms > 0 ? static_cast<double>(r.operations) * 1000.0 / r.runtime_ms : 0;

  std::array<OpMeasurement, kNumMeasures> merged;
  for (const auto& s : stats) {
    for (int m = 0; m < kNumMeasures; ++m) {
      merged[m].ok.Merge(s->ops[m].ok);
      merged[m].failed.Merge(s->ops[m].failed);
      for (int k = 0; k < 3; ++k) merged[m].returns[k] += s->ops[m].returns[k];
    }
    for (const auto& [kind, n] : s->errors) r.errors[kind] += n;
  }
  for (int m = 0; m < kNumMeasures; ++m) {
    const OpMeasurement& op = merged[m];
    const uint64_t attempted = op.returns[0] + op.returns[1] + op.returns[2];
    if (attempted == 0) continue;
    OpSummary s = OpSummary::FromHistogram(kMeasureNames[m], op.ok);
    s.returns["OK"] = op.returns[0];
    s.returns["NOT_FOUND"] = op.returns[1];
    s.returns["ERROR"] = op.returns[2];
    r.ops.push_back(std::move(s));
  }
  for (int m = 0; m < kNumMeasures; ++m) {
    if (merged[m].failed.count() == 0) continue;
    r.ops.push_back(
        OpSummary::FromHistogram(std::string(kMeasureNames[m]) + "-FAILED", merged[m].failed));
  }
  BackendReport br = backend.PhaseReport();
  r.backend_section = br.section;
  r.backend_values = br.values;
  return r;
}

}  // namespace rdkv::kvbench

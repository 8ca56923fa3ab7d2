// Runs one phase (load or run) of a workload against a backend with N client threads, like
// YCSB's Client: per-thread operation counts, an optional target rate, a time limit, a status
// line every status.interval seconds, and per-operation latency histograms.
//
// Measurement: each thread's clock is std::chrono::steady_clock. Without a target, an operation's
// latency runs from the moment it is issued to its return. With a target (ops/s over all
// threads) operation i of a thread is due at start + i / (target / threads); the thread waits
// for that moment, and latency runs from it, so a stall delays later operations and they count
// the wait (no coordinated omission). Read-modify-write is one operation made of a read and an
// update: [READ] and [UPDATE] count both parts (the read from the operation's start), and
// [READ-MODIFY-WRITE] the whole.
#pragma once

#include <cstdio>
#include <string>

#include "bench/kvbench/db.h"
#include "bench/kvbench/report.h"
#include "bench/kvbench/workload.h"

namespace rdkv::kvbench {

enum class Phase { kLoad, kRun };

struct DriverOptions {
  Phase phase = Phase::kRun;
  std::FILE* status_out = stderr;  // status lines; nullptr: none
  // The load phase's progress ("load: 40.0k/100k records (40%), 20.0k records/s, ETA 3 s"): on a
  // terminal one line rewritten every second, otherwise a plain line every status.interval
  // (progress_interval when set). nullptr: none.
  std::FILE* progress_out = nullptr;
  double progress_interval = 0;  // seconds; 0: 1 s on a terminal, else status.interval
};

// The report of the phase (runtime, throughput, per-op summaries, errors by kind, the
// backend's figures). Fails only when the threads cannot start (a DB cannot be opened).
Result<Report> RunPhase(CoreWorkload& workload, Backend& backend, const DriverOptions& options);

// The operations a thread does: YCSB splits count evenly, the first count % threads one more.
int64_t ThreadOpCount(int64_t count, int threads, int thread_index);

}  // namespace rdkv::kvbench

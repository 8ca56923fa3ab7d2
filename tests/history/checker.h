// The linearizability checker for rdkv histories (history.h; model and algorithm in
// tests/history/README.md).
//
// Model: one register per key, absent or (value, version); keys are checked independently
// (linearizability is compositional). Every key is absent before its first operation.
//   put          -> present(value, v), v the returned version
//   insert       ok iff absent, exists iff present
//   cas(e)       ok iff present with version e, version_mismatch iff present with another,
//                not_found iff absent
//   delete       ok iff present (-> absent), not_found iff absent
//   get          returns the state: value and version
// A key's versions strictly increase in linearization order (also across deletes). An op with
// outcome `unknown` may take effect at any point after its invoke, or never; its version is
// the one a get of its value observed, else unknown (only bounded by its neighbours). `fail`
// ops and gets without an answer have no effect and are ignored.
//
// Algorithm: per key, a depth-first search for a linearization that linearizes an operation
// only once every operation that completed before its invoke is linearized (Wing & Gong, with
// Lowe's just-in-time linearization), memoizing (set of linearized ops, register state) so a
// configuration is explored once. Before the search, values identify their writes (values are
// unique): a read of a value no write wrote, a value read with two versions, a read that
// completed before its write was invoked, and (version_precheck) an op that observed an older
// version than one completed before it was invoked, are reported at once.
//
// Thread-safety: CheckHistory and CheckKey are pure functions (CheckHistory runs keys on
// several threads).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tests/history/history.h"

namespace rdkv::history {

struct CheckOptions {
  // Threads checking keys in parallel; 0 = hardware concurrency.
  int threads = 0;
  // Memory for one key's memo table (bitsets of linearized ops); the key's verdict is
  // kUnknown when the search needs more.
  size_t max_memo_bytes = size_t{1} << 30;
  // Time for one key's search (0: none); the key's verdict is kUnknown when it needs more.
  double max_seconds = 0;
  // 0: an op of unknown outcome may take effect any time after its invoke, or never (sound,
  // but a failing search may have to try very many placements of such ops). > 0: an
  // assumption, that it takes effect at most this long after it completed, or never: a bound
  // on how long a request can stay in flight unseen (in a server's queue, the network).
  int64_t unknown_deadline_ns = 0;
  // Linearized ops shown before a violation's window.
  size_t context_ops = 4;
  // Before the search, a sweep in O(n log n) finds the ops that observed versions out of real
  // time order (a stale read, versions not increasing): violations the search would find
  // too, found at once whatever the rest of the history. Off only to test the search.
  bool version_precheck = true;
};

enum class Verdict : uint8_t {
  kLinearizable,
  kViolation,
  kUnknown,     // the search ran out of its memory budget
  kBadHistory,  // the history breaks the recorder's rules (a value written twice)
};
std::string_view VerdictName(Verdict v);

struct KeyReport {
  std::string key;
  Verdict verdict = Verdict::kLinearizable;
  // Counts of the key's ops, by type and outcome.
  size_t ops = 0, gets = 0, puts = 0, inserts = 0, cas = 0, deletes = 0;
  size_t unknown = 0, failed = 0;
  uint64_t states = 0;  // configurations explored
  double seconds = 0;
  // On a violation (or bad history): what was found, the register state the longest partial
  // linearization reached, its last ops (context) and the window of ops that cannot be
  // linearized from there (the op that cannot complete, and every op that could precede it).
  std::string explanation;
  std::string state_before;
  std::vector<Op> context;
  std::vector<Op> window;
};

struct CheckResult {
  Verdict verdict = Verdict::kLinearizable;  // the worst over keys
  std::vector<KeyReport> keys;               // sorted by key
  size_t ops = 0;
  double seconds = 0;
};

// Checks one key's ops (all with op.key == key).
KeyReport CheckKey(const std::string& key, std::vector<Op> ops, const CheckOptions& options);
// Checks every key.
CheckResult CheckHistory(const std::vector<Op>& ops, const CheckOptions& options = {});

// "c3 cas(k1, expected=12, value=c3-17) -> ok v13  [+1.200 ms, +1.500 ms]" (times relative
// to origin_ns).
std::string FormatOp(const Op& op, int64_t origin_ns);
// The verdict, per-key counts, times, and each violation's window (lincheck's output).
std::string FormatReport(const CheckResult& r);

}  // namespace rdkv::history

// lincheck HISTORY.jsonl [...]: checks a recorded history for linearizability (checker.h).
// Prints the verdict, per-key operation counts and the time taken; on a violation, the key and
// the window of operations that cannot be linearized. Exit 0 linearizable, 1 not linearizable,
// 2 error (unreadable or malformed history, bad history, search budget exceeded).
#include <gflags/gflags.h>

#include <cstdio>

#include "tests/history/checker.h"
#include "tests/history/history.h"

DEFINE_int32(threads, 0, "Keys checked in parallel (0 = one per core).");
DEFINE_uint64(max_memo_mb, 1024, "Memory budget of one key's search, MiB.");
DEFINE_double(max_seconds, 0, "Time budget of one key's search, seconds (0: none).");
DEFINE_int64(unknown_deadline_ms, 0,
             "0: an op of unknown outcome may take effect any time after its invoke, or never. "
             "> 0: assume it takes effect at most this long after it completed, or never (much "
             "faster on failing histories with many unknown outcomes; an assumption).");
DEFINE_uint64(context, 4, "Linearized ops shown before a violation's window.");
DEFINE_bool(version_precheck, true,
            "Find ops that observed versions out of real-time order before the search (off: "
            "the search alone decides; for testing it).");

int main(int argc, char** argv) {
  gflags::SetUsageMessage(
      "lincheck HISTORY.jsonl...: checks rdkv histories for linearizability.\n"
      "Exit 0 linearizable, 1 not linearizable, 2 error or undecided.");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  if (argc < 2) {
    std::fprintf(stderr, "usage: lincheck HISTORY.jsonl... (see --help)\n");
    return 2;
  }
  std::vector<rdkv::history::Op> ops;
  for (int i = 1; i < argc; ++i) {  // several files: e.g. one per load process
    auto h = rdkv::history::ReadHistory(argv[i]);
    if (!h.ok()) {
      std::fprintf(stderr, "lincheck: %s\n", h.status().ToString().c_str());
      return 2;
    }
    ops.insert(ops.end(), h->begin(), h->end());
  }
  rdkv::history::CheckOptions o;
  o.threads = FLAGS_threads;
  o.max_memo_bytes = FLAGS_max_memo_mb << 20;
  o.context_ops = FLAGS_context;
  o.version_precheck = FLAGS_version_precheck;
  o.max_seconds = FLAGS_max_seconds;
  o.unknown_deadline_ns = FLAGS_unknown_deadline_ms * 1000000;
  rdkv::history::CheckResult r = rdkv::history::CheckHistory(ops, o);
  std::fputs(rdkv::history::FormatReport(r).c_str(), stdout);
  switch (r.verdict) {
    case rdkv::history::Verdict::kLinearizable:
      return 0;
    case rdkv::history::Verdict::kViolation:
      return 1;
    default:
      return 2;
  }
}

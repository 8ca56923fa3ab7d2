// kvbench: a YCSB-style benchmark driver for rdkv, Redis and memcached.
//
//   kvbench load -db rdkv -P bench/workloads/workloada -p rdkv.seed=127.0.0.1:7400
//   kvbench run  -db rdkv -P bench/workloads/workloada -threads 4 -target 20000
//   kvbench run  -db redis -P bench/workloads/workloadb -p redis.port=6379 --json
//
// See kvbench --help, and docs/benchmarks.md for how it is run side by side with Redis and
// memcached (bench/compare.sh).
#include <glog/logging.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench/kvbench/db.h"
#include "bench/kvbench/driver.h"
#include "bench/kvbench/report.h"
#include "bench/kvbench/workload.h"

namespace rdkv::kvbench {
namespace {

constexpr int kExitUsage = 2;
constexpr int kExitFailed = 1;
constexpr int kExitOpErrors = 3;

void Usage(std::FILE* out) {
  std::fprintf(
      out,
      "usage: kvbench load|run [options]\n"
      "\n"
      "YCSB's core workloads against rdkv, Redis or memcached, with YCSB's generators and\n"
      "YCSB's output format. Load the records first (load), then measure (run).\n"
      "\n"
      "options:\n"
      "  -db NAME         rdkv (default), redis or memcached (built in: ");
  const auto backends = AvailableBackends();
  for (size_t i = 0; i < backends.size(); ++i) {
    std::fprintf(out, "%s%s", i ? ", " : "", backends[i].c_str());
  }
  std::fprintf(
      out,
      ")\n"
      "  -P FILE          a workload file (YCSB property format), e.g. bench/workloads/workloada;\n"
      "                   may be repeated; later files win\n"
      "  -p NAME=VALUE    set a property (wins over every -P file)\n"
      "  -threads N       client threads (property threadcount)\n"
      "  -target N        ops/s over all threads; latencies then count from each operation's\n"
      "                   intended start (no coordinated omission) (property target)\n"
      "  -s               status lines on stderr (on by default; status.interval=0 turns off);\n"
      "                   load also prints its progress (records done/total, rate, ETA):\n"
      "                   on a terminal one line updated every second\n"
      "  --json           print one JSON object instead of YCSB's text\n"
      "  -h, --help       this text\n"
      "\n"
      "properties (unknown ones are errors):\n");
  for (const auto& [name, what] : KnownProperties()) {
    std::fprintf(out, "  %-26s %s\n", name.c_str(), what.c_str());
  }
  std::fprintf(out,
               "\n"
               "Workload E (scans) is refused: rdkv is a hash store without range scans (and the\n"
               "redis and memcached backends keep plain keys, which cannot scan either).\n"
               "Exit status: 0 done; 3 done but some operations failed (see Return=ERROR and\n"
               "[ERRORS]); 1 the run could not start; 2 usage or workload error.\n");
}

int Main(int argc, char** argv) {
  if (argc < 2) {
    Usage(stderr);
    return kExitUsage;
  }
  const std::string phase_arg = argv[1];
  if (phase_arg == "-h" || phase_arg == "--help" || phase_arg == "-help") {
    Usage(stdout);
    return 0;
  }
  if (phase_arg != "load" && phase_arg != "run") {
    std::fprintf(stderr,
                 "kvbench: the first argument must be load or run, not '%s' (kvbench --help)\n",
                 phase_arg.c_str());
    return kExitUsage;
  }
  const Phase phase = phase_arg == "load" ? Phase::kLoad : Phase::kRun;

  std::vector<std::string> files;
  std::vector<std::pair<std::string, std::string>> overrides;  // (assignment, origin)
  bool json = false;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* flag) -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "kvbench: %s needs a value (kvbench --help)\n", flag);
        return nullptr;
      }
      return argv[++i];
    };
    if (a == "-h" || a == "--help" || a == "-help") {
      Usage(stdout);
      return 0;
    } else if (a == "--json" || a == "-json") {
      json = true;
    } else if (a == "-s") {
      // Status lines are always on (YCSB needs -s for them); kept for YCSB command lines.
    } else if (a == "-P") {
      const char* v = value("-P");
      if (!v) return kExitUsage;
      files.push_back(v);
    } else if (a == "-p") {
      const char* v = value("-p");
      if (!v) return kExitUsage;
      overrides.push_back({v, "-p"});
    } else if (a == "-db" || a == "-threads" || a == "-target") {
      const char* v = value(a.c_str());
      if (!v) return kExitUsage;
      const std::string prop = a == "-db" ? "db" : a == "-threads" ? "threadcount" : "target";
      overrides.push_back({prop + "=" + v, a});
    } else {
      std::fprintf(stderr, "kvbench: unknown argument '%s' (kvbench --help)\n", a.c_str());
      return kExitUsage;
    }
  }

  Properties props;
  for (const auto& f : files) {
    Status s = props.LoadFile(f);
    if (!s.ok()) {
      std::fprintf(stderr, "kvbench: %s\n", s.message().c_str());
      return kExitUsage;
    }
  }
  for (const auto& [assignment, origin] : overrides) {
    Status s = props.ParseOverride(assignment);
    if (!s.ok()) {
      std::fprintf(stderr, "kvbench: %s\n", s.message().c_str());
      return kExitUsage;
    }
    const std::string name = assignment.substr(0, assignment.find('='));
    props.Set(name, props.Get(name), origin);
  }
  auto config = ParseWorkload(props);
  if (!config.ok()) {
    std::fprintf(stderr, "kvbench: %s\n", config.status().message().c_str());
    return kExitUsage;
  }
  const std::string db = props.Get("db", "rdkv");
  if (config->scanproportion > 0) {
    std::fprintf(stderr, "kvbench: %s\n", ScanRefusal(*config).c_str());
    return kExitUsage;
  }

  std::fprintf(stderr,
               "kvbench %s: db=%s recordcount=%lld operationcount=%lld requestdistribution=%s "
               "read/update/insert/rmw=%g/%g/%g/%g fieldcount=%d fieldlength=%d insertorder=%s "
               "threads=%d target=%g maxexecutiontime=%g\n",
               phase_arg.c_str(), db.c_str(), static_cast<long long>(config->recordcount),
               static_cast<long long>(config->operationcount),
               std::string(DistributionName(config->requestdistribution)).c_str(),
               config->readproportion, config->updateproportion, config->insertproportion,
               config->readmodifywriteproportion, config->fieldcount, config->fieldlength,
               config->orderedinserts ? "ordered" : "hashed", config->threadcount, config->target,
               config->maxexecutiontime);

  auto backend = MakeBackend(db, props);
  if (!backend.ok()) {
    std::fprintf(stderr, "kvbench: %s\n", backend.status().ToString().c_str());
    return kExitFailed;
  }
  CoreWorkload workload(*config);
  DriverOptions opts;
  opts.phase = phase;
  // load: records done/total, rate and ETA on stderr (with the status lines; off with them).
  if (config->status_interval > 0) opts.progress_out = stderr;
  auto report = RunPhase(workload, **backend, opts);
  if (!report.ok()) {
    std::fprintf(stderr, "kvbench: %s\n", report.status().ToString().c_str());
    return kExitFailed;
  }
  for (const auto& [name, vo] : props.all()) report->properties[name] = vo.first;
  const std::string out = json ? FormatJson(*report) : FormatText(*report);
  std::fwrite(out.data(), 1, out.size(), stdout);
  std::fflush(stdout);
  if (!report->errors.empty()) {
    uint64_t n = 0;
    for (const auto& [kind, c] : report->errors) n += c;
    std::fprintf(stderr, "kvbench: %llu operation(s) failed; see Return=ERROR and [ERRORS]\n",
                 static_cast<unsigned long long>(n));
    return kExitOpErrors;
  }
  return 0;
}

}  // namespace
}  // namespace rdkv::kvbench

int main(int argc, char** argv) {
  // The rdkv client logs with glog: to stderr, warnings and worse unless GLOG_minloglevel says
  // otherwise (connection notices would interleave with the status lines).
  FLAGS_logtostderr = true;
  if (std::getenv("GLOG_minloglevel") == nullptr) FLAGS_minloglevel = google::GLOG_WARNING;
  google::InitGoogleLogging(argv[0]);
  return rdkv::kvbench::Main(argc, argv);
}

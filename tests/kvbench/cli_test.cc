// The kvbench command line: workload E refused, property errors, help. No server needed: all of
// these stop before a backend is contacted.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace {

struct CliRun {
  int status = -1;
  std::string output;  // stdout and stderr
};

CliRun Kvbench(const std::string& args) {
  CliRun r;
  const std::string cmd = std::string(KVBENCH_BIN) + " " + args + " 2>&1";
  std::FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

const std::string kWorkloads = KVBENCH_WORKLOADS_DIR;

TEST(KvbenchCli, WorkloadERefusedForEveryBackend) {
  for (const char* db : {"rdkv", "redis", "memcached"}) {
    for (const char* phase : {"load", "run"}) {
      const CliRun r =
          Kvbench(std::string(phase) + " -db " + db + " -P " + kWorkloads + "/workloade");
      EXPECT_EQ(r.status, 2) << db << " " << phase << ": " << r.output;
      EXPECT_NE(r.output.find("no range scans"), std::string::npos) << r.output;
      EXPECT_NE(r.output.find("workload E"), std::string::npos) << r.output;
    }
  }
}

TEST(KvbenchCli, PropertyErrors) {
  CliRun r = Kvbench("run -P " + kWorkloads + "/workloada -p recordcont=10");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("unknown property 'recordcont'"), std::string::npos) << r.output;

  r = Kvbench("run -P " + kWorkloads + "/workloada -p readproportion=lots");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("readproportion"), std::string::npos) << r.output;

  r = Kvbench("run -P " + kWorkloads + "/workloada -threads zero");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("threadcount (-threads)"), std::string::npos) << r.output;

  r = Kvbench("run -P /nonexistent/workload");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("/nonexistent/workload"), std::string::npos) << r.output;

  r = Kvbench("run -P " + kWorkloads + "/workloada -p noequals");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("name=value"), std::string::npos) << r.output;

  r = Kvbench("run -db mysql -P " + kWorkloads + "/workloada");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("rdkv, redis, memcached"), std::string::npos) << r.output;
}

TEST(KvbenchCli, UsageErrorsAndHelp) {
  CliRun r = Kvbench("");
  EXPECT_EQ(r.status, 2);
  r = Kvbench("bench");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("load or run"), std::string::npos) << r.output;
  r = Kvbench("run -frobnicate");
  EXPECT_EQ(r.status, 2);
  r = Kvbench("--help");
  EXPECT_EQ(r.status, 0);
  for (const char* p : {"recordcount", "requestdistribution", "zipfianconstant", "insertorder",
                        "maxexecutiontime", "rdkv.seed", "redis.port", "memcached.port"}) {
    EXPECT_NE(r.output.find(p), std::string::npos) << p;
  }
}

TEST(KvbenchCli, UnreachableServerFailsClearly) {
  // Port 1 on loopback: nothing listens there.
  for (const char* db : {"rdkv", "redis", "memcached"}) {
    const std::string port =
        std::string(" -p ") + db + (std::string(db) == "rdkv" ? ".seed=127.0.0.1:1" : ".port=1");
    const CliRun r = Kvbench("run -db " + std::string(db) + " -P " + kWorkloads + "/workloadc" +
                             port + (std::string(db) == "rdkv" ? " -p rdkv.transport=tcp" : ""));
    if (r.output.find("built without") != std::string::npos) continue;  // backend not in this build
    EXPECT_EQ(r.status, 1) << db << ": " << r.output;
    EXPECT_NE(r.output.find("127.0.0.1:1"), std::string::npos) << db << ": " << r.output;
  }
}

}  // namespace

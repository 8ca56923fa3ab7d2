// YCSB workload properties (the files in bench/workloads/, -P and -p) and the core workload:
// keys, values, the operation mix and the key choosers, with YCSB's CoreWorkload definitions.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "bench/kvbench/generators.h"
#include "rdkv/status.h"

namespace rdkv::kvbench {

// name -> value, remembering where each value came from (for error messages).
class Properties {
 public:
  // Java .properties syntax: "name=value", "name: value" or "name value"; '#' and '!' start
  // comment lines; a line ending in '\' continues on the next. A later setting wins.
  // origin names the source in errors ("bench/workloads/workloada").
  Status ParseText(std::string_view text, const std::string& origin);
  Status LoadFile(const std::string& path);
  // "name=value" from -p.
  Status ParseOverride(std::string_view assignment);
  void Set(const std::string& name, const std::string& value, const std::string& origin);

  bool Has(const std::string& name) const { return values_.count(name) != 0; }
  std::string Get(const std::string& name, const std::string& fallback = "") const;
  // "file:line" or "-p" for a set property; "" when unset.
  std::string OriginOf(const std::string& name) const;
  const std::map<std::string, std::pair<std::string, std::string>>& all() const { return values_; }

 private:
  std::map<std::string, std::pair<std::string, std::string>> values_;  // name -> (value, origin)
};

enum class Distribution { kUniform, kZipfian, kLatest, kHotspot };
std::string_view DistributionName(Distribution d);

struct WorkloadConfig {
  int64_t recordcount = 0;
  int64_t operationcount = 0;        // 0 with maxexecutiontime: run until the time is up
  int64_t warmupoperationcount = 0;  // run phase: unmeasured operations before the clock starts
  int64_t insertstart = 0;
  int64_t insertcount = 0;  // default recordcount - insertstart
  double readproportion = 0.95;
  double updateproportion = 0.05;
  double insertproportion = 0;
  double readmodifywriteproportion = 0;
  double scanproportion = 0;
  Distribution requestdistribution = Distribution::kUniform;
  double zipfianconstant = ZipfianGenerator::kZipfianConstant;
  double hotspotdatafraction = 0.2;
  double hotspotopnfraction = 0.8;
  int fieldcount = 10;
  int fieldlength = 100;
  bool orderedinserts = false;  // insertorder=ordered
  double maxexecutiontime = 0;  // seconds; 0 = no limit
  double target = 0;            // ops/s over all threads; 0 = as fast as possible
  int threadcount = 1;
  double status_interval = 10;  // seconds between status lines; 0 = none
};

// Every property kvbench understands, with a one-line description (for --help and errors).
const std::vector<std::pair<std::string, std::string>>& KnownProperties();

// Checks every property (unknown names and malformed values are errors naming the property and
// where it was set) and returns the workload. Backend properties ("rdkv.", "redis.",
// "memcached.") are checked here for their names only; the backends parse their values.
Result<WorkloadConfig> ParseWorkload(const Properties& props);

// The message for a workload with scans (YCSB E); kvbench refuses those.
std::string ScanRefusal(const WorkloadConfig& config);

enum class OpType { kRead = 0, kUpdate = 1, kInsert = 2, kScan = 3, kReadModifyWrite = 4 };

// YCSB CoreWorkload. Shared by all threads; per-thread state in ThreadState.
class CoreWorkload {
 public:
  explicit CoreWorkload(const WorkloadConfig& config);

  const WorkloadConfig& config() const { return config_; }

  // "user" + keynum (insertorder=ordered) or "user" + fnvhash64(keynum) (hashed, the default).
  std::string BuildKeyName(int64_t keynum) const;
  // fieldcount fields "field<i>=" + fieldlength printable bytes, concatenated; field0's bytes
  // start with "<key> " when they fit, so a read can check it got its own key's value.
  void BuildValue(std::string_view key, Rng& rng, std::string* out) const;
  // True when value has the shape BuildValue gives and (when it fits) names key.
  bool CheckValue(std::string_view key, std::string_view value) const;
  size_t value_size() const { return value_size_; }

  // Load phase: the next key number to insert (insertstart, insertstart+1, ...).
  int64_t NextLoadKeynum() { return load_sequence_.NextValue(); }
  // Run phase inserts: recordcount, recordcount+1, ...; Acknowledge when the insert finished.
  int64_t NextInsertKeynum() { return insert_sequence_.NextValue(); }
  void AcknowledgeInsert(int64_t keynum);
  // The highest key number below which every run-phase insert finished.
  int64_t LastAcknowledged() const { return insert_sequence_.LastValue(); }

  class ThreadState {
   public:
    OpType NextOp() { return static_cast<OpType>(ops_.Next(rng_)); }
    // A key number that exists: draws again while the chooser picks one not yet inserted
    // (YCSB's nextKeynum).
    int64_t NextKeynum();
    Rng& rng() { return rng_; }

   private:
    friend class CoreWorkload;
    ThreadState(const CoreWorkload* w, uint64_t seed);
    const CoreWorkload* w_;
    Rng rng_;
    DiscreteGenerator ops_;
    std::unique_ptr<NumberGenerator> chooser_;
  };
  std::unique_ptr<ThreadState> NewThread(uint64_t seed) const;

 private:
  WorkloadConfig config_;
  size_t value_size_;
  std::vector<std::string> field_names_;  // "field0=" ...
  CounterGenerator load_sequence_;
  AcknowledgedCounterGenerator insert_sequence_;
  int64_t expected_new_keys_;
  double latest_zetan_ = -1;  // zeta(recordcount - 1) for "latest", computed once
};

}  // namespace rdkv::kvbench

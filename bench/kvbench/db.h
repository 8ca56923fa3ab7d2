// The store kvbench drives: one Backend per process, one DB per client thread (YCSB's model).
// A record is one value (the fields encoded together, see CoreWorkload::BuildValue) under one
// key on every backend, so all three do the same work per operation.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "bench/kvbench/workload.h"
#include "rdkv/status.h"

namespace rdkv::kvbench {

// YCSB's Status, reduced to what kvbench reports: OK, NOT_FOUND, or ERROR with a kind
// ("TimedOut", "connection", ...) for the errors-by-kind counts.
struct OpStatus {
  enum Code { kOk, kNotFound, kError };
  Code code = kOk;
  std::string kind;  // set for kError

  static OpStatus Ok() { return {}; }
  static OpStatus NotFound() { return {kNotFound, {}}; }
  static OpStatus Error(std::string kind) { return {kError, std::move(kind)}; }
  bool ok() const { return code == kOk; }
};

class DB {
 public:
  virtual ~DB() = default;
  // The record's value into *value; NOT_FOUND when absent.
  virtual OpStatus Read(std::string_view key, std::string* value) = 0;
  // Replaces the record's value.
  virtual OpStatus Update(std::string_view key, std::string_view value) = 0;
  // Adds a record (rdkv: Insert, an error when present; redis/memcached: SET).
  virtual OpStatus Insert(std::string_view key, std::string_view value) = 0;
};

// Backend-specific figures for the report: a section ("RDKV") and name/value lines.
struct BackendReport {
  std::string section;
  std::vector<std::pair<std::string, double>> values;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // A connection for one client thread.
  virtual Result<std::unique_ptr<DB>> NewDB() = 0;
  // Called before the threads start and after they stopped (for counters over the phase).
  virtual void PhaseStart() {}
  virtual BackendReport PhaseReport() { return {}; }
};

// "rdkv", "redis" or "memcached", configured from the properties of its prefix.
Result<std::unique_ptr<Backend>> MakeBackend(const std::string& db, const Properties& props);

// Backends this build has (redis and memcached need hiredis and libmemcached at build time).
std::vector<std::string> AvailableBackends();

}  // namespace rdkv::kvbench

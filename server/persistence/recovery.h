// Recovery: loads a kvserver database (docs/persistence.md, "Recovery") into an empty Store.
//
// The database is opened READ-ONLY: whatever goes wrong (damaged files, another format version,
// more data than the region holds), nothing in the directory changes. Items are loaded in
// version order, so each gets back exactly its persisted version (Store::EnsureVersionAbove
// before each Put), and the counter then restarts kVersionGapAfterRecovery above the largest
// version the database remembers.
//
// Thread-safety: one call at a time per store; the store must not be serving yet.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "rdkv/status.h"
#include "server/persistence/format.h"
#include "server/store.h"

namespace rocksdb {
class Env;
}

namespace rdkv::server::persistence {

struct RecoveryStats {
  uint64_t keys = 0;
  uint64_t bytes = 0;          // key + value bytes loaded
  uint64_t max_version = 0;    // the largest version the database remembers (items and meta)
  uint64_t sequence = 0;       // RocksDB's last sequence number: identifies the state loaded
  double seconds = 0;           // in all: open, read, order, apply
  double read_seconds = 0;      // reading RocksDB (and copying items out), wall clock
  double apply_seconds = 0;     // ordering by version and writing into the region, wall clock
  double read_cpu_seconds = 0;  // CPU time of the reading threads (all of them)
  double apply_cpu_seconds = 0; // CPU time of the applying thread
  int read_threads = 1;
};

struct LoadOptions {
  rocksdb::Env* env = nullptr;  // null: the default Env
  RocksDbTuning tuning;
  uint64_t max_value_bytes = 1u << 20;  // the server's --max_value_size
  std::chrono::milliseconds progress_interval{2000};  // progress log period on long loads
};

// True when `db_dir` holds a RocksDB database (its CURRENT file exists).
bool HasDatabase(const std::string& db_dir);

// Loads every item of the database in `db_dir` into `store`, which must be empty.
// Errors (nothing on disk is changed by any of them):
//   kCorruption       damaged files, a malformed record, two items with one version
//   kNotSupported     not an rdkv database, or another format version
//   kOutOfSpace       the items need more heap (or index) than the region has
//   kInvalidArgument  a value larger than `max_value_bytes`
//   kIoError          the files cannot be read
Result<RecoveryStats> LoadDatabase(const std::string& db_dir, Store* store,
                                   const LoadOptions& options);

// Reads the database in `db_dir` read-only, calling `item` for each item in key order
// (tests and the crash test's checker). Same errors as LoadDatabase for damaged or foreign
// databases. *max_version (optional) receives the meta max_version.
using ItemVisitor = std::function<void(std::string_view key, uint64_t version,
                                       std::string_view value)>;
Status ScanDatabase(const std::string& db_dir, rocksdb::Env* env, const ItemVisitor& item,
                    uint64_t* max_version = nullptr);

}  // namespace rdkv::server::persistence

// Recovery: loads a kvserver database (docs/persistence.md, "Recovery") into an empty Store.
//
// The database is opened READ-ONLY: whatever goes wrong (damaged files, another format version,
// more data than the region holds), nothing in the directory changes. Key ranges load on
// parallel threads straight into the region, each item with exactly its persisted version
// (Store::Restore), and the counter then restarts kVersionGapAfterRecovery above the largest
// version the database remembers.
//
// Thread-safety: one call at a time per store; the store must not be serving yet.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "common/kv/limits.h"
#include "rdkv/status.h"
#include "server/persistence/format.h"
#include "server/store.h"

namespace rocksdb {
class Env;
}

namespace rdkv::server::persistence {

struct RecoveryStats {
  uint64_t keys = 0;
  uint64_t bytes = 0;        // key + value bytes loaded
  uint64_t max_version = 0;  // the largest version the database remembers (items and meta)
  uint64_t sequence = 0;     // RocksDB's last sequence number: identifies the state loaded
  double seconds = 0;        // wall clock, in all: open, read and write into the region
  double cpu_seconds = 0;    // CPU time of the loading threads (all of them)
  int threads = 1;           // key ranges loaded in parallel
};

struct LoadOptions {
  rocksdb::Env* env = nullptr;  // null: the default Env
  RocksDbTuning tuning;
  uint64_t max_value_bytes = kv::kDefaultMaxValueBytes;  // the server's --max_value_size
  std::chrono::milliseconds progress_interval{2000};     // progress log period on long loads
  // The progress lines' prefix: "recovery" (the data dir's database) or "restore" (a snapshot).
  std::string progress_label = "recovery";
  // Key ranges loaded in parallel at most (fewer when the database has few table files);
  // 0: the number of CPUs, at most 8.
  int threads = 0;
};

// True when `db_dir` holds a RocksDB database (its CURRENT file exists).
bool HasDatabase(const std::string& db_dir);

// Loads every item of the database in `db_dir` into `store`, which must be empty.
// Errors (nothing on disk is changed by any of them):
//   kCorruption       damaged files, a malformed record
//   kNotSupported     not an rdkv database, or another format version
//   kOutOfSpace       the items need more heap (or index) than the region has
//   kInvalidArgument  a value larger than `max_value_bytes`
//   kIoError          the files cannot be read
Result<RecoveryStats> LoadDatabase(const std::string& db_dir, Store* store,
                                   const LoadOptions& options);

// Reads the database in `db_dir` read-only, calling `item` for each item in key order
// (tests and the crash test's checker). Same errors as LoadDatabase for damaged or foreign
// databases. *max_version (optional) receives the meta max_version.
using ItemVisitor =
    std::function<void(std::string_view key, uint64_t version, std::string_view value)>;
Status ScanDatabase(const std::string& db_dir, rocksdb::Env* env, const ItemVisitor& item,
                    uint64_t* max_version = nullptr);

}  // namespace rdkv::server::persistence

// The persister: makes the writes a kvserver applies durable in its RocksDB database, in
// groups (one WriteBatch and at most one WAL sync per group), and takes snapshots.
// docs/persistence.md is the prose version: modes, promises, queue, format, failure cases.
//
// Write path (server/service.cc), per write request:
//   1. Admit()          waits while the queue is full (backpressure: writers slowed, never
//                       dropped); kIoError while the disk is failing, before anything is applied
//   2. apply to the Store (which hands out the version)
//   3. EnqueuePut/EnqueueDelete  with the same key order as step 2 (the caller serializes the
//                       writers of one key across steps 2-3)
//   4. reply: async at once; sync from `done`, called on the persister thread once the group
//      holding the write is in the WAL and synced (or failed: kIoError)
//
// Thread-safety: Admit/Enqueue*/Flush/Snapshot/stats from any thread. The destructor writes and
// syncs what is queued, then closes the database; no other call may be running.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "common/kv/limits.h"
#include "common/util/histogram.h"
#include "rdkv/status.h"
#include "server/persistence/format.h"
#include "server/persistence/recovery.h"
#include "server/store.h"

namespace rocksdb {
class Env;
}

namespace rdkv::server::persistence {

enum class Durability : uint8_t {
  kNone,   // a pure cache: nothing on disk
  kAsync,  // acknowledged when applied; in the WAL within a group, WAL synced every persist_lag
  kSync,   // acknowledged only after the write's group is in the WAL and synced
};
Result<Durability> ParseDurability(std::string_view name);
std::string_view DurabilityName(Durability d);

struct PersistOptions {
  Durability durability = Durability::kNone;
  std::string data_dir;  // holds db/ (the RocksDB database) and, by default, snapshots/
  // async: the WAL is synced at least this often, and writers wait while the oldest queued
  // write is older than half of it.
  std::chrono::milliseconds persist_lag{100};
  // Bound on applied-but-unwritten bytes (keys + values); writers wait while it is exceeded.
  uint64_t queue_bytes = 64ull << 20;
  std::string snapshot_dir;                        // empty: <data_dir>/snapshots
  std::chrono::milliseconds snapshot_interval{0};  // periodic snapshots; 0 = off
  int snapshot_keep = 5;                           // periodic snapshots kept; 0 = all
  std::string restore_from;                        // start from this snapshot directory
  RocksDbTuning tuning;
  uint64_t max_value_bytes = kv::kDefaultMaxValueBytes;  // the server's --max_value_size
  std::chrono::milliseconds io_retry{1000};              // after an I/O error, retry this often
  std::chrono::milliseconds progress_interval{2000};
  rocksdb::Env* env = nullptr;  // test hook (fault injection); null = default
  // Recovery stops (kUnavailable, nothing changed on disk) once this is true: a signal
  // handler's flag. Null: never. Not owned; must outlive Start.
  const std::atomic<bool>* stop = nullptr;
  // Tests only: recovery sleeps this long per item.
  std::chrono::microseconds test_recovery_item_delay{0};
};

// One line: the mode and what it promises, printed at start.
std::string PromiseText(const PersistOptions& options);

struct PersisterStats {
  Durability durability = Durability::kNone;
  uint64_t queued_records = 0, queued_bytes = 0;  // applied, not yet handed to RocksDB
  uint64_t records = 0;                           // written to RocksDB
  uint64_t groups = 0;                            // WriteBatches written (one RocksDB write each)
  uint64_t syncs = 0;                             // WAL syncs
  uint64_t max_group_records = 0;
  uint64_t admission_waits = 0;  // writes that waited for room (backpressure)
  uint64_t max_lag_us = 0;       // longest time a write waited in the queue before RocksDB had it
  uint64_t io_errors = 0;
  bool failing = false;  // writes are refused (kIoError) until the disk recovers
  std::string last_error;
  uint64_t snapshots = 0;
  std::string last_snapshot;
  HistogramSnapshot group_records;     // records per group written
  HistogramSnapshot wal_sync_seconds;  // sync: a group's write + fsync; async: one SyncWAL
};

class Persister {
 public:
  using Completion = std::function<void(const Status&)>;
  using SnapshotDone = std::function<void(Result<std::string> path)>;

  // Brings `store` (formatted, empty, not yet serving) to the state on disk, then opens the
  // database for writing:
  //   --restore_from set: loads the snapshot (read-only) and installs a copy of it as
  //     <data_dir>/db (an existing database there is renamed to db.pre-restore-<time>);
  //   else <data_dir>/db exists: loads it read-only first, then opens it read-write and
  //     checks nobody changed it in between;
  //   else creates a new database.
  // A failure before the load completes changes nothing on disk, except a torn WAL tail cut
  // before the load (--wal_recovery=torn_tail; its message says so). In none mode returns
  // nullptr (after loading --restore_from, if set, read-only: nothing is written).
  static Result<std::unique_ptr<Persister>> Start(const PersistOptions& options, Store* store,
                                                  RecoveryStats* recovered = nullptr);
  ~Persister();

  Durability durability() const;

  // Before applying a write. Waits while the queue is full. kIoError while failing.
  Status Admit();
  // After applying a write (same order as the store for one key). `done` may be null; in
  // sync mode it runs once, on the persister thread, when the write is durable or failed.
  void EnqueuePut(std::string_view key, uint64_t version, std::string_view value, Completion done);
  void EnqueueDelete(std::string_view key, Completion done);
  // Records that versions up to `v` were handed out (the version counter was raised without a
  // write, e.g. by a shard move), so recovery restarts the counter above it.
  void EnqueueMaxVersion(uint64_t v, Completion done);
  // Waits until everything enqueued before the call is in the WAL and synced; the failure if
  // the persister is failing.
  Status Flush();

  // Takes a snapshot named `name` (empty: a generated name) on the snapshot thread: everything
  // acknowledged before the call is in it. `done` gets its directory. Names are
  // [A-Za-z0-9._-], 1..128 characters, not starting with '.'.
  void Snapshot(std::string name, SnapshotDone done);
  // Blocking form.
  Result<std::string> SnapshotNow(std::string name);

  PersisterStats stats() const;
  const std::string& snapshot_dir() const;

  class Impl;

 private:
  explicit Persister(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace rdkv::server::persistence

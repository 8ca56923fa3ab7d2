// Private to the persister (server/persistence/persister*.cc): the Impl class behind Persister,
// spread over one file per job:
//   persister.cc           database lifecycle: Start (load, restore, create, open), the
//                          destructor (drain, close), reopening after an error, stats
//   persister_commit.cc    the group-commit queue (Admit, Enqueue*) and the persister thread
//                          that writes the groups (Run, Process, Written)
//   persister_wal_sync.cc  async mode's WAL syncer thread, and Flush
//   persister_snapshot.cc  the snapshot thread (checkpoints, pruning)
//
// Locks (each a leaf: none is taken while another is held):
//   mu_       the queue, the sequence numbers and the failure state; the cond vars below
//   db_mu_    db_: exclusive while the persister thread replaces it, shared around every use
//   snap_mu_  the snapshot queue and counters
#pragma once

#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <rocksdb/write_batch.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <memory>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "common/util/histogram.h"
#include "common/util/mutex.h"
#include "common/util/thread_annotations.h"
#include "server/persistence/persister.h"

namespace rdkv::server::persistence {

namespace persister_internal {

using Clock = std::chrono::steady_clock;

// "YYYYmmdd-HHMMSS-mmm", UTC: snapshot names and renamed-aside databases.
std::string UtcStamp();
Status FsError(const std::string& what, const std::error_code& ec);
// The file that marks a directory as a complete snapshot.
inline constexpr const char* kSnapshotMarker = "RDKV_SNAPSHOT";

// An exclusive flock(2) on <snapshot dir>/.kvserver-lock for the persister's life: two servers
// given one --snapshot_dir would delete each other's unfinished snapshots at start and prune
// each other's periodic ones. Released (the descriptor closed) by the destructor.
class SnapshotDirLock {
 public:
  // Creates the directory if needed. kUnavailable naming the holder when another process (or
  // another persister of this one) holds the lock. A directory that cannot be created, a
  // lock file that cannot be opened, or a file system without flock (ENOLCK) is not an error
  // (a snapshot would report it): a lock without a descriptor, and a warning in the log.
  static Result<std::unique_ptr<SnapshotDirLock>> Take(const std::string& dir,
                                                       const std::string& data_dir);
  // kUnavailable naming the holder when another process holds the lock now; creates nothing
  // (no lock file yet: OK). Take still decides: a server may take the lock in between.
  static Status Probe(const std::string& dir);
  static constexpr const char* kLockFile = ".kvserver-lock";
  ~SnapshotDirLock();
  SnapshotDirLock(const SnapshotDirLock&) = delete;
  SnapshotDirLock& operator=(const SnapshotDirLock&) = delete;

 private:
  explicit SnapshotDirLock(int fd) : fd_(fd) {}
  int fd_;
};

}  // namespace persister_internal

class Persister::Impl {
 public:
  using Clock = persister_internal::Clock;

  // persister.cc
  Impl(const PersistOptions& o, const rocksdb::Options& db_options, std::string db_dir,
       std::unique_ptr<rocksdb::DB> db, uint64_t max_version,
       std::unique_ptr<persister_internal::SnapshotDirLock> snapshot_dir_lock);
  ~Impl();

  Durability durability() const { return o_.durability; }
  const std::string& snapshot_dir() const { return snapshot_dir_; }
  PersisterStats stats() const EXCLUDES(mu_, snap_mu_);

  // persister_commit.cc
  Status Admit() EXCLUDES(mu_);
  void EnqueuePut(std::string_view key, uint64_t version, std::string_view value, Completion done)
      EXCLUDES(mu_);
  void EnqueueDelete(std::string_view key, Completion done) EXCLUDES(mu_);
  void EnqueueMaxVersion(uint64_t v, Completion done) EXCLUDES(mu_);

  // persister_wal_sync.cc
  Status Flush() EXCLUDES(mu_);

  // persister_snapshot.cc
  void Snapshot(std::string name, SnapshotDone done) EXCLUDES(snap_mu_);

 private:
  struct Group {
    Group() = default;
    rocksdb::WriteBatch batch;
    std::vector<Completion> done;
    uint64_t records = 0;
    uint64_t bytes = 0;
    uint64_t last_seq = 0;  // enqueue sequence of its last record
    Clock::time_point oldest{};
  };

  // --- persister.cc: the database ---

  // After a failed write: RocksDB's Resume() clears a recoverable background error; an error
  // it cannot resume from needs the database closed and opened again. Persister thread only.
  rocksdb::Status RecoverDb() EXCLUDES(db_mu_);

  // --- persister_commit.cc: the queue and the persister thread ---

  // Returns whether the persister thread needs a wake-up.
  bool NoteEnqueuedLocked(uint64_t bytes, Completion done) REQUIRES(mu_);
  // Takes the pending group, adding the meta key that remembers max_version.
  Group TakePendingLocked() REQUIRES(mu_);
  // The write failure, else the WAL sync failure, else OK.
  Status FailingLocked() const REQUIRES(mu_) { return failing_.ok() ? sync_failing_ : failing_; }
  // Groups wait for a retry after a failed write. Persister thread only.
  bool broken() const { return !retry_.empty(); }
  rocksdb::WriteOptions WriteOpts() const;
  // The persister thread.
  void Run() EXCLUDES(mu_);
  // Writes the groups that failed before (in order), then `g`. Persister thread only.
  void Process(Group g) EXCLUDES(mu_, db_mu_);
  // One WriteBatch into the database (shared db_mu_: the persister may be reopening it).
  rocksdb::Status WriteGroup(Group& g) EXCLUDES(db_mu_);
  // Bookkeeping after a group is in RocksDB. Persister thread only.
  void Written(Group& g, bool with_done) EXCLUDES(mu_);

  // --- persister_wal_sync.cc ---

  // async: the WAL syncer thread.
  void SyncLoop() EXCLUDES(mu_, db_mu_);

  // --- persister_snapshot.cc: the snapshot thread ---

  void SnapshotLoop() EXCLUDES(snap_mu_);
  Result<std::string> TakeSnapshot(const std::string& name) EXCLUDES(snap_mu_, db_mu_, mu_);
  // Keeps the newest snapshot_keep periodic snapshots.
  void Prune();

  const PersistOptions o_;
  const rocksdb::Options db_options_;
  const std::string db_dir_;
  const bool sync_;
  const std::string snapshot_dir_;
  const std::unique_ptr<persister_internal::SnapshotDirLock> snapshot_dir_lock_;

  // Replaced by the persister thread alone (RecoverDb, exclusive); the persister thread, the
  // WAL syncer and the snapshot thread use it under a shared lock.
  mutable SharedMutex db_mu_;
  std::unique_ptr<rocksdb::DB> db_ GUARDED_BY(db_mu_);

  mutable Mutex mu_;
  CondVar work_cv_;     // the persister thread waits here
  CondVar room_cv_;     // writers waiting for room in the queue
  CondVar durable_cv_;  // Flush() callers
  CondVar sync_cv_;     // async: the WAL syncer thread
  Group pending_ GUARDED_BY(mu_);
  uint64_t in_flight_records_ GUARDED_BY(mu_) = 0;
  uint64_t in_flight_bytes_ GUARDED_BY(mu_) = 0;
  uint64_t enqueued_seq_ GUARDED_BY(mu_) = 0;
  uint64_t written_seq_ GUARDED_BY(mu_) = 0;
  uint64_t synced_seq_ GUARDED_BY(mu_) = 0;
  uint64_t max_version_ GUARDED_BY(mu_);
  int flush_waiters_ GUARDED_BY(mu_) = 0;
  bool stop_ GUARDED_BY(mu_) = false;
  bool stopped_ GUARDED_BY(mu_) = false;
  Status failing_ GUARDED_BY(mu_);            // writes to RocksDB fail
  Status sync_failing_ GUARDED_BY(mu_);       // async WAL syncs fail
  bool writer_done_ GUARDED_BY(mu_) = false;  // the persister thread has ended
  std::string last_error_ GUARDED_BY(mu_);
  Clock::time_point last_sync_ GUARDED_BY(mu_);
  Clock::time_point next_retry_ GUARDED_BY(mu_){};
  uint64_t gather_target_ GUARDED_BY(mu_) = 0;  // sync: see Run
  Clock::time_point gather_deadline_ GUARDED_BY(mu_){};
  // Persister thread only (no lock; the analysis cannot express a thread role):
  Clock::time_point write_started_{};
  std::deque<Group> retry_;

  std::atomic<uint64_t> records_{0}, groups_{0}, syncs_{0}, max_group_records_{0};
  std::atomic<uint64_t> admission_waits_{0}, max_lag_us_{0}, io_errors_{0};
  // Records per group written, and seconds per WAL sync (sync mode: a group's write with its
  // fsync; async: one SyncWAL of the syncer). Lock-free.
  AtomicHistogram group_records_hist_{{1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096}};
  AtomicHistogram wal_sync_seconds_hist_{AtomicHistogram::LatencySecondsBounds()};

  mutable Mutex snap_mu_;
  CondVar snap_cv_;
  std::deque<std::pair<std::string, SnapshotDone>> snap_queue_ GUARDED_BY(snap_mu_);
  bool snap_stop_ GUARDED_BY(snap_mu_) = false;
  uint64_t snapshots_ GUARDED_BY(snap_mu_) = 0;
  std::string last_snapshot_ GUARDED_BY(snap_mu_);

  std::thread thread_;
  std::thread sync_thread_;  // async only
  std::thread snap_thread_;
};

}  // namespace rdkv::server::persistence

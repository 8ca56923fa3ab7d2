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

#include <atomic>
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

// A write() that a signal stops ends at a page boundary of the file; every Linux page size is
// a multiple of this.
inline constexpr uint64_t kTornWriteAlignment = 4096;

// What ScanWalFiles found in a database's write-ahead log files.
struct WalScan {
  uint64_t files = 0;         // WAL files read
  uint64_t bytes = 0;         // their total size
  uint64_t max_sequence = 0;  // the last sequence number of any intact record, damage or not
  bool damaged = false;
  std::string damaged_file;        // the first damaged WAL file (a path in the database directory)
  uint64_t damaged_offset = 0;     // byte offset in it of the first record that is not intact
  std::string damage;              // what is wrong there, e.g. "checksum mismatch"
  uint64_t damaged_file_size = 0;  // the damaged file's size when it was scanned
  bool damage_at_tail = false;     // the damage is the end of the newest WAL file (a torn or
                                   // truncated last record), nothing intact follows it
  // The first damage is the file ending inside a record (its header, its body, or before its
  // last fragment): every byte there checked out, the rest was never written.
  bool torn_end = false;
  // ... and it ends right after an intact fragment, or right after an intact fragment header:
  // where RocksDB's file writer may end one write() and start the next (a record larger than
  // its buffer, 1 MiB, is written in several).
  bool torn_at_boundary = false;

  // A torn tail: the newest WAL file ends inside its last record, every fragment before that
  // point intact, nothing after it. What a write cut off by a crash leaves, and what a file
  // truncated at that point looks like too.
  bool torn_tail() const { return damaged && damage_at_tail && torn_end; }
  // A torn tail that ends where a write() cut off by a crash ends: at a page boundary (the
  // kernel copies a write into the page cache a page at a time and stops between pages for
  // SIGKILL), or where the file writer starts a write() of its own (torn_at_boundary). A
  // truncation anywhere else is not what a crash leaves.
  bool crash_torn_tail() const {
    return torn_tail() && (torn_at_boundary || damaged_file_size % kTornWriteAlignment == 0);
  }

  // "<file> at byte <offset>: <damage>", or "" when not damaged.
  std::string Describe() const;
};

// Reads every WAL file (*.log) of the database in `db_dir`, in file-number order, and checks
// each record's header and checksum (RocksDB's log format: 32 KiB blocks of CRC32C-checked
// fragments). Read-only. kIoError when a file cannot be read. Thread-safe (plain function).
Result<WalScan> ScanWalFiles(const std::string& db_dir);

// The largest version the database in `db_dir` remembers handing out (its meta key; the
// persister writes it with every group), from a read-only open with point-in-time recovery
// (a damaged WAL gives what its intact part holds): nothing changes.
Result<uint64_t> ReadRememberedMaxVersion(const std::string& db_dir, rocksdb::Env* env);

// For a snapshot just copied from a live database (a RocksDB checkpoint): the newest WAL file
// is copied up to its size at one instant, which can fall inside a record that a concurrent
// write was appending. Such a torn last record is cut off (the file truncated where it starts,
// and synced); the snapshot's promise (everything acknowledged before it was asked for) does
// not depend on it: those writes were flushed into table files first. Damage with intact
// records after it is kCorruption (nothing changed). *cut gets the bytes removed (0: none).
Status TrimTornWalTail(const std::string& db_dir, uint64_t* cut);

// What CutTornWalTail did: bytes 0 when the WAL had no torn tail (nothing was changed).
struct TornTailCut {
  std::string file;     // the WAL file cut
  uint64_t offset = 0;  // where its torn last record started: the file's new size
  uint64_t bytes = 0;   // bytes removed
  std::string kept;     // the file that holds the removed bytes ("" when kept nowhere)
};

// For a start of the data dir's own database (--wal_recovery=torn_tail): when the WAL's only
// damage is a torn tail a crash leaves (WalScan::crash_torn_tail) and the database is an rdkv
// database of this format (a read-only open checks that first), copies the torn record's bytes
// into a new file in `keep_dir` (synced, with its directory; "" keeps none), then truncates
// the WAL file where that record starts and syncs it and its directory. All of it under the
// database's RocksDB LOCK (kUnavailable while another process uses the database), and only
// while the file still has the size it was scanned with. A WAL file shared by hard link with
// another directory (a snapshot) is copied first, so only this database's copy is cut. Any
// other damage, or none, changes nothing (bytes 0): the caller's LoadDatabase judges it.
// kIoError when a file cannot be read or written; kCorruption when the WAL is not whole after
// the cut; LoadDatabase's format errors. `env` may be null (the default Env).
// In sync mode such a record was never acknowledged: a write group is answered only after its
// record is whole in the file and synced (docs/persistence.md, Recovery step 0).
// `found`: a scan of the WAL made before (LoadOptions::wal_scan); nothing is done unless it
// shows a crash torn tail, which is checked again under the lock.
Result<TornTailCut> CutTornWalTail(const std::string& db_dir, const std::string& keep_dir,
                                   rocksdb::Env* env, const WalScan& found);

struct RecoveryStats {
  uint64_t keys = 0;
  uint64_t bytes = 0;        // key + value bytes loaded
  uint64_t max_version = 0;  // the largest version the database remembers (items and meta)
  uint64_t sequence = 0;     // RocksDB's last sequence number: identifies the state loaded
  double seconds = 0;        // wall clock, in all: open, read and write into the region
  double cpu_seconds = 0;    // CPU time of the loading threads (all of them)
  int threads = 1;           // key ranges loaded in parallel
  // --wal_recovery=point_in_time on a damaged WAL: what was found ("" when the WAL was intact)
  // and the last sequence number the WAL holds, above `sequence` when writes were dropped.
  std::string wal_damage;
  uint64_t wal_max_sequence = 0;
  // --wal_recovery=torn_tail: the torn last record cut before the load (bytes 0: none).
  TornTailCut torn_tail_cut;
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
  // Checked between items: once it is true the load stops with kUnavailable ("stopped while
  // loading"), the database is closed and nothing is changed. Null: never stops. Not owned.
  const std::atomic<bool>* stop = nullptr;
  // Receives the WAL check's result, also when the load refuses the WAL (null: not wanted).
  // Not owned.
  WalScan* wal_scan = nullptr;
  // Tests only: sleep this long after each item (makes a recovery slow enough to signal).
  std::chrono::microseconds test_item_delay{0};
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
//   kUnavailable      options.stop became true
// A WAL with a damaged record (a bad checksum, a truncated or missing fragment, zeroed bytes
// followed by records) is kCorruption naming the file and offset, unless
// options.tuning.wal_recovery is kPointInTime: then the writes before the damage are loaded
// and RecoveryStats says what was dropped.
Result<RecoveryStats> LoadDatabase(const std::string& db_dir, Store* store,
                                   const LoadOptions& options);

// Reads the database in `db_dir` read-only, calling `item` for each item in key order
// (tests and the crash test's checker). Same errors as LoadDatabase for damaged or foreign
// databases. *max_version (optional) receives the meta max_version.
using ItemVisitor =
    std::function<void(std::string_view key, uint64_t version, std::string_view value)>;
// `wal_recovery` kPointInTime reads what precedes a damaged WAL record (what a start recovers
// after cutting a torn tail); any other value refuses a damaged WAL.
Status ScanDatabase(const std::string& db_dir, rocksdb::Env* env, const ItemVisitor& item,
                    uint64_t* max_version = nullptr,
                    WalRecovery wal_recovery = WalRecovery::kRefuse);

}  // namespace rdkv::server::persistence

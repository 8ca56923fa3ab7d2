// The persister's database lifecycle: Start (load, restore, create, open), the destructor
// (drain the queue, close the database), reopening the database after an error, and stats.
// The other jobs of Persister::Impl live in persister_commit.cc, persister_wal_sync.cc and
// persister_snapshot.cc (server/persistence/persister_impl.h lists them).
#include "server/persistence/persister.h"

#include <fcntl.h>
#include <glog/logging.h>
#include <rocksdb/db.h>
#include <rocksdb/env.h>
#include <rocksdb/options.h>
#include <rocksdb/write_batch.h>

#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>

#include "common/util/thread_name.h"
#include "server/persistence/persister_impl.h"
#include "server/persistence/recovery.h"

namespace rdkv::server::persistence {

namespace fs = std::filesystem;
using persister_internal::Clock;
using persister_internal::FsError;
using persister_internal::kSnapshotMarker;
using persister_internal::SnapshotDirLock;
using persister_internal::UtcStamp;

Result<Durability> ParseDurability(std::string_view name) {
  if (name == "sync") return Durability::kSync;
  if (name == "async") return Durability::kAsync;
  if (name == "none") return Durability::kNone;
  return Status::InvalidArgument("unknown durability '" + std::string(name) +
                                 "' (sync, async, none)");
}

std::string_view DurabilityName(Durability d) {
  switch (d) {
    case Durability::kSync:
      return "sync";
    case Durability::kAsync:
      return "async";
    case Durability::kNone:
      return "none";
  }
  return "?";
}

namespace {
// Where a persister keeps its snapshots: the one definition of --snapshot_dir's default.
std::string SnapshotDirOf(const PersistOptions& o) {
  return o.snapshot_dir.empty() ? (fs::path(o.data_dir) / "snapshots").string() : o.snapshot_dir;
}
}  // namespace

std::string PromiseText(const PersistOptions& o) {
  switch (o.durability) {
    case Durability::kSync:
      return "durability=sync: a write is acknowledged only after it is in the write-ahead log "
             "under " +
             o.data_dir +
             " and fsynced (group commit: writes share syncs); an "
             "acknowledged write survives kill -9, an OS crash and power loss";
    case Durability::kAsync:
      return "durability=async: a write is acknowledged once applied in memory; it is in the "
             "write-ahead log under " +
             o.data_dir +
             " within milliseconds (from then on it "
             "survives kill -9) and fsynced within " +
             std::to_string(o.persist_lag.count()) +
             " ms; a crash may lose the writes acknowledged in about the last " +
             std::to_string(o.persist_lag.count()) + " ms";
    case Durability::kNone:
      return "durability=none: a pure cache; nothing is written to disk and every item is lost "
             "when the server stops";
  }
  return "";
}

namespace persister_internal {

std::string UtcStamp() {
  auto now = std::chrono::system_clock::now();
  std::time_t t = std::chrono::system_clock::to_time_t(now);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[64];
  int ms = static_cast<int>(
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000);
  std::snprintf(buf, sizeof(buf), "%04d%02d%02d-%02d%02d%02d-%03d", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ms);
  return buf;
}

Status FsError(const std::string& what, const std::error_code& ec) {
  return Status::IoError(what + ": " + ec.message());
}

}  // namespace persister_internal

namespace {

// RocksDB holds a lock on <db>/LOCK while a database is open read-write. Probing it first
// means a server whose data dir is in use fails at once instead of after a long load. The
// probe goes through the Env's LockFile, which also knows the locks of this process (a plain
// fcntl probe would not see them, and closing its descriptor would drop them).
Status CheckNotInUse(const fs::path& db_dir, rocksdb::Env* env) {
  fs::path lock = db_dir / "LOCK";
  std::error_code ec;
  if (!fs::exists(lock, ec)) return Status::Ok();  // LockFile would create it
  rocksdb::FileLock* fl = nullptr;
  rocksdb::Status s = env->LockFile(lock.string(), &fl);
  if (!s.ok()) {
    return Status::Unavailable(db_dir.string() + " is in use (" + s.ToString() +
                               "): is another kvserver using this --data_dir?");
  }
  env->UnlockFile(fl).PermitUncheckedError();
  return Status::Ok();
}

// Copies a snapshot (a RocksDB checkpoint) to <data_dir>/db: into a staging directory first,
// synced, then renamed into place. An existing database is renamed aside, never deleted.
Status CopySnapshotTo(const fs::path& snap, const fs::path& staging);

Status InstallSnapshot(const fs::path& snap, const fs::path& data_dir, const fs::path& db_dir) {
  std::error_code ec;
  fs::path staging = data_dir / "db.restore";
  fs::remove_all(staging, ec);  // a leftover of an interrupted restore: ours
  if (Status copied = CopySnapshotTo(snap, staging); !copied.ok()) {
    std::error_code remove_ec;
    fs::remove_all(staging, remove_ec);  // a partial copy is nobody's: db.restore exists only
    return copied;                       // while a restore runs
  }
  if (fs::exists(db_dir, ec)) {
    fs::path aside = data_dir / ("db.pre-restore-" + UtcStamp());
    fs::rename(db_dir, aside, ec);
    if (ec) return FsError("cannot move the current database aside", ec);
    LOG(WARNING) << "restore: the database that was in " << db_dir << " is kept as " << aside;
  }
  fs::rename(staging, db_dir, ec);
  if (ec) return FsError("cannot rename " + staging.string() + " to " + db_dir.string(), ec);
  return FsyncPath(data_dir, true);
}

// The snapshot's files into `staging` (created here), synced.
Status CopySnapshotTo(const fs::path& snap, const fs::path& staging) {
  std::error_code ec;
  if (!fs::create_directory(staging, ec)) return FsError("cannot create " + staging.string(), ec);
  // The error_code forms only (also the increment and the entry's type): a failure is a
  // Status for the operator, not a throw out of the server's start.
  for (fs::directory_iterator it(snap, ec), end; !ec && it != end; it.increment(ec)) {
    const fs::directory_entry& e = *it;
    std::error_code type_ec;
    if (!e.is_regular_file(type_ec)) {
      if (type_ec) return FsError("cannot read the type of " + e.path().string(), type_ec);
      continue;
    }
    std::string name = e.path().filename().string();
    if (name == kSnapshotMarker || name == "LOCK" || name.rfind("LOG", 0) == 0) continue;
    fs::path to = staging / name;
    bool linked = false;
    std::error_code copy_ec;
    if (e.path().extension() == ".sst") {  // immutable in RocksDB: share, do not copy
      fs::create_hard_link(e.path(), to, copy_ec);
      linked = !copy_ec;
    }
    if (!linked && !fs::copy_file(e.path(), to, copy_ec)) {
      return FsError("cannot copy " + e.path().string() + " to " + to.string(), copy_ec);
    }
    RDKV_RETURN_IF_ERROR(FsyncPath(to, false));
  }
  if (ec) return FsError("cannot list " + snap.string(), ec);
  return FsyncPath(staging, true);
}

// In the data dir: the snapshot the database was last restored from (RestoreNote).
constexpr const char* kRestoredFromFile = "restored_from";

// A small file's bytes ("" when it is missing or unreadable).
std::string ReadSmallFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return s.size() > (64u << 10) ? "" : s;
}

// A small file of the data dir that decides what a start does: nullopt when it does not
// exist; kIoError (naming it) when it exists but cannot be read, is not a regular file or is
// over 64 KiB, so that an unreadable note is never taken for a missing one.
Result<std::optional<std::string>> ReadDataDirNote(const fs::path& path) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (st.type() == fs::file_type::not_found) return std::optional<std::string>();
  if (ec || st.type() != fs::file_type::regular) {
    return Status::IoError(path.string() + " exists but is not a readable file" +
                           (ec ? ": " + ec.message() : std::string()) +
                           " [nothing on disk was changed]");
  }
  std::ifstream in(path, std::ios::binary);
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in.eof() && !in) return Status::IoError("cannot read " + path.string());
  if (s.size() > (64u << 10)) return Status::IoError(path.string() + " is larger than 64 KiB");
  return std::optional<std::string>(std::move(s));
}

// Writes `bytes` to `path` through a temporary file, synced and renamed into place.
Status WriteSmallFile(const fs::path& path, const std::string& bytes) {
  const fs::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << bytes;
    if (!out) return Status::IoError("cannot write " + tmp.string());
  }
  RDKV_RETURN_IF_ERROR(FsyncPath(tmp, false));
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) return FsError("cannot rename " + tmp.string() + " to " + path.string(), ec);
  return FsyncPath(path.parent_path(), true);
}

// In the data dir: the bytes of torn WAL records cut at starts (--wal_recovery=torn_tail).
constexpr const char* kTornTailDir = "torn-wal-tails";

// In the data dir: the largest version a database replaced by a restore had handed out.
constexpr const char* kVersionFloorFile = "version_floor";

// A restore's note: the snapshot's absolute path and marker, and the installed database's
// RocksDB identity.
std::string RestoreNote(const std::string& snapshot, const fs::path& db_dir) {
  std::error_code ec;
  const fs::path abs = fs::weakly_canonical(fs::absolute(snapshot, ec), ec);
  return "snapshot=" + abs.string() + "\n" + ReadSmallFile(fs::path(snapshot) / kSnapshotMarker) +
         "identity=" + ReadSmallFile(db_dir / "IDENTITY") + "\n";
}

// Creates an empty database holding only the meta keys, in a staging directory renamed into
// place when complete: a half-created database never exists under <data_dir>/db.
Status CreateDatabase(const fs::path& data_dir, const fs::path& db_dir, rocksdb::Options options) {
  std::error_code ec;
  fs::path staging = data_dir / "db.new";
  fs::remove_all(staging, ec);          // a leftover of an interrupted creation: ours
  fs::create_directories(staging, ec);  // (RocksDB logs an error when it has to create it)
  options.create_if_missing = true;
  options.error_if_exists = true;
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(options, staging.string(), &raw);
  if (!s.ok()) return FromRocks("cannot create a database in " + staging.string(), s);
  std::unique_ptr<rocksdb::DB> db(raw);
  rocksdb::WriteBatch b;
  std::string format = std::to_string(kFormatVersion);
  char zero[kVersionBytes];
  EncodeVersion(0, zero);
  b.Put(rocksdb::Slice(kMetaFormat.data(), kMetaFormat.size()), format);
  b.Put(rocksdb::Slice(kMetaMaxVersion.data(), kMetaMaxVersion.size()),
        rocksdb::Slice(zero, kVersionBytes));
  rocksdb::WriteOptions wo;
  wo.sync = true;
  s = db->Write(wo, &b);
  if (s.ok()) s = db->Close();
  if (!s.ok()) return FromRocks("cannot initialise the database in " + staging.string(), s);
  db.reset();
  fs::rename(staging, db_dir, ec);
  if (ec) return FsError("cannot rename " + staging.string() + " to " + db_dir.string(), ec);
  return FsyncPath(data_dir, true);
}

constexpr uint64_t kNoSequenceCheck = ~uint64_t{0};

}  // namespace

// ---------------------------------------------------------------------------------------------

namespace persister_internal {

namespace {

Status InUse(const std::string& dir, const fs::path& lock_file) {
  std::string holder;
  {
    std::ifstream in(lock_file);
    std::getline(in, holder);
  }
  return Status::Unavailable("the snapshot dir " + dir + " is in use by another kvserver" +
                             (holder.empty() ? "" : " (" + holder + ")") +
                             ": give each server its own --snapshot_dir (servers sharing one "
                             "would delete each other's snapshots)");
}

}  // namespace

Status SnapshotDirLock::Probe(const std::string& dir) {
  const fs::path path = fs::path(dir) / kLockFile;
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);  // never creates it
  if (fd < 0) return Status::Ok();  // no lock file yet, or none readable: Take decides
  const bool held = flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK;
  close(fd);  // releases the lock, if this took it
  return held ? InUse(dir, path) : Status::Ok();
}

Result<std::unique_ptr<SnapshotDirLock>> SnapshotDirLock::Take(const std::string& dir,
                                                               const std::string& data_dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  const fs::path path = fs::path(dir) / kLockFile;
  int fd = ec ? -1 : open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    LOG(WARNING) << "cannot lock the snapshot dir " << dir << " ("
                 << (ec ? ec.message() : std::string(std::strerror(errno)))
                 << "): another kvserver given the same --snapshot_dir would not be noticed";
    return std::unique_ptr<SnapshotDirLock>(new SnapshotDirLock(-1));
  }
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    close(fd);
    if (err == EWOULDBLOCK) return InUse(dir, path);
    // A file system without locks (NFS without lockd): the same as a dir that cannot be
    // locked at all, a warning.
    LOG(WARNING) << "cannot lock the snapshot dir " << dir << " (" << std::strerror(err)
                 << "): another kvserver given the same --snapshot_dir would not be noticed";
    return std::unique_ptr<SnapshotDirLock>(new SnapshotDirLock(-1));
  }
  // Who holds it, for the next one's error message.
  const std::string who = "pid " + std::to_string(getpid()) + ", --data_dir=" + data_dir + "\n";
  if (ftruncate(fd, 0) == 0) {
    ssize_t n = pwrite(fd, who.data(), who.size(), 0);
    (void)n;  // only a hint in another server's error
  }
  return std::unique_ptr<SnapshotDirLock>(new SnapshotDirLock(fd));
}

SnapshotDirLock::~SnapshotDirLock() {
  if (fd_ >= 0) close(fd_);
}

}  // namespace persister_internal

Persister::Impl::Impl(const PersistOptions& o, const rocksdb::Options& db_options,
                      std::string db_dir, std::unique_ptr<rocksdb::DB> db, uint64_t max_version,
                      std::unique_ptr<SnapshotDirLock> snapshot_dir_lock)
    : o_(o),
      db_options_(db_options),
      db_dir_(std::move(db_dir)),
      sync_(o.durability == Durability::kSync),
      snapshot_dir_(SnapshotDirOf(o)),
      snapshot_dir_lock_(std::move(snapshot_dir_lock)),
      db_(std::move(db)),
      max_version_(max_version) {
  last_sync_ = Clock::now();
  thread_ = std::thread([this] {
    rdkv::util::NameThisThread("rdkv-persist");
    Run();
  });
  if (!sync_) {
    sync_thread_ = std::thread([this] {
      rdkv::util::NameThisThread("rdkv-wal-sync");
      SyncLoop();
    });
  }
  snap_thread_ = std::thread([this] {
    rdkv::util::NameThisThread("rdkv-snapshot");
    SnapshotLoop();
  });
}

Persister::Impl::~Impl() {
  {
    MutexLock l(&snap_mu_);
    snap_stop_ = true;
  }
  snap_cv_.SignalAll();
  snap_thread_.join();
  {
    MutexLock l(&mu_);
    stop_ = true;
  }
  work_cv_.SignalAll();
  room_cv_.SignalAll();
  thread_.join();
  if (sync_thread_.joinable()) sync_thread_.join();
  // Every thread has ended: db_ is this thread's alone.
  if (db_) {
    rocksdb::Status s = db_->Close();
    if (!s.ok()) LOG(ERROR) << "persister: closing the database: " << s.ToString();
  }
}

PersisterStats Persister::Impl::stats() const {
  PersisterStats s;
  s.durability = o_.durability;
  {
    MutexLock l(&mu_);
    s.queued_records = pending_.records + in_flight_records_;
    s.queued_bytes = pending_.bytes + in_flight_bytes_;
    s.failing = !FailingLocked().ok();
    s.last_error = last_error_;
  }
  s.records = records_.load();
  s.groups = groups_.load();
  s.syncs = syncs_.load();
  s.max_group_records = max_group_records_.load();
  s.admission_waits = admission_waits_.load();
  s.max_lag_us = max_lag_us_.load();
  s.io_errors = io_errors_.load();
  s.group_records = group_records_hist_.Snapshot();
  s.wal_sync_seconds = wal_sync_seconds_hist_.Snapshot();
  {
    MutexLock l(&snap_mu_);
    s.snapshots = snapshots_;
    s.last_snapshot = last_snapshot_;
  }
  return s;
}

// An error RocksDB cannot resume from (e.g. a failure while it switched to a new WAL) needs
// the database closed and opened again, which replays the WAL.
rocksdb::Status Persister::Impl::RecoverDb() {
  {
    ReaderMutexLock l(&db_mu_);
    if (db_) {
      rocksdb::Status s = db_->Resume();
      if (s.ok()) return s;
      LOG(WARNING) << "persister: RocksDB cannot resume (" << s.ToString()
                   << "); closing and reopening the database";
    }
  }
  {
    // Only this thread replaces db_: it is still the one Resume() refused.
    WriterMutexLock l(&db_mu_);
    if (db_) {
      db_->Close().PermitUncheckedError();
      db_.reset();
    }
  }
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(db_options_, db_dir_, &raw);
  if (!s.ok()) return s;
  WriterMutexLock l(&db_mu_);
  db_.reset(raw);
  LOG(WARNING) << "persister: reopened " << db_dir_;
  return s;
}

// ---------------------------------------------------------------------------------------------

Persister::Persister(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Persister::~Persister() = default;
Durability Persister::durability() const { return impl_->durability(); }
Status Persister::Admit() { return impl_->Admit(); }
void Persister::EnqueuePut(std::string_view key, uint64_t version, std::string_view value,
                           Completion done) {
  impl_->EnqueuePut(key, version, value, std::move(done));
}
void Persister::EnqueueMaxVersion(uint64_t v, Completion done) {
  impl_->EnqueueMaxVersion(v, std::move(done));
}

void Persister::EnqueueDelete(std::string_view key, Completion done) {
  impl_->EnqueueDelete(key, std::move(done));
}
Status Persister::Flush() { return impl_->Flush(); }
void Persister::Snapshot(std::string name, SnapshotDone done) {
  impl_->Snapshot(std::move(name), std::move(done));
}
PersisterStats Persister::stats() const { return impl_->stats(); }
const std::string& Persister::snapshot_dir() const { return impl_->snapshot_dir(); }

Result<std::unique_ptr<Persister>> Persister::Start(const PersistOptions& options, Store* store,
                                                    RecoveryStats* recovered) {
  LoadOptions lo;
  lo.env = options.env;
  lo.tuning = options.tuning;
  lo.max_value_bytes = options.max_value_bytes;
  lo.progress_interval = options.progress_interval;
  lo.stop = options.stop;
  lo.test_item_delay = options.test_recovery_item_delay;
  // `wal` (optional) receives the load's WAL check, also when the load refuses the WAL.
  auto load = [&](const std::string& dir, WalScan* wal = nullptr) -> Result<RecoveryStats> {
    LOG(INFO) << "recovery: loading " << dir << " (read-only) into the region";
    LoadOptions dir_lo = lo;
    dir_lo.wal_scan = wal;
    if (!options.restore_from.empty() && dir == options.restore_from) {
      dir_lo.progress_label = "restore";  // progress lines: "restore: 1.20M/5.00M keys (24%), ..."
    }
    Result<RecoveryStats> r = LoadDatabase(dir, store, dir_lo);
    if (!r.ok()) {
      return Status(r.status().code(), r.status().message() + " [nothing on disk was changed]");
    }
    double mib = r->bytes / (1024.0 * 1024.0);
    LOG(INFO) << "recovery: loaded " << r->keys << " keys (" << static_cast<uint64_t>(mib)
              << " MiB) in " << r->seconds << " s ("
              << static_cast<uint64_t>(r->keys / std::max(r->seconds, 1e-9)) << " keys/s, "
              << static_cast<uint64_t>(mib / std::max(r->seconds, 1e-9)) << " MiB/s, " << r->threads
              << " threads); the largest version it remembers is " << r->max_version
              << ", new versions start above " << r->max_version + kVersionGapAfterRecovery
              << " (a gap of 2^32 for versions given out but not persisted)";
    if (recovered) *recovered = *r;
    return r;
  };
  if (!options.restore_from.empty() && !HasDatabase(options.restore_from)) {
    return Status::InvalidArgument("--restore_from=" + options.restore_from +
                                   " is not a snapshot (no RocksDB CURRENT file in it)");
  }
  if (options.durability == Durability::kNone) {
    if (!options.restore_from.empty()) {
      RDKV_RETURN_IF_ERROR(load(options.restore_from).status());
    }
    return std::unique_ptr<Persister>();
  }
  if (options.data_dir.empty()) {
    return Status::InvalidArgument("durability=" + std::string(DurabilityName(options.durability)) +
                                   " needs a --data_dir");
  }
  if (options.persist_lag.count() < 1)
    return Status::InvalidArgument("persist lag must be >= 1 ms");
  rocksdb::Options dbo;
  RDKV_RETURN_IF_ERROR(MakeDbOptions(options.tuning, options.env, &dbo));

  std::error_code ec;
  const fs::path data_dir(options.data_dir);
  const fs::path db_dir = data_dir / "db";
  if (fs::exists(data_dir, ec) && !fs::is_directory(data_dir, ec)) {
    return Status::InvalidArgument("--data_dir=" + options.data_dir + " is not a directory");
  }
  if (!fs::exists(data_dir, ec)) {
    fs::create_directories(data_dir, ec);
    if (ec) return FsError("cannot create --data_dir=" + options.data_dir, ec);
  }
  RDKV_RETURN_IF_ERROR(CheckNotInUse(db_dir, dbo.env));
  const fs::path snap_dir = SnapshotDirOf(options);
  // A snapshot dir another running server holds is refused before anything here changes (the
  // lock itself is taken once the start has passed its checks: creating it would change the
  // data dir of a start refused later).
  RDKV_RETURN_IF_ERROR(SnapshotDirLock::Probe(snap_dir.string()));

  uint64_t expected_sequence = 0;
  uint64_t max_version = 0;
  // The largest version a database this data dir held before a restore had handed out
  // (written by the restore): versions stay above it at every start.
  const fs::path floor_file = data_dir / kVersionFloorFile;
  uint64_t version_floor = 0;
  RDKV_ASSIGN_OR_RETURN(std::optional<std::string> floor_text, ReadDataDirNote(floor_file));
  if (floor_text) {
    std::string f = *floor_text;
    while (!f.empty() && (f.back() == '\n' || f.back() == ' ')) f.pop_back();
    uint64_t v = 0;
    const auto [end, err] = std::from_chars(f.data(), f.data() + f.size(), v);
    if (f.empty() || err != std::errc() || end != f.data() + f.size() ||
        v > kv::kMaxItemVersion - kVersionGapAfterRecovery) {
      return Status::Corruption(floor_file.string() +
                                " does not hold a version (a decimal number below " +
                                std::to_string(kv::kMaxItemVersion - kVersionGapAfterRecovery) +
                                ") [nothing on disk was changed]");
    }
    version_floor = v;
    LOG(INFO) << "versions stay above " << v << " (" << floor_file
              << ": the largest a database replaced by a restore gave out)";
  }
  // What identifies a restore: the snapshot's path and marker (name, sequence, time), and the
  // RocksDB identity of the database it installed (a database created since is another one).
  const fs::path restored_note = data_dir / kRestoredFromFile;
  bool restore = !options.restore_from.empty();
  bool restored = false;
  if (restore) {
    RDKV_ASSIGN_OR_RETURN(std::optional<std::string> note, ReadDataDirNote(restored_note));
    if (HasDatabase(db_dir.string()) && note &&
        *note == RestoreNote(options.restore_from, db_dir)) {
      // The flag was left on after the restore it asked for: restoring again would throw away
      // every write since.
      LOG(WARNING) << "restore: " << db_dir << " was already restored from " << options.restore_from
                   << "; not restoring it again (that would drop every write since). Drop "
                      "--restore_from; to go back to that snapshot once more, remove "
                   << restored_note;
      restore = false;
    }
  }
  if (restore) {
    RDKV_ASSIGN_OR_RETURN(RecoveryStats r, load(options.restore_from));
    // The database being replaced may have handed out versions above the snapshot's (writes
    // after it, restarts): none of them is handed out again.
    uint64_t replaced_max = 0;
    if (HasDatabase(db_dir.string())) {
      Result<uint64_t> m = ReadRememberedMaxVersion(db_dir.string(), options.env);
      if (m.ok()) {
        replaced_max = *m;
      } else {
        LOG(WARNING) << "restore: cannot read the largest version of the database being "
                        "replaced ("
                     << m.status().ToString()
                     << "): versions it handed out after the snapshot may be handed out again";
      }
    }
    // Kept in the data dir before anything is replaced, for this start and every later one.
    if (replaced_max > version_floor) {
      RDKV_RETURN_IF_ERROR(WriteSmallFile(floor_file, std::to_string(replaced_max)));
      version_floor = replaced_max;
    }
    RDKV_RETURN_IF_ERROR(InstallSnapshot(options.restore_from, data_dir, db_dir));
    restored = true;  // noted once the database is open (and has its identity)
    LOG(INFO) << "restore: " << options.restore_from << " installed as " << db_dir;
    expected_sequence = r.sequence;
    max_version = r.max_version;
  } else if (HasDatabase(db_dir.string())) {
    WalScan wal;
    Result<RecoveryStats> loaded = load(db_dir.string(), &wal);
    TornTailCut torn_tail_cut;
    if (!loaded.ok() && options.tuning.wal_recovery == WalRecovery::kTornTail &&
        wal.crash_torn_tail()) {
      // The load refused (before reading anything) the one WAL damage a crash leaves, a write
      // cut off inside its record: cut that record, then load again. Any other damage stays
      // refused. An intact WAL is scanned once, by the load.
      RDKV_ASSIGN_OR_RETURN(
          torn_tail_cut,
          CutTornWalTail(db_dir.string(), (data_dir / kTornTailDir).string(), dbo.env, wal));
      if (torn_tail_cut.bytes > 0) {
        LOG(WARNING) << "recovery: the write-ahead log " << torn_tail_cut.file
                     << " ended inside its last record (a write cut off by a crash): cut "
                     << torn_tail_cut.bytes << " bytes from byte " << torn_tail_cut.offset
                     << " (that record's write was never acknowledged in sync mode; in async "
                        "mode it is the group a crash loses); the bytes are kept in "
                     << torn_tail_cut.kept << " (--wal_recovery=torn_tail)";
        loaded = load(db_dir.string());
        if (!loaded.ok()) {
          return Status(loaded.status().code(),
                        loaded.status().message() +
                            " (except the WAL's torn last record, cut before the load; its "
                            "bytes are in " +
                            torn_tail_cut.kept + ")");
        }
      }
    }
    RDKV_ASSIGN_OR_RETURN(RecoveryStats r, std::move(loaded));
    if (recovered) recovered->torn_tail_cut = torn_tail_cut;
    expected_sequence = r.sequence;
    max_version = r.max_version;
  } else {
    if (fs::exists(db_dir, ec) && !fs::is_empty(db_dir, ec)) {
      return Status::NotSupported(db_dir.string() +
                                  " holds files but no RocksDB database (no "
                                  "CURRENT file); move it away [nothing on disk was changed]");
    }
    // No database, but a restore's staging: a restore stopped between moving the database
    // aside and renaming the snapshot's copy into place. A new empty database here would
    // hide both.
    if (fs::exists(data_dir / "db.restore", ec)) {
      return Status::Unavailable(
          "an interrupted restore: " + data_dir.string() +
          " has no database but holds db.restore (the snapshot's copy being installed). Start "
          "again with the same --restore_from (it copies the snapshot again); the database it "
          "replaced, if there was one, is the newest db.pre-restore-<time> directory [nothing "
          "on disk was changed]");
    }
    fs::remove(db_dir, ec);  // an empty directory, if any
    RDKV_RETURN_IF_ERROR(CreateDatabase(data_dir, db_dir, dbo));
    LOG(INFO) << "created a new database in " << db_dir;
    expected_sequence = kNoSequenceCheck;
  }

  if (version_floor > max_version) {
    store->EnsureVersionAbove(version_floor + kVersionGapAfterRecovery);
    max_version = version_floor;
  }
  dbo.create_if_missing = false;
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(dbo, db_dir.string(), &raw);
  if (!s.ok()) return FromRocks("cannot open " + db_dir.string() + " for writing", s);
  std::unique_ptr<rocksdb::DB> db(raw);
  if (restored) {
    RDKV_RETURN_IF_ERROR(WriteSmallFile(restored_note, RestoreNote(options.restore_from, db_dir)));
  }
  if (expected_sequence != kNoSequenceCheck && db->GetLatestSequenceNumber() != expected_sequence) {
    return Status::Unavailable(db_dir.string() + " changed while it was being loaded (sequence " +
                               std::to_string(expected_sequence) + " loaded, " +
                               std::to_string(db->GetLatestSequenceNumber()) +
                               " now): is another kvserver using it?");
  }
  // The counter starts above what the database remembers (the recovery gap, the floor): that
  // base is made durable before anything is served, so that a restart whose writes are all
  // lost (async mode, a WAL dropped point in time) does not start again from the same base and
  // give the versions those writes had to other writes.
  if (const uint64_t base = store->version_counter(); base > max_version) {
    char v[kVersionBytes];
    EncodeVersion(base, v);
    rocksdb::WriteOptions sync;
    sync.sync = true;
    rocksdb::Status put =
        db->Put(sync, rocksdb::Slice(kMetaMaxVersion.data(), kMetaMaxVersion.size()),
                rocksdb::Slice(v, kVersionBytes));
    if (!put.ok()) return FromRocks("cannot record the version counter in " + db_dir.string(), put);
    max_version = base;
  }
  // The snapshot dir is this server's alone from here on (taken after every check of the
  // start, which leave the data dir as it was); then the leftovers of its own snapshots
  // interrupted by a crash go.
  RDKV_ASSIGN_OR_RETURN(std::unique_ptr<SnapshotDirLock> snap_lock,
                        SnapshotDirLock::Take(snap_dir.string(), options.data_dir));
  for (fs::directory_iterator it(snap_dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->path().filename().string().rfind(".tmp-", 0) == 0) {
      std::error_code remove_ec;
      fs::remove_all(it->path(), remove_ec);
      if (remove_ec) {
        LOG(WARNING) << "cannot remove the unfinished snapshot " << it->path() << ": "
                     << remove_ec.message();
      }
    }
  }
  LOG(INFO) << PromiseText(options);
  return std::unique_ptr<Persister>(new Persister(std::make_unique<Impl>(
      options, dbo, db_dir.string(), std::move(db), max_version, std::move(snap_lock))));
}

}  // namespace rdkv::server::persistence

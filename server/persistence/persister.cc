#include "server/persistence/persister.h"

#include <fcntl.h>
#include <glog/logging.h>
#include <rocksdb/db.h>
#include <rocksdb/env.h>
#include <rocksdb/options.h>
#include <rocksdb/utilities/checkpoint.h>
#include <rocksdb/write_batch.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <ctime>
#include <deque>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <shared_mutex>
#include <optional>
#include <thread>
#include <vector>

namespace rdkv::server::persistence {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

Result<Durability> ParseDurability(std::string_view name) {
  if (name == "sync") return Durability::kSync;
  if (name == "async") return Durability::kAsync;
  if (name == "none") return Durability::kNone;
  return Status::InvalidArgument("unknown durability '" + std::string(name) +
                                 "' (sync, async, none)");
}

std::string_view DurabilityName(Durability d) {
  switch (d) {
    case Durability::kSync: return "sync";
    case Durability::kAsync: return "async";
    case Durability::kNone: return "none";
  }
  return "?";
}

std::string PromiseText(const PersistOptions& o) {
  switch (o.durability) {
    case Durability::kSync:
      return "durability=sync: a write is acknowledged only after it is in the write-ahead log "
             "under " + o.data_dir + " and fsynced (group commit: writes share syncs); an "
             "acknowledged write survives kill -9, an OS crash and power loss";
    case Durability::kAsync:
      return "durability=async: a write is acknowledged once applied in memory; it is in the "
             "write-ahead log under " + o.data_dir + " within milliseconds (from then on it "
             "survives kill -9) and fsynced within " + std::to_string(o.persist_lag.count()) +
             " ms; a crash may lose the writes acknowledged in about the last " +
             std::to_string(o.persist_lag.count()) + " ms";
    case Durability::kNone:
      return "durability=none: a pure cache; nothing is written to disk and every item is lost "
             "when the server stops";
  }
  return "";
}

namespace {

std::string UtcStamp() {
  auto now = std::chrono::system_clock::now();
  std::time_t t = std::chrono::system_clock::to_time_t(now);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[64];
  int ms = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                now.time_since_epoch()).count() % 1000);
  std::snprintf(buf, sizeof(buf), "%04d%02d%02d-%02d%02d%02d-%03d", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ms);
  return buf;
}

Status FsError(const std::string& what, const std::error_code& ec) {
  return Status::IoError(what + ": " + ec.message());
}

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

bool ValidSnapshotName(std::string_view name) {
  if (name.empty() || name.size() > 128 || name[0] == '.') return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '.' || c == '_' || c == '-';
  });
}

constexpr const char* kSnapshotMarker = "RDKV_SNAPSHOT";

// Copies a snapshot (a RocksDB checkpoint) to <data_dir>/db: into a staging directory first,
// synced, then renamed into place. An existing database is renamed aside, never deleted.
Status InstallSnapshot(const fs::path& snap, const fs::path& data_dir, const fs::path& db_dir) {
  std::error_code ec;
  fs::path staging = data_dir / "db.restore";
  fs::remove_all(staging, ec);  // a leftover of an interrupted restore: ours
  if (!fs::create_directory(staging, ec)) return FsError("cannot create " + staging.string(), ec);
  for (const fs::directory_entry& e : fs::directory_iterator(snap, ec)) {
    if (!e.is_regular_file()) continue;
    std::string name = e.path().filename().string();
    if (name == kSnapshotMarker || name == "LOCK" || name.rfind("LOG", 0) == 0) continue;
    fs::path to = staging / name;
    bool linked = false;
    if (e.path().extension() == ".sst") {  // immutable in RocksDB: share, do not copy
      fs::create_hard_link(e.path(), to, ec);
      linked = !ec;
    }
    if (!linked && !fs::copy_file(e.path(), to, ec)) {
      return FsError("cannot copy " + e.path().string() + " to " + to.string(), ec);
    }
    RDKV_RETURN_IF_ERROR(FsyncPath(to, false));
  }
  if (ec) return FsError("cannot list " + snap.string(), ec);
  RDKV_RETURN_IF_ERROR(FsyncPath(staging, true));
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

// Creates an empty database holding only the meta keys, in a staging directory renamed into
// place when complete: a half-created database never exists under <data_dir>/db.
Status CreateDatabase(const fs::path& data_dir, const fs::path& db_dir, rocksdb::Options options) {
  std::error_code ec;
  fs::path staging = data_dir / "db.new";
  fs::remove_all(staging, ec);  // a leftover of an interrupted creation: ours
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

class Persister::Impl {
 public:
  Impl(const PersistOptions& o, const rocksdb::Options& db_options, std::string db_dir,
       std::unique_ptr<rocksdb::DB> db, uint64_t max_version)
      : o_(o),
        db_options_(db_options),
        db_dir_(std::move(db_dir)),
        db_(std::move(db)),
        sync_(o.durability == Durability::kSync),
        max_version_(max_version) {
    snapshot_dir_ = o.snapshot_dir.empty() ? (fs::path(o.data_dir) / "snapshots").string()
                                           : o.snapshot_dir;
    last_sync_ = Clock::now();
    thread_ = std::thread([this] { Run(); });
    if (!sync_) sync_thread_ = std::thread([this] { SyncLoop(); });
    snap_thread_ = std::thread([this] { SnapshotLoop(); });
  }

  ~Impl() {
    {
      std::lock_guard<std::mutex> l(snap_mu_);
      snap_stop_ = true;
    }
    snap_cv_.notify_all();
    snap_thread_.join();
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    work_cv_.notify_all();
    room_cv_.notify_all();
    thread_.join();
    if (sync_thread_.joinable()) sync_thread_.join();
    if (db_) {
      rocksdb::Status s = db_->Close();
      if (!s.ok()) LOG(ERROR) << "persister: closing the database: " << s.ToString();
    }
  }

  Durability durability() const { return o_.durability; }
  const std::string& snapshot_dir() const { return snapshot_dir_; }

  Status Admit() {
    std::unique_lock<std::mutex> lk(mu_);
    if (Status f = FailingLocked(); !f.ok()) return f;
    bool waited = false;
    for (;;) {
      if (stop_) return Status::Unavailable("the server is stopping");
      if (Status f = FailingLocked(); !f.ok()) return f;
      Clock::time_point now = Clock::now();
      bool full = pending_.bytes >= o_.queue_bytes;
      Clock::time_point too_old = pending_.oldest + o_.persist_lag / 2;
      bool old = !sync_ && pending_.records > 0 && now >= too_old;
      if (!full && !old) break;
      waited = true;
      work_cv_.notify_one();
      // The persister notifies when it takes the pending group; the timeout is a safety net.
      room_cv_.wait_for(lk, std::chrono::milliseconds(10));
    }
    if (waited) admission_waits_.fetch_add(1, std::memory_order_relaxed);
    return Status::Ok();
  }

  void EnqueuePut(std::string_view key, uint64_t version, std::string_view value,
                  Completion done) {
    char ver[kVersionBytes];
    EncodeVersion(version, ver);
    const char prefix = kDataPrefix;
    rocksdb::Slice kparts[2] = {rocksdb::Slice(&prefix, 1), rocksdb::Slice(key.data(), key.size())};
    rocksdb::Slice vparts[2] = {rocksdb::Slice(ver, kVersionBytes),
                                rocksdb::Slice(value.data(), value.size())};
    bool wake;
    {
      std::lock_guard<std::mutex> l(mu_);
      rocksdb::Status s = pending_.batch.Put(rocksdb::SliceParts(kparts, 2),
                                             rocksdb::SliceParts(vparts, 2));
      CHECK(s.ok()) << "WriteBatch::Put: " << s.ToString();  // only fails past 4 GiB
      wake = NoteEnqueuedLocked(key.size() + value.size() + 1 + kVersionBytes, std::move(done));
      max_version_ = std::max(max_version_, version);
    }
    if (wake) work_cv_.notify_one();
  }

  void EnqueueDelete(std::string_view key, Completion done) {
    const char prefix = kDataPrefix;
    rocksdb::Slice kparts[2] = {rocksdb::Slice(&prefix, 1), rocksdb::Slice(key.data(), key.size())};
    bool wake;
    {
      std::lock_guard<std::mutex> l(mu_);
      rocksdb::Status s = pending_.batch.Delete(rocksdb::SliceParts(kparts, 2));
      CHECK(s.ok()) << "WriteBatch::Delete: " << s.ToString();
      wake = NoteEnqueuedLocked(key.size() + 1, std::move(done));
    }
    if (wake) work_cv_.notify_one();
  }

  void EnqueueMaxVersion(uint64_t v, Completion done) {
    bool wake;
    {
      std::lock_guard<std::mutex> l(mu_);
      max_version_ = std::max(max_version_, v);
      char enc[kVersionBytes];
      EncodeVersion(max_version_, enc);
      rocksdb::Status s = pending_.batch.Put(
          rocksdb::Slice(kMetaMaxVersion.data(), kMetaMaxVersion.size()),
          rocksdb::Slice(enc, kVersionBytes));
      CHECK(s.ok()) << "WriteBatch::Put: " << s.ToString();
      wake = NoteEnqueuedLocked(kMetaMaxVersion.size() + kVersionBytes, std::move(done));
    }
    if (wake) work_cv_.notify_one();
  }

  Status Flush() {
    std::unique_lock<std::mutex> lk(mu_);
    const uint64_t target = enqueued_seq_;
    if (synced_seq_ >= target) return Status::Ok();
    if (Status f = FailingLocked(); !f.ok()) return f;
    ++flush_waiters_;
    work_cv_.notify_one();
    sync_cv_.notify_one();
    durable_cv_.wait(lk, [&] {
      return synced_seq_ >= target || !FailingLocked().ok() || stopped_;
    });
    --flush_waiters_;
    if (synced_seq_ >= target) return Status::Ok();
    Status f = FailingLocked();
    return f.ok() ? Status::Unavailable("the persister stopped") : f;
  }

  void Snapshot(std::string name, SnapshotDone done) {
    {
      std::lock_guard<std::mutex> l(snap_mu_);
      if (!snap_stop_) {
        snap_queue_.emplace_back(std::move(name), std::move(done));
        snap_cv_.notify_one();
        return;
      }
    }
    done(Status::Unavailable("the server is stopping"));
  }

  PersisterStats stats() const {
    PersisterStats s;
    s.durability = o_.durability;
    {
      std::lock_guard<std::mutex> l(mu_);
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
    {
      std::lock_guard<std::mutex> l(snap_mu_);
      s.snapshots = snapshots_;
      s.last_snapshot = last_snapshot_;
    }
    return s;
  }

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

  // Returns whether the persister thread needs a wake-up: it waits for a first record, or
  // (sync) while gathering for the record count that ends the wait. Otherwise it is busy and
  // looks at the queue when it is done.
  bool NoteEnqueuedLocked(uint64_t bytes, Completion done) {
    if (pending_.records == 0) pending_.oldest = Clock::now();
    ++pending_.records;
    pending_.bytes += bytes;
    pending_.last_seq = ++enqueued_seq_;
    if (done) pending_.done.push_back(std::move(done));
    return pending_.records == 1 || pending_.records == gather_target_;
  }

  // Takes the pending group (under mu_), adding the meta key that remembers max_version.
  Group TakePendingLocked() {
    Group g = std::move(pending_);
    pending_ = Group();
    if (g.records > 0) {
      char v[kVersionBytes];
      EncodeVersion(max_version_, v);
      rocksdb::Status s = g.batch.Put(rocksdb::Slice(kMetaMaxVersion.data(), kMetaMaxVersion.size()),
                                      rocksdb::Slice(v, kVersionBytes));
      CHECK(s.ok()) << s.ToString();
    }
    in_flight_records_ = g.records;
    in_flight_bytes_ = g.bytes;
    return g;
  }

  bool broken() const { return !retry_.empty(); }

  // The write failure, else the WAL sync failure, else OK. Under mu_.
  Status FailingLocked() const { return failing_.ok() ? sync_failing_ : failing_; }

  // The persister thread.
  void Run() {
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      Clock::time_point now = Clock::now();
      const bool have = pending_.records > 0;
      if (stop_ && !have && !broken()) break;
      const bool retry_due = broken() && (stop_ || now >= next_retry_);
      // sync: the writers of the group just made durable are answered and come back within a
      // round trip; waiting a little for them (a quarter of the last sync, at most 1 ms, and
      // only until as many writes are pending as that group had) lets one sync cover them
      // all, instead of closed-loop clients splitting into two groups that alternate.
      const bool gathering = sync_ && have && !broken() && !stop_ &&
                             pending_.records < gather_target_ && now < gather_deadline_ &&
                             pending_.bytes < o_.queue_bytes;
      if (gathering) {
        work_cv_.wait_until(lk, gather_deadline_);
        continue;
      }
      if ((have && !broken()) || retry_due) {
        Group g = TakePendingLocked();
        room_cv_.notify_all();
        lk.unlock();
        Process(std::move(g));
        lk.lock();
        in_flight_records_ = in_flight_bytes_ = 0;
        if (stop_ && broken()) break;  // one last attempt was made
        continue;
      }
      Clock::time_point wake = Clock::time_point::max();
      if (broken()) wake = next_retry_;
      if (wake == Clock::time_point::max()) {
        work_cv_.wait(lk);
      } else {
        work_cv_.wait_until(lk, wake);
      }
    }
    if (broken()) {
      uint64_t lost = 0;
      for (const Group& g : retry_) lost += g.records;
      LOG(ERROR) << "persister: stopping with " << lost << " applied writes that could not be "
                 << "persisted (" << last_error_ << "); they are lost";
    }
    writer_done_ = true;
    sync_cv_.notify_all();
    if (sync_) {
      stopped_ = true;
      durable_cv_.notify_all();
    }
  }

  rocksdb::WriteOptions WriteOpts() const {
    rocksdb::WriteOptions wo;
    wo.sync = sync_;
    return wo;
  }

  // Writes the groups that failed before (in order), then `g`. Persister thread only.
  void Process(Group g) {
    rocksdb::Status s;
    const char* step = "writing to";
    if (broken()) {
      s = RecoverDb();
      step = s.ok() ? "retrying writes to" : "recovering from the last error in";
      while (s.ok() && !retry_.empty()) {
        Group& r = retry_.front();
        s = db_->Write(WriteOpts(), &r.batch);
        if (s.ok()) {
          Written(r, /*with_done=*/false);
          retry_.pop_front();
        }
      }
      if (s.ok()) {
        LOG(WARNING) << "persister: the data dir is writable again; writes resume";
        step = "writing to";
      }
    }
    if (s.ok() && g.records > 0) {
      write_started_ = Clock::now();
      s = db_->Write(WriteOpts(), &g.batch);
      if (s.ok()) Written(g, /*with_done=*/true);
    }
    if (!s.ok()) {
      io_errors_.fetch_add(1, std::memory_order_relaxed);
      Status err = FromRocks(std::string(step) + " " + o_.data_dir, s);
      Status failing = Status::IoError(
          "the data dir cannot be written (" + err.message() +
          "): writes are refused until it can be; writes already applied are retried every " +
          std::to_string(o_.io_retry.count()) + " ms");
      LOG_EVERY_N(ERROR, 10) << "persister: " << failing.message();
      {
        // Refuse new writes before answering the failed ones.
        std::lock_guard<std::mutex> l(mu_);
        failing_ = failing;
        last_error_ = err.message();
        next_retry_ = Clock::now() + o_.io_retry;
        durable_cv_.notify_all();
      }
      if (g.records > 0) {
        Status not_durable = Status::IoError(
            "not durable: " + err.message() +
            "; the write was applied in memory and its persistence is retried, so it may or may "
            "not survive a restart; writes are refused until the data dir can be written");
        for (Completion& c : g.done) c(not_durable);
        g.done.clear();
        retry_.push_back(std::move(g));
      }
      return;
    }
    std::lock_guard<std::mutex> l(mu_);
    if (!failing_.ok()) failing_ = Status::Ok();
    room_cv_.notify_all();
    durable_cv_.notify_all();
  }

  // After a failed write: RocksDB's Resume() clears a recoverable background error; an error
  // it cannot resume from (e.g. a failure while it switched to a new WAL) needs the database
  // closed and opened again, which replays the WAL. Persister thread only.
  rocksdb::Status RecoverDb() {
    if (db_) {
      rocksdb::Status s = db_->Resume();
      if (s.ok()) return s;
      LOG(WARNING) << "persister: RocksDB cannot resume (" << s.ToString()
                   << "); closing and reopening the database";
      std::unique_lock<std::shared_mutex> l(db_mu_);
      db_->Close().PermitUncheckedError();
      db_.reset();
    }
    rocksdb::DB* raw = nullptr;
    rocksdb::Status s = rocksdb::DB::Open(db_options_, db_dir_, &raw);
    if (!s.ok()) return s;
    std::unique_lock<std::shared_mutex> l(db_mu_);
    db_.reset(raw);
    LOG(WARNING) << "persister: reopened " << db_dir_;
    return s;
  }

  // Bookkeeping after a group is in RocksDB. Persister thread only.
  void Written(Group& g, bool with_done) {
    Clock::time_point now = Clock::now();
    groups_.fetch_add(1, std::memory_order_relaxed);
    records_.fetch_add(g.records, std::memory_order_relaxed);
    if (sync_) syncs_.fetch_add(1, std::memory_order_relaxed);
    uint64_t gr = g.records;
    uint64_t prev = max_group_records_.load(std::memory_order_relaxed);
    while (gr > prev && !max_group_records_.compare_exchange_weak(prev, gr)) {
    }
    uint64_t lag = std::chrono::duration_cast<std::chrono::microseconds>(now - g.oldest).count();
    prev = max_lag_us_.load(std::memory_order_relaxed);
    while (lag > prev && !max_lag_us_.compare_exchange_weak(prev, lag)) {
    }
    {
      std::lock_guard<std::mutex> l(mu_);
      const bool was_synced = written_seq_ == synced_seq_;
      written_seq_ = std::max(written_seq_, g.last_seq);
      if (sync_) {
        synced_seq_ = written_seq_;
        last_sync_ = now;
      } else if (was_synced || flush_waiters_ > 0) {
        sync_cv_.notify_one();  // the syncer sleeps without a deadline while all is synced
      }
    }
    if (with_done) {
      for (Completion& c : g.done) c(Status::Ok());
      g.done.clear();
    }
    if (sync_) {
      auto took = Clock::now() - write_started_;
      std::lock_guard<std::mutex> l(mu_);
      gather_target_ = g.records;
      gather_deadline_ = Clock::now() + std::min<Clock::duration>(took / 4, std::chrono::milliseconds(1));
    }
  }

  // async: the WAL syncer thread. It fsyncs the WAL at least every persist_lag (and at once
  // for a Flush), on its own thread, so a slow fsync never holds up the WAL writes that make
  // acknowledged writes survive a killed process.
  void SyncLoop() {
    std::unique_lock<std::mutex> lk(mu_);
    Clock::time_point retry_at{};
    for (;;) {
      Clock::time_point now = Clock::now();
      const bool unsynced = written_seq_ > synced_seq_;
      if (writer_done_ && (!unsynced || !sync_failing_.ok())) break;
      const bool due = unsynced && (writer_done_ || flush_waiters_ > 0 ||
                                    now >= last_sync_ + o_.persist_lag) &&
                       (sync_failing_.ok() || now >= retry_at);
      if (!due) {
        Clock::time_point wake = unsynced ? last_sync_ + o_.persist_lag : Clock::time_point::max();
        if (!sync_failing_.ok()) wake = std::max(wake, retry_at);
        if (wake == Clock::time_point::max()) {
          sync_cv_.wait(lk);
        } else {
          sync_cv_.wait_until(lk, wake);
        }
        continue;
      }
      const uint64_t target = written_seq_;
      lk.unlock();
      rocksdb::Status s;
      {
        std::shared_lock<std::shared_mutex> db_lock(db_mu_);  // the persister may reopen db_
        s = db_ ? db_->SyncWAL() : rocksdb::Status::Incomplete("the database is being reopened");
      }
      syncs_.fetch_add(1, std::memory_order_relaxed);
      lk.lock();
      last_sync_ = Clock::now();
      if (s.ok()) {
        synced_seq_ = std::max(synced_seq_, target);
        if (!sync_failing_.ok()) {
          LOG(WARNING) << "persister: the WAL can be synced again; writes resume";
          sync_failing_ = Status::Ok();
          room_cv_.notify_all();
        }
      } else {
        io_errors_.fetch_add(1, std::memory_order_relaxed);
        last_error_ = FromRocks("syncing the WAL in " + o_.data_dir, s).message();
        sync_failing_ = Status::IoError("the data dir cannot be synced (" + last_error_ +
                                        "): writes are refused until it can be");
        retry_at = last_sync_ + o_.io_retry;
        LOG_EVERY_N(ERROR, 10) << "persister: " << sync_failing_.message();
      }
      durable_cv_.notify_all();
    }
    stopped_ = true;
    durable_cv_.notify_all();
  }

  // --- snapshots (snapshot thread) ---

  void SnapshotLoop() {
    std::unique_lock<std::mutex> lk(snap_mu_);
    const bool periodic = o_.snapshot_interval.count() > 0;
    Clock::time_point next_auto =
        periodic ? Clock::now() + o_.snapshot_interval : Clock::time_point::max();
    for (;;) {
      if (snap_stop_) break;
      if (!snap_queue_.empty()) {
        auto [name, done] = std::move(snap_queue_.front());
        snap_queue_.pop_front();
        lk.unlock();
        Result<std::string> r = TakeSnapshot(name.empty() ? "snap-" + UtcStamp() : name);
        done(std::move(r));
        lk.lock();
        continue;
      }
      if (Clock::now() >= next_auto) {
        lk.unlock();
        Result<std::string> r = TakeSnapshot("auto-" + UtcStamp());
        if (r.ok()) {
          Prune();
        } else {
          LOG(WARNING) << "periodic snapshot failed: " << r.status().ToString();
        }
        lk.lock();
        next_auto = Clock::now() + o_.snapshot_interval;
        continue;
      }
      if (next_auto == Clock::time_point::max()) {
        snap_cv_.wait(lk);
      } else {
        snap_cv_.wait_until(lk, next_auto);
      }
    }
    for (auto& [name, done] : snap_queue_) done(Status::Unavailable("the server is stopping"));
    snap_queue_.clear();
  }

  Result<std::string> TakeSnapshot(const std::string& name) {
    if (!ValidSnapshotName(name)) {
      return Status::InvalidArgument("snapshot name '" + name + "': use 1..128 of [A-Za-z0-9._-], "
                                     "not starting with '.'");
    }
    std::error_code ec;
    fs::path dir(snapshot_dir_);
    fs::create_directories(dir, ec);
    if (ec) return FsError("cannot create the snapshot dir " + dir.string(), ec);
    fs::path final_path = fs::absolute(dir / name, ec);
    if (fs::exists(final_path, ec)) {
      return Status::AlreadyExists("snapshot " + final_path.string() + " already exists");
    }
    // Everything acknowledged before this point is in the database.
    Status f = Flush();
    if (!f.ok()) return Status(f.code(), "cannot snapshot: " + f.message());
    fs::path tmp = dir / (".tmp-" + name);
    fs::remove_all(tmp, ec);
    std::shared_lock<std::shared_mutex> db_lock(db_mu_);  // the persister may reopen db_
    if (!db_) return Status::Unavailable("cannot snapshot: the database is being reopened");
    rocksdb::Checkpoint* raw = nullptr;
    rocksdb::Status s = rocksdb::Checkpoint::Create(db_.get(), &raw);
    std::unique_ptr<rocksdb::Checkpoint> cp(raw);
    uint64_t sequence = 0;
    // log_size_for_flush = 0: flush the memtables, so the snapshot is SST files only.
    if (s.ok()) s = cp->CreateCheckpoint(tmp.string(), 0, &sequence);
    cp.reset();
    db_lock.unlock();
    if (!s.ok()) {
      fs::remove_all(tmp, ec);
      return FromRocks("snapshot " + name, s);
    }
    {
      std::ofstream m(tmp / kSnapshotMarker);
      m << "name=" << name << "\nformat=" << kFormatVersion << "\nsequence=" << sequence
        << "\ncreated_utc=" << UtcStamp() << "\n";
      if (!m) return Status::IoError("cannot write " + (tmp / kSnapshotMarker).string());
    }
    RDKV_RETURN_IF_ERROR(FsyncPath(tmp / kSnapshotMarker, false));
    fs::rename(tmp, final_path, ec);
    if (ec) return FsError("cannot rename " + tmp.string(), ec);
    RDKV_RETURN_IF_ERROR(FsyncPath(dir, true));
    LOG(INFO) << "snapshot " << final_path << " taken (sequence " << sequence << ")";
    std::lock_guard<std::mutex> l(snap_mu_);
    ++snapshots_;
    last_snapshot_ = final_path.string();
    return final_path.string();
  }

  // Keeps the newest snapshot_keep periodic snapshots ("auto-<UTC time>", so names sort by
  // age). Snapshots taken on request are the operator's and never pruned.
  void Prune() {
    if (o_.snapshot_keep <= 0) return;
    std::error_code ec;
    std::vector<fs::path> autos;
    for (const fs::directory_entry& e : fs::directory_iterator(snapshot_dir_, ec)) {
      std::string n = e.path().filename().string();
      if (e.is_directory() && n.rfind("auto-", 0) == 0 &&
          fs::exists(e.path() / kSnapshotMarker)) {
        autos.push_back(e.path());
      }
    }
    std::sort(autos.begin(), autos.end());
    for (size_t i = 0; i + o_.snapshot_keep < autos.size(); ++i) {
      fs::remove_all(autos[i], ec);
      if (ec) {
        LOG(WARNING) << "cannot prune snapshot " << autos[i] << ": " << ec.message();
      } else {
        LOG(INFO) << "pruned snapshot " << autos[i];
      }
    }
  }

  const PersistOptions o_;
  const rocksdb::Options db_options_;
  const std::string db_dir_;
  // Used by the persister thread (which alone replaces it, under an exclusive db_mu_) and by
  // the snapshot thread (under a shared db_mu_).
  mutable std::shared_mutex db_mu_;
  std::unique_ptr<rocksdb::DB> db_;
  const bool sync_;
  std::string snapshot_dir_;

  mutable std::mutex mu_;
  std::condition_variable work_cv_;     // the persister thread waits here
  std::condition_variable room_cv_;     // writers waiting for room in the queue
  std::condition_variable durable_cv_;  // Flush() callers
  std::condition_variable sync_cv_;     // async: the WAL syncer thread
  Group pending_;                       // guarded by mu_
  uint64_t in_flight_records_ = 0, in_flight_bytes_ = 0;  // guarded by mu_
  uint64_t enqueued_seq_ = 0, written_seq_ = 0, synced_seq_ = 0;  // guarded by mu_
  uint64_t max_version_;                // guarded by mu_
  int flush_waiters_ = 0;               // guarded by mu_
  bool stop_ = false, stopped_ = false; // guarded by mu_
  Status failing_;                      // guarded by mu_: writes to RocksDB fail
  Status sync_failing_;                 // guarded by mu_: async WAL syncs fail
  bool writer_done_ = false;            // guarded by mu_: the persister thread has ended
  std::string last_error_;              // guarded by mu_
  Clock::time_point last_sync_;         // guarded by mu_
  Clock::time_point next_retry_{};      // guarded by mu_
  uint64_t gather_target_ = 0;          // guarded by mu_ (sync: see Run)
  Clock::time_point gather_deadline_{}; // guarded by mu_
  // Persister thread only:
  Clock::time_point write_started_{};
  std::deque<Group> retry_;

  std::atomic<uint64_t> records_{0}, groups_{0}, syncs_{0}, max_group_records_{0};
  std::atomic<uint64_t> admission_waits_{0}, max_lag_us_{0}, io_errors_{0};

  mutable std::mutex snap_mu_;
  std::condition_variable snap_cv_;
  std::deque<std::pair<std::string, SnapshotDone>> snap_queue_;  // guarded by snap_mu_
  bool snap_stop_ = false;                                       // guarded by snap_mu_
  uint64_t snapshots_ = 0;                                       // guarded by snap_mu_
  std::string last_snapshot_;                                    // guarded by snap_mu_

  std::thread thread_;
  std::thread sync_thread_;  // async only
  std::thread snap_thread_;
};

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
Result<std::string> Persister::SnapshotNow(std::string name) {
  std::mutex mu;
  std::condition_variable cv;
  std::optional<Result<std::string>> out;
  impl_->Snapshot(std::move(name), [&](Result<std::string> r) {
    std::lock_guard<std::mutex> l(mu);
    out.emplace(std::move(r));
    cv.notify_all();
  });
  std::unique_lock<std::mutex> lk(mu);
  cv.wait(lk, [&] { return out.has_value(); });
  return std::move(*out);
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
  auto load = [&](const std::string& dir) -> Result<RecoveryStats> {
    LOG(INFO) << "recovery: loading " << dir << " (read-only) into the region";
    Result<RecoveryStats> r = LoadDatabase(dir, store, lo);
    if (!r.ok()) {
      return Status(r.status().code(), r.status().message() + " [nothing on disk was changed]");
    }
    double mib = r->bytes / (1024.0 * 1024.0);
    LOG(INFO) << "recovery: loaded " << r->keys << " keys (" << static_cast<uint64_t>(mib)
              << " MiB) in " << r->seconds << " s ("
              << static_cast<uint64_t>(r->keys / std::max(r->seconds, 1e-9)) << " keys/s, "
              << static_cast<uint64_t>(mib / std::max(r->seconds, 1e-9))
              << " MiB/s, " << r->threads << " threads); versions continue above "
              << r->max_version;
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
  if (options.persist_lag.count() < 1) return Status::InvalidArgument("persist lag must be >= 1 ms");
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

  uint64_t expected_sequence = 0;
  uint64_t max_version = 0;
  if (!options.restore_from.empty()) {
    RDKV_ASSIGN_OR_RETURN(RecoveryStats r, load(options.restore_from));
    RDKV_RETURN_IF_ERROR(InstallSnapshot(options.restore_from, data_dir, db_dir));
    LOG(INFO) << "restore: " << options.restore_from << " installed as " << db_dir;
    expected_sequence = r.sequence;
    max_version = r.max_version;
  } else if (HasDatabase(db_dir.string())) {
    RDKV_ASSIGN_OR_RETURN(RecoveryStats r, load(db_dir.string()));
    expected_sequence = r.sequence;
    max_version = r.max_version;
  } else {
    if (fs::exists(db_dir, ec) && !fs::is_empty(db_dir, ec)) {
      return Status::NotSupported(db_dir.string() + " holds files but no RocksDB database (no "
                                  "CURRENT file); move it away [nothing on disk was changed]");
    }
    fs::remove(db_dir, ec);  // an empty directory, if any
    RDKV_RETURN_IF_ERROR(CreateDatabase(data_dir, db_dir, dbo));
    LOG(INFO) << "created a new database in " << db_dir;
    expected_sequence = kNoSequenceCheck;
  }

  dbo.create_if_missing = false;
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(dbo, db_dir.string(), &raw);
  if (!s.ok()) return FromRocks("cannot open " + db_dir.string() + " for writing", s);
  std::unique_ptr<rocksdb::DB> db(raw);
  if (expected_sequence != kNoSequenceCheck &&
      db->GetLatestSequenceNumber() != expected_sequence) {
    return Status::Unavailable(
        db_dir.string() + " changed while it was being loaded (sequence " +
        std::to_string(expected_sequence) + " loaded, " +
        std::to_string(db->GetLatestSequenceNumber()) + " now): is another kvserver using it?");
  }
  // Leftovers of snapshots interrupted by a crash.
  fs::path snap_dir = options.snapshot_dir.empty() ? data_dir / "snapshots" : fs::path(options.snapshot_dir);
  for (const fs::directory_entry& e : fs::directory_iterator(snap_dir, ec)) {
    if (e.path().filename().string().rfind(".tmp-", 0) == 0) fs::remove_all(e.path(), ec);
  }
  LOG(INFO) << PromiseText(options);
  return std::unique_ptr<Persister>(
      new Persister(std::make_unique<Impl>(options, dbo, db_dir.string(), std::move(db),
                                           max_version)));
}

}  // namespace rdkv::server::persistence

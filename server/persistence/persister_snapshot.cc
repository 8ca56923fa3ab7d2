// The persister's snapshots: the snapshot thread (SnapshotLoop) takes the snapshots asked for
// (Snapshot, SnapshotNow) and the periodic ones as RocksDB checkpoints, each complete before
// it is renamed into place, and prunes old periodic ones.
#include <glog/logging.h>
#include <rocksdb/db.h>
#include <rocksdb/utilities/checkpoint.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "server/persistence/persister_impl.h"
#include "server/persistence/recovery.h"

namespace rdkv::server::persistence {

namespace fs = std::filesystem;
using persister_internal::FsError;
using persister_internal::kSnapshotMarker;
using persister_internal::UtcStamp;

namespace {

bool ValidSnapshotName(std::string_view name) {
  if (name.empty() || name.size() > 128 || name[0] == '.') return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == '-';
  });
}

}  // namespace

void Persister::Impl::Snapshot(std::string name, SnapshotDone done) {
  {
    MutexLock l(&snap_mu_);
    if (!snap_stop_) {
      snap_queue_.emplace_back(std::move(name), std::move(done));
      snap_cv_.Signal();
      return;
    }
  }
  done(Status::Unavailable("the server is stopping"));
}

void Persister::Impl::SnapshotLoop() {
  MutexLock l(&snap_mu_);
  const bool periodic = o_.snapshot_interval.count() > 0;
  Clock::time_point next_auto =
      periodic ? Clock::now() + o_.snapshot_interval : Clock::time_point::max();
  for (;;) {
    if (snap_stop_) break;
    if (!snap_queue_.empty()) {
      auto [name, done] = std::move(snap_queue_.front());
      snap_queue_.pop_front();
      l.Unlock();
      Result<std::string> r = TakeSnapshot(name.empty() ? "snap-" + UtcStamp() : name);
      done(std::move(r));
      l.Lock();
      continue;
    }
    if (Clock::now() >= next_auto) {
      l.Unlock();
      Result<std::string> r = TakeSnapshot("auto-" + UtcStamp());
      if (r.ok()) {
        Prune();
      } else {
        LOG(WARNING) << "periodic snapshot failed: " << r.status().ToString();
      }
      l.Lock();
      next_auto = Clock::now() + o_.snapshot_interval;
      continue;
    }
    if (next_auto == Clock::time_point::max()) {
      snap_cv_.Wait(&snap_mu_);
    } else {
      snap_cv_.WaitUntil(&snap_mu_, next_auto);
    }
  }
  for (auto& [name, done] : snap_queue_) done(Status::Unavailable("the server is stopping"));
  snap_queue_.clear();
}

Result<std::string> Persister::Impl::TakeSnapshot(const std::string& name) {
  if (!ValidSnapshotName(name)) {
    return Status::InvalidArgument("snapshot name '" + name +
                                   "': use 1..128 of [A-Za-z0-9._-], "
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
  uint64_t sequence = 0;
  rocksdb::Status s;
  {
    ReaderMutexLock db_lock(&db_mu_);  // the persister may reopen db_
    if (!db_) return Status::Unavailable("cannot snapshot: the database is being reopened");
    rocksdb::Checkpoint* raw = nullptr;
    s = rocksdb::Checkpoint::Create(db_.get(), &raw);
    std::unique_ptr<rocksdb::Checkpoint> cp(raw);
    // log_size_for_flush = 0: flush the memtables, so the snapshot is SST files only.
    if (s.ok()) s = cp->CreateCheckpoint(tmp.string(), 0, &sequence);
  }
  if (!s.ok()) {
    fs::remove_all(tmp, ec);
    return FromRocks("snapshot " + name, s);
  }
  // The live WAL was copied up to its size at one instant, maybe inside a record that a write
  // after the flush was appending: such a torn end would make a restore refuse the snapshot.
  uint64_t cut = 0;
  if (Status trimmed = TrimTornWalTail(tmp.string(), &cut); !trimmed.ok()) {
    fs::remove_all(tmp, ec);
    return Status(trimmed.code(), "snapshot " + name + ": " + trimmed.message());
  }
  if (cut > 0) {
    LOG(INFO) << "snapshot " << name << ": cut the torn last " << cut
              << " bytes of its copied write-ahead log (a write that came after the snapshot "
                 "was asked for)";
  }
  // A failure from here leaves no .tmp- directory behind (docs/persistence.md, failure cases).
  auto fail = [&](Status s) {
    std::error_code remove_ec;
    fs::remove_all(tmp, remove_ec);
    return s;
  };
  {
    std::ofstream m(tmp / kSnapshotMarker);
    m << "name=" << name << "\nformat=" << kFormatVersion << "\nsequence=" << sequence
      << "\ncreated_utc=" << UtcStamp() << "\n";
    if (!m) return fail(Status::IoError("cannot write " + (tmp / kSnapshotMarker).string()));
  }
  if (Status synced = FsyncPath(tmp / kSnapshotMarker, false); !synced.ok()) return fail(synced);
  if (Status synced = FsyncPath(tmp, true); !synced.ok())
    return fail(synced);  // the marker's entry
  fs::rename(tmp, final_path, ec);
  if (ec) return fail(FsError("cannot rename " + tmp.string(), ec));
  RDKV_RETURN_IF_ERROR(FsyncPath(dir, true));
  LOG(INFO) << "snapshot " << final_path << " taken (sequence " << sequence << ")";
  MutexLock l(&snap_mu_);
  ++snapshots_;
  last_snapshot_ = final_path.string();
  return final_path.string();
}

// Keeps the newest snapshot_keep periodic snapshots ("auto-<UTC time>", so names sort by
// age). Snapshots taken on request are the operator's and never pruned.
void Persister::Impl::Prune() {
  if (o_.snapshot_keep <= 0) return;
  std::error_code ec;
  std::vector<fs::path> autos;
  // The error_code forms only: this runs on the snapshot thread, where a throw (a folder it
  // may not read) would end the server.
  for (fs::directory_iterator it(snapshot_dir_, ec), end; !ec && it != end; it.increment(ec)) {
    const fs::directory_entry& e = *it;
    std::string n = e.path().filename().string();
    std::error_code entry_ec;
    if (e.is_directory(entry_ec) && n.rfind("auto-", 0) == 0 &&
        fs::exists(e.path() / kSnapshotMarker, entry_ec)) {
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

Result<std::string> Persister::SnapshotNow(std::string name) {
  Mutex mu;
  CondVar cv;
  std::optional<Result<std::string>> out;  // under mu
  impl_->Snapshot(std::move(name), [&](Result<std::string> r) {
    MutexLock l(&mu);
    out.emplace(std::move(r));
    cv.SignalAll();
  });
  MutexLock l(&mu);
  while (!out.has_value()) cv.Wait(&mu);
  return std::move(*out);
}

}  // namespace rdkv::server::persistence

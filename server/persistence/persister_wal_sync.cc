// The persister's WAL syncs: in async mode the persister thread writes groups to the WAL
// without syncing, and the WAL syncer thread (SyncLoop) fsyncs it at least every persist_lag,
// and at once for a Flush, on its own thread, so a slow fsync never holds up the WAL writes
// that make acknowledged writes survive a killed process. In sync mode each group's write
// syncs (persister_commit.cc) and there is no syncer. Flush waits for either.
#include <glog/logging.h>
#include <rocksdb/db.h>

#include <algorithm>
#include <string>

#include "server/persistence/persister_impl.h"

namespace rdkv::server::persistence {

Status Persister::Impl::Flush() {
  MutexLock l(&mu_);
  const uint64_t target = enqueued_seq_;
  if (synced_seq_ >= target) return Status::Ok();
  if (Status f = FailingLocked(); !f.ok()) return f;
  ++flush_waiters_;
  work_cv_.Signal();
  sync_cv_.Signal();
  while (!(synced_seq_ >= target || !FailingLocked().ok() || stopped_)) durable_cv_.Wait(&mu_);
  --flush_waiters_;
  if (synced_seq_ >= target) return Status::Ok();
  Status f = FailingLocked();
  return f.ok() ? Status::Unavailable("the persister stopped") : f;
}

void Persister::Impl::SyncLoop() {
  MutexLock l(&mu_);
  Clock::time_point retry_at{};
  for (;;) {
    Clock::time_point now = Clock::now();
    const bool unsynced = written_seq_ > synced_seq_;
    if (writer_done_ && (!unsynced || !sync_failing_.ok())) break;
    const bool due = unsynced &&
                     (writer_done_ || flush_waiters_ > 0 || now >= last_sync_ + o_.persist_lag) &&
                     (sync_failing_.ok() || now >= retry_at);
    if (!due) {
      Clock::time_point wake = unsynced ? last_sync_ + o_.persist_lag : Clock::time_point::max();
      if (!sync_failing_.ok()) wake = std::max(wake, retry_at);
      if (wake == Clock::time_point::max()) {
        sync_cv_.Wait(&mu_);
      } else {
        sync_cv_.WaitUntil(&mu_, wake);
      }
      continue;
    }
    const uint64_t target = written_seq_;
    l.Unlock();
    rocksdb::Status s;
    {
      ReaderMutexLock db_lock(&db_mu_);  // the persister may reopen db_
      const Clock::time_point start = Clock::now();
      s = db_ ? db_->SyncWAL() : rocksdb::Status::Incomplete("the database is being reopened");
      if (db_) {
        wal_sync_seconds_hist_.Observe(std::chrono::duration<double>(Clock::now() - start).count());
      }
    }
    syncs_.fetch_add(1, std::memory_order_relaxed);
    l.Lock();
    last_sync_ = Clock::now();
    if (s.ok()) {
      synced_seq_ = std::max(synced_seq_, target);
      if (!sync_failing_.ok()) {
        LOG(WARNING) << "persister: the WAL can be synced again; writes resume";
        sync_failing_ = Status::Ok();
        room_cv_.SignalAll();
      }
    } else {
      io_errors_.fetch_add(1, std::memory_order_relaxed);
      last_error_ = FromRocks("syncing the WAL in " + o_.data_dir, s).message();
      sync_failing_ = Status::IoError("the data dir cannot be synced (" + last_error_ +
                                      "): writes are refused until it can be");
      retry_at = last_sync_ + o_.io_retry;
      LOG_EVERY_N(ERROR, 10) << "persister: " << sync_failing_.message();
    }
    durable_cv_.SignalAll();
  }
  stopped_ = true;
  durable_cv_.SignalAll();
}

}  // namespace rdkv::server::persistence

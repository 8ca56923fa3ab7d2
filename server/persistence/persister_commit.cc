// The persister's group commit: writers queue their writes (Admit, Enqueue*) into the pending
// group; the persister thread (Run) takes the whole group, writes it as one WriteBatch (and,
// in sync mode, one WAL sync), answers its writers and retries the groups a failing disk
// refused. See server/persistence/persister_impl.h for the other files of Persister::Impl.
#include <glog/logging.h>
#include <rocksdb/db.h>
#include <rocksdb/write_batch.h>

#include <algorithm>
#include <string>
#include <utility>

#include "common/util/reply_batch.h"
#include "server/persistence/persister_impl.h"

namespace rdkv::server::persistence {

Status Persister::Impl::Admit() {
  MutexLock l(&mu_);
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
    work_cv_.Signal();
    // The persister notifies when it takes the pending group; the timeout is a safety net.
    room_cv_.WaitFor(&mu_, std::chrono::milliseconds(10));
  }
  if (waited) admission_waits_.fetch_add(1, std::memory_order_relaxed);
  return Status::Ok();
}

void Persister::Impl::EnqueuePut(std::string_view key, uint64_t version, std::string_view value,
                                 Completion done) {
  char ver[kVersionBytes];
  EncodeVersion(version, ver);
  const char prefix = kDataPrefix;
  rocksdb::Slice kparts[2] = {rocksdb::Slice(&prefix, 1), rocksdb::Slice(key.data(), key.size())};
  rocksdb::Slice vparts[2] = {rocksdb::Slice(ver, kVersionBytes),
                              rocksdb::Slice(value.data(), value.size())};
  bool wake;
  {
    MutexLock l(&mu_);
    rocksdb::Status s =
        pending_.batch.Put(rocksdb::SliceParts(kparts, 2), rocksdb::SliceParts(vparts, 2));
    CHECK(s.ok()) << "WriteBatch::Put: " << s.ToString();  // only fails past 4 GiB
    wake = NoteEnqueuedLocked(key.size() + value.size() + 1 + kVersionBytes, std::move(done));
    max_version_ = std::max(max_version_, version);
  }
  if (wake) work_cv_.Signal();
}

void Persister::Impl::EnqueueDelete(std::string_view key, Completion done) {
  const char prefix = kDataPrefix;
  rocksdb::Slice kparts[2] = {rocksdb::Slice(&prefix, 1), rocksdb::Slice(key.data(), key.size())};
  bool wake;
  {
    MutexLock l(&mu_);
    rocksdb::Status s = pending_.batch.Delete(rocksdb::SliceParts(kparts, 2));
    CHECK(s.ok()) << "WriteBatch::Delete: " << s.ToString();
    wake = NoteEnqueuedLocked(key.size() + 1, std::move(done));
  }
  if (wake) work_cv_.Signal();
}

void Persister::Impl::EnqueueMaxVersion(uint64_t v, Completion done) {
  bool wake;
  {
    MutexLock l(&mu_);
    max_version_ = std::max(max_version_, v);
    char enc[kVersionBytes];
    EncodeVersion(max_version_, enc);
    rocksdb::Status s =
        pending_.batch.Put(rocksdb::Slice(kMetaMaxVersion.data(), kMetaMaxVersion.size()),
                           rocksdb::Slice(enc, kVersionBytes));
    CHECK(s.ok()) << "WriteBatch::Put: " << s.ToString();
    wake = NoteEnqueuedLocked(kMetaMaxVersion.size() + kVersionBytes, std::move(done));
  }
  if (wake) work_cv_.Signal();
}

// Returns whether the persister thread needs a wake-up: it waits for a first record, or
// (sync) while gathering for the record count that ends the wait. Otherwise it is busy and
// looks at the queue when it is done.
bool Persister::Impl::NoteEnqueuedLocked(uint64_t bytes, Completion done) {
  if (pending_.records == 0) pending_.oldest = Clock::now();
  ++pending_.records;
  pending_.bytes += bytes;
  pending_.last_seq = ++enqueued_seq_;
  if (done) pending_.done.push_back(std::move(done));
  return pending_.records == 1 || pending_.records == gather_target_;
}

Persister::Impl::Group Persister::Impl::TakePendingLocked() {
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

void Persister::Impl::Run() {
  MutexLock l(&mu_);
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
      work_cv_.WaitUntil(&mu_, gather_deadline_);
      continue;
    }
    if ((have && !broken()) || retry_due) {
      Group g = TakePendingLocked();
      room_cv_.SignalAll();
      l.Unlock();
      Process(std::move(g));
      l.Lock();
      in_flight_records_ = in_flight_bytes_ = 0;
      if (stop_ && broken()) break;  // one last attempt was made
      continue;
    }
    Clock::time_point wake = Clock::time_point::max();
    if (broken()) wake = next_retry_;
    if (wake == Clock::time_point::max()) {
      work_cv_.Wait(&mu_);
    } else {
      work_cv_.WaitUntil(&mu_, wake);
    }
  }
  if (broken()) {
    uint64_t lost = 0;
    for (const Group& g : retry_) lost += g.records;
    LOG(ERROR) << "persister: stopping with " << lost << " applied writes that could not be "
               << "persisted (" << last_error_ << "); they are lost";
  }
  writer_done_ = true;
  sync_cv_.SignalAll();
  if (sync_) {
    stopped_ = true;
    durable_cv_.SignalAll();
  }
}

rocksdb::WriteOptions Persister::Impl::WriteOpts() const {
  rocksdb::WriteOptions wo;
  wo.sync = sync_;
  return wo;
}

rocksdb::Status Persister::Impl::WriteGroup(Group& g) {
  // Shared: only this thread takes db_mu_ exclusively, so this never waits for a writer.
  ReaderMutexLock l(&db_mu_);
  if (!db_) return rocksdb::Status::Incomplete("the database is closed (a reopen failed)");
  const Clock::time_point start = Clock::now();
  rocksdb::Status s = db_->Write(WriteOpts(), &g.batch);
  if (sync_) {
    wal_sync_seconds_hist_.Observe(std::chrono::duration<double>(Clock::now() - start).count());
  }
  return s;
}

void Persister::Impl::Process(Group g) {
  rocksdb::Status s;
  const char* step = "writing to";
  if (broken()) {
    s = RecoverDb();
    step = s.ok() ? "retrying writes to" : "recovering from the last error in";
    while (s.ok() && !retry_.empty()) {
      Group& r = retry_.front();
      s = WriteGroup(r);
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
    s = WriteGroup(g);
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
      MutexLock l(&mu_);
      failing_ = failing;
      last_error_ = err.message();
      next_retry_ = Clock::now() + o_.io_retry;
      durable_cv_.SignalAll();
    }
    if (g.records > 0) {
      Status not_durable = Status::IoError(
          "not durable: " + err.message() +
          "; the write was applied in memory and its persistence is retried, so it may or may "
          "not survive a restart; writes are refused until the data dir can be written");
      ReplyBatch replies;
      for (Completion& c : g.done) c(not_durable);
      g.done.clear();
      retry_.push_back(std::move(g));
    }
    return;
  }
  MutexLock l(&mu_);
  if (!failing_.ok()) failing_ = Status::Ok();
  room_cv_.SignalAll();
  durable_cv_.SignalAll();
}

void Persister::Impl::Written(Group& g, bool with_done) {
  Clock::time_point now = Clock::now();
  groups_.fetch_add(1, std::memory_order_relaxed);
  records_.fetch_add(g.records, std::memory_order_relaxed);
  group_records_hist_.Observe(static_cast<double>(g.records));
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
    MutexLock l(&mu_);
    const bool was_synced = written_seq_ == synced_seq_;
    written_seq_ = std::max(written_seq_, g.last_seq);
    if (sync_) {
      synced_seq_ = written_seq_;
      last_sync_ = now;
    } else if (was_synced || flush_waiters_ > 0) {
      sync_cv_.Signal();  // the syncer sleeps without a deadline while all is synced
    }
  }
  if (with_done) {
    ReplyBatch replies;  // the group's answers: one write per client connection
    for (Completion& c : g.done) c(Status::Ok());
    g.done.clear();
  }
  if (sync_) {
    auto took = Clock::now() - write_started_;
    MutexLock l(&mu_);
    gather_target_ = g.records;
    gather_deadline_ =
        Clock::now() + std::min<Clock::duration>(took / 4, std::chrono::milliseconds(1));
  }
}

}  // namespace rdkv::server::persistence

// A fault-injecting RocksDB FileSystem for the persistence tests (the RocksDB way to test a
// full or failing disk: a FileSystemWrapper in front of the real one).
//
//   FaultInjection fi;                  // a FaultFs over FileSystem::Default(), and its Env
//   options.env = fi.env.get();
//   fi.fs->fail_writes = true;          // every append/sync/new file: IOError(NoSpace)
//   fi.fs->sync_delay_us = 2000;        // each sync takes 2 ms longer (group commit tests)
//   fi.fs->append_delay_us = 5000;      // each append takes 5 ms longer (a slow disk)
//
// Thread-safety: the knobs are atomics; flip them from any thread.
#pragma once

#include <rocksdb/env.h>
#include <rocksdb/file_system.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

namespace rdkv::testing {

class FaultFs : public rocksdb::FileSystemWrapper {
 public:
  FaultFs() : rocksdb::FileSystemWrapper(rocksdb::FileSystem::Default()) {}

  std::atomic<bool> fail_writes{false};
  std::atomic<int64_t> sync_delay_us{0};
  std::atomic<int64_t> append_delay_us{0};
  std::atomic<uint64_t> syncs{0};
  std::atomic<uint64_t> injected{0};

  const char* Name() const override { return "rdkv-test-FaultFs"; }

  rocksdb::IOStatus NewWritableFile(const std::string& f, const rocksdb::FileOptions& o,
                                    std::unique_ptr<rocksdb::FSWritableFile>* r,
                                    rocksdb::IODebugContext* dbg) override {
    if (fail_writes) return Injected(f);
    std::unique_ptr<rocksdb::FSWritableFile> file;
    rocksdb::IOStatus s = target()->NewWritableFile(f, o, &file, dbg);
    if (s.ok()) r->reset(new File(std::move(file), this));
    return s;
  }
  rocksdb::IOStatus ReopenWritableFile(const std::string& f, const rocksdb::FileOptions& o,
                                       std::unique_ptr<rocksdb::FSWritableFile>* r,
                                       rocksdb::IODebugContext* dbg) override {
    if (fail_writes) return Injected(f);
    std::unique_ptr<rocksdb::FSWritableFile> file;
    rocksdb::IOStatus s = target()->ReopenWritableFile(f, o, &file, dbg);
    if (s.ok()) r->reset(new File(std::move(file), this));
    return s;
  }
  rocksdb::IOStatus ReuseWritableFile(const std::string& f, const std::string& old,
                                      const rocksdb::FileOptions& o,
                                      std::unique_ptr<rocksdb::FSWritableFile>* r,
                                      rocksdb::IODebugContext* dbg) override {
    if (fail_writes) return Injected(f);
    std::unique_ptr<rocksdb::FSWritableFile> file;
    rocksdb::IOStatus s = target()->ReuseWritableFile(f, old, o, &file, dbg);
    if (s.ok()) r->reset(new File(std::move(file), this));
    return s;
  }

 private:
  rocksdb::IOStatus Injected(const std::string& what) {
    injected.fetch_add(1);
    return rocksdb::IOStatus::NoSpace("injected fault", what);
  }

  class File : public rocksdb::FSWritableFileOwnerWrapper {
   public:
    File(std::unique_ptr<rocksdb::FSWritableFile>&& f, FaultFs* fs)
        : rocksdb::FSWritableFileOwnerWrapper(std::move(f)), fs_(fs) {}
    rocksdb::IOStatus Append(const rocksdb::Slice& d, const rocksdb::IOOptions& o,
                             rocksdb::IODebugContext* dbg) override {
      if (auto s = Before(false); !s.ok()) return s;
      return target()->Append(d, o, dbg);
    }
    rocksdb::IOStatus Append(const rocksdb::Slice& d, const rocksdb::IOOptions& o,
                             const rocksdb::DataVerificationInfo& v,
                             rocksdb::IODebugContext* dbg) override {
      if (auto s = Before(false); !s.ok()) return s;
      return target()->Append(d, o, v, dbg);
    }
    rocksdb::IOStatus PositionedAppend(const rocksdb::Slice& d, uint64_t off,
                                       const rocksdb::IOOptions& o,
                                       rocksdb::IODebugContext* dbg) override {
      if (auto s = Before(false); !s.ok()) return s;
      return target()->PositionedAppend(d, off, o, dbg);
    }
    rocksdb::IOStatus PositionedAppend(const rocksdb::Slice& d, uint64_t off,
                                       const rocksdb::IOOptions& o,
                                       const rocksdb::DataVerificationInfo& v,
                                       rocksdb::IODebugContext* dbg) override {
      if (auto s = Before(false); !s.ok()) return s;
      return target()->PositionedAppend(d, off, o, v, dbg);
    }
    rocksdb::IOStatus Flush(const rocksdb::IOOptions& o, rocksdb::IODebugContext* dbg) override {
      if (fs_->fail_writes) return fs_->Injected("flush");
      return target()->Flush(o, dbg);
    }
    rocksdb::IOStatus Sync(const rocksdb::IOOptions& o, rocksdb::IODebugContext* dbg) override {
      if (auto s = Before(true); !s.ok()) return s;
      return target()->Sync(o, dbg);
    }
    rocksdb::IOStatus Fsync(const rocksdb::IOOptions& o, rocksdb::IODebugContext* dbg) override {
      if (auto s = Before(true); !s.ok()) return s;
      return target()->Fsync(o, dbg);
    }
    rocksdb::IOStatus RangeSync(uint64_t off, uint64_t n, const rocksdb::IOOptions& o,
                                rocksdb::IODebugContext* dbg) override {
      if (fs_->fail_writes) return fs_->Injected("range sync");
      return target()->RangeSync(off, n, o, dbg);
    }

   private:
    rocksdb::IOStatus Before(bool sync) {
      if (fs_->fail_writes) return fs_->Injected(sync ? "sync" : "append");
      int64_t us = sync ? fs_->sync_delay_us.load() : fs_->append_delay_us.load();
      if (us > 0) std::this_thread::sleep_for(std::chrono::microseconds(us));
      if (sync) fs_->syncs.fetch_add(1);
      return rocksdb::IOStatus::OK();
    }
    FaultFs* fs_;
  };
};

struct FaultInjection {
  std::shared_ptr<FaultFs> fs = std::make_shared<FaultFs>();
  std::unique_ptr<rocksdb::Env> env = rocksdb::NewCompositeEnv(fs);
};

}  // namespace rdkv::testing

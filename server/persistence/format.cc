#include "server/persistence/format.h"

#include <glog/logging.h>
#include <rocksdb/cache.h>
#include <rocksdb/convenience.h>
#include <rocksdb/env.h>
#include <rocksdb/memtablerep.h>
#include <rocksdb/options.h>
#include <rocksdb/table.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdarg>
#include <cstdio>

namespace rdkv::server::persistence {

Status FromRocks(std::string_view what, const rocksdb::Status& s) {
  if (s.ok()) return Status::Ok();
  std::string m = std::string(what) + ": " + s.ToString();
  if (s.IsCorruption()) return Status::Corruption(std::move(m));
  if (s.IsIOError()) return Status::IoError(std::move(m));  // includes NoSpace
  if (s.IsNotFound()) return Status::NotFound(std::move(m));
  if (s.IsInvalidArgument()) return Status::InvalidArgument(std::move(m));
  if (s.IsBusy() || s.IsTryAgain()) return Status::Busy(std::move(m));
  if (s.IsShutdownInProgress() || s.IsIncomplete()) return Status::Unavailable(std::move(m));
  if (s.IsNotSupported()) return Status::NotSupported(std::move(m));
  return Status::Internal(std::move(m));
}

Result<WalRecovery> ParseWalRecovery(std::string_view name) {
  if (name == "refuse") return WalRecovery::kRefuse;
  if (name == "torn_tail") return WalRecovery::kTornTail;
  if (name == "point_in_time") return WalRecovery::kPointInTime;
  return Status::InvalidArgument("unknown WAL recovery '" + std::string(name) +
                                 "' (torn_tail, refuse, point_in_time)");
}

Status MakeDbOptions(const RocksDbTuning& tuning, rocksdb::Env* env, rocksdb::Options* out) {
  rocksdb::CompressionType compression;
  if (tuning.compression == "none") {
    compression = rocksdb::kNoCompression;
  } else if (tuning.compression == "snappy") {
    compression = rocksdb::kSnappyCompression;
  } else if (tuning.compression == "lz4") {
    compression = rocksdb::kLZ4Compression;
  } else if (tuning.compression == "zstd") {
    compression = rocksdb::kZSTD;
  } else {
    return Status::InvalidArgument("unknown compression '" + tuning.compression +
                                   "' (none, snappy, lz4, zstd)");
  }
  std::vector<rocksdb::CompressionType> supported = rocksdb::GetSupportedCompressions();
  if (compression != rocksdb::kNoCompression &&
      std::find(supported.begin(), supported.end(), compression) == supported.end()) {
    return Status::InvalidArgument("compression '" + tuning.compression +
                                   "' is not built into this RocksDB");
  }
  if (tuning.write_buffer_bytes < (1u << 20)) {
    return Status::InvalidArgument("the RocksDB write buffer must be at least 1 MiB");
  }
  if (tuning.background_jobs < 1 || tuning.background_jobs > 64) {
    return Status::InvalidArgument("RocksDB background jobs must be 1..64");
  }
  rocksdb::Options o;
  if (env != nullptr) o.env = env;
  o.paranoid_checks = true;
  o.compression = compression;
  o.write_buffer_size = tuning.write_buffer_bytes;
  o.max_write_buffer_number = 3;
  o.max_total_wal_size = 4 * tuning.write_buffer_bytes;
  o.max_background_jobs = tuning.background_jobs;
  // The persister is the only writer and nothing reads the memtable while serving: a vector
  // memtable appends (sorting once, at flush) instead of a skiplist insert per record, which
  // was most of the persister's CPU time with random keys.
  o.memtable_factory = std::make_shared<rocksdb::VectorRepFactory>();
  o.allow_concurrent_memtable_write = false;
  o.level_compaction_dynamic_level_bytes = true;
  o.target_file_size_base = std::max<uint64_t>(tuning.write_buffer_bytes, 8u << 20);
  o.max_bytes_for_level_base = 4 * o.target_file_size_base;
  // Any damage in a WAL (a bad checksum, a truncated record) fails the open: point-in-time
  // recovery would silently drop every acknowledged write after it. Recovery names the file
  // and offset (ScanWalFiles); --wal_recovery=point_in_time accepts the loss explicitly.
  o.wal_recovery_mode = tuning.wal_recovery == WalRecovery::kPointInTime
                            ? rocksdb::WALRecoveryMode::kPointInTimeRecovery
                            : rocksdb::WALRecoveryMode::kAbsoluteConsistency;
  // RocksDB's warnings and errors go to glog; it writes no LOG file of its own. On a full disk
  // the LOG file is the first to fail, and this librocksdb (7.8, assertions on) aborts the
  // process when a background job later logs to a LOG writer that has seen an error.
  o.info_log = MakeGlogLogger();
  rocksdb::BlockBasedTableOptions t;
  t.block_size = 16 * 1024;
  t.block_cache =
      tuning.block_cache_bytes > 0 ? rocksdb::NewLRUCache(tuning.block_cache_bytes) : nullptr;
  t.no_block_cache = tuning.block_cache_bytes == 0;
  o.table_factory.reset(rocksdb::NewBlockBasedTableFactory(t));
  *out = std::move(o);
  return Status::Ok();
}

namespace {
class GlogLogger : public rocksdb::Logger {
 public:
  GlogLogger() : rocksdb::Logger(rocksdb::InfoLogLevel::WARN_LEVEL) {}
  using rocksdb::Logger::Logv;
  void Logv(const char* format, va_list ap) override {
    char buf[1024];
    std::vsnprintf(buf, sizeof(buf), format, ap);
    LOG(WARNING) << "rocksdb: " << buf;
  }
};
}  // namespace

std::shared_ptr<rocksdb::Logger> MakeGlogLogger() { return std::make_shared<GlogLogger>(); }

Status FsyncPath(const std::filesystem::path& p, bool directory) {
  int fd = ::open(p.c_str(), (directory ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno("open " + p.string(), errno);
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) return Status::FromErrno("fsync " + p.string(), err);
  return Status::Ok();
}

}  // namespace rdkv::server::persistence

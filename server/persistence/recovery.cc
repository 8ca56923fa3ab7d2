#include "server/persistence/recovery.h"

#include <glog/logging.h>
#include <rocksdb/db.h>
#include <rocksdb/iterator.h>
#include <rocksdb/metadata.h>
#include <rocksdb/options.h>

#include <time.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <memory>
#include <thread>
#include <vector>

#include "common/kv/layout.h"
#include "common/kv/limits.h"
#include "common/util/progress.h"
#include "server/allocator.h"

namespace rdkv::server::persistence {
namespace {

using Clock = std::chrono::steady_clock;
constexpr double kMiB = 1024.0 * 1024.0;

// An open, validated, read-only database.
struct ReadOnlyDb {
  std::unique_ptr<rocksdb::DB> db;
  uint64_t meta_max_version = 0;
};

Result<ReadOnlyDb> OpenValidated(const std::string& db_dir, rocksdb::Env* env,
                                 const RocksDbTuning& tuning) {
  if (!HasDatabase(db_dir)) {
    return Status::NotSupported(db_dir + " is not a RocksDB database (no CURRENT file)");
  }
  rocksdb::Options options;
  RDKV_RETURN_IF_ERROR(MakeDbOptions(tuning, env, &options));
  options.create_if_missing = false;
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s = rocksdb::DB::OpenForReadOnly(options, db_dir, &raw);
  if (!s.ok()) return FromRocks("cannot open " + db_dir + " read-only", s);
  ReadOnlyDb out;
  out.db.reset(raw);
  std::string v;
  s = out.db->Get(rocksdb::ReadOptions(), rocksdb::Slice(kMetaFormat.data(), kMetaFormat.size()),
                  &v);
  if (s.IsNotFound()) {
    return Status::NotSupported(db_dir +
                                " is a RocksDB database but not an rdkv one (it has no "
                                "format key '" +
                                std::string(kMetaFormat) + "')");
  }
  if (!s.ok()) return FromRocks("cannot read the format key of " + db_dir, s);
  if (v != std::to_string(kFormatVersion)) {
    return Status::NotSupported(db_dir + " holds rdkv persistence format version '" + v +
                                "'; this kvserver reads version " + std::to_string(kFormatVersion));
  }
  s = out.db->Get(rocksdb::ReadOptions(),
                  rocksdb::Slice(kMetaMaxVersion.data(), kMetaMaxVersion.size()), &v);
  if (s.ok()) {
    if (v.size() != kVersionBytes) {
      return Status::Corruption(db_dir + ": the max_version meta key has " +
                                std::to_string(v.size()) + " bytes, not 8");
    }
    out.meta_max_version = DecodeVersion(v.data());
  } else if (!s.IsNotFound()) {
    return FromRocks("cannot read the max_version key of " + db_dir, s);
  }
  return out;
}

// Iterates the data keys in [begin, end) (RocksDB keys; defaults: all data keys); `fn`
// returns a non-OK Status to stop.
template <typename Fn>
Status ForEachItem(rocksdb::DB* db, const std::string& db_dir, Fn&& fn,
                   std::string_view begin = std::string_view(&kDataPrefix, 1),
                   std::string_view end = kDataEnd) {
  rocksdb::ReadOptions ro;
  ro.fill_cache = false;
  ro.readahead_size = 4u << 20;
  ro.verify_checksums = true;
  rocksdb::Slice upper(end.data(), end.size());
  ro.iterate_upper_bound = &upper;
  std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(ro));
  for (it->Seek(rocksdb::Slice(begin.data(), begin.size())); it->Valid(); it->Next()) {
    rocksdb::Slice k = it->key();
    rocksdb::Slice v = it->value();
    if (v.size() < kVersionBytes) {
      return Status::Corruption(db_dir + ": the record of a key of " +
                                std::to_string(k.size() - 1) + " bytes has a " +
                                std::to_string(v.size()) + "-byte value (needs >= 8)");
    }
    RDKV_RETURN_IF_ERROR(fn(std::string_view(k.data() + 1, k.size() - 1), DecodeVersion(v.data()),
                            std::string_view(v.data() + kVersionBytes, v.size() - kVersionBytes)));
  }
  return FromRocks("reading " + db_dir, it->status());
}

// Up to `parts` - 1 data keys that cut the database into ranges of about equal size: the
// smallest keys of its table files. Fewer (none) when it has few table files.
std::vector<std::string> SplitKeys(rocksdb::DB* db, size_t parts) {
  std::vector<rocksdb::LiveFileMetaData> files;
  db->GetLiveFilesMetaData(&files);
  std::vector<std::string> starts;
  for (const rocksdb::LiveFileMetaData& f : files) {
    if (!f.smallestkey.empty() && f.smallestkey[0] == kDataPrefix) starts.push_back(f.smallestkey);
  }
  std::sort(starts.begin(), starts.end());
  starts.erase(std::unique(starts.begin(), starts.end()), starts.end());
  std::vector<std::string> out;
  for (size_t i = 1; i < parts && starts.size() > 1; ++i) {
    const std::string& k = starts[i * starts.size() / parts];
    if (k > std::string(1, kDataPrefix) && (out.empty() || k > out.back())) out.push_back(k);
  }
  return out;
}

double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

}  // namespace

bool HasDatabase(const std::string& db_dir) {
  std::error_code ec;
  return std::filesystem::is_regular_file(std::filesystem::path(db_dir) / "CURRENT", ec);
}

Status ScanDatabase(const std::string& db_dir, rocksdb::Env* env, const ItemVisitor& item,
                    uint64_t* max_version) {
  RDKV_ASSIGN_OR_RETURN(ReadOnlyDb rodb, OpenValidated(db_dir, env, RocksDbTuning{}));
  if (max_version) *max_version = rodb.meta_max_version;
  return ForEachItem(rodb.db.get(), db_dir,
                     [&](std::string_view k, uint64_t version, std::string_view v) {
                       item(k, version, v);
                       return Status::Ok();
                     });
}

Result<RecoveryStats> LoadDatabase(const std::string& db_dir, Store* store,
                                   const LoadOptions& options) {
  const Clock::time_point start = Clock::now();
  RDKV_ASSIGN_OR_RETURN(ReadOnlyDb rodb, OpenValidated(db_dir, options.env, options.tuning));
  RecoveryStats stats;
  stats.sequence = rodb.db->GetLatestSequenceNumber();
  uint64_t estimate = 0;
  rodb.db->GetIntProperty("rocksdb.estimate-num-keys", &estimate);
  if (store->counters().items != 0) {
    return Status::Internal("recovery needs an empty store");
  }

  // Key ranges (cut at table-file boundaries) load on parallel threads, each writing its items
  // straight from RocksDB's iterator into the region with their persisted versions
  // (Store::Restore). Keys are unique in the database, so no order between ranges matters.
  const uint64_t heap_units = store->header().heap_bytes / kv::kUnit;
  const uint64_t slots = store->header().bucket_count * kv::kSlotsPerBucket;
  const size_t threads = options.threads > 0
                             ? static_cast<size_t>(options.threads)
                             : std::clamp<size_t>(std::thread::hardware_concurrency(), 1, 8);
  std::vector<std::string> splits = SplitKeys(rodb.db.get(), threads);
  const size_t parts = splits.size() + 1;
  struct Part {
    uint64_t keys = 0, bytes = 0, max_version = 0;
    double cpu_seconds = 0;
    Status status;
  };
  std::vector<Part> part(parts);
  std::atomic<uint64_t> total_keys{0}, total_units{0}, total_bytes{0};
  std::atomic<bool> stop{false};
  // Any loading thread may log; the one the meter lets through does (every progress_interval):
  // "recovery: 1.20M/5.00M keys (24%), 400k keys/s, ETA 10 s, 180 MiB". The total is RocksDB's
  // estimate, raised to the keys loaded when that is more.
  // Its clock starts with the loading (after the open), so the rate is the loading rate.
  ProgressMeter meter(options.progress_label, "keys", estimate, options.progress_interval);
  auto progress = [&](uint64_t done, uint64_t total, uint64_t bytes) {
    Clock::time_point now = Clock::now();
    if (!meter.Due(now)) return;
    if (total > meter.total()) meter.set_total(total);
    LOG(INFO) << meter.Line(done, now) << ", " << static_cast<uint64_t>(bytes / kMiB) << " MiB";
  };
  auto too_large = [&](uint64_t keys, uint64_t units) {
    return Status::OutOfSpace(
        db_dir + " holds more than the region can: after " + std::to_string(keys) +
        " keys the items need " + std::to_string(units * kv::kUnit >> 20) + " MiB of the " +
        std::to_string(heap_units * kv::kUnit >> 20) + " MiB heap (" + std::to_string(slots) +
        " index slots); start with a larger --memory");
  };
  auto load_part = [&](size_t pi) {
    const double cpu0 = ThreadCpuSeconds();
    Part& me = part[pi];
    std::string_view begin = pi == 0 ? std::string_view(&kDataPrefix, 1) : splits[pi - 1];
    std::string_view end = pi + 1 == parts ? kDataEnd : std::string_view(splits[pi]);
    uint64_t units_batch = 0, keys_batch = 0, bytes_batch = 0;
    // Adds this thread's counts to the totals (every 4096 items and at the end), checks that
    // everything loaded so far fits, and stops when another thread failed.
    auto publish = [&]() -> Status {
      uint64_t keys = total_keys.fetch_add(keys_batch) + keys_batch;
      uint64_t units = total_units.fetch_add(units_batch) + units_batch;
      uint64_t bytes = total_bytes.fetch_add(bytes_batch) + bytes_batch;
      keys_batch = units_batch = bytes_batch = 0;
      if (units > heap_units || keys > slots) return too_large(keys, units);
      if (stop.load(std::memory_order_relaxed)) return Status::Internal("stopped");
      progress(keys, std::max(estimate, keys), bytes);
      return Status::Ok();
    };
    me.status = ForEachItem(
        rodb.db.get(), db_dir,
        [&](std::string_view k, uint64_t version, std::string_view v) {
          if (Status key_ok = kv::CheckKey(k); !key_ok.ok()) {
            return Status::Corruption(db_dir + ": " + key_ok.message());
          }
          if (version == 0) return Status::Corruption(db_dir + ": an item with version 0");
          if (v.size() > options.max_value_bytes) {
            return Status::InvalidArgument(
                db_dir + " holds a value of " + std::to_string(v.size()) +
                " bytes, more than --max_value_size=" + std::to_string(options.max_value_bytes) +
                "; start with a larger --max_value_size");
          }
          uint32_t units = kv::UnitsFor(kv::ItemBytes(k.size(), v.size()));
          units_batch += Allocator::ClassUnits(Allocator::ClassOf(units));
          ++keys_batch;
          bytes_batch += k.size() + v.size();
          Status r = store->Restore(k, v, version);
          if (!r.ok()) {
            uint64_t keys = total_keys.load() + keys_batch;
            if (r.code() == StatusCode::kOutOfSpace &&
                r.message().find("window") == std::string::npos) {
              return too_large(keys, total_units.load() + units_batch);
            }
            if (r.code() == StatusCode::kAlreadyExists) {
              return Status::Corruption(db_dir + ": a key of " + std::to_string(k.size()) +
                                        " bytes appears twice");
            }
            return Status(r.code(), "loading " + db_dir + " into the region failed after " +
                                        std::to_string(keys) + " keys: " + r.message());
          }
          ++me.keys;
          me.bytes += k.size() + v.size();
          me.max_version = std::max(me.max_version, version);
          return (me.keys & 0xfff) == 0 ? publish() : Status::Ok();
        },
        begin, end);
    if (me.status.ok()) me.status = publish();
    if (!me.status.ok()) stop = true;
    me.cpu_seconds = ThreadCpuSeconds() - cpu0;
  };
  {
    std::vector<std::thread> loaders;
    for (size_t pi = 1; pi < parts; ++pi) loaders.emplace_back(load_part, pi);
    load_part(0);
    for (std::thread& t : loaders) t.join();
  }
  // The first real error (a thread that stopped because another failed says "stopped").
  for (Part& p : part) {
    if (!p.status.ok() && p.status.message() != "stopped") return p.status;
  }
  stats.threads = static_cast<int>(parts);
  for (const Part& p : part) {
    stats.cpu_seconds += p.cpu_seconds;
    stats.keys += p.keys;
    stats.bytes += p.bytes;
    stats.max_version = std::max(stats.max_version, p.max_version);
  }
  stats.max_version = std::max(stats.max_version, rodb.meta_max_version);
  store->EnsureVersionAbove(stats.max_version + kVersionGapAfterRecovery);
  stats.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return stats;
}

}  // namespace rdkv::server::persistence

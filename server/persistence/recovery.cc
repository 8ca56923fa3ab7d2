#include "server/persistence/recovery.h"

#include <glog/logging.h>
#include <rocksdb/db.h>
#include <rocksdb/iterator.h>
#include <rocksdb/options.h>

#include <sys/mman.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <vector>

#include "common/kv/layout.h"
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
    return Status::NotSupported(db_dir + " is a RocksDB database but not an rdkv one (it has no "
                                "format key '" + std::string(kMetaFormat) + "')");
  }
  if (!s.ok()) return FromRocks("cannot read the format key of " + db_dir, s);
  if (v != std::to_string(kFormatVersion)) {
    return Status::NotSupported(db_dir + " holds rdkv persistence format version '" + v +
                                "'; this kvserver reads version " +
                                std::to_string(kFormatVersion));
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

// Iterates the data keys; `fn` returns a non-OK Status to stop.
template <typename Fn>
Status ForEachItem(rocksdb::DB* db, const std::string& db_dir, Fn&& fn) {
  rocksdb::ReadOptions ro;
  ro.fill_cache = false;
  ro.readahead_size = 4u << 20;
  ro.verify_checksums = true;
  rocksdb::Slice upper(kDataEnd.data(), kDataEnd.size());
  ro.iterate_upper_bound = &upper;
  std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(ro));
  const char start[1] = {kDataPrefix};
  for (it->Seek(rocksdb::Slice(start, 1)); it->Valid(); it->Next()) {
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

// Items copied out of RocksDB, to be applied in version order. Chunks are anonymous mappings
// with transparent-huge-page advice: a 5-million-item load otherwise spends a tenth of its
// time in page faults.
class Arena {
 public:
  static constexpr size_t kChunk = 64u << 20;
  Arena() = default;
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  ~Arena() {
    for (auto& [p, n] : chunks_) munmap(p, n);
  }
  // nullptr when memory runs out.
  const char* Add(std::string_view key, std::string_view value) {
    size_t need = 8 + key.size() + value.size();
    if (chunks_.empty() || used_ + need > cap_) {
      size_t n = std::max(kChunk, need);
      void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) return nullptr;
      madvise(p, n, MADV_HUGEPAGE);
      chunks_.emplace_back(static_cast<char*>(p), n);
      cap_ = n;
      used_ = 0;
    }
    char* p = chunks_.back().first + used_;
    uint32_t kb = static_cast<uint32_t>(key.size()), vb = static_cast<uint32_t>(value.size());
    std::memcpy(p, &kb, 4);
    std::memcpy(p + 4, &vb, 4);
    std::memcpy(p + 8, key.data(), key.size());
    if (!value.empty()) std::memcpy(p + 8 + key.size(), value.data(), value.size());
    used_ += need;
    return p;
  }
  static void Read(const char* p, std::string_view* key, std::string_view* value) {
    uint32_t kb, vb;
    std::memcpy(&kb, p, 4);
    std::memcpy(&vb, p + 4, 4);
    *key = std::string_view(p + 8, kb);
    *value = std::string_view(p + 8 + kb, vb);
  }

 private:
  std::vector<std::pair<char*, size_t>> chunks_;
  size_t used_ = 0;
  size_t cap_ = 0;
};

std::string Eta(uint64_t done, uint64_t total, double rate) {
  if (total <= done || rate <= 0) return "soon";
  return std::to_string(static_cast<uint64_t>((total - done) / rate) + 1) + " s";
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

  // Phase 1: read every item (checking it fits), in key order.
  const uint64_t heap_units = store->header().heap_bytes / kv::kUnit;
  const uint64_t slots = store->header().bucket_count * kv::kSlotsPerBucket;
  uint64_t need_units = 0;
  Arena arena;
  std::vector<std::pair<uint64_t, const char*>> order;
  order.reserve(estimate);
  Clock::time_point next_log = start + options.progress_interval;
  auto progress = [&](const char* phase, uint64_t done, uint64_t total) {
    Clock::time_point now = Clock::now();
    if (now < next_log) return;
    next_log = now + options.progress_interval;
    double secs = std::chrono::duration<double>(now - start).count();
    double rate = done / std::max(secs, 1e-9);
    LOG(INFO) << "recovery (" << phase << "): " << done << " of ~" << total << " keys, "
              << static_cast<uint64_t>(stats.bytes / kMiB) << " MiB, "
              << static_cast<uint64_t>(rate) << " keys/s, ETA " << Eta(done, total, rate);
  };
  Status s = ForEachItem(
      rodb.db.get(), db_dir, [&](std::string_view k, uint64_t version, std::string_view v) {
        if (k.empty() || k.size() > kv::kMaxKeyBytes) {
          return Status::Corruption(db_dir + ": a key of " + std::to_string(k.size()) +
                                    " bytes (keys are 1..1024 bytes)");
        }
        if (version == 0) return Status::Corruption(db_dir + ": an item with version 0");
        if (v.size() > options.max_value_bytes) {
          return Status::InvalidArgument(
              db_dir + " holds a value of " + std::to_string(v.size()) +
              " bytes, more than --max_value_size=" + std::to_string(options.max_value_bytes) +
              "; start with a larger --max_value_size");
        }
        uint32_t units = kv::UnitsFor(kv::ItemBytes(k.size(), v.size()));
        need_units += Allocator::ClassUnits(Allocator::ClassOf(units));
        ++stats.keys;
        stats.bytes += k.size() + v.size();
        if (need_units > heap_units || stats.keys > slots) {
          return Status::OutOfSpace(
              db_dir + " holds more than the region can: after " + std::to_string(stats.keys) +
              " keys the items need " + std::to_string(need_units * kv::kUnit >> 20) +
              " MiB of the " + std::to_string(heap_units * kv::kUnit >> 20) + " MiB heap (" +
              std::to_string(slots) + " index slots); start with a larger --memory");
        }
        const char* entry = arena.Add(k, v);
        if (entry == nullptr) {
          return Status::OutOfSpace("recovery: no memory to stage " + db_dir + " (after " +
                                    std::to_string(stats.keys) + " keys)");
        }
        order.emplace_back(version, entry);
        stats.max_version = std::max(stats.max_version, version);
        if ((stats.keys & 0xfff) == 0) progress("reading", stats.keys, std::max(estimate, stats.keys));
        return Status::Ok();
      });
  if (!s.ok()) return s;
  rodb.db.reset();  // the RocksDB side is done: free its memtables and caches
  const Clock::time_point read_done = Clock::now();
  stats.read_seconds = std::chrono::duration<double>(read_done - start).count();

  // Phase 2: apply in version order, so every item gets exactly its version back.
  std::sort(order.begin(), order.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  for (size_t i = 0; i < order.size(); ++i) {
    auto [version, entry] = order[i];
    if (i > 0 && order[i - 1].first == version) {
      return Status::Corruption(db_dir + ": two items share version " + std::to_string(version));
    }
    std::string_view k, v;
    Arena::Read(entry, &k, &v);
    store->EnsureVersionAbove(version - 1);
    Result<uint64_t> got = store->Put(k, v);
    if (!got.ok()) {
      return Status(got.status().code(),
                    "loading " + db_dir + " into the region failed after " + std::to_string(i) +
                        " keys: " + got.status().message() +
                        (got.status().code() == StatusCode::kOutOfSpace
                             ? " (start with a larger --memory or --index_fraction)"
                             : ""));
    }
    if (*got != version) {
      return Status::Internal("recovery gave a key version " + std::to_string(*got) + ", not " +
                              std::to_string(version));
    }
    if ((i & 0xffff) == 0) progress("loading", i, order.size());
  }
  stats.max_version = std::max(stats.max_version, rodb.meta_max_version);
  store->EnsureVersionAbove(stats.max_version + kVersionGapAfterRecovery);
  const Clock::time_point end = Clock::now();
  stats.seconds = std::chrono::duration<double>(end - start).count();
  stats.apply_seconds = std::chrono::duration<double>(end - read_done).count();
  return stats;
}

}  // namespace rdkv::server::persistence

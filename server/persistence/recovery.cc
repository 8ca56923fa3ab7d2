#include "server/persistence/recovery.h"

#include <glog/logging.h>
#include <rocksdb/db.h>
#include <rocksdb/iterator.h>
#include <rocksdb/metadata.h>
#include <rocksdb/options.h>

#include <time.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
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
    if (out.meta_max_version > kv::kMaxItemVersion) {
      return Status::Corruption(db_dir + ": the max_version meta key holds " +
                                std::to_string(out.meta_max_version) + ", above the largest " +
                                "item version " + std::to_string(kv::kMaxItemVersion));
    }
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

// --- the WAL scan -----------------------------------------------------------------------------
// RocksDB's log format (db/log_format.h): 32 KiB blocks; each holds fragments with a header
// crc32c (4, masked, LE) | length (2, LE) | type (1) [| log number (4): recyclable types]; a
// block's last < 7 bytes are zero padding. A logical record (a WriteBatch: sequence u64 LE,
// count u32 LE, ...) is one FULL fragment or FIRST, MIDDLE..., LAST.
constexpr size_t kWalBlock = 32768;
constexpr size_t kWalHeader = 7;
constexpr size_t kWalRecyclableHeader = 11;
enum WalType : uint8_t {
  kWalZero = 0,
  kWalFull = 1,
  kWalFirst = 2,
  kWalMiddle = 3,
  kWalLast = 4,
  kWalRecFull = 5,
  kWalRecFirst = 6,
  kWalRecMiddle = 7,
  kWalRecLast = 8,
  kWalSetCompression = 9,
};

uint32_t Crc32cExtend(uint32_t crc, const uint8_t* p, size_t n) {
  static const auto table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82f63b78u : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
}

uint32_t Unmask(uint32_t masked) {
  uint32_t rot = masked - 0xa282ead8u;
  return (rot >> 17) | (rot << 15);
}

uint64_t LoadLe(const uint8_t* p, size_t n) {
  uint64_t v = 0;
  for (size_t i = 0; i < n; ++i) v |= uint64_t{p[i]} << (8 * i);
  return v;
}

// The scan of one WAL file, fed a whole number of blocks at a time (fragments never cross a
// block boundary), so a large WAL is never read into memory at once.
struct WalFileScan {
  std::string path;
  bool newest = false;  // the last WAL file: damage at its end may be a torn tail
  WalScan* scan = nullptr;
  bool damaged_here = false;
  bool in_record = false;
  uint64_t record_start = 0;
  std::string head;                    // the logical record's first bytes (its WriteBatch header)
  uint64_t zero_start = ~uint64_t{0};  // zeroed headers seen since the last intact record
  bool zeros_at_end = false;           // the file ends in a zeroed partial header

  // How the file ends at a damage: not at all (wrong bytes), inside a record, or inside a
  // record right after an intact fragment or fragment header.
  enum class Torn { kNo, kInside, kAtBoundary };
  void Damage(uint64_t offset, std::string what, Torn torn = Torn::kNo) {
    if (damaged_here) return;
    damaged_here = true;
    if (scan->damaged) return;
    scan->damaged = true;
    scan->damaged_file = path;
    // The first record that is not intact: a fragment cut inside a record of several
    // fragments is damage of that record, from its first fragment on.
    scan->damaged_offset = in_record && record_start < offset ? record_start : offset;
    scan->damage = std::move(what);
    scan->damage_at_tail = newest;  // cleared when an intact record follows
    scan->torn_end = torn != Torn::kNo;
    scan->torn_at_boundary = torn == Torn::kAtBoundary;
  }
  void FinishRecord() {
    if (head.size() >= 12) {
      const auto* h = reinterpret_cast<const uint8_t*>(head.data());
      uint64_t seq = LoadLe(h, 8);
      uint64_t count = LoadLe(h + 8, 4);
      scan->max_sequence = std::max(scan->max_sequence, seq + (count > 0 ? count - 1 : 0));
    }
    head.clear();
    in_record = false;
  }
  // Bytes [base, base + size) of the file; base is a multiple of kWalBlock and so is size,
  // except for the file's last chunk.
  void Feed(const uint8_t* chunk, size_t size, uint64_t base);
  void End() {
    // Right after a whole fragment, unless zeros came after it (not where a write ends).
    const bool clean = zero_start == ~uint64_t{0} && !zeros_at_end;
    if (in_record)
      Damage(record_start, "truncated record (the file ends before its last fragment)",
             clean ? Torn::kAtBoundary : Torn::kInside);
  }
};

void WalFileScan::Feed(const uint8_t* chunk, size_t size, uint64_t base) {
  auto damage = [this, base](size_t pos, std::string what, Torn torn = Torn::kNo) {
    Damage(base + pos, std::move(what), torn);
  };
  auto finish_record = [this] { FinishRecord(); };
  size_t pos = 0;
  while (pos < size) {
    const size_t block_left = kWalBlock - pos % kWalBlock;
    if (block_left < kWalHeader) {  // trailer padding
      pos += block_left;
      continue;
    }
    if (size - pos < kWalHeader) {
      bool zeros = std::all_of(chunk + pos, chunk + size, [](uint8_t b) { return b == 0; });
      if (!zeros) damage(pos, "truncated record header (the file ends inside it)", Torn::kInside);
      zeros_at_end = zeros;
      break;
    }
    const uint8_t* h = chunk + pos;
    const uint32_t length = static_cast<uint32_t>(LoadLe(h + 4, 2));
    const uint8_t type = h[6];
    if (type == kWalZero && length == 0) {
      // Zeroed bytes: RocksDB skips the rest of the block. Damage only if intact records follow.
      if (zero_start == ~uint64_t{0}) zero_start = base + pos;
      pos += block_left;
      continue;
    }
    const bool recyclable = type >= kWalRecFull && type <= kWalRecLast;
    const size_t header = recyclable ? kWalRecyclableHeader : kWalHeader;
    const uint8_t kind = recyclable ? static_cast<uint8_t>(type - 4) : type;  // FULL..LAST
    if (header + length > block_left) {
      damage(pos, size - pos < header + length
                      ? "truncated record (the file ends inside it)"
                      : "record length " + std::to_string(length) + " runs past its block");
      pos += block_left;  // resynchronise at the next block
      in_record = false;
      head.clear();
      continue;
    }
    if (size - pos < header + length) {
      // A whole header and no payload: where the file writer may flush between the two, if
      // the header's type fits (its checksum covers the payload, so nothing else checks it).
      const bool fits = in_record ? (kind == kWalMiddle || kind == kWalLast)
                                  : (kind == kWalFull || kind == kWalFirst);
      damage(pos, "truncated record (the file ends inside it)",
             size - pos == header && fits ? Torn::kAtBoundary : Torn::kInside);
      break;
    }
    uint32_t crc = Crc32cExtend(0, h + 6, header - 6);  // type [+ log number]
    crc = Crc32cExtend(crc, h + header, length);
    // A record with a good checksum and a type this scan does not know (a meta record of a
    // newer RocksDB) is skipped: RocksDB itself judges those.
    if (crc != Unmask(static_cast<uint32_t>(LoadLe(h, 4))) || type == kWalZero) {
      damage(pos, type == kWalZero ? "record of type 0 with a length" : "checksum mismatch");
      pos += block_left;
      in_record = false;
      head.clear();
      continue;
    }
    // An intact fragment.
    if (zero_start != ~uint64_t{0}) {
      Damage(zero_start, "zeroed bytes followed by intact records");
      zero_start = ~uint64_t{0};
    }
    auto take = [&] {
      size_t want = std::min<size_t>(12 - std::min<size_t>(12, head.size()), length);
      head.append(reinterpret_cast<const char*>(h + header), want);
    };
    switch (kind) {
      case kWalFull:
        if (in_record) Damage(record_start, "record without its last fragment");
        in_record = false;
        head.clear();
        take();
        finish_record();
        break;
      case kWalFirst:
        if (in_record) Damage(record_start, "record without its last fragment");
        in_record = true;
        record_start = base + pos;
        head.clear();
        take();
        break;
      case kWalMiddle:
      case kWalLast:
        if (!in_record) {
          damage(pos, "fragment without the start of its record");
        } else {
          take();
          if (kind == kWalLast) finish_record();
        }
        break;
      default:  // kWalSetCompression and newer meta records
        break;
    }
    if (damaged_here && scan->damaged_file == path && base + pos > scan->damaged_offset) {
      scan->damage_at_tail = false;  // an intact record after the damage: not a torn tail
    }
    pos += header + length;
  }
}

}  // namespace

std::string WalScan::Describe() const {
  if (!damaged) return "";
  return damaged_file + " at byte " + std::to_string(damaged_offset) + ": " + damage;
}

Result<WalScan> ScanWalFiles(const std::string& db_dir) {
  namespace fs = std::filesystem;
  std::vector<std::pair<uint64_t, fs::path>> files;
  std::error_code ec;
  // The error_code forms only (also the increment): a directory that fails to list is an
  // error the caller reports, never a throw out of a server's start.
  for (fs::directory_iterator it(db_dir, ec), end; !ec && it != end; it.increment(ec)) {
    const fs::directory_entry& e = *it;
    const std::string name = e.path().filename().string();
    if (e.path().extension() != ".log" || name.size() <= 4) continue;
    const std::string stem = name.substr(0, name.size() - 4);
    if (!std::all_of(stem.begin(), stem.end(), [](char c) { return c >= '0' && c <= '9'; }) ||
        stem.size() > 19) {
      continue;
    }
    // A FIFO or a device under a WAL's name would block or never end the read below.
    std::error_code type_ec;
    if (!e.is_regular_file(type_ec)) {
      return Status::IoError(e.path().string() +
                             " is not a regular file (a WAL file's name on something else)");
    }
    files.emplace_back(std::stoull(stem), e.path());
  }
  if (ec) return Status::IoError("cannot list " + db_dir + ": " + ec.message());
  std::sort(files.begin(), files.end());
  WalScan scan;
  for (size_t i = 0; i < files.size(); ++i) {
    const fs::path& path = files[i].second;
    std::ifstream in(path, std::ios::binary);
    if (!in.is_open()) return Status::IoError("cannot open " + path.string());
    WalFileScan file;
    file.path = path.string();
    file.newest = i + 1 == files.size();
    file.scan = &scan;
    std::vector<uint8_t> chunk(32 * kWalBlock);  // 1 MiB
    uint64_t base = 0;
    for (;;) {
      in.read(reinterpret_cast<char*>(chunk.data()), static_cast<std::streamsize>(chunk.size()));
      const size_t got = static_cast<size_t>(in.gcount());
      if (in.bad()) return Status::IoError("cannot read " + path.string());
      file.Feed(chunk.data(), got, base);
      base += got;
      if (got < chunk.size()) break;  // the end of the file
    }
    file.End();
    if (file.damaged_here && scan.damaged_file == file.path) scan.damaged_file_size = base;
    ++scan.files;
    scan.bytes += base;
  }
  return scan;
}

namespace {

double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

}  // namespace

Result<uint64_t> ReadRememberedMaxVersion(const std::string& db_dir, rocksdb::Env* env) {
  // Point in time: a database with a damaged WAL (the usual reason to restore) still gives
  // the version its intact part remembers, a lower bound the recovery gap covers.
  RocksDbTuning tuning;
  tuning.wal_recovery = WalRecovery::kPointInTime;
  RDKV_ASSIGN_OR_RETURN(ReadOnlyDb rodb, OpenValidated(db_dir, env, tuning));
  return rodb.meta_max_version;
}

namespace {

// Truncates `file` (a WAL of the database in `db_dir`) to `offset` bytes and syncs it and the
// directory, if it still has `expected_size` bytes (kUnavailable otherwise: something appends
// to it). A file shared by hard link with another directory is copied first (synced before
// it replaces the link): only this directory's copy is cut.
// OK when `file` still has the `expected_size` bytes it was scanned with; kUnavailable when
// something changed it since (a kvserver appending to it).
Status StillScannedSize(const std::string& file, uint64_t expected_size) {
  std::error_code ec;
  const uint64_t size = std::filesystem::file_size(file, ec);
  if (ec) return Status::IoError("cannot read the size of " + file + ": " + ec.message());
  if (size != expected_size) {
    return Status::Unavailable(file + " changed size while its torn end was being cut (" +
                               std::to_string(expected_size) + " bytes scanned, " +
                               std::to_string(size) + " now): is another kvserver using it?");
  }
  return Status::Ok();
}

Status CutWalFile(const std::string& db_dir, const std::string& file, uint64_t offset,
                  uint64_t expected_size) {
  RDKV_RETURN_IF_ERROR(StillScannedSize(file, expected_size));
  if (offset > expected_size) return Status::Internal("damage past the end of " + file);
  std::error_code ec;
  if (std::filesystem::hard_link_count(file, ec) > 1 && !ec) {
    const std::string own = file + ".own";
    std::filesystem::copy_file(file, own, std::filesystem::copy_options::overwrite_existing, ec);
    if (ec) return Status::IoError("cannot copy " + file + ": " + ec.message());
    RDKV_RETURN_IF_ERROR(FsyncPath(own, false));
    std::filesystem::rename(own, file, ec);
    if (ec) return Status::IoError("cannot copy " + file + ": " + ec.message());
  }
  if (ec) return Status::IoError("cannot stat " + file + ": " + ec.message());
  std::filesystem::resize_file(file, offset, ec);
  if (ec) return Status::IoError("cannot truncate " + file + ": " + ec.message());
  RDKV_RETURN_IF_ERROR(FsyncPath(file, false));
  return FsyncPath(db_dir, true);  // for a copy renamed over a shared link
}

// Copies bytes [offset, end of file) of `file` into `to` (a new file), synced, with its
// directory and that directory's own entry.
Status KeepTail(const std::string& file, uint64_t offset, const std::filesystem::path& to) {
  std::ifstream in(file, std::ios::binary);
  if (!in.is_open()) return Status::IoError("cannot open " + file);
  in.seekg(static_cast<std::streamoff>(offset));
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return Status::IoError("cannot read " + file);
  std::error_code ec;
  const std::filesystem::path dir = to.parent_path();
  const bool new_dir = !std::filesystem::exists(dir, ec);
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::IoError("cannot create " + dir.string() + ": " + ec.message());
  if (new_dir) RDKV_RETURN_IF_ERROR(FsyncPath(dir.parent_path(), true));
  {
    std::ofstream out(to, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.close();  // a buffered write fails here (a full disk), not in write()
    if (!out) return Status::IoError("cannot write " + to.string());
  }
  std::error_code size_ec;
  if (std::filesystem::file_size(to, size_ec) != bytes.size() || size_ec) {
    return Status::IoError("cannot write " + to.string() + " whole");
  }
  RDKV_RETURN_IF_ERROR(FsyncPath(to, false));
  return FsyncPath(dir, true);
}

}  // namespace

Status TrimTornWalTail(const std::string& db_dir, uint64_t* cut) {
  *cut = 0;
  RDKV_ASSIGN_OR_RETURN(WalScan scan, ScanWalFiles(db_dir));
  if (!scan.damaged) return Status::Ok();
  if (!scan.damage_at_tail) {
    return Status::Corruption("the write-ahead log copied into " + db_dir +
                              " is damaged before its end: " + scan.Describe());
  }
  RDKV_RETURN_IF_ERROR(
      CutWalFile(db_dir, scan.damaged_file, scan.damaged_offset, scan.damaged_file_size));
  *cut = scan.damaged_file_size - scan.damaged_offset;
  // Again: what is left must be whole.
  RDKV_ASSIGN_OR_RETURN(WalScan again, ScanWalFiles(db_dir));
  if (again.damaged) {
    return Status::Corruption("the write-ahead log copied into " + db_dir +
                              " is still damaged after its torn end was cut: " + again.Describe());
  }
  return Status::Ok();
}

Result<TornTailCut> CutTornWalTail(const std::string& db_dir, const std::string& keep_dir,
                                   rocksdb::Env* env, const WalScan& found) {
  TornTailCut cut;
  if (!found.crash_torn_tail()) return cut;  // nothing to cut, or for the load to refuse
  // Under the database's lock: a kvserver that opened it since would be appending to the file.
  if (env == nullptr) env = rocksdb::Env::Default();
  rocksdb::FileLock* lock = nullptr;
  const std::string lock_path = db_dir + "/LOCK";
  std::error_code lock_ec;
  if (!std::filesystem::exists(lock_path, lock_ec)) return cut;  // not RocksDB's: the load judges
  rocksdb::Status locked = env->LockFile(lock_path, &lock);
  if (!locked.ok()) {
    return Status::Unavailable(db_dir + " is in use (" + locked.ToString() +
                               "): is another kvserver using this --data_dir?");
  }
  struct Unlock {
    rocksdb::Env* env;
    rocksdb::FileLock* lock;
    ~Unlock() { env->UnlockFile(lock).PermitUncheckedError(); }
  } unlock{env, lock};
  RDKV_ASSIGN_OR_RETURN(WalScan scan, ScanWalFiles(db_dir));  // again, under the lock
  if (!scan.crash_torn_tail()) return cut;
  // Only an rdkv database of this format is changed: a read-only open checks the format key
  // (point in time: the torn record is what it would stop at), and changes nothing.
  {
    RocksDbTuning tuning;
    tuning.wal_recovery = WalRecovery::kPointInTime;
    RDKV_ASSIGN_OR_RETURN(ReadOnlyDb rodb, OpenValidated(db_dir, env, tuning));
  }
  cut.file = scan.damaged_file;
  cut.offset = scan.damaged_offset;
  RDKV_RETURN_IF_ERROR(StillScannedSize(scan.damaged_file, scan.damaged_file_size));
  if (!keep_dir.empty()) {
    // One file per cut, named after the WAL and the offset, with the time so that a second
    // crash at the same place keeps its own.
    const std::filesystem::path wal(scan.damaged_file);
    const auto now = std::chrono::duration_cast<std::chrono::seconds>(
        std::chrono::system_clock::now().time_since_epoch());
    const std::filesystem::path to =
        std::filesystem::path(keep_dir) /
        (wal.stem().string() + ".log-from-" + std::to_string(scan.damaged_offset) + "-cut-at-" +
         std::to_string(now.count()));
    RDKV_RETURN_IF_ERROR(KeepTail(scan.damaged_file, scan.damaged_offset, to));
    cut.kept = to.string();
  }
  RDKV_RETURN_IF_ERROR(
      CutWalFile(db_dir, scan.damaged_file, scan.damaged_offset, scan.damaged_file_size));
  cut.bytes = scan.damaged_file_size - scan.damaged_offset;
  RDKV_ASSIGN_OR_RETURN(WalScan again, ScanWalFiles(db_dir));
  if (again.damaged) {
    return Status::Corruption(
        "the write-ahead log of " + db_dir +
        " is still damaged after its torn last record was cut: " + again.Describe());
  }
  return cut;
}

bool HasDatabase(const std::string& db_dir) {
  std::error_code ec;
  return std::filesystem::is_regular_file(std::filesystem::path(db_dir) / "CURRENT", ec);
}

Status ScanDatabase(const std::string& db_dir, rocksdb::Env* env, const ItemVisitor& item,
                    uint64_t* max_version, WalRecovery wal_recovery) {
  RocksDbTuning tuning;
  tuning.wal_recovery = wal_recovery;
  RDKV_ASSIGN_OR_RETURN(ReadOnlyDb rodb, OpenValidated(db_dir, env, tuning));
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
  // The WAL is checked before RocksDB reads it: a damaged record is named (file and offset)
  // instead of being recovered around. RocksDB's own check (kAbsoluteConsistency) backs it up.
  WalScan wal;
  if (HasDatabase(db_dir)) {
    RDKV_ASSIGN_OR_RETURN(wal, ScanWalFiles(db_dir));
    if (options.wal_scan != nullptr) *options.wal_scan = wal;
    if (wal.damaged && options.tuning.wal_recovery != WalRecovery::kPointInTime) {
      std::string tail;
      if (!wal.damage_at_tail) {
        tail = " Intact records follow the damage: acknowledged writes would be lost.";
      } else if (!wal.torn_end) {
        tail =
            " The damage is the end of the newest WAL file, but not a record the file ends "
            "inside of (what a crash leaves): the bytes there are wrong.";
      } else if (!wal.crash_torn_tail()) {
        tail =
            " The newest WAL file ends inside its last record, but neither at a page boundary "
            "nor after a whole fragment, where a write cut off by a crash ends: a truncated "
            "file, which may have lost acknowledged writes.";
      } else if (options.tuning.wal_recovery == WalRecovery::kTornTail) {
        tail =
            " The newest WAL file ends inside its last record as a write cut off by a crash "
            "leaves it; a start of a data dir's own database cuts such a record "
            "(--wal_recovery=torn_tail), a snapshot given to --restore_from is never changed.";
      } else {
        tail =
            " The damage is the end of the newest WAL file: a truncated file, or the torn "
            "last write of a crash (in sync mode such a write was never acknowledged; "
            "--wal_recovery=torn_tail cuts it).";
      }
      return Status::Corruption(
          "the write-ahead log of " + db_dir + " is damaged: " + wal.Describe() +
          ". The WAL holds writes up to sequence " + std::to_string(wal.max_sequence) +
          "; recovering only those before the damage would drop the rest, so the server "
          "refuses to start." +
          tail +
          " Restore a snapshot (--restore_from), or accept the loss with "
          "--wal_recovery=point_in_time");
    }
  }
  RDKV_ASSIGN_OR_RETURN(ReadOnlyDb rodb, OpenValidated(db_dir, options.env, options.tuning));
  RecoveryStats stats;
  stats.sequence = rodb.db->GetLatestSequenceNumber();
  if (wal.damaged) {
    stats.wal_damage = wal.Describe();
    stats.wal_max_sequence = wal.max_sequence;
    LOG(WARNING) << "--wal_recovery=point_in_time: the write-ahead log of " << db_dir
                 << " is damaged (" << stats.wal_damage << "); recovered through sequence "
                 << stats.sequence << ", the WAL holds writes through sequence " << wal.max_sequence
                 << ": "
                 << (wal.max_sequence > stats.sequence ? wal.max_sequence - stats.sequence : 0)
                 << " sequence numbers (writes) after the damage are dropped, permanently once "
                    "the server opens the database for writing";
  }
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
          if (options.stop != nullptr && options.stop->load(std::memory_order_relaxed)) {
            return Status::Unavailable("stopped while loading " + db_dir + " (signal)");
          }
          if (options.test_item_delay.count() > 0) {
            std::this_thread::sleep_for(options.test_item_delay);
          }
          if (Status key_ok = kv::CheckKey(k); !key_ok.ok()) {
            return Status::Corruption(db_dir + ": " + key_ok.message());
          }
          if (version == 0 || version > kv::kMaxItemVersion) {
            return Status::Corruption(db_dir + ": an item with version " + std::to_string(version) +
                                      " (versions are 1.." + std::to_string(kv::kMaxItemVersion) +
                                      ")");
          }
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

// The on-disk format of a kvserver's RocksDB database, version 1 (docs/persistence.md).
//
//   data key   'k' | user key            value: version u64 LE | user value
//   meta key   'm' | name                value: see below
//     m"format"       decimal text "1": this file's format version; any other value is refused
//     m"max_version"  u64 LE: the largest version handed to a persisted write (written in
//                     every group, so a deleted key's version is remembered too)
//
// A delete is a RocksDB Delete of the data key. Keys sort as bytes, so all data keys form one
// contiguous range ['k', 'l').
//
// Thread-safety: plain functions.
#pragma once

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>

#include "rdkv/status.h"

namespace rocksdb {
class Env;
class Logger;
class Status;
struct Options;
}  // namespace rocksdb

namespace rdkv::server::persistence {

inline constexpr uint32_t kFormatVersion = 1;
inline constexpr char kDataPrefix = 'k';
inline constexpr std::string_view kDataEnd = "l";  // first key after every data key
inline constexpr std::string_view kMetaFormat = "mformat";
inline constexpr std::string_view kMetaMaxVersion = "mmax_version";
inline constexpr size_t kVersionBytes = 8;

// After recovery the version counter restarts this far above the largest persisted version:
// versions handed out but not yet persisted when the server died (a sync-mode write a GET may
// already have seen, an async write lost with the unsynced WAL tail) are never reused for
// another value. 2^32 exceeds the writes any server can apply between two WAL syncs; it costs
// one 2^-32 share of the 64-bit version space per restart.
inline constexpr uint64_t kVersionGapAfterRecovery = uint64_t{1} << 32;

inline std::string DataKey(std::string_view key) {
  std::string k;
  k.reserve(key.size() + 1);
  k.push_back(kDataPrefix);
  k.append(key);
  return k;
}

inline void EncodeVersion(uint64_t v, char out[kVersionBytes]) {
  for (size_t i = 0; i < kVersionBytes; ++i) out[i] = static_cast<char>(v >> (8 * i));
}
inline uint64_t DecodeVersion(const char* in) {
  uint64_t v = 0;
  for (size_t i = 0; i < kVersionBytes; ++i) v |= uint64_t{static_cast<uint8_t>(in[i])} << (8 * i);
  return v;
}

// What recovery does with a damaged write-ahead log (--wal_recovery).
enum class WalRecovery : uint8_t {
  // Refuse to start, naming the damaged file and offset; nothing on disk is changed. A WAL
  // holds acknowledged writes: recovering only what precedes the damage would lose them.
  kRefuse,
  // As kRefuse, except for the one damage a crash leaves: the newest WAL file ending, at a
  // page boundary, inside its last record (a write() stopped by SIGKILL). That record is cut
  // (its bytes kept in <data_dir>/torn-wal-tails/) and the start goes on: in sync mode it was
  // never acknowledged (CutTornWalTail in recovery.h; docs/persistence.md, Recovery step 0).
  kTornTail,
  // The operator accepts losing what follows the damage: recover the writes before it
  // (RocksDB's point-in-time recovery) and report what was dropped. The loss is permanent.
  kPointInTime,
};
// "refuse" | "torn_tail" | "point_in_time"; kInvalidArgument otherwise.
Result<WalRecovery> ParseWalRecovery(std::string_view name);

// The tuning flags. Reads come from the region, never from RocksDB, so the cache is small and
// there are no bloom filters; RocksDB is read sequentially once, at recovery.
struct RocksDbTuning {
  std::string compression = "lz4";            // none | snappy | lz4 | zstd
  uint64_t write_buffer_bytes = 64ull << 20;  // per memtable; up to 3 memtables
  uint64_t block_cache_bytes = 32ull << 20;
  int background_jobs = 2;                            // flushes + compactions
  WalRecovery wal_recovery = WalRecovery::kTornTail;  // kvserver's --wal_recovery default
};

// RocksDB options for a kvserver database into *out. kInvalidArgument for an unknown or
// unsupported compression. `env` may be null (the default Env).
Status MakeDbOptions(const RocksDbTuning& tuning, rocksdb::Env* env, rocksdb::Options* out);

// A RocksDB info logger that sends warnings and errors to glog and writes no file (read-only
// opens must not create a LOG file in the directory they inspect).
std::shared_ptr<rocksdb::Logger> MakeGlogLogger();

// rocksdb::Status -> rdkv::Status, prefixed with `what`.
Status FromRocks(std::string_view what, const rocksdb::Status& s);

// fsync of a file, or of a directory (so a rename or a new entry in it is durable).
Status FsyncPath(const std::filesystem::path& p, bool directory);

}  // namespace rdkv::server::persistence

// Issue #15, defect 8: silent loss of synced writes. A WAL garbled in the middle, or truncated,
// used to be recovered point-in-time: the server started with 4 of 20 acknowledged keys, logged
// a RocksDB warning and rewrote the data dir, making the loss permanent. Now the start is
// refused with the file and offset named and nothing on disk changed; only an explicit
// --wal_recovery=point_in_time recovers around the damage, and it reports what was dropped.
// The one exception (the default --wal_recovery=torn_tail): a newest WAL file that ends inside
// its last record at a page boundary, what SIGKILL leaves in a write() of several pages. That
// record was never acknowledged; it is cut, its bytes kept, and the start goes on.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "server/persistence/recovery.h"
#include "tests/persistence/test_util.h"

namespace rdkv::testing {
namespace {

using namespace std::chrono_literals;
using server::persistence::ScanWalFiles;
using server::persistence::WalRecovery;
using server::persistence::WalScan;

constexpr int kKeys = 20;

PersistOptions Opts(const std::string& dir, WalRecovery wal = WalRecovery::kRefuse) {
  PersistOptions o;
  o.durability = Durability::kSync;
  o.data_dir = dir;
  o.tuning.write_buffer_bytes = 4u << 20;
  o.tuning.block_cache_bytes = 1u << 20;
  o.tuning.wal_recovery = wal;
  return o;
}

// The largest WAL file of the database in `db_dir` ("" when none), its size in *size.
std::string LargestWal(const std::string& db_dir, uint64_t* size) {
  std::string wal;
  *size = 0;
  for (const auto& e : fs::directory_iterator(db_dir)) {
    if (e.path().extension() == ".log" && fs::file_size(e.path()) > *size) {
      wal = e.path().string();
      *size = fs::file_size(e.path());
    }
  }
  return wal;
}

// A database in `dir` whose WAL holds three small records and then one of 60,000 bytes (two
// fragments: the rest of the first 32 KiB block, then the second block). Its WAL's path.
std::string SmallRecordsThenALargeOne(const std::string& dir, WalRecovery mode,
                                      uint64_t* wal_size) {
  {
    auto n = Node::Start(Opts(dir, mode));
    EXPECT_TRUE(n.ok()) << n.status().ToString();
    if (!n.ok()) return "";
    for (int i = 0; i < 3; ++i) {
      EXPECT_TRUE((*n)->Put("small" + std::to_string(i), "v").status.ok());
    }
    Reply r = (*n)->Put("large", std::string(60000, 'x'));
    EXPECT_TRUE(r.status.ok()) << r.status.ToString();
  }
  return LargestWal(dir + "/db", wal_size);
}

class WalDamageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto n = Node::Start(Opts(dir_.path()));
    ASSERT_TRUE(n.ok()) << n.status().ToString();
    // 20 acknowledged (synced) writes of 4000 bytes: the WAL spans three 32 KiB blocks.
    for (int i = 0; i < kKeys; ++i) {
      Reply r = (*n)->Put("key" + std::to_string(i), std::string(4000, static_cast<char>('a' + i)));
      ASSERT_TRUE(r.status.ok()) << r.status.ToString();
    }
    n->reset();
    wal_ = LargestWal(dir_.path() + "/db", &wal_size_);
    ASSERT_GT(wal_size_, 70000u) << "the writes are expected in the WAL";
    Result<WalScan> scan = ScanWalFiles(dir_.path() + "/db");
    ASSERT_TRUE(scan.ok()) << scan.status().ToString();
    EXPECT_FALSE(scan->damaged) << scan->Describe();
  }
  void Garble(uint64_t offset) {
    std::fstream f(wal_, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(offset));
    char b[16];
    f.read(b, sizeof(b));
    for (char& c : b) c = static_cast<char>(c ^ 0x5a);
    f.seekp(static_cast<std::streamoff>(offset));
    f.write(b, sizeof(b));
  }
  // The start is refused naming the WAL file and a byte offset, and the data dir is unchanged.
  void ExpectRefusedUntouched(const std::string& words, WalRecovery mode = WalRecovery::kRefuse) {
    auto before = Fingerprint(dir_.path());
    Result<std::unique_ptr<Node>> n = Node::Start(Opts(dir_.path(), mode));
    ASSERT_FALSE(n.ok()) << "started with " << (*n)->store().counters().items << " of " << kKeys
                         << " acknowledged keys";
    const std::string m = n.status().message();
    EXPECT_EQ(n.status().code(), StatusCode::kCorruption) << m;
    EXPECT_NE(m.find(wal_ + " at byte "), std::string::npos) << m;
    EXPECT_NE(m.find(words), std::string::npos) << m;
    EXPECT_NE(m.find("--wal_recovery=point_in_time"), std::string::npos) << m;
    EXPECT_NE(m.find("nothing on disk was changed"), std::string::npos) << m;
    EXPECT_EQ(Fingerprint(dir_.path()), before) << "the data dir changed";
  }
  TempDir dir_;
  std::string wal_;
  uint64_t wal_size_ = 0;
};

TEST_F(WalDamageTest, GarbledInTheMiddleIsRefusedWithFileAndOffset) {
  Garble(wal_size_ / 2);
  ExpectRefusedUntouched("Intact records follow the damage");
  ExpectRefusedUntouched("acknowledged writes would be lost");  // and again: still refused
}

TEST_F(WalDamageTest, TruncatedIsRefusedWithFileAndOffset) {
  fs::resize_file(wal_, wal_size_ / 2 + 17);
  ExpectRefusedUntouched("truncated");
}

// A snapshot's copied WAL may end inside a record a concurrent write was appending: the
// snapshot cuts that torn end (TrimTornWalTail), and the database then opens whole.
TEST_F(WalDamageTest, ATornEndIsCutAndTheDatabaseOpensWhole) {
  fs::resize_file(wal_, wal_size_ / 2 + 17);
  // A hard link elsewhere (as a checkpoint may share a file with the live database) is left
  // whole: only this directory's copy is cut.
  TempDir elsewhere;
  const std::string shared = elsewhere.path() + "/shared.log";
  fs::create_hard_link(wal_, shared);
  uint64_t cut = 0;
  Status trimmed = server::persistence::TrimTornWalTail(dir_.path() + "/db", &cut);
  ASSERT_TRUE(trimmed.ok()) << trimmed.ToString();
  EXPECT_GT(cut, 0u);
  EXPECT_LT(cut, 32768u) << "more than the torn record was cut";
  EXPECT_EQ(fs::file_size(wal_), wal_size_ / 2 + 17 - cut);
  EXPECT_EQ(fs::file_size(shared), wal_size_ / 2 + 17) << "the other link was cut too";
  EXPECT_EQ(fs::hard_link_count(wal_), 1u);
  Result<WalScan> scan = ScanWalFiles(dir_.path() + "/db");
  ASSERT_TRUE(scan.ok());
  EXPECT_FALSE(scan->damaged) << scan->Describe();
  {
    Result<std::unique_ptr<Node>> n = Node::Start(Opts(dir_.path()));  // refuse mode: opens
    ASSERT_TRUE(n.ok()) << n.status().ToString();
    EXPECT_GT((*n)->store().counters().items, 0u);
    EXPECT_LT((*n)->store().counters().items, static_cast<uint64_t>(kKeys));
  }
}

// A torn end inside a record of several fragments (a write larger than a 32 KiB block) is cut
// from the record's first fragment: what is left is whole.
TEST(WalTrimTest, ATornRecordOfSeveralFragmentsIsCutFromItsStart) {
  TempDir dir;
  uint64_t size = 0;
  const std::string wal = SmallRecordsThenALargeOne(dir.path(), WalRecovery::kRefuse, &size);
  ASSERT_GT(size, 60000u);
  fs::resize_file(wal, size - 50);  // inside the large record's last fragment
  uint64_t cut = 0;
  Status trimmed = server::persistence::TrimTornWalTail(dir.path() + "/db", &cut);
  ASSERT_TRUE(trimmed.ok()) << trimmed.ToString();
  EXPECT_GT(cut, 55000u) << "the record's first fragments were left";
  Result<WalScan> scan = ScanWalFiles(dir.path() + "/db");
  ASSERT_TRUE(scan.ok());
  EXPECT_FALSE(scan->damaged) << scan->Describe();
  auto n = Node::Start(Opts(dir.path()));
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ((*n)->store().counters().items, 3u);
}

// A kill -9 under load can stop the write() of the newest WAL record between two pages: the
// file then ends inside that record at a page boundary. The default --wal_recovery=torn_tail
// cuts that record (never acknowledged in sync mode) before the load, keeps its bytes, and the
// server starts; a second start finds nothing more to cut.
TEST_F(WalDamageTest, ATornTailAtAPageBoundaryIsCutAtStartAndItsBytesKept) {
  const uint64_t end = (wal_size_ / 2) / server::persistence::kTornWriteAlignment *
                       server::persistence::kTornWriteAlignment;
  std::string torn;  // the bytes the record had in the file from its start to `end`
  fs::resize_file(wal_, end);
  Result<WalScan> scan = ScanWalFiles(dir_.path() + "/db");
  ASSERT_TRUE(scan.ok());
  ASSERT_TRUE(scan->torn_tail()) << "the cut is expected inside a record: " << scan->Describe();
  const uint64_t record_start = scan->damaged_offset;
  {
    std::ifstream in(wal_, std::ios::binary);
    in.seekg(static_cast<std::streamoff>(record_start));
    torn.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  ASSERT_EQ(torn.size(), end - record_start);
  uint64_t items = 0;
  {
    Result<std::unique_ptr<Node>> n = Node::Start(Opts(dir_.path(), WalRecovery::kTornTail));
    ASSERT_TRUE(n.ok()) << n.status().ToString();
    items = (*n)->store().counters().items;
    EXPECT_GT(items, 0u);
    EXPECT_LT(items, static_cast<uint64_t>(kKeys));
    const server::persistence::TornTailCut& cut = (*n)->recovered().torn_tail_cut;
    EXPECT_EQ(cut.file, wal_);
    EXPECT_EQ(cut.offset, record_start);
    EXPECT_EQ(cut.bytes, end - record_start);
    ASSERT_FALSE(cut.kept.empty());
    EXPECT_EQ(fs::path(cut.kept).parent_path(), fs::path(dir_.path()) / "torn-wal-tails");
    std::ifstream kept(cut.kept, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(kept)), std::istreambuf_iterator<char>());
    EXPECT_TRUE(bytes == torn) << "the kept bytes are not the torn record's";
    // Every key before the torn record is there, whole.
    for (uint64_t i = 0; i < items; ++i) {
      uint64_t version = 0;
      Result<std::string> v = (*n)->store().Get("key" + std::to_string(i), &version);
      ASSERT_TRUE(v.ok()) << i << ": " << v.status().ToString();
      EXPECT_EQ(*v, std::string(4000, static_cast<char>('a' + i)));
    }
  }
  {
    Result<std::unique_ptr<Node>> n = Node::Start(Opts(dir_.path(), WalRecovery::kTornTail));
    ASSERT_TRUE(n.ok()) << n.status().ToString();
    EXPECT_EQ((*n)->store().counters().items, items);
    EXPECT_EQ((*n)->recovered().torn_tail_cut.bytes, 0u) << "cut again";
  }
  size_t kept_files = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir_.path() + "/torn-wal-tails")) {
    ++kept_files;
  }
  EXPECT_EQ(kept_files, 1u);
}

// The strict mode refuses the same torn tail and changes nothing.
TEST_F(WalDamageTest, RefuseModeRefusesATornTailToo) {
  fs::resize_file(wal_, (wal_size_ / 2) / 4096 * 4096);
  ExpectRefusedUntouched("torn_tail cuts it", WalRecovery::kRefuse);
}

// A record larger than RocksDB's 1 MiB file buffer is written in several write()s; a crash
// between two of them leaves the file ending right after a fragment's header (the buffer is
// flushed before the payload that does not fit), off any page boundary. That is cut too; one
// byte of payload later is not what a crash leaves, and is refused.
TEST(WalTornTailTest, AnEndRightAfterAFragmentHeaderIsCutOneByteLaterIsRefused) {
  for (const bool after_header : {true, false}) {
    SCOPED_TRACE(after_header ? "right after the header" : "one byte into the payload");
    TempDir dir;
    uint64_t size = 0;
    const std::string wal = SmallRecordsThenALargeOne(dir.path(), WalRecovery::kTornTail, &size);
    ASSERT_GT(size, 32768u + 8);
    // The large record's second fragment starts at the second block (32 KiB): its header is the
    // block's first 7 bytes.
    const uint64_t end = 32768 + 7 + (after_header ? 0 : 1);
    fs::resize_file(wal, end);
    Result<WalScan> scan = ScanWalFiles(dir.path() + "/db");
    ASSERT_TRUE(scan.ok());
    ASSERT_TRUE(scan->torn_tail()) << scan->Describe();
    EXPECT_EQ(scan->crash_torn_tail(), after_header) << scan->Describe();
    const auto before = Fingerprint(dir.path());
    Result<std::unique_ptr<Node>> n = Node::Start(Opts(dir.path(), WalRecovery::kTornTail));
    if (after_header) {
      ASSERT_TRUE(n.ok()) << n.status().ToString();
      EXPECT_EQ((*n)->store().counters().items, 3u);
      EXPECT_EQ((*n)->recovered().torn_tail_cut.offset, scan->damaged_offset);
      EXPECT_EQ((*n)->recovered().torn_tail_cut.bytes, end - scan->damaged_offset);
      EXPECT_LT(scan->damaged_offset, 32768u) << "cut from the record's first fragment";
    } else {
      ASSERT_FALSE(n.ok());
      EXPECT_NE(n.status().message().find("neither at a page boundary"), std::string::npos)
          << n.status().ToString();
      EXPECT_EQ(Fingerprint(dir.path()), before) << "the data dir changed";
    }
  }
}

// A file that ends inside a record anywhere but at a page boundary is not what a killed
// write() leaves: refused in the default mode too, nothing changed.
TEST_F(WalDamageTest, ATruncationOffAPageBoundaryIsRefusedByDefault) {
  fs::resize_file(wal_, (wal_size_ / 2) / 4096 * 4096 + 17);
  ExpectRefusedUntouched("neither at a page boundary", WalRecovery::kTornTail);
  EXPECT_FALSE(fs::exists(dir_.path() + "/torn-wal-tails"));
}

// Wrong bytes in the last record are damage, not a torn write: refused in the default mode.
TEST_F(WalDamageTest, AGarbledLastRecordIsRefusedByDefault) {
  Garble(wal_size_ - 100);
  ExpectRefusedUntouched("the bytes there are wrong", WalRecovery::kTornTail);
}

// And damage with intact records after it is refused in the default mode as before.
TEST_F(WalDamageTest, DamageInTheMiddleIsRefusedByDefault) {
  Garble(wal_size_ / 2);
  ExpectRefusedUntouched("Intact records follow the damage", WalRecovery::kTornTail);
}

// Damage with intact records after it is no torn end: refused, and the file is not touched.
TEST_F(WalDamageTest, DamageBeforeTheEndIsNotCut) {
  Garble(wal_size_ / 2);
  const auto before = Fingerprint(dir_.path());
  uint64_t cut = 0;
  Status trimmed = server::persistence::TrimTornWalTail(dir_.path() + "/db", &cut);
  EXPECT_EQ(trimmed.code(), StatusCode::kCorruption) << trimmed.ToString();
  EXPECT_EQ(cut, 0u);
  EXPECT_EQ(Fingerprint(dir_.path()), before) << "the data dir changed";
}

TEST_F(WalDamageTest, ZeroedBlockFollowedByRecordsIsRefused) {
  // RocksDB itself skips a zeroed block silently; the scan does not.
  std::fstream f(wal_, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(32768);
  std::string zeros(32768, '\0');
  f.write(zeros.data(), static_cast<std::streamsize>(zeros.size()));
  f.close();
  ExpectRefusedUntouched("zeroed");
}

TEST_F(WalDamageTest, PointInTimeIsAnExplicitChoiceAndReportsTheDrop) {
  Garble(wal_size_ / 2);
  Result<std::unique_ptr<Node>> n = Node::Start(Opts(dir_.path(), WalRecovery::kPointInTime));
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  const RecoveryStats& r = (*n)->recovered();
  EXPECT_LT((*n)->store().counters().items, static_cast<uint64_t>(kKeys));
  EXPECT_NE(r.wal_damage.find(wal_ + " at byte "), std::string::npos) << r.wal_damage;
  EXPECT_GT(r.wal_max_sequence, r.sequence) << "the drop is reported by sequence numbers";
}

TEST(WalScanTest, DamageBeyondTheFirstMiBIsFound) {
  // The scan reads 1 MiB at a time: a WAL of ~1.6 MiB, garbled at 3/4.
  TempDir dir;
  {
    auto n = Node::Start(Opts(dir.path()));
    ASSERT_TRUE(n.ok()) << n.status().ToString();
    for (int i = 0; i < 400; ++i) {
      ASSERT_TRUE((*n)->Put("big" + std::to_string(i), std::string(4000, 'x')).status.ok());
    }
  }
  std::string wal;
  for (const auto& e : fs::directory_iterator(dir.path() + "/db")) {
    if (e.path().extension() == ".log" && fs::file_size(e.path()) > (1u << 20)) wal = e.path();
  }
  ASSERT_FALSE(wal.empty()) << "expected a WAL over 1 MiB";
  Result<WalScan> scan = ScanWalFiles(dir.path() + "/db");
  ASSERT_TRUE(scan.ok());
  EXPECT_FALSE(scan->damaged) << scan->Describe();
  const uint64_t at = fs::file_size(wal) * 3 / 4;
  {
    std::fstream f(wal, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(at));
    f.write("\x01\x02\x03\x04\x05\x06\x07\x08", 8);
  }
  scan = ScanWalFiles(dir.path() + "/db");
  ASSERT_TRUE(scan.ok());
  ASSERT_TRUE(scan->damaged);
  EXPECT_EQ(scan->damaged_file, wal);
  EXPECT_GT(scan->damaged_offset, 1u << 20);
  EXPECT_LE(scan->damaged_offset, at);
  EXPECT_GT(scan->damaged_offset + 32768, at) << "within the damaged block";
  EXPECT_FALSE(scan->damage_at_tail) << scan->Describe();
}

TEST(WalScanTest, IntactWalAfterRestartIsNotDamage) {
  TempDir dir;
  for (int round = 0; round < 3; ++round) {
    auto n = Node::Start(Opts(dir.path()));
    ASSERT_TRUE(n.ok()) << n.status().ToString();
    EXPECT_EQ((*n)->store().counters().items, static_cast<uint64_t>(round * 10));
    for (int i = 0; i < 10; ++i) {
      ASSERT_TRUE(
          (*n)->Put("r" + std::to_string(round) + "k" + std::to_string(i), "v").status.ok());
    }
  }
  Result<WalScan> scan = ScanWalFiles(dir.path() + "/db");
  ASSERT_TRUE(scan.ok());
  EXPECT_FALSE(scan->damaged) << scan->Describe();
  EXPECT_GT(scan->max_sequence, 0u);
}

}  // namespace
}  // namespace rdkv::testing

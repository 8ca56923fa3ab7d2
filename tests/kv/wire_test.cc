#include "common/kv/wire.h"

#include <gtest/gtest.h>

#include "common/kv/admin_wire.h"

#include <algorithm>
#include <cstring>

namespace rdkv::kv {
namespace {

TEST(WireTest, RequestRoundTrip) {
  std::vector<uint8_t> buf;
  EncodeRequest({Op::kCas, "key", "value", 99}, &buf);
  Result<Request> r = DecodeRequest(buf, WireLimits{});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->op, Op::kCas);
  EXPECT_EQ(r->key, "key");
  EXPECT_EQ(r->value, "value");
  EXPECT_EQ(r->expected_version, 99u);
}

TEST(WireTest, ResponseRoundTrip) {
  std::vector<uint8_t> buf;
  EncodeResponse(Status::VersionMismatch("current version is 5"), 5, "", &buf);
  Result<Response> r = DecodeResponse(buf);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status.code(), StatusCode::kVersionMismatch);
  EXPECT_EQ(r->status.message(), "current version is 5");
  EXPECT_EQ(r->version, 5u);
  EncodeResponse(Status::Ok(), 1, "{\"items\":1}", &buf);
  r = DecodeResponse(buf);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->status.ok());
  EXPECT_EQ(r->body, "{\"items\":1}");
}

TEST(WireTest, ItemLocationRoundTripsAndRefusesMalformedBodies) {
  std::string body;
  EncodeItemLocation({0xdeadbeef, 513, 1}, &body);
  ASSERT_EQ(body.size(), kItemLocationBytes);
  EXPECT_EQ(static_cast<uint8_t>(body[0]), 0xef);  // little-endian on the wire
  Result<std::optional<ItemLocation>> w = DecodeItemLocation(body);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  ASSERT_TRUE(w->has_value());
  EXPECT_EQ(**w, (ItemLocation{0xdeadbeef, 513, 1}));
  // No body: no location (a retried write's answer, an older server).
  w = DecodeItemLocation("");
  ASSERT_TRUE(w.ok());
  EXPECT_FALSE(w->has_value());
  // Wrong size, zero length, a third bucket, a reserved byte set.
  EXPECT_TRUE(DecodeItemLocation(body.substr(0, 7)).status().Is(StatusCode::kProtocolError));
  EXPECT_TRUE(DecodeItemLocation(body + "x").status().Is(StatusCode::kProtocolError));
  std::string bad;
  EncodeItemLocation({1, 0, 0}, &bad);
  EXPECT_TRUE(DecodeItemLocation(bad).status().Is(StatusCode::kProtocolError));
  EncodeItemLocation({1, 1, 2}, &bad);
  EXPECT_TRUE(DecodeItemLocation(bad).status().Is(StatusCode::kProtocolError));
  bad = body;
  bad[7] = 1;
  EXPECT_TRUE(DecodeItemLocation(bad).status().Is(StatusCode::kProtocolError));
}

TEST(WireTest, MalformedRequestsAreProtocolErrors) {
  std::vector<uint8_t> good;
  EncodeRequest({Op::kPut, "k", "v", 0}, &good);
  auto expect_code = [](std::vector<uint8_t> b, StatusCode code, const char* what) {
    Result<Request> r = DecodeRequest(b, WireLimits{});
    EXPECT_FALSE(r.ok()) << what;
    EXPECT_EQ(r.status().code(), code) << what << ": " << r.status().ToString();
  };
  expect_code({}, StatusCode::kProtocolError, "empty");
  expect_code(std::vector<uint8_t>(good.begin(), good.begin() + 10), StatusCode::kProtocolError,
              "short");
  auto b = good;
  b[0] ^= 1;
  expect_code(b, StatusCode::kProtocolError, "magic");
  b = good;
  b[2] = 9;
  expect_code(b, StatusCode::kProtocolError, "version");
  b = good;
  b[3] = 200;
  expect_code(b, StatusCode::kProtocolError, "op");
  b = good;
  b.push_back(0);
  expect_code(b, StatusCode::kProtocolError, "trailing byte");
  b = good;
  uint32_t huge = 0xffffffff;
  std::memcpy(b.data() + 4, &huge, 4);
  expect_code(b, StatusCode::kProtocolError, "key length past the end");
  b = good;
  b[12] = 1;
  expect_code(b, StatusCode::kProtocolError, "flags");
}

TEST(WireTest, LimitsAreInvalidArgument) {
  std::vector<uint8_t> buf;
  WireLimits limits{1024, 100};
  EncodeRequest({Op::kPut, "", "v", 0}, &buf);
  EXPECT_EQ(DecodeRequest(buf, limits).status().code(), StatusCode::kInvalidArgument);
  std::string long_key(1025, 'k');
  EncodeRequest({Op::kPut, long_key, "v", 0}, &buf);
  EXPECT_EQ(DecodeRequest(buf, limits).status().code(), StatusCode::kInvalidArgument);
  std::string big(101, 'v');
  EncodeRequest({Op::kPut, "k", big, 0}, &buf);
  EXPECT_EQ(DecodeRequest(buf, limits).status().code(), StatusCode::kInvalidArgument);
  EncodeRequest({Op::kPut, std::string(1024, 'k'), std::string(100, 'v'), 0}, &buf);
  EXPECT_TRUE(DecodeRequest(buf, limits).ok()) << "limits are inclusive";
}

// --- admin messages (common/kv/admin_wire.h) ---

// Encodes `r` into a frame and decodes the frame again, as a server does before the admin
// decoder sees it.
Request Reframe(const Request& r, std::vector<uint8_t>* buf) {
  EncodeRequest(r, buf);
  Result<Request> framed = DecodeRequest(*buf, WireLimits{});
  EXPECT_TRUE(framed.ok()) << framed.status().ToString();
  return framed.ok() ? *framed : Request{};
}

TEST(AdminWireTest, RequestsRoundTrip) {
  std::vector<uint8_t> buf;
  std::string scratch;
  {
    Result<SnapshotRequest> m = DecodeSnapshot(Reframe(EncodeSnapshot({"before-change"}), &buf));
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    EXPECT_EQ(m->name, "before-change");
  }
  EXPECT_TRUE(DecodeMapFetch(Reframe(EncodeMapFetch({}), &buf)).ok());
  {
    Result<MapInstallRequest> m =
        DecodeMapInstall(Reframe(EncodeMapInstall({"{\"epoch\":2}"}), &buf));
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    EXPECT_EQ(m->map_json, "{\"epoch\":2}");
    EXPECT_FALSE(m->check_only);
    Result<MapInstallRequest> check =
        DecodeMapInstall(Reframe(EncodeMapInstall({"{\"epoch\":3}", true}), &buf));
    ASSERT_TRUE(check.ok()) << check.status().ToString();
    EXPECT_EQ(check->map_json, "{\"epoch\":3}");
    EXPECT_TRUE(check->check_only);
  }
  for (uint32_t shard : {0u, 7u, 10u, kMaxShards - 1}) {
    Result<ShardScanRequest> m =
        DecodeShardScan(Reframe(EncodeShardScan({shard, 12345}, &scratch), &buf));
    ASSERT_TRUE(m.ok()) << shard << ": " << m.status().ToString();
    EXPECT_EQ(m->shard, shard);
    EXPECT_EQ(m->cursor, 12345u);
    EXPECT_EQ(m->copy_for, kScanForNoReplica);
    for (uint32_t server : {0u, 9u, 10u, 4000000000u}) {
      Result<ShardScanRequest> f =
          DecodeShardScan(Reframe(EncodeShardScan({shard, 0, server}, &scratch), &buf));
      ASSERT_TRUE(f.ok()) << shard << "/" << server << ": " << f.status().ToString();
      EXPECT_EQ(f->shard, shard);
      EXPECT_EQ(f->cursor, 0u);
      EXPECT_EQ(f->copy_for, server);
    }
    Result<DropShardRequest> d =
        DecodeDropShard(Reframe(EncodeDropShard({shard, 99}, &scratch), &buf));
    ASSERT_TRUE(d.ok()) << shard << ": " << d.status().ToString();
    EXPECT_EQ(d->shard, shard);
    EXPECT_EQ(d->version_floor, 99u);
  }
  {
    Result<ImportRequest> m = DecodeImport(Reframe(EncodeImport({"key", "value", 42}), &buf));
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    EXPECT_EQ(m->key, "key");
    EXPECT_EQ(m->value, "value");
    EXPECT_EQ(m->version, 42u);
  }
}

TEST(AdminWireTest, InstallIsItsOwnAdminOp) {
  EXPECT_EQ(EncodeMapInstall({"{}"}).op, Op::kInstallMap);
  EXPECT_EQ(EncodeMapFetch({}).op, Op::kClusterMap);
  EXPECT_TRUE(IsAdmin(Op::kInstallMap));
  EXPECT_FALSE(IsAdmin(Op::kClusterMap));
  EXPECT_EQ(static_cast<int>(Op::kInstallMap), 12);
  for (Op op : {Op::kSnapshot, Op::kShardScan, Op::kImport, Op::kDropShard}) {
    EXPECT_TRUE(IsAdmin(op)) << OpName(op);
  }
}

TEST(AdminWireTest, MalformedRequestsAreRefused) {
  auto code = [](const auto& r) { return r.status().code(); };
  const StatusCode kProto = StatusCode::kProtocolError, kInvalid = StatusCode::kInvalidArgument;
  // Fields a message does not use.
  EXPECT_EQ(code(DecodeSnapshot({Op::kSnapshot, "s", "v", 0})), kProto);
  EXPECT_EQ(code(DecodeSnapshot({Op::kSnapshot, "s", "", 1})), kProto);
  EXPECT_EQ(
      code(DecodeSnapshot({Op::kSnapshot, std::string(kMaxSnapshotNameBytes + 1, 's'), "", 0})),
      kInvalid);
  EXPECT_EQ(code(DecodeMapFetch({Op::kClusterMap, "k", "", 0})), kProto);
  EXPECT_EQ(code(DecodeMapFetch({Op::kClusterMap, "", "{}", 0})), kProto);
  EXPECT_EQ(code(DecodeMapFetch({Op::kClusterMap, "", "", 3})), kProto);
  EXPECT_EQ(code(DecodeMapInstall({Op::kInstallMap, "", "", 0})), kProto) << "no map";
  EXPECT_EQ(code(DecodeMapInstall({Op::kInstallMap, "k", "{}", 0})), kProto);
  EXPECT_EQ(code(DecodeMapInstall({Op::kInstallMap, "", "{}", 2})), kProto) << "not check-only";
  // SHARD_SCAN's value is a server id in canonical decimal.
  for (std::string_view bad : {"v", "-1", "01", "1 ", "4294967295", "4294967296", "0x1"}) {
    EXPECT_EQ(code(DecodeShardScan({Op::kShardScan, "3", bad, 0})), kInvalid) << bad;
  }
  EXPECT_EQ(code(DecodeDropShard({Op::kDropShard, "3", "v", 0})), kProto);
  EXPECT_EQ(code(DecodeShardScan({Op::kShardScan, "3", "", kScanDone})), kInvalid);
  // Shard numbers: canonical decimal below kMaxShards only.
  const std::string_view bad_shards[] = {"",
                                         "-1",
                                         "+1",
                                         "01",
                                         "00",
                                         "1a",
                                         " 1",
                                         "1 ",
                                         "4096",
                                         "99999",
                                         "4294967296",
                                         "0x10",
                                         std::string_view("1\0", 2)};
  for (std::string_view bad : bad_shards) {
    EXPECT_EQ(code(DecodeShardScan({Op::kShardScan, bad, "", 0})), kInvalid) << bad;
    EXPECT_EQ(code(DecodeDropShard({Op::kDropShard, bad, "", 0})), kInvalid) << bad;
  }
  // IMPORT: a key within the limits and a version.
  EXPECT_EQ(code(DecodeImport({Op::kImport, "k", "v", 0})), kInvalid);
  EXPECT_EQ(code(DecodeImport({Op::kImport, "", "v", 1})), kInvalid);
  EXPECT_EQ(code(DecodeImport({Op::kImport, std::string(kMaxKeyBytes + 1, 'k'), "v", 1})),
            kInvalid);
  // A decoder given another op's request.
  EXPECT_EQ(code(DecodeShardScan({Op::kDropShard, "1", "", 0})), StatusCode::kInternal);
  EXPECT_EQ(code(DecodeImport({Op::kPut, "k", "v", 1})), StatusCode::kInternal);
}

TEST(AdminWireTest, AnswersRoundTrip) {
  EXPECT_EQ(DecodeSnapshotAnswer(0, "/data/snap")->path, "/data/snap");
  Result<MapAnswer> map = DecodeMapAnswer(7, "{}");
  ASSERT_TRUE(map.ok());
  EXPECT_EQ(map->epoch, 7u);
  EXPECT_EQ(map->map_json, "{}");
  EXPECT_TRUE(DecodeMapAnswer(0, "").ok()) << "standalone";
  EXPECT_EQ(DecodeDropShardAnswer(5, "")->dropped, 5u);

  ScanAnswerBuilder builder(100);
  ASSERT_TRUE(builder.Add({"a", "1", 3}));
  ASSERT_TRUE(builder.Add({"bb", "", 4}));
  Result<ShardScanAnswer> scan = DecodeShardScanAnswer(10, 20, builder.body(), WireLimits{});
  ASSERT_TRUE(scan.ok()) << scan.status().ToString();
  EXPECT_EQ(scan->next_cursor, 20u);
  ASSERT_EQ(scan->entries.size(), 2u);
  EXPECT_EQ(scan->entries[0].key, "a");
  EXPECT_EQ(scan->entries[0].value, "1");
  EXPECT_EQ(scan->entries[0].version, 3u);
  EXPECT_EQ(scan->entries[1].key, "bb");
  EXPECT_EQ(scan->entries[1].version, 4u);
  scan = DecodeShardScanAnswer(10, kScanDone, "", WireLimits{});
  ASSERT_TRUE(scan.ok());
  EXPECT_TRUE(scan->entries.empty());
}

TEST(AdminWireTest, ScanAnswerKeepsToItsLimit) {
  // One entry always goes in; more only while the body stays within the limit.
  const std::string value(100, 'v');
  ScanAnswerBuilder builder(100);
  const std::string key(kMaxKeyBytes, 'k');
  ASSERT_TRUE(builder.Add({key, value, 1}));
  EXPECT_EQ(builder.body().size(), MaxScanAnswerBodyBytes(100));
  EXPECT_FALSE(builder.Add({"k", "", 2}));
  EXPECT_EQ(builder.body().size(), MaxScanAnswerBodyBytes(100)) << "a refused entry adds nothing";
  ScanAnswerBuilder small(100);
  size_t added = 0;
  while (small.Add({"key", "value", 1})) ++added;
  EXPECT_GT(added, 1u);
  EXPECT_LE(small.body().size(), MaxScanAnswerBodyBytes(100));
}

TEST(AdminWireTest, MalformedAnswersAreRefused) {
  const StatusCode kProto = StatusCode::kProtocolError;
  EXPECT_EQ(DecodeSnapshotAnswer(1, "p").status().code(), kProto);
  EXPECT_EQ(DecodeMapAnswer(3, "").status().code(), kProto) << "epoch without a map";
  EXPECT_EQ(DecodeDropShardAnswer(1, "x").status().code(), kProto);
  ScanAnswerBuilder builder(100);
  ASSERT_TRUE(builder.Add({"key", "value", 1}));
  const std::string body = builder.body();
  // No progress: the next cursor must pass the request's (or end the scan).
  EXPECT_EQ(DecodeShardScanAnswer(10, 10, body, WireLimits{}).status().code(), kProto);
  EXPECT_EQ(DecodeShardScanAnswer(10, 3, body, WireLimits{}).status().code(), kProto);
  // Every cut of the body short of its end, and a trailing byte.
  for (size_t n = 1; n < body.size(); ++n) {
    EXPECT_EQ(DecodeShardScanAnswer(0, kScanDone, body.substr(0, n), WireLimits{}).status().code(),
              kProto)
        << n;
  }
  EXPECT_EQ(DecodeShardScanAnswer(0, kScanDone, body + "x", WireLimits{}).status().code(), kProto);
  // Entries that break the limits: an empty key, a key or value over them, lengths near 2^32.
  auto entry = [](uint32_t kb, uint32_t vb) {
    std::string e(kScanEntryHeaderBytes, '\0');
    std::memcpy(e.data(), &kb, 4);
    std::memcpy(e.data() + 4, &vb, 4);
    // At most 2000 bytes of each: lengths past that make the entry cut short.
    return e + std::string(std::min<uint32_t>(kb, 2000), 'k') +
           std::string(std::min<uint32_t>(vb, 2000), 'v');
  };
  const WireLimits limits{1024, 100};
  EXPECT_TRUE(DecodeShardScanAnswer(0, kScanDone, entry(1, 100), limits).ok());
  EXPECT_EQ(DecodeShardScanAnswer(0, kScanDone, entry(0, 1), limits).status().code(), kProto);
  EXPECT_EQ(DecodeShardScanAnswer(0, kScanDone, entry(1025, 1), limits).status().code(), kProto);
  EXPECT_EQ(DecodeShardScanAnswer(0, kScanDone, entry(1, 101), limits).status().code(), kProto);
  EXPECT_EQ(DecodeShardScanAnswer(0, kScanDone, entry(0xffffffff, 0xffffffff),
                                  WireLimits{~size_t{0}, ~uint64_t{0}})
                .status()
                .code(),
            kProto);
}

TEST(WireTest, OtherVersionsGetAClearError) {
  std::vector<uint8_t> buf;
  EncodeRequest({Op::kPing, "", "", 0}, &buf);
  buf[2] = 1;  // a wire version 1 peer
  Result<Request> r = DecodeRequest(buf, WireLimits{});
  EXPECT_EQ(r.status().code(), StatusCode::kProtocolError);
  EXPECT_NE(r.status().message().find("version 1"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find(std::to_string(kWireVersion)), std::string::npos);
  EncodeResponse(Status::Ok(), 0, "", &buf);
  buf[2] = 1;
  Result<Response> a = DecodeResponse(buf);
  EXPECT_EQ(a.status().code(), StatusCode::kProtocolError);
  EXPECT_NE(a.status().message().find("version 1"), std::string::npos) << a.status().message();
}

// SHARD_IDS and RECORD_IDS (a copy's request ids): round trips, and everything that breaks
// their rules refused by the right code.
TEST(AdminWireTest, RequestIdPagesRoundTripAndAreChecked) {
  std::vector<uint8_t> buf;
  std::string scratch;
  auto code = [](const auto& r) { return r.status().code(); };
  const StatusCode kProto = StatusCode::kProtocolError, kInvalid = StatusCode::kInvalidArgument;
  for (uint32_t shard : {0u, 10u, kMaxShards - 1}) {
    Result<ShardIdsRequest> m =
        DecodeShardIds(Reframe(EncodeShardIds({shard, 77}, &scratch), &buf));
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    EXPECT_EQ(m->shard, shard);
    EXPECT_EQ(m->cursor, 77u);
  }
  std::vector<AnsweredWrite> page;
  for (uint64_t i = 1; i <= kMaxIdsPerRecord; ++i) page.push_back({100 + i, 5, i});
  const std::string packed = EncodeAnsweredWrites(page);
  {
    Result<RecordIdsRequest> m =
        DecodeRecordIds(Reframe(EncodeRecordIds({12, packed}, &scratch), &buf));
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    EXPECT_EQ(m->shard, 12u);
    const std::vector<AnsweredWrite> back = DecodeAnsweredWrites(m->ids);
    ASSERT_EQ(back.size(), page.size());
    EXPECT_EQ(back.back().version, page.back().version);
    EXPECT_EQ(back.back().request_seq, page.back().request_seq);
  }
  EXPECT_EQ(static_cast<int>(Op::kShardIds), 14);
  EXPECT_EQ(static_cast<int>(Op::kRecordIds), 15);
  EXPECT_TRUE(IsAdmin(Op::kShardIds));
  EXPECT_TRUE(IsAdmin(Op::kRecordIds));

  // SHARD_IDS: a shard and a cursor, nothing else.
  EXPECT_EQ(code(DecodeShardIds({Op::kShardIds, "3", "v", 0})), kProto);
  EXPECT_EQ(code(DecodeShardIds({Op::kShardIds, "3", "", kScanDone})), kInvalid);
  EXPECT_EQ(code(DecodeShardIds({Op::kShardIds, "03", "", 0})), kInvalid);
  EXPECT_EQ(code(DecodeShardIds({Op::kShardIds, "4096", "", 0})), kInvalid);
  // RECORD_IDS: 1..kMaxIdsPerRecord whole entries, valid ids and versions, no version field.
  const std::string one = EncodeAnsweredWrites({{9, 1, 1}});
  EXPECT_TRUE(DecodeRecordIds({Op::kRecordIds, "3", one, 0}).ok());
  EXPECT_EQ(code(DecodeRecordIds({Op::kRecordIds, "3", "", 0})), kProto) << "no ids";
  EXPECT_EQ(code(DecodeRecordIds({Op::kRecordIds, "3", one, 1})), kProto) << "a version";
  EXPECT_EQ(code(DecodeRecordIds({Op::kRecordIds, "3", one.substr(1), 0})), kProto) << "part";
  EXPECT_EQ(code(DecodeRecordIds({Op::kRecordIds, "3", packed + one, 0})), kProto) << "129";
  EXPECT_EQ(code(DecodeRecordIds({Op::kRecordIds, "3", EncodeAnsweredWrites({{9, 0, 1}}), 0})),
            kProto);
  EXPECT_EQ(code(DecodeRecordIds({Op::kRecordIds, "3", EncodeAnsweredWrites({{9, 1, 0}}), 0})),
            kProto);
  // Version 0: a DELETE's answer on a shard without replicas carries none.
  EXPECT_TRUE(DecodeRecordIds({Op::kRecordIds, "3", EncodeAnsweredWrites({{0, 1, 1}}), 0}).ok());
  EXPECT_EQ(code(DecodeRecordIds(
                {Op::kRecordIds, "3", EncodeAnsweredWrites({{kMaxItemVersion + 1, 1, 1}}), 0})),
            kInvalid);
  EXPECT_EQ(code(DecodeRecordIds({Op::kRecordIds, "x", one, 0})), kInvalid);
  EXPECT_EQ(code(DecodeRecordIds({Op::kShardIds, "3", one, 0})), StatusCode::kInternal);

  // The answer: a cursor that advances (or the end) and 0..kMaxIdsPerShardIdsAnswer valid
  // entries; a server sends no more than its scan answers hold, and never fewer than one.
  std::vector<AnsweredWrite> full;
  for (uint64_t i = 1; i <= kMaxIdsPerShardIdsAnswer; ++i) full.push_back({i, 5, i});
  Result<ShardIdsAnswer> a = DecodeShardIdsAnswer(5, 6, EncodeAnsweredWrites(full));
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->next_cursor, 6u);
  EXPECT_EQ(a->ids.size(), kMaxIdsPerShardIdsAnswer);
  EXPECT_TRUE(DecodeShardIdsAnswer(5, kScanDone, "").ok());
  EXPECT_EQ(code(DecodeShardIdsAnswer(5, 5, one)), kProto) << "no progress";
  EXPECT_EQ(code(DecodeShardIdsAnswer(5, 6, EncodeAnsweredWrites(full) + one)), kProto) << "4097";
  EXPECT_EQ(MaxIdsPerShardIdsAnswer(kMaxValueBytes), kMaxIdsPerShardIdsAnswer);
  EXPECT_EQ(MaxIdsPerShardIdsAnswer(kMinMaxValueBytes),
            MaxScanAnswerBodyBytes(kMinMaxValueBytes) / kAnsweredWriteBytes);
  EXPECT_LE(
      sizeof(ResponseHeader) + MaxIdsPerShardIdsAnswer(kMinMaxValueBytes) * kAnsweredWriteBytes,
      MaxMessageBytes(kMinMaxValueBytes));
  EXPECT_EQ(code(DecodeShardIdsAnswer(5, 6, one + "x")), kProto) << "part";
  EXPECT_EQ(code(DecodeShardIdsAnswer(5, 6, EncodeAnsweredWrites({{9, 0, 1}}))), kProto);
}

}  // namespace
}  // namespace rdkv::kv

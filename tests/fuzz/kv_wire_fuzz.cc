// libFuzzer target: the key-value request and response decoders (common/kv/wire.h), the admin
// message decoders (common/kv/admin_wire.h) and the item check clients run on bytes READ from a
// server (common/kv/layout.h). None may crash, read out of bounds, or accept what it should
// not; an admin message that decodes re-encodes to the same request.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/kv/admin_wire.h"
#include "common/kv/layout.h"
#include "common/kv/wire.h"

namespace {

using rdkv::kv::Request;

bool SameRequest(const Request& a, const Request& b) {
  return a.op == b.op && a.key == b.key && a.value == b.value &&
         a.expected_version == b.expected_version;
}

bool Inside(std::string_view part, std::string_view whole) {
  return part.empty() ||
         (part.data() >= whole.data() && part.data() + part.size() <= whole.data() + whole.size());
}

// Runs the admin decoder of a framed request's op; what decodes must re-encode to the request.
void CheckAdminRequest(const Request& r) {
  namespace kv = rdkv::kv;
  std::string scratch;
  std::optional<Request> again;  // the re-encoding of what decoded
  switch (r.op) {
    case kv::Op::kSnapshot:
      if (auto m = kv::DecodeSnapshot(r); m.ok()) again = kv::EncodeSnapshot(*m);
      break;
    case kv::Op::kClusterMap:
      if (auto m = kv::DecodeMapFetch(r); m.ok()) again = kv::EncodeMapFetch(*m);
      break;
    case kv::Op::kInstallMap:
      if (auto m = kv::DecodeMapInstall(r); m.ok()) again = kv::EncodeMapInstall(*m);
      break;
    case kv::Op::kShardScan:
      if (auto m = kv::DecodeShardScan(r); m.ok()) {
        if (m->shard >= kv::kMaxShards) std::abort();
        again = kv::EncodeShardScan(*m, &scratch);
      }
      break;
    case kv::Op::kImport:
      if (auto m = kv::DecodeImport(r); m.ok()) again = kv::EncodeImport(*m);
      break;
    case kv::Op::kDropShard:
      if (auto m = kv::DecodeDropShard(r); m.ok()) {
        if (m->shard >= kv::kMaxShards) std::abort();
        again = kv::EncodeDropShard(*m, &scratch);
      }
      break;
    case kv::Op::kShardIds:
      if (auto m = kv::DecodeShardIds(r); m.ok()) {
        if (m->shard >= kv::kMaxShards || m->cursor == kv::kScanDone) std::abort();
        again = kv::EncodeShardIds(*m, &scratch);
      }
      break;
    case kv::Op::kRecordIds:
      if (auto m = kv::DecodeRecordIds(r); m.ok()) {
        const std::vector<kv::AnsweredWrite> ids = kv::DecodeAnsweredWrites(m->ids);
        if (m->shard >= kv::kMaxShards || ids.empty() || ids.size() > kv::kMaxIdsPerRecord ||
            ids.size() * kv::kAnsweredWriteBytes != m->ids.size() || !Inside(m->ids, r.value)) {
          std::abort();
        }
        for (const kv::AnsweredWrite& w : ids) {
          if (w.client_id == 0 || w.request_seq == 0) std::abort();
        }
        again = kv::EncodeRecordIds(*m, &scratch);
      }
      break;
    case kv::Op::kPut:
    case kv::Op::kInsert:
    case kv::Op::kDelete:
    case kv::Op::kCas:
    case kv::Op::kStats:
    case kv::Op::kPing:
      break;  // no admin message
    case kv::Op::kReplicate:
      break;  // replicate_batch_fuzz.cc
  }
  if (again.has_value() && !SameRequest(*again, r)) std::abort();
}

// The answer decoders on (u64 version | body) taken from the input.
void CheckAdminAnswers(std::string_view text, const rdkv::kv::WireLimits& limits) {
  namespace kv = rdkv::kv;
  if (text.size() < 16) return;
  uint64_t cursor, version;
  std::memcpy(&cursor, text.data(), 8);
  std::memcpy(&version, text.data() + 8, 8);
  std::string_view body = text.substr(16);
  if (auto a = kv::DecodeShardScanAnswer(cursor, version, body, limits); a.ok()) {
    if (a->next_cursor != kv::kScanDone && a->next_cursor <= cursor) std::abort();
    for (const kv::ScanEntry& e : a->entries) {
      if (!Inside(e.key, body) || !Inside(e.value, body) || e.key.empty() ||
          e.key.size() > limits.max_key_bytes || e.value.size() > limits.max_value_bytes) {
        std::abort();
      }
    }
  }
  auto map = kv::DecodeMapAnswer(version, body);
  if (map.ok() && !Inside(map->map_json, body)) std::abort();
  auto snapshot = kv::DecodeSnapshotAnswer(version, body);
  if (snapshot.ok() && !Inside(snapshot->path, body)) std::abort();
  if (kv::DecodeDropShardAnswer(version, body).ok() && !body.empty()) std::abort();
  if (auto ids = kv::DecodeShardIdsAnswer(cursor, version, body); ids.ok()) {
    if (ids->next_cursor != kv::kScanDone && ids->next_cursor <= cursor) std::abort();
    if (ids->ids.size() > kv::kMaxIdsPerShardIdsAnswer ||
        ids->ids.size() * kv::kAnsweredWriteBytes != body.size()) {
      std::abort();
    }
    for (const kv::AnsweredWrite& w : ids->ids) {
      if (w.client_id == 0 || w.request_seq == 0) std::abort();
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::span<const uint8_t> in(data, size);
  rdkv::kv::WireLimits limits{1024, 4096};
  rdkv::Result<rdkv::kv::Request> req = rdkv::kv::DecodeRequest(in, limits);
  if (req.ok()) {
    // A decoded request re-encodes to the same bytes.
    std::vector<uint8_t> again;
    rdkv::kv::EncodeRequest(*req, &again);
    if (again.size() != size || !std::equal(again.begin(), again.end(), data)) std::abort();
    CheckAdminRequest(*req);
  }
  rdkv::Result<rdkv::kv::Response> resp = rdkv::kv::DecodeResponse(in);
  if (resp.ok() && resp->body.size() > size) std::abort();
  // Shard scan bodies (admin responses): entries never point outside the input.
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto entries = rdkv::kv::DecodeScanEntries(text, limits);
  if (entries.ok()) {
    for (const auto& e : *entries) {
      if (e.key.data() < text.data() || e.value.data() + e.value.size() > text.data() + size)
        std::abort();
    }
  }
  CheckAdminAnswers(text, limits);
  // A write answer's item location: accepted only whole, and re-encodes to the same bytes.
  auto where = rdkv::kv::DecodeItemLocation(text);
  if (where.ok() && where->has_value()) {
    std::string again;
    rdkv::kv::EncodeItemLocation(**where, &again);
    if (again != text) std::abort();
  }
  // Bytes READ from a region: the check must never accept a wrong key.
  std::string_view value;
  uint64_t version = 0;
  if (rdkv::kv::CheckItem(data, size, "fuzz-key", &value, &version) == rdkv::kv::ItemCheck::kOk) {
    if (size < sizeof(rdkv::kv::ItemHeader) + 8 ||
        std::string_view(reinterpret_cast<const char*>(data) + sizeof(rdkv::kv::ItemHeader), 8) !=
            "fuzz-key") {
      std::abort();
    }
  }
  return 0;
}

// libFuzzer target: the REPLICATE decoders (common/kv/admin_wire.h: batches, single ones and
// their answers entries), which backups run on
// what a primary (or anyone holding the admin credential) sends, and primaries on the answers.
// None may crash, read outside its input or accept what breaks the limits; what decodes
// re-encodes to the same bytes.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/kv/admin_wire.h"
#include "common/kv/wire.h"

namespace {

namespace kv = rdkv::kv;

bool Inside(std::string_view part, std::string_view whole) {
  return part.empty() ||
         (part.data() >= whole.data() && part.data() + part.size() <= whole.data() + whole.size());
}

// Answers that a decoder accepted: whole entries, each with a whole id and a version in
// 1..the message's, and no delete or request id of the message's own.
void CheckAnswers(const kv::ReplicateRequest& m) {
  if (!m.answers) return;
  const size_t n = m.value.size() / kv::kAnsweredWriteBytes;
  if (m.is_delete || m.client_id != 0 || m.request_seq != 0 || n == 0 ||
      n > kv::kMaxAnsweredWrites || m.value.size() % kv::kAnsweredWriteBytes != 0) {
    std::abort();
  }
  const std::vector<kv::AnsweredWrite> answers = kv::DecodeAnsweredWrites(m.value);
  if (answers.size() != n) std::abort();
  for (const kv::AnsweredWrite& w : answers) {
    if (w.version == 0 || w.version > m.version || w.client_id == 0 || w.request_seq == 0) {
      std::abort();
    }
  }
  if (kv::EncodeAnsweredWrites(answers) != m.value) std::abort();
}

// A decoded batch: every entry within the body and the limits, and the body re-encodes exactly.
void CheckBatch(const kv::Request& r, const kv::WireLimits& limits) {
  auto b = kv::DecodeReplicateBatch(r, limits);
  if (!b.ok()) return;
  if (b->entries.empty() || b->entries.size() > kv::kMaxReplicateBatchEntries) std::abort();
  kv::ReplicateBatchBuilder again(r.value.size());
  for (const kv::ReplicateRequest& m : b->entries) {
    if (!Inside(m.key, r.value) || !Inside(m.value, r.value) || m.key.empty() ||
        m.key.size() > limits.max_key_bytes ||
        (!m.answers && m.value.size() > limits.max_value_bytes) || m.version == 0 ||
        (m.is_delete && !m.value.empty()) || m.map_epoch != b->map_epoch) {
      std::abort();
    }
    CheckAnswers(m);
    if (!again.Add(m)) std::abort();  // it fitted the body it came from
  }
  if (again.body() != r.value) std::abort();
  kv::Request frame = again.Encode(b->map_epoch, b->sender_id);
  if (frame.key != r.key || frame.map_epoch != r.map_epoch || frame.flags != r.flags) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const kv::WireLimits limits{64, 1024};
  std::string_view text(reinterpret_cast<const char*>(data), size);
  // A whole request frame.
  auto r = kv::DecodeRequest(std::span<const uint8_t>(data, size), limits);
  if (r.ok() && kv::IsReplicateBatch(*r)) CheckBatch(*r, limits);
  // A single REPLICATE: what decodes is within the frame and re-encodes to the same fields.
  if (r.ok() && r->op == kv::Op::kReplicate && !kv::IsReplicateBatch(*r)) {
    auto m = kv::DecodeReplicate(*r);
    if (m.ok()) {
      CheckAnswers(*m);
      const kv::Request again = kv::EncodeReplicate(*m);
      if (again.key != r->key || again.value != r->value || again.flags != r->flags ||
          again.expected_version != r->expected_version || again.client_id != r->client_id) {
        std::abort();
      }
    }
  }
  // The input as a batch body.
  kv::Request body{kv::Op::kReplicate, kv::kReplicateBatchKey, text, 0};
  body.map_epoch = 1;
  CheckBatch(body, limits);
  // An answer: the first byte is the number of entries expected, the rest the body.
  if (size >= 1) {
    const size_t expected = data[0];
    std::string_view answer = text.substr(1);
    auto results = kv::DecodeReplicateBatchAnswer(expected, answer, expected);
    if (results.ok()) {
      if (results->size() != expected) std::abort();
      std::string again;
      for (const kv::ReplicateBatchResult& res : *results) {
        kv::AppendReplicateBatchResult(res.code, res.version, &again);
      }
      if (again != answer) std::abort();
    }
  }
  return 0;
}

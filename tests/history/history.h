// Histories of key-value operations, for the linearizability checker (checker.h).
//
// A history is a file of JSON lines, one per completed operation (tests/history/README.md):
//
//   {"client":3,"op":"cas","key":"k1","value":"c3-17","expected":12,
//    "invoke":1200,"complete":1500,"outcome":"ok","version":13}
//   {"client":1,"op":"get","key":"k1","invoke":1300,"complete":1350,"outcome":"ok",
//    "value":"c3-17","version":13}
//
// "value" is the written value (put/insert/cas) or the value a get returned; "version" the new
// version (put/insert/cas ok) or the version a get returned; "expected" is a cas's expected
// version. Times are nanoseconds on one clock (CLOCK_MONOTONIC is system-wide, so several
// processes on one machine may share a history).
//
//   HistoryRecorder   a thread-safe sink to a file; each thread records through its own
//                     ClientLog (a buffer flushed in batches), which also makes unique values
//   ParseHistoryLine / ReadHistory   the parser (errors name the line and the field)
//
// Thread-safety: HistoryRecorder is thread-safe; a ClientLog belongs to one thread at a time.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/util/mutex.h"
#include "rdkv/status.h"

namespace rdkv::history {

enum class OpType : uint8_t { kGet, kPut, kInsert, kCas, kDelete };

enum class Outcome : uint8_t {
  kOk,               // applied (writes) / found (get)
  kNotFound,         // get, cas, delete: the key was absent
  kExists,           // insert: the key was present
  kVersionMismatch,  // cas: present with another version
  kUnknown,          // timed out, connection lost, unavailable: may have applied, or not
  kFail,             // a definite error: no effect
};

std::string_view OpTypeName(OpType t);
std::string_view OutcomeName(Outcome o);
Result<OpType> ParseOpType(std::string_view s);
Result<Outcome> ParseOutcome(std::string_view s);

// The outcome a client call's status means for the history: OK -> kOk; kNotFound,
// kAlreadyExists, kVersionMismatch -> their answers; kInvalidArgument (checked before sending)
// -> kFail; every other error -> kUnknown (a write may have applied: the conservative reading).
Outcome OutcomeOfStatus(const Status& s);

// One completed operation.
struct Op {
  uint64_t client = 0;
  OpType type = OpType::kGet;
  std::string key;
  // Written value (put/insert/cas) or returned value (get ok).
  std::string value;
  uint64_t expected = 0;  // cas only
  int64_t invoke_ns = 0;
  int64_t complete_ns = 0;
  Outcome outcome = Outcome::kOk;
  // New version (put/insert/cas ok) or the version read (get ok); 0 otherwise.
  uint64_t version = 0;
};

// One JSON object, no newline.
std::string ToJsonLine(const Op& op);
// Parses one line (ToJsonLine's form). Errors are kInvalidArgument naming the field.
Result<Op> ParseHistoryLine(std::string_view line);
// Every line of the file (blank lines skipped); errors name the file and line number.
Result<std::vector<Op>> ReadHistory(const std::string& path);
// Writes ops, one line each (for tests and tools that edit histories).
Status WriteHistory(const std::string& path, const std::vector<Op>& ops);

// Now on CLOCK_MONOTONIC, in nanoseconds.
int64_t MonotonicNowNs();

class HistoryRecorder;

// One client's log: records its operations into a local buffer, handed to the recorder every
// `kFlushEvery` ops and at Flush/destruction. Not thread-safe: one per thread.
class ClientLog {
 public:
  static constexpr size_t kFlushEvery = 256;
  ClientLog(HistoryRecorder* recorder, uint64_t client_id)
      : recorder_(recorder), client_(client_id) {}
  ~ClientLog();
  ClientLog(const ClientLog&) = delete;
  ClientLog& operator=(const ClientLog&) = delete;

  uint64_t client_id() const { return client_; }
  // A value no other client (with another id) and no other call of this one produces:
  // "c<client>-<seq>".
  std::string NextValue();
  // Records a completed op (its client field is set to this log's id).
  void Record(Op op);
  // Hands the buffered ops to the recorder.
  void Flush();

 private:
  HistoryRecorder* const recorder_;
  const uint64_t client_;
  uint64_t seq_ = 0;
  std::vector<Op> buffer_;
};

class HistoryRecorder {
 public:
  // Creates (truncates) `path`.
  static Result<std::unique_ptr<HistoryRecorder>> Create(const std::string& path);
  ~HistoryRecorder();
  HistoryRecorder(const HistoryRecorder&) = delete;
  HistoryRecorder& operator=(const HistoryRecorder&) = delete;

  // Appends ops as lines (one locked write per batch).
  void Append(const std::vector<Op>& ops);
  // Flushes and closes the file; the first write error, if any. Later Appends are dropped and
  // make Close's status an error.
  Status Close();
  uint64_t ops_written() const;

 private:
  explicit HistoryRecorder(std::FILE* f) : file_(f) {}
  mutable Mutex mu_;
  std::FILE* file_ GUARDED_BY(mu_);
  Status error_ GUARDED_BY(mu_);
  uint64_t written_ GUARDED_BY(mu_) = 0;
};

}  // namespace rdkv::history

#include "tests/history/history.h"

#include <time.h>

#include <cerrno>
#include <fstream>
#include <nlohmann/json.hpp>

namespace rdkv::history {

namespace {
constexpr std::string_view kOpNames[] = {"get", "put", "insert", "cas", "delete"};
constexpr std::string_view kOutcomeNames[] = {"ok",      "not_found", "exists", "version_mismatch",
                                              "unknown", "fail"};

bool WritesValue(OpType t) {
  return t == OpType::kPut || t == OpType::kInsert || t == OpType::kCas;
}
}  // namespace

std::string_view OpTypeName(OpType t) { return kOpNames[static_cast<int>(t)]; }
std::string_view OutcomeName(Outcome o) { return kOutcomeNames[static_cast<int>(o)]; }

Result<OpType> ParseOpType(std::string_view s) {
  for (size_t i = 0; i < std::size(kOpNames); ++i) {
    if (kOpNames[i] == s) return static_cast<OpType>(i);
  }
  return Status::InvalidArgument("unknown op '" + std::string(s) +
                                 "' (get, put, insert, cas, delete)");
}

Result<Outcome> ParseOutcome(std::string_view s) {
  for (size_t i = 0; i < std::size(kOutcomeNames); ++i) {
    if (kOutcomeNames[i] == s) return static_cast<Outcome>(i);
  }
  return Status::InvalidArgument("unknown outcome '" + std::string(s) +
                                 "' (ok, not_found, exists, version_mismatch, unknown, fail)");
}

Outcome OutcomeOfStatus(const Status& s) {
  switch (s.code()) {
    case StatusCode::kOk:
      return Outcome::kOk;
    case StatusCode::kNotFound:
      return Outcome::kNotFound;
    case StatusCode::kAlreadyExists:
      return Outcome::kExists;
    case StatusCode::kVersionMismatch:
      return Outcome::kVersionMismatch;
    case StatusCode::kInvalidArgument:
      return Outcome::kFail;
    default:
      return Outcome::kUnknown;
  }
}

std::string ToJsonLine(const Op& op) {
  nlohmann::ordered_json j;
  j["client"] = op.client;
  j["op"] = OpTypeName(op.type);
  j["key"] = op.key;
  bool has_value = WritesValue(op.type) || (op.type == OpType::kGet && op.outcome == Outcome::kOk);
  if (has_value) j["value"] = op.value;
  if (op.type == OpType::kCas) j["expected"] = op.expected;
  j["invoke"] = op.invoke_ns;
  j["complete"] = op.complete_ns;
  j["outcome"] = OutcomeName(op.outcome);
  if (op.outcome == Outcome::kOk && op.type != OpType::kDelete) j["version"] = op.version;
  // Values are arbitrary bytes: replace invalid UTF-8 rather than throw.
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

Result<Op> ParseHistoryLine(std::string_view line) {
  nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::InvalidArgument("not valid JSON");
  if (!j.is_object()) return Status::InvalidArgument("not a JSON object");
  Op op;
  auto get_uint = [&](const char* name, bool required, uint64_t* out) -> Status {
    auto it = j.find(name);
    if (it == j.end()) {
      return required ? Status::InvalidArgument(std::string("missing field \"") + name + "\"")
                      : Status::Ok();
    }
    if (!it->is_number_unsigned() && !(it->is_number_integer() && it->get<int64_t>() >= 0)) {
      return Status::InvalidArgument(std::string("field \"") + name +
                                     "\" must be a non-negative integer, not " + it->dump());
    }
    *out = it->get<uint64_t>();
    return Status::Ok();
  };
  auto get_string = [&](const char* name, bool required, std::string* out) -> Status {
    auto it = j.find(name);
    if (it == j.end()) {
      return required ? Status::InvalidArgument(std::string("missing field \"") + name + "\"")
                      : Status::Ok();
    }
    if (!it->is_string()) {
      return Status::InvalidArgument(std::string("field \"") + name + "\" must be a string, not " +
                                     it->dump());
    }
    *out = it->get<std::string>();
    return Status::Ok();
  };
  RDKV_RETURN_IF_ERROR(get_uint("client", true, &op.client));
  std::string s;
  RDKV_RETURN_IF_ERROR(get_string("op", true, &s));
  RDKV_ASSIGN_OR_RETURN(op.type, ParseOpType(s));
  RDKV_RETURN_IF_ERROR(get_string("key", true, &op.key));
  RDKV_RETURN_IF_ERROR(get_string("outcome", true, &s));
  RDKV_ASSIGN_OR_RETURN(op.outcome, ParseOutcome(s));
  uint64_t t = 0;
  RDKV_RETURN_IF_ERROR(get_uint("invoke", true, &t));
  op.invoke_ns = static_cast<int64_t>(t);
  RDKV_RETURN_IF_ERROR(get_uint("complete", true, &t));
  op.complete_ns = static_cast<int64_t>(t);
  if (op.complete_ns < op.invoke_ns) {
    return Status::InvalidArgument("\"complete\" (" + std::to_string(op.complete_ns) +
                                   ") is before \"invoke\" (" + std::to_string(op.invoke_ns) + ")");
  }
  bool value_required =
      WritesValue(op.type) || (op.type == OpType::kGet && op.outcome == Outcome::kOk);
  RDKV_RETURN_IF_ERROR(get_string("value", value_required, &op.value));
  RDKV_RETURN_IF_ERROR(get_uint("expected", op.type == OpType::kCas, &op.expected));
  bool version_required = op.outcome == Outcome::kOk && op.type != OpType::kDelete;
  RDKV_RETURN_IF_ERROR(get_uint("version", version_required, &op.version));
  // Answers that an op cannot give.
  bool valid = true;
  switch (op.outcome) {
    case Outcome::kNotFound:
      valid = op.type == OpType::kGet || op.type == OpType::kCas || op.type == OpType::kDelete;
      break;
    case Outcome::kExists:
      valid = op.type == OpType::kInsert;
      break;
    case Outcome::kVersionMismatch:
      valid = op.type == OpType::kCas;
      break;
    default:
      break;
  }
  if (!valid) {
    return Status::InvalidArgument("outcome \"" + std::string(OutcomeName(op.outcome)) +
                                   "\" is not an answer of \"" + std::string(OpTypeName(op.type)) +
                                   "\"");
  }
  return op;
}

Result<std::vector<Op>> ReadHistory(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status::FromErrno("open " + path, errno);
  std::vector<Op> ops;
  std::string line;
  size_t n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto op = ParseHistoryLine(line);
    if (!op.ok()) {
      return Status::InvalidArgument(path + ":" + std::to_string(n) + ": " + op.status().message());
    }
    ops.push_back(std::move(op).value());
  }
  if (in.bad()) return Status::IoError("read " + path);
  return ops;
}

Status WriteHistory(const std::string& path, const std::vector<Op>& ops) {
  std::ofstream out(path, std::ios::trunc);
  if (!out) return Status::FromErrno("create " + path, errno);
  for (const Op& op : ops) out << ToJsonLine(op) << '\n';
  out.flush();
  if (!out) return Status::IoError("write " + path);
  return Status::Ok();
}

int64_t MonotonicNowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

ClientLog::~ClientLog() { Flush(); }

std::string ClientLog::NextValue() {
  return "c" + std::to_string(client_) + "-" + std::to_string(++seq_);
}

void ClientLog::Record(Op op) {
  op.client = client_;
  buffer_.push_back(std::move(op));
  if (buffer_.size() >= kFlushEvery) Flush();
}

void ClientLog::Flush() {
  if (buffer_.empty()) return;
  recorder_->Append(buffer_);
  buffer_.clear();
}

Result<std::unique_ptr<HistoryRecorder>> HistoryRecorder::Create(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) return Status::FromErrno("create " + path, errno);
  return std::unique_ptr<HistoryRecorder>(new HistoryRecorder(f));
}

HistoryRecorder::~HistoryRecorder() { Close().IgnoreError(); }

void HistoryRecorder::Append(const std::vector<Op>& ops) {
  std::string text;
  for (const Op& op : ops) {
    text += ToJsonLine(op);
    text += '\n';
  }
  MutexLock l(&mu_);
  if (file_ == nullptr) {
    if (error_.ok()) error_ = Status::Internal("ops recorded after Close");
    return;
  }
  if (std::fwrite(text.data(), 1, text.size(), file_) != text.size() && error_.ok()) {
    error_ = Status::FromErrno("write history", errno);
  }
  written_ += ops.size();
}

Status HistoryRecorder::Close() {
  MutexLock l(&mu_);
  if (file_ != nullptr) {
    if (std::fclose(file_) != 0 && error_.ok()) error_ = Status::FromErrno("close history", errno);
    file_ = nullptr;
  }
  return error_;
}

uint64_t HistoryRecorder::ops_written() const {
  MutexLock l(&mu_);
  return written_;
}

}  // namespace rdkv::history

// Status and Result<T>: how every rdkv call reports success or failure.
//
// A Status is either OK or carries a code and a human-readable message. Both types are
// [[nodiscard]]: ignoring one is a compile error under -Werror, because an unchecked error is
// how acknowledged data gets lost. An OK Status does not allocate.
//
// Thread-safety: values; safe to copy and move between threads, not to mutate concurrently.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace rdkv {

enum class StatusCode : uint8_t {
  kOk = 0,
  kNotFound = 1,         // the key does not exist
  kInvalidArgument = 2,  // bad input from the caller (key too long, malformed flag, ...)
  kAlreadyExists = 3,    // INSERT of a key that is present
  kVersionMismatch = 4,  // CAS whose expected version is not the current one
  kOutOfSpace = 5,       // the server's region (or disk) is full; nothing stored was harmed
  kTimedOut = 6,         // no answer within the deadline; the operation may or may not have applied
  kUnavailable = 7,      // the server cannot be reached or is not serving
  kConnectionLost = 8,   // the connection broke; in-flight operations have unknown outcome
  kPermissionDenied = 9,    // authentication refused
  kRemoteAccessError = 10,  // a one-sided READ was refused by the remote side (bad rkey/bounds)
  kCorruption = 11,         // data failed its checksum after all retries, or a file is damaged
  kIoError = 12,            // a local system call failed
  kBusy = 13,               // a queue is full; retry later
  kWrongOwner = 14,         // the server does not own the key's shard (cluster map moved)
  kInternal = 15,           // a bug or an impossible state
  kNotSupported = 16,       // the operation is not available here
  kProtocolError = 17,      // a malformed or unexpected message arrived
};

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  static Status NotFound(std::string m = {}) { return {StatusCode::kNotFound, std::move(m)}; }
  static Status InvalidArgument(std::string m) {
    return {StatusCode::kInvalidArgument, std::move(m)};
  }
  static Status AlreadyExists(std::string m = {}) {
    return {StatusCode::kAlreadyExists, std::move(m)};
  }
  static Status VersionMismatch(std::string m = {}) {
    return {StatusCode::kVersionMismatch, std::move(m)};
  }
  static Status OutOfSpace(std::string m) { return {StatusCode::kOutOfSpace, std::move(m)}; }
  static Status TimedOut(std::string m) { return {StatusCode::kTimedOut, std::move(m)}; }
  static Status Unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
  static Status ConnectionLost(std::string m) {
    return {StatusCode::kConnectionLost, std::move(m)};
  }
  static Status PermissionDenied(std::string m) {
    return {StatusCode::kPermissionDenied, std::move(m)};
  }
  static Status RemoteAccessError(std::string m) {
    return {StatusCode::kRemoteAccessError, std::move(m)};
  }
  static Status Corruption(std::string m) { return {StatusCode::kCorruption, std::move(m)}; }
  static Status IoError(std::string m) { return {StatusCode::kIoError, std::move(m)}; }
  static Status Busy(std::string m) { return {StatusCode::kBusy, std::move(m)}; }
  static Status WrongOwner(std::string m) { return {StatusCode::kWrongOwner, std::move(m)}; }
  static Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
  static Status NotSupported(std::string m) { return {StatusCode::kNotSupported, std::move(m)}; }
  static Status ProtocolError(std::string m) { return {StatusCode::kProtocolError, std::move(m)}; }
  // errno-based I/O error: "<what>: <strerror(err)>".
  static Status FromErrno(std::string_view what, int err);

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  bool Is(StatusCode c) const { return code_ == c; }

  // "OK" or "<CodeName>: <message>".
  std::string ToString() const;

  // Explicitly drops a status the caller has decided not to act on.
  void IgnoreError() const {}

  friend bool operator==(const Status& a, const Status& b) { return a.code_ == b.code_; }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// Either a value or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}         // NOLINT(google-explicit-constructor)
  Result(Status status) : v_(std::move(status)) {}  // NOLINT(google-explicit-constructor)

  bool ok() const { return std::holds_alternative<T>(v_); }
  // The error; Status::Ok() when a value is held.
  Status status() const { return ok() ? Status::Ok() : std::get<Status>(v_); }

  // Precondition: ok().
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace rdkv

// Propagates a non-OK Status to the caller.
#define RDKV_RETURN_IF_ERROR(expr)               \
  do {                                           \
    ::rdkv::Status rdkv_status_ = (expr);        \
    if (!rdkv_status_.ok()) return rdkv_status_; \
  } while (0)

#define RDKV_CONCAT_INNER_(a, b) a##b
#define RDKV_CONCAT_(a, b) RDKV_CONCAT_INNER_(a, b)
// Declares `lhs` from a Result's value, or returns its Status.
#define RDKV_ASSIGN_OR_RETURN(lhs, expr)                  \
  auto RDKV_CONCAT_(rdkv_result_, __LINE__) = (expr);     \
  if (!RDKV_CONCAT_(rdkv_result_, __LINE__).ok())         \
    return RDKV_CONCAT_(rdkv_result_, __LINE__).status(); \
  lhs = std::move(RDKV_CONCAT_(rdkv_result_, __LINE__)).value()

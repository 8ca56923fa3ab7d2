#include "rdkv/status.h"

#include <cstring>

namespace rdkv {

std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "OK";
    case StatusCode::kNotFound:
      return "NotFound";
    case StatusCode::kInvalidArgument:
      return "InvalidArgument";
    case StatusCode::kAlreadyExists:
      return "AlreadyExists";
    case StatusCode::kVersionMismatch:
      return "VersionMismatch";
    case StatusCode::kOutOfSpace:
      return "OutOfSpace";
    case StatusCode::kTimedOut:
      return "TimedOut";
    case StatusCode::kUnavailable:
      return "Unavailable";
    case StatusCode::kConnectionLost:
      return "ConnectionLost";
    case StatusCode::kPermissionDenied:
      return "PermissionDenied";
    case StatusCode::kRemoteAccessError:
      return "RemoteAccessError";
    case StatusCode::kCorruption:
      return "Corruption";
    case StatusCode::kIoError:
      return "IoError";
    case StatusCode::kBusy:
      return "Busy";
    case StatusCode::kWrongOwner:
      return "WrongOwner";
    case StatusCode::kInternal:
      return "Internal";
    case StatusCode::kNotSupported:
      return "NotSupported";
    case StatusCode::kProtocolError:
      return "ProtocolError";
  }
  return "Unknown";
}

Status Status::FromErrno(std::string_view what, int err) {
  char buf[256];
  // GNU strerror_r returns a pointer that may or may not be buf.
  const char* text = strerror_r(err, buf, sizeof(buf));
  return Status(StatusCode::kIoError, std::string(what) + ": " + text);
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  std::string out(StatusCodeName(code_));
  if (!message_.empty()) {
    out += ": ";
    out += message_;
  }
  return out;
}

}  // namespace rdkv

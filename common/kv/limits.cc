#include "common/kv/limits.h"

#include <string>

namespace rdkv::kv {

Status CheckKey(std::string_view key) {
  if (key.empty()) {
    return Status::InvalidArgument("key is empty (keys are 1.." + std::to_string(kMaxKeyBytes) +
                                   " bytes)");
  }
  if (key.size() > kMaxKeyBytes) {
    return Status::InvalidArgument("key of " + std::to_string(key.size()) +
                                   " bytes is longer than the limit of " +
                                   std::to_string(kMaxKeyBytes) + " bytes");
  }
  return Status::Ok();
}

Status CheckValueSize(size_t value_bytes, uint64_t max_value_bytes) {
  if (value_bytes > max_value_bytes) {
    return Status::InvalidArgument("value of " + std::to_string(value_bytes) +
                                   " bytes is larger than the server's limit of " +
                                   std::to_string(max_value_bytes) + " bytes");
  }
  return Status::Ok();
}

Status CheckItemVersion(uint64_t version, std::string_view what) {
  if (version == 0 || version > kMaxItemVersion) {
    return Status::InvalidArgument(std::string(what) + " " + std::to_string(version) +
                                   " is outside 1.." + std::to_string(kMaxItemVersion) +
                                   " (the largest item version; versions never wrap)");
  }
  return Status::Ok();
}

}  // namespace rdkv::kv

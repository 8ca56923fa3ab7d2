// Internal entry points of the client library, for its tests (not installed).
#pragma once

#include <memory>

#include "common/transport/transport.h"
#include "rdkv/client.h"

namespace rdkv::client {

// Client::Connect with a caller-provided fabric (tests use an in-memory fake to inject torn
// reads, slow reads and READ errors). Takes ownership of `fabric`.
Result<std::unique_ptr<Client>> ConnectWithFabric(const ClientOptions& options,
                                                  std::unique_ptr<transport::Fabric> fabric);

// How CheckItem's verdict on one candidate item is acted upon by a GET (client/get_engine.cc).
enum class Verdict : uint8_t {
  kAccept,   // a LIVE, intact item of the key
  kForeign,  // an intact item of another key (a fingerprint collision): not this key's slot
  kRetry,    // torn, retired or unreadable: the key's slot changed under the READ
};
// `torn` is set when the item failed its checksum (for the torn_reads counter).
Verdict ClassifyItem(const uint8_t* bytes, size_t n, std::string_view key, std::string_view* value,
                     uint64_t* version, bool* torn);

// "key 'abc'" with non-printable bytes escaped and long keys shortened, for error messages
// (client/call.cc).
std::string DescribeKey(std::string_view key);

}  // namespace rdkv::client

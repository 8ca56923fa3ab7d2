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
  kAccept,   // an intact item of the key that this path may return
  kForeign,  // an intact item of another key (a fingerprint collision): not this key's slot
  kRetry,    // torn, unreadable, or (cached location) not LIVE: the key's slot changed
};
// How the GET got to the item's address; it decides whether a retired item is an answer
// (docs/design.md "index path, found").
enum class Reach : uint8_t {
  // A remembered location (cache path, or a contended key's item READ beside its buckets):
  // only a LIVE item proves it is the key's current value.
  kCachedLocation,
  // A slot word whose READ completed before this item READ was posted, within read_deadline,
  // on a server that owned the key's shard before that slot READ: the item was the key's
  // current value when the slot was read, so a retired (DEAD) one is an answer too. PENDING is
  // not: only a grace period longer than read_deadline would make it the slot's item.
  kSlotReadFirst,
};
// `torn` is set when the item failed its checksum (for the torn_reads counter); `live` (when
// not null) tells whether an accepted item was LIVE.
Verdict ClassifyItem(const uint8_t* bytes, size_t n, std::string_view key, std::string_view* value,
                     uint64_t* version, bool* torn, Reach reach = Reach::kCachedLocation,
                     bool* live = nullptr);

// "key 'abc'" with non-printable bytes escaped and long keys shortened, for error messages
// (client/call.cc).
std::string DescribeKey(std::string_view key);

}  // namespace rdkv::client

// One live connection to one server, with what the client learned from its region header.
//
// A Session is immutable after OpenSession except for `broken` and the quarantine. Threads
// hold it through a shared_ptr for the duration of one call; a reconnect replaces it in the
// Link and the old one is destroyed (closing its Connection) when its last user is done.
//
// Thread-safety: every method is safe from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "client/read_buffers.h"
#include "common/kv/layout.h"
#include "common/transport/transport.h"
#include "common/util/mutex.h"
#include "common/util/units.h"
#include "rdkv/client.h"

namespace rdkv::client {

// Where a server listens (ParseHostPort reads it, FormatHostPort writes it).
struct ServerAddress {
  std::string host;   // a name or an address; IPv6 without the brackets
  uint16_t port = 0;  // 1..65535
  std::string ToString() const { return FormatHostPort(host, port); }
};

class Session {
 public:
  Session(std::unique_ptr<transport::Connection> conn, const kv::RegionHeader& header,
          const transport::RegionDescriptor& region, ScratchPool* pool);
  // Closes the connection first, then gives quarantined scratches back to the pool.
  ~Session();

  transport::Connection& conn() const { return *conn_; }
  const kv::RegionHeader& header() const { return header_; }
  const transport::RegionDescriptor& region() const { return region_; }
  // Absolute remote address of a region offset.
  uint64_t RemoteAddr(uint64_t offset) const { return region_.addr + offset; }

  bool usable() const { return !broken_.load(std::memory_order_acquire) && conn_->alive(); }
  // The next call replaces this session.
  void MarkBroken() { broken_.store(true, std::memory_order_release); }

  // Keeps a scratch whose READs are still owned by the transport (a timed-out wait) until
  // they complete or the connection is closed; then it goes back to the pool.
  void Quarantine(std::unique_ptr<ReadScratch> scratch);

  // --- the ownership lease (cluster mode; docs/design.md "Stale maps and one-sided GETs") ---
  enum class LeaseVerdict : uint8_t { kOk, kExpired, kNotOwned };
  // Whether the caller's next batch (posted at `now`) should carry an ownership READ: yes when
  // there is no lease or it has expired (older than 2 x `half_lease`); when it is older than
  // `half_lease` but still valid, only the first caller is told yes (it claims the refresh)
  // and the others ride on the lease they have until that refresh is recorded (UpdateLease);
  // if it never is (its READ failed), the lease expires and every caller is told yes again.
  bool ClaimLeaseRefresh(std::chrono::steady_clock::time_point now,
                         std::chrono::steady_clock::duration half_lease);
  // Records an ownership READ (kOwnershipBytes) posted at `posted` (client clock, taken before
  // posting). An older READ than the one recorded is ignored.
  void UpdateLease(std::chrono::steady_clock::time_point posted, const uint8_t* ownership);
  // Whether a READ that completed at `completed` may be used for `shard`: kOk when the last
  // ownership READ showed the shard owned and completed < posted + lease; kNotOwned when it
  // showed it not owned; kExpired otherwise (no lease, or too old).
  LeaseVerdict CheckLease(uint32_t shard, std::chrono::steady_clock::time_point completed,
                          std::chrono::steady_clock::duration lease) const;
  // The map epoch the last ownership READ showed (0 when none).
  uint64_t lease_epoch() const;

 private:
  std::unique_ptr<transport::Connection> conn_;
  const kv::RegionHeader header_;
  const transport::RegionDescriptor region_;
  ScratchPool* pool_;
  std::atomic<bool> broken_{false};
  Mutex quarantine_mu_;
  std::vector<std::unique_ptr<ReadScratch>> quarantine_ GUARDED_BY(quarantine_mu_);
  mutable Mutex lease_mu_;
  bool lease_valid_ GUARDED_BY(lease_mu_) = false;
  std::chrono::steady_clock::time_point lease_posted_ GUARDED_BY(lease_mu_);
  uint64_t lease_epoch_ GUARDED_BY(lease_mu_) = 0;
  uint64_t owned_[kv::kMaxShards / 64] GUARDED_BY(lease_mu_) = {};
  bool refresh_claimed_ GUARDED_BY(lease_mu_) = false;
};

// Validates a region header READ from a server (magic, layout version, checksum, geometry
// against the advertised region). kProtocolError naming the first problem found.
Status ValidateRegionHeader(const kv::RegionHeader& h, const transport::RegionDescriptor& region);

// Connects to `address` over `fabric`, READs and validates the region header.
// Errors: kUnavailable / kTimedOut / kPermissionDenied from the transport, kProtocolError for
// a region this client cannot read. Messages do not name the server: the caller does, once
// (Links::SessionOf).
Result<std::shared_ptr<Session>> OpenSession(transport::Fabric* fabric,
                                             const ServerAddress& address,
                                             const ClientOptions& options, ScratchPool* pool);

}  // namespace rdkv::client

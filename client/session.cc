#include "client/session.h"

#include <cstring>

#include "common/kv/wire.h"

namespace rdkv::client {

Session::Session(std::unique_ptr<transport::Connection> conn, const kv::RegionHeader& header,
                 const transport::RegionDescriptor& region, ScratchPool* pool)
    : conn_(std::move(conn)), header_(header), region_(region), pool_(pool) {}

Session::~Session() {
  conn_.reset();                 // every READ it owned is now void: its destination may be reused
  MutexLock l(&quarantine_mu_);  // no other user is left; taken for the analysis
  for (auto& s : quarantine_) {
    for (size_t i = 0; i < s->op_capacity; ++i) {
      if (!s->ops[i].done()) s->ops[i].status.store(transport::ReadStatus::kConnectionLost);
    }
    pool_->Release(std::move(s));
  }
}

void Session::Quarantine(std::unique_ptr<ReadScratch> scratch) {
  std::vector<std::unique_ptr<ReadScratch>> ready;
  {
    MutexLock l(&quarantine_mu_);
    quarantine_.push_back(std::move(scratch));
    for (size_t i = 0; i < quarantine_.size();) {
      if (quarantine_[i]->Idle()) {
        ready.push_back(std::move(quarantine_[i]));
        quarantine_[i] = std::move(quarantine_.back());
        quarantine_.pop_back();
      } else {
        ++i;
      }
    }
  }
  for (auto& s : ready) pool_->Release(std::move(s));
}

bool Session::ClaimLeaseRefresh(std::chrono::steady_clock::time_point now,
                                std::chrono::steady_clock::duration half_lease) {
  MutexLock l(&lease_mu_);
  if (lease_valid_ && now - lease_posted_ <= half_lease) return false;  // fresh
  bool expired = !lease_valid_ || now - lease_posted_ >= 2 * half_lease;
  // Another batch is refreshing it and this one is still covered. A claim whose READ failed
  // is never recorded; the lease then expires and every batch probes again.
  if (!expired && refresh_claimed_) return false;
  refresh_claimed_ = true;
  return true;
}

void Session::UpdateLease(std::chrono::steady_clock::time_point posted, const uint8_t* ownership) {
  MutexLock l(&lease_mu_);
  if (lease_valid_ && posted < lease_posted_) return;
  lease_valid_ = true;
  lease_posted_ = posted;
  refresh_claimed_ = false;
  std::memcpy(&lease_epoch_, ownership, 8);
  std::memcpy(owned_, ownership + 8, sizeof(owned_));
}

Session::LeaseVerdict Session::CheckLease(uint32_t shard,
                                          std::chrono::steady_clock::time_point completed,
                                          std::chrono::steady_clock::duration lease) const {
  MutexLock l(&lease_mu_);
  if (!lease_valid_ || shard >= kv::kMaxShards) return LeaseVerdict::kExpired;
  if (!kv::OwnsShard(owned_, shard)) return LeaseVerdict::kNotOwned;
  if (completed >= lease_posted_ + lease) return LeaseVerdict::kExpired;
  return LeaseVerdict::kOk;
}

uint64_t Session::lease_epoch() const {
  MutexLock l(&lease_mu_);
  return lease_epoch_;
}

namespace {
// "layout version N (...), this client reads M": the refusal of a region of another layout.
std::string LayoutMismatch(uint32_t version) {
  const char* what = version == 1   ? " (a server from before index v2)"
                     : version == 2 ? " (a server from before compact items: 64-byte units)"
                     : version < kv::kLayoutVersion ? " (an older server)"
                                                    : " (a newer server)";
  return "layout version " + std::to_string(version) + what + ", this client reads " +
         std::to_string(kv::kLayoutVersion);
}
}  // namespace

Status ValidateRegionHeader(const kv::RegionHeader& h, const transport::RegionDescriptor& region) {
  auto bad = [](const std::string& why) {
    return Status::ProtocolError("server region header: " + why);
  };
  if (h.magic != kv::kRegionMagic) return bad("bad magic (not an rdkv region)");
  if (h.layout_version != kv::kLayoutVersion) {
    return bad(LayoutMismatch(h.layout_version));
  }
  if (h.header_checksum != kv::HeaderChecksum(h)) return bad("checksum mismatch");
  if (h.header_bytes < sizeof(kv::RegionHeader) || h.header_bytes > kv::kHeaderBytes) {
    return bad("header size " + std::to_string(h.header_bytes) + " is invalid");
  }
  if (h.region_bytes > region.length) {
    return bad("region of " + std::to_string(h.region_bytes) + " bytes is larger than the " +
               std::to_string(region.length) + " bytes registered");
  }
  if (h.region_bytes < kv::kHeaderBytes) return bad("region size is smaller than the header");
  if (h.index_offset < kv::kHeaderBytes || h.index_offset % kv::kBucketBytes != 0 ||
      h.index_offset >= h.region_bytes || h.bucket_count < 2 ||
      h.bucket_count > (h.region_bytes - h.index_offset) / kv::kBucketBytes ||
      h.index_offset + h.bucket_count * kv::kBucketBytes > h.heap_offset) {
    return bad("index geometry is invalid");
  }
  if (h.heap_offset % kv::kUnit != 0 || h.heap_offset > h.region_bytes ||
      h.heap_bytes > h.region_bytes - h.heap_offset) {
    return bad("heap geometry is invalid");
  }
  if (h.max_value_bytes == 0 ||
      kv::UnitsFor(kv::ItemBytes(kv::kMaxKeyBytes, h.max_value_bytes)) > kv::kMaxItemUnits) {
    return bad("max_value_bytes " + std::to_string(h.max_value_bytes) + " is out of range");
  }
  return Status::Ok();
}

namespace {

Result<std::unique_ptr<transport::Connection>> ConnectOnce(transport::Fabric* fabric,
                                                           const ServerAddress& address,
                                                           const ClientOptions& options,
                                                           size_t max_message_size) {
  transport::ConnectOptions co;
  co.host = address.host;
  co.port = address.port;
  co.auth_token = options.auth_token;
  if (!options.admin_token.empty()) {
    co.auth_token = options.admin_token;
    co.role = transport::SessionRole::kAdmin;
  }
  co.tls.ca_file = options.tls.ca_file;
  co.tls.cert_file = options.tls.cert_file;
  co.tls.key_file = options.tls.key_file;
  co.connect_timeout = options.connect_timeout;
  co.max_outstanding_reads = options.max_outstanding_reads;
  co.busy_poll = options.busy_poll;
  co.max_message_size = max_message_size;
  auto conn = fabric->Connect(co);
  if (!conn.ok()) return conn.status();
  return std::move(conn).value();
}

}  // namespace

Result<std::shared_ptr<Session>> OpenSession(transport::Fabric* fabric,
                                             const ServerAddress& address,
                                             const ClientOptions& options, ScratchPool* pool) {
  // Room for the largest request to a server with kvserver's largest --max_value_size (1 MiB);
  // a server with a larger limit gets a second connection sized for it.
  size_t max_message = kv::MaxMessageBytes(kv::kMaxValueBytes);
  for (int round = 0; round < 2; ++round) {
    RDKV_ASSIGN_OR_RETURN(std::unique_ptr<transport::Connection> conn,
                          ConnectOnce(fabric, address, options, max_message));
    const auto& regions = conn->regions();
    if (regions.empty()) {
      return Status::ProtocolError("advertised no region");
    }
    const transport::RegionDescriptor region = regions[0];
    if (region.layout_version != kv::kLayoutVersion) {
      return Status::ProtocolError("region has " + LayoutMismatch(region.layout_version));
    }
    if (region.length < kv::kHeaderBytes) {
      return Status::ProtocolError("region is smaller than its header");
    }
    RDKV_ASSIGN_OR_RETURN(
        std::unique_ptr<transport::MemoryRegion> buf,
        fabric->AllocateRegion(kv::kHeaderBytes, transport::RegionAccess::kLocal));
    transport::ReadOp op;
    op.local = buf->data();
    op.lkey = buf->lkey();
    op.remote_addr = region.addr;
    op.rkey = region.rkey;
    op.length = kv::kHeaderBytes;
    transport::ReadOp* ops[] = {&op};
    Status s = conn->ReadAndWait(ops, std::chrono::steady_clock::now() + options.connect_timeout);
    if (!s.ok()) {
      // On a timeout the READ still owns `buf`: close the connection before freeing it.
      conn.reset();
      return Status(s.code(), "reading the region header: " + s.message());
    }
    if (op.status.load() != transport::ReadStatus::kOk) {
      return Status::Unavailable("reading the region header failed (READ status " +
                                 std::to_string(static_cast<int>(op.status.load())) + ")");
    }
    kv::RegionHeader header;
    std::memcpy(&header, buf->data(), sizeof(header));
    Status valid = ValidateRegionHeader(header, region);
    if (!valid.ok()) return valid;
    // Requests carry up to a full key and value: make sure the connection can send them.
    size_t need = kv::MaxMessageBytes(header.max_value_bytes);
    if (need > max_message && round == 0) {
      max_message = need;
      continue;  // reconnect with room for the server's largest value
    }
    return std::make_shared<Session>(std::move(conn), header, region, pool);
  }
  return Status::Internal("could not size the connection's messages");
}

}  // namespace rdkv::client

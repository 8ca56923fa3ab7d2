// An in-process fake of the fabric and of a kvserver's region, for the client's unit tests.
//
// FakeServer owns a region formatted like kvserver's (header, index, heap) and a tiny store
// (bump allocation, no reuse unless asked) that follows docs/design.md's write order. READs
// are memcpy's from the region; hooks let a test tear, slow down or fail them. Calls run the
// wire protocol against the store.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/kv/layout.h"
#include "common/kv/wire.h"
#include "common/transport/transport.h"

namespace rdkv::testing {

class FakeServer {
 public:
  explicit FakeServer(size_t region_bytes = 1 << 20, uint64_t max_value = 64 << 10)
      : bytes_(region_bytes), max_value_(max_value) {
    region_ = static_cast<uint8_t*>(std::aligned_alloc(4096, bytes_));
    Format();
  }
  ~FakeServer() { std::free(region_); }

  // Reformats the region as a new server incarnation (a restart).
  void Format() {
    std::lock_guard<std::mutex> l(mu_);
    std::memset(region_, 0, bytes_);
    kv::Geometry g = kv::ComputeGeometry(bytes_, 1.0 / 16);
    kv::RegionHeader h{};
    h.magic = kv::kRegionMagic;
    h.layout_version = kv::kLayoutVersion;
    h.header_bytes = kv::kHeaderBytes;
    h.region_bytes = bytes_;
    h.index_offset = g.index_offset;
    h.bucket_count = g.bucket_count;
    h.heap_offset = g.heap_offset;
    h.heap_bytes = g.heap_bytes;
    h.incarnation = ++incarnation_counter_ * 7919;
    h.max_value_bytes = max_value_;
    h.shard_count = 1;
    h.header_checksum = kv::HeaderChecksum(h);
    std::memcpy(region_, &h, sizeof(h));
    bump_units_ = 0;
  }

  kv::RegionHeader header() const {
    kv::RegionHeader h;
    std::memcpy(&h, region_, sizeof(h));
    return h;
  }
  void SetHeader(const kv::RegionHeader& h) { std::memcpy(region_, &h, sizeof(h)); }
  uint8_t* region() const { return region_; }
  size_t size() const { return bytes_; }

  // --- the store (design order: write item, store slot, retire old) ---
  struct Found {
    uint64_t* slot = nullptr;
    kv::ItemHeader item{};
  };

  uint64_t* Window(uint64_t hash) {
    kv::RegionHeader h = header();
    return reinterpret_cast<uint64_t*>(region_ + h.index_offset +
                                       kv::BucketOf(hash, h.bucket_count) * kv::kBucketBytes);
  }

  uint8_t* ItemAt(uint32_t offset_units) {
    return region_ + header().heap_offset + uint64_t{offset_units} * kv::kUnit;
  }

  // The slot holding `key`, or nullptr.
  uint64_t* FindSlot(std::string_view key) {
    uint64_t hash = kv::KeyHash(key);
    uint64_t* w = Window(hash);
    for (size_t i = 0; i < 16; ++i) {
      if (w[i] == 0) continue;
      kv::SlotFields f = kv::UnpackSlot(w[i]);
      if (f.fingerprint != kv::FingerprintOf(hash)) continue;
      const uint8_t* it = ItemAt(f.offset_units);
      kv::ItemHeader ih;
      std::memcpy(&ih, it, sizeof(ih));
      if (ih.key_bytes == key.size() &&
          std::memcmp(it + sizeof(ih), key.data(), key.size()) == 0) {
        return &w[i];
      }
    }
    return nullptr;
  }

  // Writes an item at `offset_units` (or the bump pointer when offset_units is ~0u) and returns
  // its slot word.
  uint64_t WriteItem(std::string_view key, std::string_view value, uint64_t version,
                     uint32_t state = kv::kStateLive, uint32_t at = ~0u) {
    kv::ItemHeader ih{};
    ih.state = state;
    ih.key_bytes = static_cast<uint32_t>(key.size());
    ih.value_bytes = static_cast<uint32_t>(value.size());
    ih.units = kv::UnitsFor(kv::ItemBytes(key.size(), value.size()));
    ih.version = version;
    ih.checksum = kv::ItemChecksum(ih, key, value);
    uint32_t off = at;
    if (off == ~0u) {
      off = bump_units_;
      bump_units_ += ih.units;
    }
    uint8_t* p = ItemAt(off);
    std::memcpy(p, &ih, sizeof(ih));
    std::memcpy(p + sizeof(ih), key.data(), key.size());
    std::memcpy(p + sizeof(ih) + key.size(), value.data(), value.size());
    return kv::PackSlot({kv::FingerprintOf(kv::KeyHash(key)), static_cast<uint16_t>(ih.units), off});
  }

  void Retire(uint64_t slot_word) {
    kv::SlotFields f = kv::UnpackSlot(slot_word);
    uint8_t* p = ItemAt(f.offset_units);
    kv::ItemHeader ih;
    std::memcpy(&ih, p, sizeof(ih));
    ih.state = kv::kStateDead;
    std::string_view k(reinterpret_cast<char*>(p + sizeof(ih)), ih.key_bytes);
    std::string_view v(reinterpret_cast<char*>(p + sizeof(ih) + ih.key_bytes), ih.value_bytes);
    ih.checksum = kv::ItemChecksum(ih, k, v);
    std::memcpy(p, &ih, sizeof(ih));
  }

  uint64_t CurrentVersion(std::string_view key) {
    uint64_t* s = FindSlot(key);
    if (s == nullptr) return 0;
    kv::ItemHeader ih;
    std::memcpy(&ih, ItemAt(kv::UnpackSlot(*s).offset_units), sizeof(ih));
    return ih.version;
  }

  // Applies a write; returns the status and new version as kvserver would.
  Status Apply(kv::Op op, std::string_view key, std::string_view value, uint64_t expected,
               uint64_t* version) {
    std::lock_guard<std::mutex> l(mu_);
    uint64_t* slot = FindSlot(key);
    if (op == kv::Op::kDelete) {
      if (slot == nullptr) return Status::NotFound("no such key");
      uint64_t old = *slot;
      *slot = 0;
      Retire(old);
      return Status::Ok();
    }
    if (op == kv::Op::kInsert && slot != nullptr) return Status::AlreadyExists("key exists");
    if (op == kv::Op::kCas) {
      if (slot == nullptr) return Status::NotFound("no such key");
      uint64_t cur = CurrentVersion(key);
      if (cur != expected) {
        *version = cur;
        return Status::VersionMismatch("version is " + std::to_string(cur));
      }
    }
    uint64_t* target = slot;
    if (target == nullptr) {
      uint64_t* w = Window(kv::KeyHash(key));
      for (size_t i = 0; i < 16 && target == nullptr; ++i) {
        if (w[i] == 0) target = &w[i];
      }
      if (target == nullptr) return Status::OutOfSpace("index window full");
    }
    uint32_t at = ~0u;
    if (reuse_next_.has_value()) {
      at = *reuse_next_;
      reuse_next_.reset();
    }
    *version = ++version_counter_;
    uint64_t word = WriteItem(key, value, *version, kv::kStateLive, at);
    uint64_t old = *target;
    __atomic_store_n(target, word, __ATOMIC_RELEASE);
    if (slot != nullptr) Retire(old);
    return Status::Ok();
  }

  // The next write places its item at this offset (to test reuse of a freed block).
  void ReuseNext(uint32_t offset_units) {
    std::lock_guard<std::mutex> l(mu_);
    reuse_next_ = offset_units;
  }

  void HandleCall(std::span<const uint8_t> request, std::vector<uint8_t>* response) {
    ++calls;
    auto req = kv::DecodeRequest(request, kv::WireLimits{1024, max_value_});
    if (!req.ok()) {
      kv::EncodeResponse(req.status(), 0, {}, response);
      return;
    }
    uint64_t version = 0;
    Status s;
    std::string body;
    switch (req->op) {
      case kv::Op::kStats: body = R"({"items":1})"; break;
      case kv::Op::kPing: break;
      default: s = Apply(req->op, req->key, req->value, req->expected_version, &version);
    }
    kv::EncodeResponse(s, version, body, response);
  }

  // --- knobs for the fake connection ---
  std::string token;
  std::atomic<bool> down{false};         // Connect fails kUnavailable
  std::atomic<uint64_t> generation{0};   // bump to kill every open connection
  std::atomic<uint64_t> reads{0};        // READs served
  std::atomic<uint64_t> calls{0};
  std::atomic<bool> calls_time_out{false};
  uint32_t rkey = 0x5eed;
  // Called after each READ's copy; may alter the destination or return a failure status.
  std::function<transport::ReadStatus(transport::ReadOp& op, uint64_t offset)> on_read;

 private:
  size_t bytes_;
  uint64_t max_value_;
  uint8_t* region_;
  std::mutex mu_;
  uint32_t bump_units_ = 0;
  uint64_t version_counter_ = 0;
  uint64_t incarnation_counter_ = 0;
  std::optional<uint32_t> reuse_next_;
};

class FakeMemory : public transport::MemoryRegion {
 public:
  explicit FakeMemory(size_t n) : n_(n) {
    p_ = static_cast<uint8_t*>(std::aligned_alloc(64, (n + 63) / 64 * 64));
    std::memset(p_, 0, n);
  }
  ~FakeMemory() override { std::free(p_); }
  uint8_t* data() const override { return p_; }
  size_t size() const override { return n_; }
  uint32_t lkey() const override { return 1; }
  uint32_t rkey() const override { return 0; }
  bool huge_pages() const override { return false; }

 private:
  uint8_t* p_;
  size_t n_;
};

class FakeConnection : public transport::Connection {
 public:
  explicit FakeConnection(FakeServer* s) : s_(s), generation_(s->generation.load()) {
    regions_.push_back({reinterpret_cast<uint64_t>(s->region()), s->size(), s->rkey,
                        kv::kLayoutVersion});
  }
  const std::vector<transport::RegionDescriptor>& regions() const override { return regions_; }

  Status PostReads(std::span<transport::ReadOp* const> ops) override {
    if (!alive()) return Status::ConnectionLost("fake: connection closed");
    for (transport::ReadOp* op : ops) {
      transport::ReadStatus st = transport::ReadStatus::kOk;
      uint64_t base = regions_[0].addr;
      if (op->rkey != s_->rkey || op->remote_addr < base ||
          op->remote_addr + op->length > base + s_->size()) {
        st = transport::ReadStatus::kRemoteAccessError;
      } else {
        std::memcpy(op->local, reinterpret_cast<const void*>(op->remote_addr), op->length);
        ++s_->reads;
        if (s_->on_read) st = s_->on_read(*op, op->remote_addr - base);
      }
      op->status.store(st, std::memory_order_release);
    }
    return Status::Ok();
  }
  size_t PollReads() override { return 0; }
  Status ReadAndWait(std::span<transport::ReadOp* const> ops,
                     std::chrono::steady_clock::time_point) override {
    return PostReads(ops);
  }
  Status Call(std::span<const uint8_t> request, std::vector<uint8_t>* response,
              std::chrono::milliseconds) override {
    if (!alive()) return Status::ConnectionLost("fake: connection closed");
    if (s_->calls_time_out) return Status::TimedOut("fake: no response");
    s_->HandleCall(request, response);
    return Status::Ok();
  }
  bool alive() const override { return !s_->down && s_->generation.load() == generation_; }
  std::string peer() const override { return "fake 127.0.0.1:1"; }

 private:
  FakeServer* s_;
  uint64_t generation_;
  std::vector<transport::RegionDescriptor> regions_;
};

class FakeFabric : public transport::Fabric {
 public:
  explicit FakeFabric(FakeServer* s) : s_(s) {}
  transport::TransportKind kind() const override { return transport::TransportKind::kTcp; }
  std::string Describe() const override { return "fake"; }
  Result<std::unique_ptr<transport::MemoryRegion>> AllocateRegion(
      size_t size, transport::RegionAccess) override {
    ++allocations;
    return std::unique_ptr<transport::MemoryRegion>(std::make_unique<FakeMemory>(size));
  }
  Result<std::unique_ptr<transport::Listener>> Listen(transport::ListenOptions) override {
    return Status::NotSupported("fake");
  }
  Result<std::unique_ptr<transport::Connection>> Connect(
      const transport::ConnectOptions& o) override {
    if (s_->down) return Status::Unavailable("fake: connection refused");
    if (o.auth_token != s_->token) return Status::PermissionDenied("fake: bad token");
    return std::unique_ptr<transport::Connection>(std::make_unique<FakeConnection>(s_));
  }
  std::atomic<int> allocations{0};

 private:
  FakeServer* s_;
};

}  // namespace rdkv::testing

// An in-process fake of the fabric and of a kvserver, for the client's unit tests.
//
// FakeServer's region is formatted and written by the real server::Store (server/store.h), so
// every write publishes in kvserver's order (docs/design.md, "Server"): the new item complete
// and PENDING, the old item DEAD, the slot stored, the new item LIVE, the old block into limbo.
// READs are memcpy's from the region. Calls run the wire protocol against the store.
//
// On top of the real store, a fault-injecting environment (in the manner of RocksDB's
// FaultInjectionTestEnv: the real thing, plus faults a test asks for by name):
//   - on_read: after each READ's copy, may alter the destination or fail the READ (torn,
//     slow, lost READs);
//   - WriteItem / Retire / Bucket / FindSlot: items and slot words the store would never write
//     (foreign items under a key's fingerprint, a new item linked while the old one is LIVE).
//     WriteItem places items in the injection area, the heap's last part, which the store's
//     allocator never hands out (the region header counts it in the heap, so clients read it);
//   - ReuseNext: the next write's item lands in a given block, as if the allocator had
//     reused that block before its grace period ended;
//   - SetHeader, down, generation, calls_time_out: a damaged header, a server that is gone,
//     broken connections, calls that are not answered.
// Outside ReuseNext, retired blocks wait a grace period of 20 s (twice the read deadline the
// client tests use), so a block is not reused under a reader unless a test asks for it.
// Keys that a test has linked to an injected item by hand (a slot word it stored itself) must
// not be written through the store afterwards: the store would retire a block it never gave.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/kv/layout.h"
#include "common/kv/wire.h"
#include "common/transport/transport.h"
#include "server/store.h"

namespace rdkv::testing {

class FakeServer {
 public:
  // `grace`: how long retired blocks wait before the store reuses them; the default is twice
  // the read deadline FakeClientTest gives its clients (kvserver's rule: deadline <= grace / 2).
  explicit FakeServer(size_t region_bytes = 1 << 20, uint64_t max_value = 64 << 10,
                      std::chrono::milliseconds grace = std::chrono::seconds(20))
      : bytes_(region_bytes), max_value_(max_value), grace_(grace) {
    region_ = static_cast<uint8_t*>(std::aligned_alloc(4096, bytes_));
    Format();
  }
  ~FakeServer() {
    store_.reset();
    std::free(region_);
  }

  // Reformats the region as a new server incarnation (a restart; durability none: versions
  // start again from 1).
  void Format() {
    std::lock_guard<std::mutex> l(mu_);
    store_.reset();
    std::memset(region_, 0, bytes_);
    // The store formats all but the injection area; the header then counts that area in the
    // heap (so clients accept slot words pointing there) while the store's allocator, sized at
    // Format, never hands it out.
    const uint64_t reserve = InjectionAreaBytes(bytes_);
    server::StoreOptions o;
    o.max_value_bytes = max_value_;
    o.grace = grace_;
    // Every update makes a new item, so that a test makes a stale location or a retired item
    // with any rewrite. (In-place updates: StoreTest and ClientTorture, against a real store.)
    o.update_in_place = false;
    auto store = server::Store::Format(region_, bytes_ - reserve, o);
    if (!store.ok()) std::abort();  // the region is too small for a store: a test bug
    store_ = std::move(store).value();
    kv::RegionHeader h = header();
    injection_base_units_ = static_cast<uint32_t>(h.heap_bytes / kv::kUnit);
    h.region_bytes = bytes_;
    h.heap_bytes = bytes_ - h.heap_offset;
    h.header_checksum = kv::HeaderChecksum(h);
    SetHeader(h);
    injection_next_units_ = injection_base_units_;
    reuse_next_.reset();
  }

  kv::RegionHeader header() const {
    kv::RegionHeader h;
    std::memcpy(&h, region_, sizeof(h));
    return h;
  }
  void SetHeader(const kv::RegionHeader& h) { std::memcpy(region_, &h, sizeof(h)); }
  uint8_t* region() const { return region_; }
  size_t size() const { return bytes_; }
  // The real store (its Get, counters, ...). Replaced by Format.
  server::Store& store() { return *store_; }

  // --- the region, read and written directly (fault injection) ---
  struct Found {
    uint64_t* slot = nullptr;
    kv::ItemHeader item{};
  };

  // The kSlotsPerBucket slots of `key`'s candidate bucket `choice` (0 or 1).
  uint64_t* Bucket(std::string_view key, size_t choice) {
    kv::RegionHeader h = header();
    kv::Buckets b = kv::BucketsOf(kv::KeyHash(key), kv::SecondHash(key), h.bucket_count);
    return reinterpret_cast<uint64_t*>(region_ + h.index_offset + b.b[choice] * kv::kBucketBytes);
  }

  uint8_t* ItemAt(uint32_t offset_units) {
    return region_ + header().heap_offset + uint64_t{offset_units} * kv::kUnit;
  }

  // The slot holding `key`, or nullptr.
  uint64_t* FindSlot(std::string_view key) {
    uint64_t hash = kv::KeyHash(key);
    for (size_t c = 0; c < kv::kChoices; ++c) {
      uint64_t* w = Bucket(key, c);
      for (size_t i = 0; i < kv::kSlotsPerBucket; ++i) {
        uint64_t word = std::atomic_ref<uint64_t>(w[i]).load(std::memory_order_acquire);
        if (word == 0) continue;
        kv::SlotFields f = kv::UnpackSlot(word);
        if (f.fingerprint != kv::FingerprintOf(hash)) continue;
        const uint8_t* it = ItemAt(f.offset_units);
        kv::ItemHeader ih;
        std::memcpy(&ih, it, sizeof(ih));
        if (ih.key_bytes == key.size() &&
            std::memcmp(it + sizeof(ih), key.data(), key.size()) == 0) {
          return &w[i];
        }
      }
    }
    return nullptr;
  }

  // Fault: writes an item the store did not write, at `at` (offset in units) or, when `at` is
  // ~0u, in the injection area; links nothing. Returns the slot word that would point at it.
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
      std::lock_guard<std::mutex> l(mu_);
      off = injection_next_units_;
      if (uint64_t{off + ih.units} * kv::kUnit > header().heap_bytes) std::abort();  // area full
      injection_next_units_ += ih.units;
    }
    uint8_t* p = ItemAt(off);
    std::memcpy(p + sizeof(ih), key.data(), key.size());
    std::memcpy(p + sizeof(ih) + key.size(), value.data(), value.size());
    std::memcpy(p, &ih, sizeof(ih));
    return kv::PackSlot(
        {kv::FingerprintOf(kv::KeyHash(key)), static_cast<uint16_t>(ih.units), off});
  }

  // Fault: marks the item `slot_word` points at DEAD (state and checksum), outside the store.
  void Retire(uint64_t slot_word) {
    kv::SlotFields f = kv::UnpackSlot(slot_word);
    uint8_t* p = ItemAt(f.offset_units);
    kv::ItemHeader ih;
    std::memcpy(&ih, p, sizeof(ih));
    ih.checksum = kv::RestateChecksum(ih.checksum, ih.state, kv::kStateDead);
    ih.state = kv::kStateDead;
    std::memcpy(p, &ih, sizeof(ih));
  }

  // The version of `key`'s current item; 0 when absent.
  uint64_t CurrentVersion(std::string_view key) {
    uint64_t* s = FindSlot(key);
    if (s == nullptr) return 0;
    kv::ItemHeader ih;
    std::memcpy(&ih, ItemAt(kv::UnpackSlot(*s).offset_units), sizeof(ih));
    return ih.version;
  }

  // Applies a write through the store; returns the status and the new version as kvserver
  // would (for kVersionMismatch, *version is the current one).
  Status Apply(kv::Op op, std::string_view key, std::string_view value, uint64_t expected,
               uint64_t* version) {
    std::lock_guard<std::mutex> l(mu_);
    Result<uint64_t> v = uint64_t{0};
    switch (op) {
      case kv::Op::kDelete:
        return store_->Delete(key);
      case kv::Op::kInsert:
        v = store_->Insert(key, value, version);
        // The fake's own answer text, fixed so tests can check the client passes it on.
        if (v.status().Is(StatusCode::kAlreadyExists)) return Status::AlreadyExists("key exists");
        break;
      case kv::Op::kCas:
        v = store_->Cas(key, expected, value, version);
        break;
      default:
        v = store_->Put(key, value);
        break;
    }
    if (!v.ok()) return v.status();
    *version = *v;
    if (reuse_next_.has_value()) {
      MoveItem(key, *reuse_next_);
      reuse_next_.reset();
    }
    return Status::Ok();
  }

  // Fault: the next write places its item at this offset, as if the allocator had reused a
  // freed block before its grace period ended (the store writes it where its allocator says;
  // the fake then copies it into this block and moves the slot there, item first).
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
      case kv::Op::kPut:
      case kv::Op::kInsert:
      case kv::Op::kCas:
      case kv::Op::kDelete:
        s = Apply(req->op, req->key, req->value, req->expected_version, &version);
        break;
      case kv::Op::kStats:
        body = R"({"items":1})";
        break;  // a fixed body, for tests
      case kv::Op::kPing:
        break;
      case kv::Op::kClusterMap:
        break;  // standalone, as kvserver: an empty map, epoch 0
      default:
        s = Status::NotSupported("the fake server is standalone, without persistence");
    }
    kv::EncodeResponse(s, version, body, response);
  }

  // --- knobs for the fake connection ---
  std::string token;
  std::atomic<bool> down{false};             // Connect fails kUnavailable
  std::atomic<bool> refuse_connects{false};  // Connect fails; open connections keep working
  std::atomic<uint64_t> generation{0};       // bump to kill every open connection
  std::atomic<uint64_t> reads{0};            // READs served
  std::atomic<uint64_t> calls{0};
  std::atomic<bool> calls_time_out{false};
  // Set before connecting or while no call runs: called for each Call; an error is what the
  // call gets instead (kTimedOut: no answer; any other code: the server's answer), OK handles it.
  std::function<Status()> on_call;
  uint32_t rkey = 0x5eed;
  // The layout version the transport advertises for the region (a test of the refusal sets an
  // older one); the region header carries its own.
  uint32_t advertised_layout_version = kv::kLayoutVersion;
  // Called after each READ's copy; may alter the destination or return a failure status.
  std::function<transport::ReadStatus(transport::ReadOp& op, uint64_t offset)> on_read;

 private:
  static uint64_t InjectionAreaBytes(size_t region_bytes) {
    return std::max<uint64_t>(64 * kv::kUnit, region_bytes / 16 / kv::kUnit * kv::kUnit);
  }

  // Copies `key`'s current item to block `to` and points its slot there (item, then slot).
  // The store's own block is left allocated and unlinked (a leak, for the test's lifetime).
  void MoveItem(std::string_view key, uint32_t to) {
    uint64_t* slot = FindSlot(key);
    if (slot == nullptr) return;
    kv::SlotFields f = kv::UnpackSlot(*slot);
    if (f.offset_units == to) return;
    std::memmove(ItemAt(to), ItemAt(f.offset_units), uint64_t{f.units} * kv::kUnit);
    f.offset_units = to;
    std::atomic_ref<uint64_t>(*slot).store(kv::PackSlot(f), std::memory_order_release);
  }

  size_t bytes_;
  uint64_t max_value_;
  std::chrono::milliseconds grace_;
  uint8_t* region_;
  std::mutex mu_;
  std::unique_ptr<server::Store> store_;
  uint32_t injection_base_units_ = 0;
  uint32_t injection_next_units_ = 0;
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
                        s->advertised_layout_version});
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
    if (s_->on_call) {
      Status injected = s_->on_call();
      if (injected.Is(StatusCode::kTimedOut)) return injected;
      if (!injected.ok()) {
        kv::EncodeResponse(injected, 0, {}, response);
        return Status::Ok();
      }
    }
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
    if (s_->down || s_->refuse_connects) return Status::Unavailable("fake: connection refused");
    if (o.auth_token != s_->token) return Status::PermissionDenied("fake: bad token");
    ++connects;
    return std::unique_ptr<transport::Connection>(std::make_unique<FakeConnection>(s_));
  }
  std::atomic<int> allocations{0};
  std::atomic<int> connects{0};  // connections opened

 private:
  FakeServer* s_;
};

}  // namespace rdkv::testing

// The tcp fabric's memory registration table (its "protection domain"): every region allocated
// through a TcpFabric, with random keys. The software NIC checks READs against it exactly like a
// NIC checks an incoming RDMA READ against its memory-region table, and the client side checks
// a ReadOp's destination against it (lkey + bounds) before writing the payload.
//
// Thread-safety: all methods are thread-safe. Lookups run under a Pin (the registry's lock,
// shared) that the caller keeps while it copies the bytes, so a region can never be unmapped
// in the middle of a copy: Unregister waits for the copies in progress, like deregistering an
// MR.
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_map>

#include "common/transport/transport.h"
#include "common/util/mutex.h"
#include "common/util/thread_annotations.h"

namespace rdkv::transport::tcp {

class RegionRegistry {
 public:
  struct Keys {
    uint32_t lkey = 0;
    uint32_t rkey = 0;
  };
  struct Entry {
    uint8_t* addr = nullptr;
    size_t length = 0;
    RegionAccess access = RegionAccess::kLocal;
  };

  // Draws fresh random (unpredictable, nonzero, unique in this registry) keys for a region.
  Keys Register(uint8_t* addr, size_t length, RegionAccess access) EXCLUDES(mu_);
  void Unregister(const Keys& keys) EXCLUDES(mu_);

  // Holds the registry (its lock, shared) for its scope: no region is unregistered meanwhile.
  //
  //   RegionRegistry::Pin pin(registry);
  //   const uint8_t* src = registry->FindRemote(rkey, addr, length);
  //   ... copy from src ...
  class SCOPED_CAPABILITY Pin {
   public:
    explicit Pin(const RegionRegistry* r) ACQUIRE_SHARED(r->mu_) : mu_(&r->mu_) {
      mu_->ReaderLock();
    }
    ~Pin() RELEASE() { mu_->ReaderUnlock(); }
    Pin(const Pin&) = delete;
    Pin& operator=(const Pin&) = delete;

   private:
    SharedMutex* const mu_;
  };

  // Lookups, under a Pin held for as long as the returned bytes are used. Return nullptr when
  // the key is unknown or [addr, addr+length) is not inside the region. A zero length is never
  // valid.
  //
  // Remote: only kRemoteRead regions, by rkey, with `addr` a remote virtual address.
  const uint8_t* FindRemote(uint32_t rkey, uint64_t addr, uint64_t length) const
      REQUIRES_SHARED(mu_);
  // Local: any region, by lkey.
  uint8_t* FindLocal(uint32_t lkey, const uint8_t* addr, uint64_t length) const
      REQUIRES_SHARED(mu_);

 private:
  // Lock order: taken (shared, by a Pin) before a tcp session's out_mu (the software NIC's
  // READ copies into the session's send buffer under both).
  mutable SharedMutex mu_;
  std::unordered_map<uint32_t, Entry> by_rkey_ GUARDED_BY(mu_);  // kRemoteRead regions only
  std::unordered_map<uint32_t, Entry> by_lkey_ GUARDED_BY(mu_);  // every region
};

// Copies `n` bytes out of a registered region into a send buffer, the way a NIC's DMA engine
// reads host memory: with no synchronization against the application, which may be writing
// the same bytes at the same time. See the definition for why sanitizers are kept out of it.
void DmaCopy(uint8_t* dst, const uint8_t* src, size_t n);

}  // namespace rdkv::transport::tcp

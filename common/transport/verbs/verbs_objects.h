// RAII owners for the verbs and rdma_cm objects the verbs transport uses (control path).
//
// One owner class per object kind. Each is move-only, creates through a static Create() that
// turns the call's failure into a Status naming the call and strerror(errno), and destroys in
// its destructor (or reset()), logging a failed destroy. Conventions checked per call:
//   ibv_create_* / ibv_reg_mr / ibv_alloc_pd / rdma_create_event_channel: NULL + errno
//   ibv_destroy_* / ibv_dealloc_pd / ibv_dereg_mr / ibv_modify_*:          positive errno
//   rdma_* (create_id, destroy_id, create_qp, ...):                        -1 + errno
// Destruction order is the owner's job: memory windows, QP, then CQ (and its completion channel),
// then MRs, then PD, then the device list (which keeps librdmacm's ibv_context alive).
#pragma once

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "common/transport/memory.h"
#include "rdkv/status.h"

namespace rdkv::transport::verbs {

// "<call>: <strerror(err)>" with the given code (kIoError unless said otherwise).
Status CallError(std::string_view call, int err, StatusCode code = StatusCode::kIoError);

// Sets O_NONBLOCK on fd; -1 + errno style is turned into a Status.
Status SetNonBlocking(int fd, std::string_view what);

// librdmacm's device list (rdma_get_devices). The contexts in it are opened and owned by
// librdmacm, shared with every rdma_cm_id that resolves to the device; holding the list keeps
// a reference on each device for as long as this object lives.
class DeviceList {
 public:
  DeviceList() = default;
  ~DeviceList() { reset(); }
  DeviceList(DeviceList&& o) noexcept : list_(std::exchange(o.list_, nullptr)), n_(o.n_) {}
  DeviceList& operator=(DeviceList&& o) noexcept;
  DeviceList(const DeviceList&) = delete;
  DeviceList& operator=(const DeviceList&) = delete;

  static Result<DeviceList> Get();
  int size() const { return n_; }
  ibv_context* operator[](int i) const { return list_[i]; }
  void reset();

 private:
  ibv_context** list_ = nullptr;
  int n_ = 0;
};

class ProtectionDomain {
 public:
  ProtectionDomain() = default;
  ~ProtectionDomain() { reset(); }
  ProtectionDomain(ProtectionDomain&& o) noexcept : pd_(std::exchange(o.pd_, nullptr)) {}
  ProtectionDomain& operator=(ProtectionDomain&& o) noexcept;
  ProtectionDomain(const ProtectionDomain&) = delete;
  ProtectionDomain& operator=(const ProtectionDomain&) = delete;

  static Result<ProtectionDomain> Create(ibv_context* ctx);
  ibv_pd* get() const { return pd_; }
  void reset();

 private:
  ibv_pd* pd_ = nullptr;
};

class MemoryRegistration {
 public:
  MemoryRegistration() = default;
  ~MemoryRegistration() { reset(); }
  MemoryRegistration(MemoryRegistration&& o) noexcept : mr_(std::exchange(o.mr_, nullptr)) {}
  MemoryRegistration& operator=(MemoryRegistration&& o) noexcept;
  MemoryRegistration(const MemoryRegistration&) = delete;
  MemoryRegistration& operator=(const MemoryRegistration&) = delete;

  static Result<MemoryRegistration> Create(ibv_pd* pd, void* addr, size_t length, int access);
  ibv_mr* get() const { return mr_; }
  uint32_t lkey() const { return mr_->lkey; }
  uint32_t rkey() const { return mr_->rkey; }
  void reset();

 private:
  ibv_mr* mr_ = nullptr;
};

// A type-2 memory window (ibv_alloc_mw / ibv_dealloc_mw): a remote key of its own onto part of
// an MR, valid only once bound by an IBV_WR_BIND_MW work request posted on one QP, and then
// only for READs arriving on that QP. ibv_dealloc_mw invalidates it (its rkey then refers to
// nothing). Must be reset before the QP it is bound to and before the MR it covers (rxe refuses
// to deregister an MR with windows bound to it).
class MemoryWindow {
 public:
  MemoryWindow() = default;
  ~MemoryWindow() { reset(); }
  MemoryWindow(MemoryWindow&& o) noexcept : mw_(std::exchange(o.mw_, nullptr)) {}
  MemoryWindow& operator=(MemoryWindow&& o) noexcept;
  MemoryWindow(const MemoryWindow&) = delete;
  MemoryWindow& operator=(const MemoryWindow&) = delete;

  static Result<MemoryWindow> Create(ibv_pd* pd);  // IBV_MW_TYPE_2
  ibv_mw* get() const { return mw_; }
  void reset();

 private:
  ibv_mw* mw_ = nullptr;
};

// A completion channel; its fd is made non-blocking so a waiter can poll() it with a timeout.
class CompletionChannel {
 public:
  CompletionChannel() = default;
  ~CompletionChannel() { reset(); }
  CompletionChannel(CompletionChannel&& o) noexcept : ch_(std::exchange(o.ch_, nullptr)) {}
  CompletionChannel& operator=(CompletionChannel&& o) noexcept;
  CompletionChannel(const CompletionChannel&) = delete;
  CompletionChannel& operator=(const CompletionChannel&) = delete;

  static Result<CompletionChannel> Create(ibv_context* ctx);
  ibv_comp_channel* get() const { return ch_; }
  int fd() const { return ch_->fd; }
  void reset();

 private:
  ibv_comp_channel* ch_ = nullptr;
};

// A CQ. Every CQ event taken from its channel must be acknowledged before the CQ is destroyed
// (ibv_destroy_cq waits for that); the waiters in this transport ack each event at once.
class CompletionQueue {
 public:
  CompletionQueue() = default;
  ~CompletionQueue() { reset(); }
  CompletionQueue(CompletionQueue&& o) noexcept : cq_(std::exchange(o.cq_, nullptr)) {}
  CompletionQueue& operator=(CompletionQueue&& o) noexcept;
  CompletionQueue(const CompletionQueue&) = delete;
  CompletionQueue& operator=(const CompletionQueue&) = delete;

  static Result<CompletionQueue> Create(ibv_context* ctx, int entries, ibv_comp_channel* channel);
  ibv_cq* get() const { return cq_; }
  void reset();

 private:
  ibv_cq* cq_ = nullptr;
};

class SharedReceiveQueue {
 public:
  SharedReceiveQueue() = default;
  ~SharedReceiveQueue() { reset(); }
  SharedReceiveQueue(SharedReceiveQueue&& o) noexcept : srq_(std::exchange(o.srq_, nullptr)) {}
  SharedReceiveQueue& operator=(SharedReceiveQueue&& o) noexcept;
  SharedReceiveQueue(const SharedReceiveQueue&) = delete;
  SharedReceiveQueue& operator=(const SharedReceiveQueue&) = delete;

  static Result<SharedReceiveQueue> Create(ibv_pd* pd, uint32_t max_wr);
  ibv_srq* get() const { return srq_; }
  void reset();

 private:
  ibv_srq* srq_ = nullptr;
};

// An rdma_cm event channel; its fd is made non-blocking (callers poll() it, then drain events).
class EventChannel {
 public:
  EventChannel() = default;
  ~EventChannel() { reset(); }
  EventChannel(EventChannel&& o) noexcept : ch_(std::exchange(o.ch_, nullptr)) {}
  EventChannel& operator=(EventChannel&& o) noexcept;
  EventChannel(const EventChannel&) = delete;
  EventChannel& operator=(const EventChannel&) = delete;

  static Result<EventChannel> Create();
  rdma_event_channel* get() const { return ch_; }
  int fd() const { return ch_->fd; }
  void reset();

 private:
  rdma_event_channel* ch_ = nullptr;
};

// An rdma_cm_id. rdma_destroy_id waits until every event reported for the id was acked.
class CmId {
 public:
  CmId() = default;
  ~CmId() { reset(); }
  CmId(CmId&& o) noexcept : id_(std::exchange(o.id_, nullptr)) {}
  CmId& operator=(CmId&& o) noexcept;
  CmId(const CmId&) = delete;
  CmId& operator=(const CmId&) = delete;

  static Result<CmId> Create(rdma_event_channel* channel, void* context);
  // Takes ownership of an id rdma_cm created (a CONNECT_REQUEST's new id).
  static CmId Adopt(rdma_cm_id* id) {
    CmId c;
    c.id_ = id;
    return c;
  }
  rdma_cm_id* get() const { return id_; }
  rdma_cm_id* operator->() const { return id_; }
  void reset();

 private:
  rdma_cm_id* id_ = nullptr;
};

// The RC queue pair of an rdma_cm_id (rdma_create_qp / rdma_destroy_qp). Must be reset before
// the CmId and before the CQs/SRQ it uses.
class CmQueuePair {
 public:
  CmQueuePair() = default;
  ~CmQueuePair() { reset(); }
  CmQueuePair(CmQueuePair&& o) noexcept : id_(std::exchange(o.id_, nullptr)) {}
  CmQueuePair& operator=(CmQueuePair&& o) noexcept;
  CmQueuePair(const CmQueuePair&) = delete;
  CmQueuePair& operator=(const CmQueuePair&) = delete;

  static Result<CmQueuePair> Create(rdma_cm_id* id, ibv_pd* pd, ibv_qp_init_attr* attr);
  ibv_qp* get() const { return id_ != nullptr ? id_->qp : nullptr; }
  void reset();

 private:
  rdma_cm_id* id_ = nullptr;
};

// A block of fixed-size chunks in one mapping with one registration: the receive and send
// buffers of the two-sided path.
class ChunkPool {
 public:
  ChunkPool() = default;
  ChunkPool(ChunkPool&&) noexcept = default;
  ChunkPool& operator=(ChunkPool&&) noexcept = default;
  ~ChunkPool() { reset(); }

  static Result<ChunkPool> Create(ibv_pd* pd, uint32_t chunks, size_t chunk_size, int access);
  uint8_t* chunk(uint32_t i) const { return mem_.data() + static_cast<size_t>(i) * chunk_size_; }
  uint32_t lkey() const { return mr_.lkey(); }
  uint32_t chunks() const { return chunks_; }
  size_t chunk_size() const { return chunk_size_; }
  void reset() {  // registration first, then the memory
    mr_.reset();
    mem_ = MappedMemory();
  }

 private:
  MappedMemory mem_;
  MemoryRegistration mr_;
  uint32_t chunks_ = 0;
  size_t chunk_size_ = 0;
};

// A Linux eventfd used to wake a thread blocked in poll().
class EventFd {
 public:
  EventFd() = default;
  ~EventFd();
  EventFd(const EventFd&) = delete;
  EventFd& operator=(const EventFd&) = delete;
  Status Open();
  int fd() const { return fd_; }
  void Signal() const;
  void Drain() const;

 private:
  int fd_ = -1;
};

}  // namespace rdkv::transport::verbs

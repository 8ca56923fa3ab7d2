// RAII owners for verbs and rdma_cm objects (control path; see verbs_objects.h).
#include "common/transport/verbs/verbs_objects.h"

#include <fcntl.h>
#include <glog/logging.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace rdkv::transport::verbs {

namespace {
std::string ErrnoText(int err) {
  char buf[128];
  return strerror_r(err, buf, sizeof(buf));  // GNU variant: returns a pointer
}
// Logs a failed destroy (destructors cannot return a Status).
void LogDestroyError(const char* call, int err) {
  LOG(ERROR) << call << " failed: " << ErrnoText(err);
}
}  // namespace

Status CallError(std::string_view call, int err, StatusCode code) {
  return Status(code, std::string(call) + ": " + ErrnoText(err));
}

Status SetNonBlocking(int fd, std::string_view what) {
  int flags = fcntl(fd, F_GETFL);
  if (flags < 0) return CallError(std::string("fcntl(F_GETFL) on ") + std::string(what), errno);
  if (fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    return CallError(std::string("fcntl(F_SETFL, O_NONBLOCK) on ") + std::string(what), errno);
  }
  return Status::Ok();
}

// ---- DeviceList ----------------------------------------------------------------------------
DeviceList& DeviceList::operator=(DeviceList&& o) noexcept {
  if (this != &o) {
    reset();
    list_ = std::exchange(o.list_, nullptr);
    n_ = o.n_;
  }
  return *this;
}

Result<DeviceList> DeviceList::Get() {
  DeviceList d;
  errno = 0;
  d.list_ = rdma_get_devices(&d.n_);
  if (d.list_ == nullptr) {
    int err = errno != 0 ? errno : ENODEV;
    return CallError("rdma_get_devices", err, StatusCode::kUnavailable);
  }
  return d;
}

void DeviceList::reset() {
  if (list_ != nullptr) rdma_free_devices(list_);  // void
  list_ = nullptr;
  n_ = 0;
}

// ---- ProtectionDomain ------------------------------------------------------------------------
ProtectionDomain& ProtectionDomain::operator=(ProtectionDomain&& o) noexcept {
  if (this != &o) {
    reset();
    pd_ = std::exchange(o.pd_, nullptr);
  }
  return *this;
}

Result<ProtectionDomain> ProtectionDomain::Create(ibv_context* ctx) {
  ProtectionDomain p;
  p.pd_ = ibv_alloc_pd(ctx);
  if (p.pd_ == nullptr) return CallError("ibv_alloc_pd", errno);
  return p;
}

void ProtectionDomain::reset() {
  if (pd_ == nullptr) return;
  if (int rc = ibv_dealloc_pd(pd_); rc != 0) LogDestroyError("ibv_dealloc_pd", rc);
  pd_ = nullptr;
}

// ---- MemoryRegistration ----------------------------------------------------------------------
MemoryRegistration& MemoryRegistration::operator=(MemoryRegistration&& o) noexcept {
  if (this != &o) {
    reset();
    mr_ = std::exchange(o.mr_, nullptr);
  }
  return *this;
}

Result<MemoryRegistration> MemoryRegistration::Create(ibv_pd* pd, void* addr, size_t length,
                                                      int access) {
  MemoryRegistration m;
  m.mr_ = ibv_reg_mr(pd, addr, length, access);
  if (m.mr_ == nullptr) {
    int err = errno;
    Status s = CallError("ibv_reg_mr of " + std::to_string(length) + " bytes", err);
    if (err == ENOMEM || err == EPERM || err == EFAULT) {
      return Status(s.code(), s.message() +
                                  " (is the locked-memory limit too low? ulimit -l unlimited, "
                                  "or LimitMEMLOCK=infinity under systemd)");
    }
    return s;
  }
  return m;
}

void MemoryRegistration::reset() {
  if (mr_ == nullptr) return;
  if (int rc = ibv_dereg_mr(mr_); rc != 0) LogDestroyError("ibv_dereg_mr", rc);
  mr_ = nullptr;
}

// ---- MemoryWindow ----------------------------------------------------------------------------
MemoryWindow& MemoryWindow::operator=(MemoryWindow&& o) noexcept {
  if (this != &o) {
    reset();
    mw_ = std::exchange(o.mw_, nullptr);
  }
  return *this;
}

Result<MemoryWindow> MemoryWindow::Create(ibv_pd* pd) {
  MemoryWindow w;
  w.mw_ = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
  if (w.mw_ == nullptr) return CallError("ibv_alloc_mw(IBV_MW_TYPE_2)", errno);
  return w;
}

void MemoryWindow::reset() {
  if (mw_ == nullptr) return;
  if (int rc = ibv_dealloc_mw(mw_); rc != 0) LogDestroyError("ibv_dealloc_mw", rc);
  mw_ = nullptr;
}

// ---- CompletionChannel -----------------------------------------------------------------------
CompletionChannel& CompletionChannel::operator=(CompletionChannel&& o) noexcept {
  if (this != &o) {
    reset();
    ch_ = std::exchange(o.ch_, nullptr);
  }
  return *this;
}

Result<CompletionChannel> CompletionChannel::Create(ibv_context* ctx) {
  CompletionChannel c;
  c.ch_ = ibv_create_comp_channel(ctx);
  if (c.ch_ == nullptr) return CallError("ibv_create_comp_channel", errno);
  RDKV_RETURN_IF_ERROR(SetNonBlocking(c.ch_->fd, "the completion channel"));
  return c;
}

void CompletionChannel::reset() {
  if (ch_ == nullptr) return;
  if (int rc = ibv_destroy_comp_channel(ch_); rc != 0) {
    LogDestroyError("ibv_destroy_comp_channel", rc);
  }
  ch_ = nullptr;
}

// ---- CompletionQueue -------------------------------------------------------------------------
CompletionQueue& CompletionQueue::operator=(CompletionQueue&& o) noexcept {
  if (this != &o) {
    reset();
    cq_ = std::exchange(o.cq_, nullptr);
  }
  return *this;
}

Result<CompletionQueue> CompletionQueue::Create(ibv_context* ctx, int entries,
                                                ibv_comp_channel* channel) {
  CompletionQueue c;
  c.cq_ = ibv_create_cq(ctx, entries, nullptr, channel, 0);
  if (c.cq_ == nullptr) {
    return CallError("ibv_create_cq with " + std::to_string(entries) + " entries", errno);
  }
  return c;
}

void CompletionQueue::reset() {
  if (cq_ == nullptr) return;
  if (int rc = ibv_destroy_cq(cq_); rc != 0) LogDestroyError("ibv_destroy_cq", rc);
  cq_ = nullptr;
}

// ---- SharedReceiveQueue ----------------------------------------------------------------------
SharedReceiveQueue& SharedReceiveQueue::operator=(SharedReceiveQueue&& o) noexcept {
  if (this != &o) {
    reset();
    srq_ = std::exchange(o.srq_, nullptr);
  }
  return *this;
}

Result<SharedReceiveQueue> SharedReceiveQueue::Create(ibv_pd* pd, uint32_t max_wr) {
  SharedReceiveQueue s;
  ibv_srq_init_attr attr{};
  attr.attr.max_wr = max_wr;
  attr.attr.max_sge = 1;
  s.srq_ = ibv_create_srq(pd, &attr);
  if (s.srq_ == nullptr) {
    return CallError("ibv_create_srq with " + std::to_string(max_wr) + " entries", errno);
  }
  return s;
}

void SharedReceiveQueue::reset() {
  if (srq_ == nullptr) return;
  if (int rc = ibv_destroy_srq(srq_); rc != 0) LogDestroyError("ibv_destroy_srq", rc);
  srq_ = nullptr;
}

// ---- EventChannel ----------------------------------------------------------------------------
EventChannel& EventChannel::operator=(EventChannel&& o) noexcept {
  if (this != &o) {
    reset();
    ch_ = std::exchange(o.ch_, nullptr);
  }
  return *this;
}

Result<EventChannel> EventChannel::Create() {
  EventChannel c;
  c.ch_ = rdma_create_event_channel();
  if (c.ch_ == nullptr) {
    return CallError("rdma_create_event_channel", errno != 0 ? errno : ENODEV,
                     StatusCode::kUnavailable);
  }
  RDKV_RETURN_IF_ERROR(SetNonBlocking(c.ch_->fd, "the rdma_cm event channel"));
  return c;
}

void EventChannel::reset() {
  if (ch_ != nullptr) rdma_destroy_event_channel(ch_);  // void
  ch_ = nullptr;
}

// ---- CmId ------------------------------------------------------------------------------------
CmId& CmId::operator=(CmId&& o) noexcept {
  if (this != &o) {
    reset();
    id_ = std::exchange(o.id_, nullptr);
  }
  return *this;
}

Result<CmId> CmId::Create(rdma_event_channel* channel, void* context) {
  CmId c;
  if (rdma_create_id(channel, &c.id_, context, RDMA_PS_TCP) != 0) {
    c.id_ = nullptr;
    return CallError("rdma_create_id", errno);
  }
  return c;
}

void CmId::reset() {
  if (id_ == nullptr) return;
  if (rdma_destroy_id(id_) != 0) LogDestroyError("rdma_destroy_id", errno);
  id_ = nullptr;
}

// ---- CmQueuePair -----------------------------------------------------------------------------
CmQueuePair& CmQueuePair::operator=(CmQueuePair&& o) noexcept {
  if (this != &o) {
    reset();
    id_ = std::exchange(o.id_, nullptr);
  }
  return *this;
}

Result<CmQueuePair> CmQueuePair::Create(rdma_cm_id* id, ibv_pd* pd, ibv_qp_init_attr* attr) {
  if (rdma_create_qp(id, pd, attr) != 0) {
    return CallError("rdma_create_qp (send " + std::to_string(attr->cap.max_send_wr) + ", recv " +
                         std::to_string(attr->cap.max_recv_wr) + ")",
                     errno);
  }
  CmQueuePair q;
  q.id_ = id;
  return q;
}

void CmQueuePair::reset() {
  if (id_ == nullptr) return;
  if (id_->qp != nullptr) rdma_destroy_qp(id_);  // void; ibv_destroy_qp inside
  id_ = nullptr;
}

// ---- ChunkPool -------------------------------------------------------------------------------
Result<ChunkPool> ChunkPool::Create(ibv_pd* pd, uint32_t chunks, size_t chunk_size, int access) {
  ChunkPool p;
  p.chunks_ = chunks;
  p.chunk_size_ = chunk_size;
  // Small pools: normal pages (a 2 MiB huge page per connection would waste memory).
  RDKV_ASSIGN_OR_RETURN(p.mem_, MappedMemory::Allocate(static_cast<size_t>(chunks) * chunk_size,
                                                       /*try_huge_pages=*/false));
  RDKV_ASSIGN_OR_RETURN(p.mr_,
                        MemoryRegistration::Create(pd, p.mem_.data(), p.mem_.size(), access));
  return p;
}

// ---- EventFd ---------------------------------------------------------------------------------
EventFd::~EventFd() {
  if (fd_ >= 0) close(fd_);
}

Status EventFd::Open() {
  fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (fd_ < 0) return CallError("eventfd", errno);
  return Status::Ok();
}

void EventFd::Signal() const {
  uint64_t one = 1;
  // A full counter (EAGAIN) still leaves the fd readable, which is all a waiter needs.
  [[maybe_unused]] ssize_t n = write(fd_, &one, sizeof(one));
}

void EventFd::Drain() const {
  uint64_t v;
  [[maybe_unused]] ssize_t n = read(fd_, &v, sizeof(v));
}

}  // namespace rdkv::transport::verbs

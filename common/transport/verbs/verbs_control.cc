// Control path of the verbs transport: device and PD, memory registration, rdma_cm connection
// setup and handshake, the cm/async-event threads, listener setup and session teardown.
// See docs/transport-verbs.md.
#include <arpa/inet.h>
#include <glog/logging.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/transport/auth.h"
#include "common/transport/memory.h"
#include "common/transport/verbs/verbs_internal.h"
#include "common/util/resolve.h"
#include "common/util/thread_name.h"
#include "common/util/units.h"

namespace rdkv::transport::verbs {

namespace {

// RC local ACK timeout, 4.096 us * 2^16 = 268 ms; with retry_cnt 7 a silent peer is declared
// dead after about 2 s of unacknowledged traffic (IBV_WC_RETRY_EXC_ERR).
constexpr uint8_t kAckTimeout = 16;
constexpr uint8_t kRetryCount = 7;
// RNR retries of the server's SENDs: 0. A client's credits guarantee a posted receive for every
// SEND of the server; a client that posts none gets IBV_WC_RNR_RETRY_EXC_ERR at once and is cut
// off instead of stalling its session.
constexpr uint8_t kRnrRetry = 0;
// RNR retries of a client's SENDs: 7, without end. The server's receive buffers are shared by
// the sessions of a receive group (its SRQ), and a client that ignores its credits can empty
// them until the server cuts it off: its neighbours then wait (RNR NAKs, retried after the
// responder's timer) instead of losing their connections
// (VerbsAuth.AClientThatIgnoresItsCreditsIsCutOffAndOthersAreServed saw an honest client lose
// its connection to RNR in one run of six before this). A server that stays stuck is seen by
// the caller's timeout.
constexpr uint8_t kClientRnrRetry = 7;

// The address of `sa` without its port (what per-source limits count by).
std::string SourceText(const sockaddr* sa) {
  char buf[INET6_ADDRSTRLEN] = "?";
  if (sa != nullptr && sa->sa_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, buf, sizeof(buf));
  } else if (sa != nullptr && sa->sa_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr, buf, sizeof(buf));
  }
  return buf;
}

std::string SockaddrText(const sockaddr* sa) {
  if (sa == nullptr) return "?";
  char buf[INET6_ADDRSTRLEN] = "?";
  uint16_t port = 0;
  if (sa->sa_family == AF_INET) {
    auto* in = reinterpret_cast<const sockaddr_in*>(sa);
    inet_ntop(AF_INET, &in->sin_addr, buf, sizeof(buf));
    port = ntohs(in->sin_port);
  } else if (sa->sa_family == AF_INET6) {
    auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);
    inet_ntop(AF_INET6, &in6->sin6_addr, buf, sizeof(buf));
    port = ntohs(in6->sin6_port);
  }
  return FormatHostPort(buf, port);
}

// The first IPv4 address of host:port if there is one, else its first address.
Result<sockaddr_storage> ResolveAddress(const std::string& host, uint16_t port, bool passive) {
  RDKV_ASSIGN_OR_RETURN(std::vector<ResolvedAddress> addresses, ResolveStream(host, port, passive));
  const ResolvedAddress* pick = &addresses.front();
  for (const ResolvedAddress& a : addresses) {
    if (a.family == AF_INET) {
      pick = &a;
      break;
    }
  }
  return pick->addr;
}

struct CmEventInfo {
  rdma_cm_event_type type = RDMA_CM_EVENT_ADDR_ERROR;
  int status = 0;
  std::vector<uint8_t> private_data;
};

// Next event on a (non-blocking) setup channel, acked before returning.
Status NextCmEvent(rdma_event_channel* ch, Clock::time_point deadline, CmEventInfo* out) {
  while (true) {
    rdma_cm_event* ev = nullptr;
    if (rdma_get_cm_event(ch, &ev) == 0) {
      out->type = ev->event;
      out->status = ev->status;
      const auto& conn = ev->param.conn;
      const auto* pd = static_cast<const uint8_t*>(conn.private_data);
      out->private_data.assign(pd, pd == nullptr ? pd : pd + conn.private_data_len);
      if (rdma_ack_cm_event(ev) != 0) return CallError("rdma_ack_cm_event", errno);
      return Status::Ok();
    }
    if (errno != EAGAIN && errno != EWOULDBLOCK) return CallError("rdma_get_cm_event", errno);
    auto left = deadline - Clock::now();
    if (left <= Clock::duration::zero()) return Status::TimedOut("timed out");
    int ms = static_cast<int>(
        std::clamp<int64_t>(std::chrono::ceil<std::chrono::milliseconds>(left).count(), 1, 1000));
    pollfd pfd{ch->fd, POLLIN, 0};
    if (poll(&pfd, 1, ms) < 0 && errno != EINTR)
      return CallError("poll on the rdma_cm channel", errno);
  }
}

int ResolveTimeoutMs(Clock::time_point deadline) {
  auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 100, 5000));
}

// The async event sinks of the process, by verbs object.
struct AsyncSinkTable {
  Mutex mu;
  std::unordered_map<const void*, AsyncEventSink*> sinks GUARDED_BY(mu);
};
AsyncSinkTable& AsyncSinks() {
  static auto* table = new AsyncSinkTable;  // leaked: used by threads until process exit
  return *table;
}

class VerbsRegion final : public MemoryRegion {
 public:
  // remote: a server region, listed in the fabric so listeners can bind windows onto it.
  VerbsRegion(VerbsFabric* fabric, MappedMemory mem, MemoryRegistration mr, bool remote)
      : fabric_(remote ? fabric : nullptr), mem_(std::move(mem)), mr_(std::move(mr)) {
    if (fabric_ != nullptr) fabric_->AddRegistration(mr_.get());
  }
  ~VerbsRegion() override {
    if (fabric_ != nullptr) fabric_->RemoveRegistration(mr_.get());
    mr_.reset();  // deregister before the memory is unmapped
  }
  uint8_t* data() const override { return mem_.data(); }
  size_t size() const override { return mem_.size(); }
  uint32_t lkey() const override { return mr_.lkey(); }
  uint32_t rkey() const override { return mr_.rkey(); }
  bool huge_pages() const override { return mem_.huge_pages(); }

 private:
  VerbsFabric* const fabric_;
  MappedMemory mem_;
  MemoryRegistration mr_;
};

}  // namespace

// =================================================================================================
// Async events
// =================================================================================================

void RegisterAsyncSink(const void* object, AsyncEventSink* sink) {
  AsyncSinkTable& t = AsyncSinks();
  MutexLock lk(&t.mu);
  t.sinks[object] = sink;
}

void UnregisterAsyncSink(const void* object) {
  if (object == nullptr) return;
  AsyncSinkTable& t = AsyncSinks();
  MutexLock lk(&t.mu);
  t.sinks.erase(object);
}

void DrainAsyncEvents(ibv_context* ctx) {
  ibv_async_event ev;
  while (ibv_get_async_event(ctx, &ev) == 0) {  // -1 (EAGAIN: none left) on failure
    const void* object = nullptr;
    bool routine = false;
    switch (ev.event_type) {
      case IBV_EVENT_COMM_EST:
      case IBV_EVENT_QP_LAST_WQE_REACHED:
        routine = true;
        [[fallthrough]];
      case IBV_EVENT_QP_FATAL:
      case IBV_EVENT_QP_REQ_ERR:
      case IBV_EVENT_QP_ACCESS_ERR:
      case IBV_EVENT_SQ_DRAINED:
      case IBV_EVENT_PATH_MIG:
      case IBV_EVENT_PATH_MIG_ERR:
        object = ev.element.qp;
        break;
      case IBV_EVENT_CQ_ERR:
        object = ev.element.cq;
        break;
      case IBV_EVENT_SRQ_LIMIT_REACHED:
        routine = true;
        [[fallthrough]];
      case IBV_EVENT_SRQ_ERR:
        object = ev.element.srq;
        break;
      case IBV_EVENT_PORT_ACTIVE:
      case IBV_EVENT_GID_CHANGE:
      case IBV_EVENT_LID_CHANGE:
      case IBV_EVENT_PKEY_CHANGE:
      case IBV_EVENT_CLIENT_REREGISTER:
        routine = true;
        break;
      default:
        break;
    }
    if (!routine) LOG(WARNING) << "verbs async event: " << ibv_event_type_str(ev.event_type);
    {
      AsyncSinkTable& t = AsyncSinks();
      MutexLock lk(&t.mu);
      if (object != nullptr) {
        auto it = t.sinks.find(object);
        if (it != t.sinks.end()) it->second->OnAsyncEvent(ev.event_type);
      } else if (ev.event_type == IBV_EVENT_DEVICE_FATAL) {
        for (auto& [obj, sink] : t.sinks) sink->OnAsyncEvent(ev.event_type);
      }
    }
    ibv_ack_async_event(&ev);  // always; ibv_destroy_qp/cq/srq wait for it
  }
}

// =================================================================================================
// VerbsFabric
// =================================================================================================

Result<std::unique_ptr<VerbsFabric>> VerbsFabric::Open(const FabricOptions& options) {
  std::unique_ptr<VerbsFabric> f(new VerbsFabric());
  f->huge_pages_ = options.huge_pages;
  Result<DeviceList> devices = DeviceList::Get();
  if (!devices.ok()) {
    return Status::Unavailable("no RDMA device (" + devices.status().message() + ")");
  }
  f->devices_ = std::move(devices).value();
  std::string seen;
  for (int i = 0; i < f->devices_.size() && f->ctx_ == nullptr; ++i) {
    ibv_context* ctx = f->devices_[i];
    const std::string name = ibv_get_device_name(ctx->device);
    if (!options.device.empty() && name != options.device) {
      seen += (seen.empty() ? "" : ", ") + name;
      continue;
    }
    ibv_device_attr da{};
    if (int rc = ibv_query_device(ctx, &da); rc != 0) {  // positive errno
      seen += (seen.empty() ? "" : ", ") + name + " (" +
              CallError("ibv_query_device", rc).message() + ")";
      continue;
    }
    for (uint8_t port = 1; port <= da.phys_port_cnt; ++port) {
      ibv_port_attr pa{};
      if (ibv_query_port(ctx, port, &pa) == 0 && pa.state == IBV_PORT_ACTIVE) {
        f->ctx_ = ctx;
        f->port_num_ = port;
        f->device_name_ = name;
        f->device_attr_ = da;
        f->port_attr_ = pa;
        break;
      }
    }
    if (f->ctx_ == nullptr) seen += (seen.empty() ? "" : ", ") + name + " (no active port)";
  }
  if (f->ctx_ == nullptr) {
    std::string want = options.device.empty()
                           ? "an RDMA device with an active port"
                           : "RDMA device '" + options.device + "' with an active port";
    return Status::Unavailable("no " + want + (seen.empty() ? "" : "; found: " + seen));
  }
  f->memory_windows_ = (f->device_attr_.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B) != 0;
  if (!f->memory_windows_) {
    LOG(WARNING) << "verbs fabric: " << f->device_name_
                 << " has no type-2 memory windows (IBV_DEVICE_MEM_WINDOW_TYPE_2B): server "
                    "regions are registered for remote READ and every client gets the region's "
                    "own rkey, valid on any queue pair of this server until it exits "
                    "(docs/security.md)";
  }
  RDKV_ASSIGN_OR_RETURN(f->pd_, ProtectionDomain::Create(f->ctx_));
  RDKV_RETURN_IF_ERROR(SetNonBlocking(f->ctx_->async_fd, "the device's async event fd"));
  RDKV_ASSIGN_OR_RETURN(f->cm_channel_, EventChannel::Create());
  RDKV_RETURN_IF_ERROR(f->wake_.Open());
  f->thread_ = std::thread(&VerbsFabric::ThreadMain, f.get());
  LOG(INFO) << "verbs fabric: " << f->Describe() << " (max_qp_wr " << f->device_attr_.max_qp_wr
            << ", max_cqe " << f->device_attr_.max_cqe << ", max_srq_wr "
            << f->device_attr_.max_srq_wr << ", max_qp_rd_atom " << f->device_attr_.max_qp_rd_atom
            << ", active_mtu " << (128 << f->port_attr_.active_mtu) << ", type-2 memory windows "
            << (f->memory_windows_ ? "yes" : "no") << ")";
  return f;
}

VerbsFabric::~VerbsFabric() {
  stop_.store(true);
  if (thread_.joinable()) {
    wake_.Signal();
    thread_.join();
  }
  {
    MutexLock lk(&sinks_mu_);
    if (!sinks_.empty()) {
      LOG(ERROR) << "verbs fabric destroyed while " << sinks_.size()
                 << " connection(s) still exist (a Fabric must outlive its Connections)";
    }
  }
  cm_channel_.reset();
  pd_.reset();  // EBUSY (logged) if regions/QPs of this PD still exist
  devices_.reset();
}

std::string VerbsFabric::Describe() const {
  return "verbs " + device_name_ + " port " + std::to_string(port_num_);
}

void VerbsFabric::AddRegistration(ibv_mr* mr) {
  MutexLock lk(&regions_mu_);
  registrations_.push_back(mr);
}

void VerbsFabric::RemoveRegistration(ibv_mr* mr) {
  MutexLock lk(&regions_mu_);
  std::erase(registrations_, mr);
}

ibv_mr* VerbsFabric::FindRegistration(const RegionDescriptor& r) {
  MutexLock lk(&regions_mu_);
  for (ibv_mr* mr : registrations_) {
    const uint64_t base = reinterpret_cast<uintptr_t>(mr->addr);
    if (mr->rkey == r.rkey && r.addr >= base && r.length <= mr->length &&
        r.addr - base <= mr->length - r.length) {
      return mr;
    }
  }
  return nullptr;
}

void VerbsFabric::RegisterCmSink(rdma_cm_id* id, CmEventSink* sink) {
  MutexLock lk(&sinks_mu_);
  sinks_[id] = sink;
}

void VerbsFabric::UnregisterCmSink(rdma_cm_id* id) {
  MutexLock lk(&sinks_mu_);
  sinks_.erase(id);
}

void VerbsFabric::ThreadMain() {
  rdkv::util::NameThisThread("rdkv-verbs-ctl");
  while (!stop_.load()) {
    pollfd pfd[3] = {
        {cm_channel_.fd(), POLLIN, 0}, {ctx_->async_fd, POLLIN, 0}, {wake_.fd(), POLLIN, 0}};
    if (poll(pfd, 3, 1000) < 0) {
      if (errno != EINTR) {
        PLOG(ERROR) << "verbs fabric thread: poll";
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      continue;
    }
    if (pfd[2].revents != 0) wake_.Drain();
    if (pfd[1].revents != 0) DrainAsyncEvents(ctx_);
    if (pfd[0].revents == 0) continue;
    while (true) {
      rdma_cm_event* ev = nullptr;
      if (rdma_get_cm_event(cm_channel_.get(), &ev) != 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK) PLOG(ERROR) << "rdma_get_cm_event";
        break;
      }
      const rdma_cm_event_type type = ev->event;
      const int status = ev->status;
      rdma_cm_id* id = ev->id;
      if (type != RDMA_CM_EVENT_TIMEWAIT_EXIT) {
        VLOG(1) << "verbs client cm event " << rdma_event_str(type) << " status " << status;
      }
      // Ack under sinks_mu_: the id was registered under it before it migrated here, which
      // orders its creation before this thread's use of it in a way ThreadSanitizer can see
      // (the real ordering goes through the kernel's event queue). The owner unregisters under
      // the same lock before rdma_destroy_id, which waits for this ack.
      MutexLock lk(&sinks_mu_);
      if (rdma_ack_cm_event(ev) != 0) PLOG(ERROR) << "rdma_ack_cm_event";
      auto it = sinks_.find(id);
      if (it != sinks_.end()) it->second->OnCmEvent(type, status);
    }
  }
}

Result<std::unique_ptr<MemoryRegion>> VerbsFabric::AllocateRegion(size_t size,
                                                                  RegionAccess access) {
  if (size == 0) return Status::InvalidArgument("cannot allocate a zero-byte region");
  RDKV_ASSIGN_OR_RETURN(MappedMemory mem, MappedMemory::Allocate(size, huge_pages_));
  // Server regions: remote READ only. Never IBV_ACCESS_REMOTE_WRITE or atomics: no peer can
  // change a byte of a registered region, whatever rkey it learns or guesses. With type-2
  // memory windows the MR itself grants no remote access at all (IBV_ACCESS_MW_BIND only):
  // remote READs go through the window bound to each authenticated connection's QP, so the
  // MR's rkey, guessed or learned, reads nothing (docs/security.md).
  const bool remote = access == RegionAccess::kRemoteRead;
  int flags = IBV_ACCESS_LOCAL_WRITE;
  if (remote) flags |= memory_windows_ ? IBV_ACCESS_MW_BIND : IBV_ACCESS_REMOTE_READ;
  RDKV_ASSIGN_OR_RETURN(MemoryRegistration mr,
                        MemoryRegistration::Create(pd_.get(), mem.data(), size, flags));
  return std::unique_ptr<MemoryRegion>(
      new VerbsRegion(this, std::move(mem), std::move(mr), remote));
}

Status VerbsFabric::CheckListenPort(const std::string& what, const std::string& host,
                                    uint16_t port) {
  if (port == 0) return Status::Ok();
  // An rdma_cm id bound as the listener binds it (REUSEADDR), then destroyed: rdma_cm refuses
  // the bind while another id listens on the address (its port space is not TCP's).
  const std::string where = FormatHostPort(host.empty() ? "0.0.0.0" : host, port);
  RDKV_ASSIGN_OR_RETURN(sockaddr_storage addr, ResolveAddress(host, port, true));
  RDKV_ASSIGN_OR_RETURN(CmId probe, CmId::Create(nullptr, nullptr));
  int reuse = 1;
  if (rdma_set_option(probe.get(), RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, &reuse,
                      sizeof(reuse)) != 0) {
    return CallError("rdma_set_option(RDMA_OPTION_ID_REUSEADDR)", errno);
  }
  if (rdma_bind_addr(probe.get(), reinterpret_cast<sockaddr*>(&addr)) != 0) {
    const int error = errno;
    if (error == EADDRINUSE) {
      return Status::Unavailable(what + " " + where +
                                 " (verbs, rdma_cm) is in use by another process (checked "
                                 "before the data dir is loaded); choose another port or stop "
                                 "that process");
    }
    if (error == EADDRNOTAVAIL) {
      // rdma_cm's answer both for a port another id listens on when either address is the
      // wildcard, and for an address of no RDMA device.
      return Status::Unavailable(what + " " + where +
                                 " (verbs, rdma_cm) cannot be bound: another process may listen "
                                 "on that port, or the host is not an address of an RDMA device "
                                 "(checked before the data dir is loaded)");
    }
    return CallError(what + ": rdma_bind_addr " + where, error, StatusCode::kUnavailable);
  }
  return Status::Ok();
}

Result<std::unique_ptr<Listener>> VerbsFabric::Listen(ListenOptions options) {
  if (options.tls.any()) {
    return Status::InvalidArgument(
        "verbs has no TLS (the NICs do the READs); TLS options are for the tcp transport only "
        "(docs/security.md \"TLS (tcp)\")");
  }
  auto listener = std::make_unique<VerbsListener>(this, std::move(options));
  RDKV_RETURN_IF_ERROR(listener->Start());
  return std::unique_ptr<Listener>(std::move(listener));
}

Result<std::unique_ptr<Connection>> VerbsFabric::Connect(const ConnectOptions& options) {
  if (options.tls.any()) {
    return Status::InvalidArgument(
        "verbs has no TLS (the NICs do the READs); TLS options are for the tcp transport only "
        "(docs/security.md \"TLS (tcp)\")");
  }
  auto conn = std::make_unique<ClientConnection>(this, options);
  RDKV_RETURN_IF_ERROR(conn->Establish());
  return std::unique_ptr<Connection>(std::move(conn));
}

}  // namespace rdkv::transport::verbs

namespace rdkv::transport {

Result<std::unique_ptr<Connection>> ConnectVerbsForTest(Fabric* fabric,
                                                        const ConnectOptions& options,
                                                        VerbsHandshakeTap* tap) {
  auto* vf = dynamic_cast<verbs::VerbsFabric*>(fabric);
  if (vf == nullptr) return Status::InvalidArgument("ConnectVerbsForTest needs a verbs Fabric");
  auto conn = std::make_unique<verbs::ClientConnection>(vf, options, tap);
  RDKV_RETURN_IF_ERROR(conn->Establish());
  return std::unique_ptr<Connection>(std::move(conn));
}

}  // namespace rdkv::transport

namespace rdkv::transport::verbs {

// =================================================================================================
// ClientConnection: setup, teardown, events
// =================================================================================================

ClientConnection::ClientConnection(VerbsFabric* fabric, const ConnectOptions& options,
                                   VerbsHandshakeTap* tap)
    : fabric_(fabric),
      options_(options),
      tap_(tap),
      peer_(FormatHostPort(options.host, options.port)) {}

Status ClientConnection::Establish() {
  const Clock::time_point deadline = Clock::now() + options_.connect_timeout;
  const ibv_device_attr& da = fabric_->device_attr();
  if (options_.max_outstanding_reads == 0 || options_.max_outstanding_calls == 0 ||
      options_.max_outstanding_calls > 0xFFFF) {
    return Status::InvalidArgument(
        "max_outstanding_reads must be >= 1 and max_outstanding_calls in [1, 65535]");
  }
  if (options_.max_message_size == 0 || options_.max_message_size > UINT32_MAX) {
    return Status::InvalidArgument("max_message_size must be in [1, 4 GiB)");
  }
  const uint64_t sq_depth = uint64_t{options_.max_outstanding_reads} + kClientSendSlots + 1;
  const uint64_t cqe = sq_depth + kClientRecvCredits;
  if (sq_depth > static_cast<uint64_t>(da.max_qp_wr) || cqe > static_cast<uint64_t>(da.max_cqe)) {
    return Status::InvalidArgument(
        "max_outstanding_reads " + std::to_string(options_.max_outstanding_reads) +
        " is too large for " + fabric_->device_name() + " (max_qp_wr " +
        std::to_string(da.max_qp_wr) + ", max_cqe " + std::to_string(da.max_cqe) + ")");
  }
  const std::string where = "verbs " + peer_;
  RDKV_ASSIGN_OR_RETURN(sockaddr_storage addr, ResolveAddress(options_.host, options_.port, false));
  RDKV_ASSIGN_OR_RETURN(setup_channel_, EventChannel::Create());
  RDKV_ASSIGN_OR_RETURN(id_, CmId::Create(setup_channel_.get(), this));

  // Address and route (rdma_cm picks the device that owns the route to the host).
  CmEventInfo ev;
  if (rdma_resolve_addr(id_.get(), nullptr, reinterpret_cast<sockaddr*>(&addr),
                        ResolveTimeoutMs(deadline)) != 0) {
    return CallError("rdma_resolve_addr " + peer_, errno, StatusCode::kUnavailable);
  }
  Status st = NextCmEvent(setup_channel_.get(), deadline, &ev);
  if (!st.ok()) return Status(st.code(), where + ": resolving the address: " + st.message());
  if (ev.type != RDMA_CM_EVENT_ADDR_RESOLVED) {
    return Status::Unavailable(where + ": cannot resolve the address to an RDMA device (" +
                               rdma_event_str(ev.type) + ", " + strerror(std::abs(ev.status)) +
                               ")");
  }
  if (id_->verbs != fabric_->context()) {
    return Status::Unavailable(where + ": the route goes through RDMA device " +
                               ibv_get_device_name(id_->verbs->device) + ", this fabric uses " +
                               fabric_->device_name());
  }
  uint8_t ack_timeout = kAckTimeout;
  if (rdma_set_option(id_.get(), RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &ack_timeout,
                      sizeof(ack_timeout)) != 0) {
    LOG(WARNING) << CallError("rdma_set_option(RDMA_OPTION_ID_ACK_TIMEOUT)", errno).ToString()
                 << "; keeping rdma_cm's default ACK timeout";
  }
  if (rdma_resolve_route(id_.get(), ResolveTimeoutMs(deadline)) != 0) {
    return CallError("rdma_resolve_route " + peer_, errno, StatusCode::kUnavailable);
  }
  st = NextCmEvent(setup_channel_.get(), deadline, &ev);
  if (!st.ok()) return Status(st.code(), where + ": resolving the route: " + st.message());
  if (ev.type != RDMA_CM_EVENT_ROUTE_RESOLVED) {
    return Status::Unavailable(where + ": no route (" + std::string(rdma_event_str(ev.type)) + ")");
  }

  // One CQ for everything this connection posts: READs, SENDs, RECVs and the test WRITE. Sized
  // for all of them at once, so it cannot overrun.
  ibv_pd* pd = fabric_->pd();
  RDKV_ASSIGN_OR_RETURN(comp_channel_, CompletionChannel::Create(fabric_->context()));
  RDKV_ASSIGN_OR_RETURN(
      cq_, CompletionQueue::Create(fabric_->context(), static_cast<int>(cqe), comp_channel_.get()));
  ibv_qp_init_attr attr{};
  attr.qp_context = this;
  attr.send_cq = cq_.get();
  attr.recv_cq = cq_.get();
  attr.cap.max_send_wr = static_cast<uint32_t>(sq_depth);
  attr.cap.max_recv_wr = kClientRecvCredits;
  attr.cap.max_send_sge = 1;
  attr.cap.max_recv_sge = 1;
  attr.qp_type = IBV_QPT_RC;
  attr.sq_sig_all = 0;
  RDKV_ASSIGN_OR_RETURN(qp_, CmQueuePair::Create(id_.get(), pd, &attr));
  RDKV_ASSIGN_OR_RETURN(
      recv_pool_, ChunkPool::Create(pd, kClientRecvCredits, kChunkSize, IBV_ACCESS_LOCAL_WRITE));
  RDKV_ASSIGN_OR_RETURN(send_pool_, ChunkPool::Create(pd, kClientSendSlots, kChunkSize, 0));

  // Every receive is posted before the server can send (it learns our credits from the
  // connect request).
  // (Establish runs before any other thread uses this connection; the locks below are
  // uncontended and keep the analysis's rules whole.)
  MutexLock poll_lock(&poll_mu_);
  recv_wrs_.assign(kClientRecvCredits, ibv_recv_wr{});
  recv_sges_.assign(kClientRecvCredits, ibv_sge{});
  reposts_.assign(kClientRecvCredits, 0);
  for (uint32_t i = 0; i < kClientRecvCredits; ++i) {
    recv_sges_[i].addr = reinterpret_cast<uintptr_t>(recv_pool_.chunk(i));
    recv_sges_[i].length = kChunkSize;
    recv_sges_[i].lkey = recv_pool_.lkey();
    recv_wrs_[i].wr_id = MakeWrId(kWrRecv, i);
    recv_wrs_[i].sg_list = &recv_sges_[i];
    recv_wrs_[i].num_sge = 1;
    recv_wrs_[i].next = i + 1 < kClientRecvCredits ? &recv_wrs_[i + 1] : nullptr;
  }
  ibv_recv_wr* bad_recv = nullptr;
  if (int rc = ibv_post_recv(qp_.get(), recv_wrs_.data(), &bad_recv); rc != 0) {
    return CallError("ibv_post_recv", rc);
  }

  poll_lock.Unlock();

  // The chain for READ batches too large for the stack (PostReadBatch fills it).
  MutexLock post_lock(&post_mu_);
  wrs_.assign(options_.max_outstanding_reads, ibv_send_wr{});
  sges_.assign(options_.max_outstanding_reads, ibv_sge{});
  post_lock.Unlock();
  // "Oversize" READ: longer than max_message_size (the contract) or than the port allows.
  max_read_length_ = static_cast<uint32_t>(
      std::min<uint64_t>(options_.max_message_size, fabric_->port_attr().max_msg_sz));

  slot_count_ = options_.max_outstanding_calls;
  slots_ = std::make_unique<CallSlot[]>(slot_count_);
  {
    MutexLock slots_lock(&slots_mu_);
    free_slot_list_.reserve(slot_count_);
    for (uint32_t i = slot_count_; i-- > 0;) free_slot_list_.push_back(i);
  }

  // Connect: magic, version, role, our credits and limit, our nonce (docs/security.md "The
  // handshake (verbs)"). Nothing here is secret or replayable.
  ConnectRequestData req;
  req.role = options_.role;
  req.credits = kClientRecvCredits;
  req.max_message = static_cast<uint32_t>(options_.max_message_size);
  if (tap_ != nullptr && tap_->client_nonce) {
    req.client_nonce = *tap_->client_nonce;
  } else {
    RDKV_ASSIGN_OR_RETURN(req.client_nonce, auth::RandomNonce());
  }
  if (tap_ != nullptr) tap_->sent_client_nonce = req.client_nonce;
  const auto blob = EncodeConnectRequest(req);
  static_assert(kConnectRequestSize <= kMaxConnectData);
  static_assert(kAcceptSize <= kMaxAcceptData);
  rdma_conn_param param{};
  param.private_data = blob.data();
  param.private_data_len = static_cast<uint8_t>(blob.size());
  param.initiator_depth = static_cast<uint8_t>(std::min(da.max_qp_init_rd_atom, 255));
  param.responder_resources = 0;  // nobody READs the client
  param.retry_count = kRetryCount;
  // rdma_cm carries this in the CM REQ, and the *server's* QP uses it (the server's accept
  // sets the client's: kClientRnrRetry).
  param.rnr_retry_count = kRnrRetry;
  if (rdma_connect(id_.get(), &param) != 0) {
    return CallError("rdma_connect " + peer_, errno, StatusCode::kUnavailable);
  }
  st = NextCmEvent(setup_channel_.get(), deadline, &ev);
  if (st.code() == StatusCode::kTimedOut) {
    return Status::TimedOut(where + ": no answer to the connect request within " +
                            std::to_string(options_.connect_timeout.count()) + " ms");
  }
  RDKV_RETURN_IF_ERROR(st);
  if (ev.type == RDMA_CM_EVENT_REJECTED) {
    RejectData rej;
    if (DecodeReject(ev.private_data, &rej)) return RejectToStatus(rej, peer_);
    return Status::Unavailable(where + ": connection refused (no listener on that port?), status " +
                               std::to_string(ev.status));
  }
  if (ev.type != RDMA_CM_EVENT_ESTABLISHED) {
    return Status::Unavailable(where + ": connect failed: " + rdma_event_str(ev.type) + " status " +
                               std::to_string(ev.status));
  }
  // The READ depth the server granted (rdma_cm set it from the accept): 0 would stall READs.
  ibv_qp_attr qattr{};
  ibv_qp_init_attr qinit{};
  if (int rc = ibv_query_qp(qp_.get(), &qattr, IBV_QP_MAX_QP_RD_ATOMIC, &qinit); rc != 0) {
    return CallError("ibv_query_qp", rc);
  }
  if (qattr.max_rd_atomic == 0) {
    return Status::ProtocolError(where + ": the server allows no outstanding READs");
  }
  AcceptData accept;
  st = DecodeAccept(ev.private_data, &accept);
  if (!st.ok()) return Status(st.code(), where + ": " + st.message());

  // The server proves first; we check before we prove anything (mutual authentication).
  const auto transcript = HandshakeTranscript(
      std::span<const uint8_t, kConnectRequestSize>(blob),
      std::span<const uint8_t, kAcceptHeadSize>(ev.private_data.data(), kAcceptHeadSize));
  const auth::Mac expected =
      auth::ComputeProof(auth::Side::kServer, options_.auth_token, options_.role, req.client_nonce,
                         accept.server_nonce, transcript);
  if (!auth::ProofsEqual(expected, accept.server_proof) &&
      (tap_ == nullptr || !tap_->ignore_server_proof)) {
    return Status::PermissionDenied(
        where + ": the server could not prove that it knows the " +
        std::string(auth::RoleName(options_.role)) +
        " secret: the secrets differ (check --auth_token_file / --admin_token_file on both "
        "sides) or this is not the server you meant");
  }
  auth::Mac proof = auth::ComputeProof(auth::Side::kClient, options_.auth_token, options_.role,
                                       req.client_nonce, accept.server_nonce, transcript);
  if (tap_ != nullptr && tap_->proof) proof = *tap_->proof;
  if (tap_ != nullptr) tap_->sent_proof = proof;
  max_request_ =
      static_cast<uint32_t>(std::min<uint64_t>(options_.max_message_size, accept.max_message));

  MsgChannel::Setup setup;
  setup.qp = qp_.get();
  setup.send_pool = &send_pool_;
  setup.peer_credits = accept.credits;
  setup.granted_credits = kClientRecvCredits;
  setup.flood = tap_ != nullptr && tap_->flood;
  setup.withhold_credits = tap_ != nullptr && tap_->withhold_credits;
  chan_.Init(setup);
  alive_.store(true, std::memory_order_release);

  // From now on the fabric's thread reports DISCONNECTED and the QP/CQ's async events (a server
  // that refuses our proof disconnects).
  fabric_->RegisterCmSink(id_.get(), this);
  RegisterAsyncSink(qp_.get(), this);
  RegisterAsyncSink(cq_.get(), this);
  registered_ = true;
  if (rdma_migrate_id(id_.get(), fabric_->cm_channel()) != 0) {
    return CallError("rdma_migrate_id", errno);
  }
  if (tap_ != nullptr && tap_->stop_before_proof) return Status::Ok();

  // Our proof, as the first message on the QP; the server answers WELCOME (the regions, with
  // this connection's own rkeys) or AUTH_REFUSED.
  std::array<uint8_t, auth::kAuthProofSize> proof_bytes{};
  auth::EncodeAuthProof({proof}, proof_bytes);
  bool fatal = false;
  st = chan_.Send(MsgType::kAuthProof, 0, proof_bytes, &fatal);
  if (fatal) Kill("ibv_post_send failed");
  if (!st.ok()) return LostStatus();
  while (hs_state_.load(std::memory_order_acquire) == kHsWaiting) {
    if (!alive()) {
      // The refusal may be in the CQ ahead of the flushed receives: one last look.
      MutexLock lk(&poll_mu_);
      size_t reads = 0;
      while (PollCq(&reads) > 0) {
      }
      if (hs_state_.load(std::memory_order_acquire) != kHsWaiting) break;
      return Status(StatusCode::kUnavailable,
                    where + ": the server closed the connection during the handshake (" +
                        LostStatus().message() + ")");
    }
    if (Clock::now() >= deadline) {
      return Status::TimedOut(where + ": no answer to the authentication proof within " +
                              std::to_string(options_.connect_timeout.count()) + " ms");
    }
    Progress(deadline);
  }
  if (hs_state_.load(std::memory_order_acquire) == kHsRefused) return hs_refusal_;
  VLOG(1) << "verbs connected to " << peer_ << ": session " << accept.session_id << ", "
          << regions_.size() << " region(s), " << accept.credits << " credits, READ depth "
          << int{qattr.max_rd_atomic} << (windows_ ? ", own memory window" : ", shared rkey");
  return Status::Ok();
}

ClientConnection::~ClientConnection() {
  if (registered_) {
    fabric_->UnregisterCmSink(id_.get());
    UnregisterAsyncSink(qp_.get());
    UnregisterAsyncSink(cq_.get());
  }
  alive_.store(false, std::memory_order_release);
  chan_.Close();
  if (registered_ && !disconnected_.exchange(true) && rdma_disconnect(id_.get()) != 0) {
    VLOG(1) << CallError("rdma_disconnect " + peer_, errno).ToString();
  }
  // QP before CQ before the MRs it used; the cm id last (then the setup channel it was on).
  qp_.reset();
  cq_.reset();
  comp_channel_.reset();
  send_pool_.reset();
  recv_pool_.reset();
  id_.reset();
  setup_channel_.reset();
}

void ClientConnection::Kill(const char* why) {
  const char* none = nullptr;
  death_reason_.compare_exchange_strong(none, why, std::memory_order_acq_rel);
  if (!alive_.exchange(false, std::memory_order_acq_rel)) return;
  chan_.Close();
  // rdma_disconnect moves the QP to the error state (every posted WR flushes) and tells the
  // server. Its failure (already disconnected) changes nothing.
  if (!disconnected_.exchange(true)) (void)rdma_disconnect(id_.get());
  WakeWaiters();
}

void ClientConnection::OnCmEvent(rdma_cm_event_type type, int status) {
  switch (type) {
    case RDMA_CM_EVENT_DISCONNECTED:
      Kill("the server disconnected");
      break;
    case RDMA_CM_EVENT_DEVICE_REMOVAL:
      Kill("the RDMA device was removed");
      break;
    case RDMA_CM_EVENT_TIMEWAIT_EXIT:
    case RDMA_CM_EVENT_ESTABLISHED:
    case RDMA_CM_EVENT_ADDR_CHANGE:
      break;
    default:
      Kill("unexpected rdma_cm event");
      break;
  }
}

void ClientConnection::OnAsyncEvent(ibv_event_type type) {
  switch (type) {
    case IBV_EVENT_QP_FATAL:
      Kill("queue pair fatal error (IBV_EVENT_QP_FATAL)");
      break;
    case IBV_EVENT_QP_REQ_ERR:
      Kill("invalid request (IBV_EVENT_QP_REQ_ERR)");
      break;
    case IBV_EVENT_QP_ACCESS_ERR:
      Kill("access error (IBV_EVENT_QP_ACCESS_ERR)");
      break;
    case IBV_EVENT_CQ_ERR:
      Kill("completion queue error (IBV_EVENT_CQ_ERR)");
      break;
    case IBV_EVENT_DEVICE_FATAL:
      Kill("device fatal error");
      break;
    default:
      break;
  }
}

// =================================================================================================
// Server sessions
// =================================================================================================

void ServerSessionImpl::MarkDead() {
  if (dead_.exchange(true, std::memory_order_acq_rel)) return;
  chan_.Close();
  MutexLock lk(&cm_mu_);
  if (cm_id_.get() != nullptr && qp_.get() != nullptr) (void)rdma_disconnect(cm_id_.get());
}

void ServerSessionImpl::OnAsyncEvent(ibv_event_type type) {
  switch (type) {
    case IBV_EVENT_QP_FATAL:
    case IBV_EVENT_QP_REQ_ERR:
    case IBV_EVENT_QP_ACCESS_ERR:  // e.g. the client READ outside a region: RC kills both QPs
    case IBV_EVENT_DEVICE_FATAL:
      MarkDead();
      break;
    case IBV_EVENT_QP_LAST_WQE_REACHED:
      last_wqe_reached_.store(true);
      break;
    case IBV_EVENT_COMM_EST: {
      // A message arrived before the RTU: let rdma_cm finish establishing.
      MutexLock lk(&cm_mu_);
      if (cm_id_.get() != nullptr) (void)rdma_notify(cm_id_.get(), IBV_EVENT_COMM_EST);
      break;
    }
    default:
      break;
  }
}

// =================================================================================================
// VerbsListener
// =================================================================================================

VerbsListener::VerbsListener(VerbsFabric* fabric, ListenOptions options)
    : fabric_(fabric), options_(std::move(options)) {}

Status VerbsListener::Start() {
  if (!options_.handler) return Status::InvalidArgument("ListenOptions::handler is empty");
  if (options_.regions.size() > kMaxRegions) {
    return Status::InvalidArgument("the verbs handshake carries at most " +
                                   std::to_string(kMaxRegions) + " regions, got " +
                                   std::to_string(options_.regions.size()));
  }
  if (options_.max_connections == 0) return Status::InvalidArgument("max_connections must be >= 1");
  if (options_.max_message_size == 0 || options_.max_message_size > UINT32_MAX) {
    return Status::InvalidArgument("max_message_size must be in [1, 4 GiB)");
  }
  if (options_.worker_threads < 1) options_.worker_threads = 1;
  // Receive groups (RecvGroup): as few as the device's CQ and SRQ sizes allow, each sized for
  // an equal share of max_connections. Per session a CQ holds its receive credits, its send
  // slots and one bind per window; 64 entries of slack per CQ.
  const ibv_device_attr& da = fabric_->device_attr();
  const uint64_t per_session = kServerRecvCredits + kServerSendSlots + options_.regions.size();
  const uint64_t fit_cq =
      da.max_cqe > 64 ? (static_cast<uint64_t>(da.max_cqe) - 64) / per_session : 0;
  const uint64_t fit_srq = static_cast<uint64_t>(std::max(da.max_srq_wr, 0)) / kServerRecvCredits;
  const uint64_t fit = std::min(fit_cq, fit_srq);
  // Room for sessions being torn down too (an evicted handshake's QP drains before its place is
  // free): up to max_handshakes of them beyond max_connections.
  const uint64_t sessions = uint64_t{options_.max_connections} + options_.max_handshakes;
  const uint64_t groups = fit == 0 ? 0 : (sessions + fit - 1) / fit;
  if (groups == 0 || groups > kMaxRecvGroups) {
    return Status::InvalidArgument(
        "max_connections " + std::to_string(options_.max_connections) + " (+ max_handshakes " +
        std::to_string(options_.max_handshakes) + ") needs " +
        (fit == 0 ? std::string("more than one CQ can hold")
                  : std::to_string(groups) + " CQs of " + std::to_string(fit) + " sessions") +
        " on " + fabric_->device_name() + " (CQs of " + std::to_string(da.max_cqe) +
        " entries, SRQs of " + std::to_string(da.max_srq_wr) + "; at most " +
        std::to_string(kMaxRecvGroups) + " CQs per listener)");
  }
  group_count_ = static_cast<uint32_t>(groups);
  sessions_per_group_ = static_cast<uint32_t>((sessions + groups - 1) / groups);
  if (options_.verbs_sessions_per_cq > 0 && options_.verbs_sessions_per_cq < sessions_per_group_) {
    // Test hook: smaller groups than the device needs, so that tests reach several groups.
    sessions_per_group_ = options_.verbs_sessions_per_cq;
    group_count_ = static_cast<uint32_t>((options_.max_connections + sessions_per_group_ - 1) /
                                         sessions_per_group_);
    if (group_count_ > kMaxRecvGroups) {
      return Status::InvalidArgument(
          "verbs_sessions_per_cq " + std::to_string(options_.verbs_sessions_per_cq) +
          " makes more than " + std::to_string(kMaxRecvGroups) + " CQs for max_connections " +
          std::to_string(options_.max_connections));
    }
  }
  const uint64_t srq_wr = uint64_t{sessions_per_group_} * kServerRecvCredits;
  const uint64_t cqe = uint64_t{sessions_per_group_} * per_session + 64;
  secrets_ = {options_.auth_token, options_.admin_token, options_.loopback_admin};
  // Per-connection windows need every advertised region to be one this fabric registered (for
  // MW binding); a region from elsewhere could not be read through a window at all.
  use_windows_ = fabric_->memory_windows();
  for (const RegionDescriptor& r : options_.regions) {
    ibv_mr* mr = fabric_->FindRegistration(r);
    if (use_windows_ && mr == nullptr) {
      return Status::InvalidArgument(
          "a region advertised by the verbs listener was not allocated (AllocateRegion "
          "kRemoteRead) by this fabric: no memory window can be bound onto it");
    }
    region_mrs_.push_back(mr);
  }
  const std::string where = "verbs " + FormatHostPort(options_.host, options_.port);
  RDKV_ASSIGN_OR_RETURN(sockaddr_storage addr, ResolveAddress(options_.host, options_.port, true));

  RDKV_ASSIGN_OR_RETURN(channel_, EventChannel::Create());
  RDKV_ASSIGN_OR_RETURN(listen_id_, CmId::Create(channel_.get(), this));
  int reuse = 1;  // a restarted server must get its port back at once (~SO_REUSEADDR)
  if (rdma_set_option(listen_id_.get(), RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, &reuse,
                      sizeof(reuse)) != 0) {
    return CallError("rdma_set_option(RDMA_OPTION_ID_REUSEADDR)", errno);
  }
  if (rdma_bind_addr(listen_id_.get(), reinterpret_cast<sockaddr*>(&addr)) != 0) {
    return CallError("rdma_bind_addr " + FormatHostPort(options_.host, options_.port), errno,
                     StatusCode::kUnavailable);
  }
  if (listen_id_->verbs != nullptr && listen_id_->verbs != fabric_->context()) {
    return Status::Unavailable(where + " belongs to RDMA device " +
                               ibv_get_device_name(listen_id_->verbs->device) +
                               ", this fabric uses " + fabric_->device_name());
  }

  ibv_pd* pd = fabric_->pd();
  RDKV_ASSIGN_OR_RETURN(comp_channel_, CompletionChannel::Create(fabric_->context()));
  groups_ = std::make_unique<RecvGroup[]>(group_count_);
  for (uint32_t g = 0; g < group_count_; ++g) {
    RDKV_ASSIGN_OR_RETURN(
        groups_[g].cq,
        CompletionQueue::Create(fabric_->context(), static_cast<int>(cqe), comp_channel_.get()));
    RDKV_ASSIGN_OR_RETURN(groups_[g].srq,
                          SharedReceiveQueue::Create(pd, static_cast<uint32_t>(srq_wr)));
    RegisterAsyncSink(groups_[g].srq.get(), this);
    RegisterAsyncSink(groups_[g].cq.get(), this);
  }
  const size_t block_slots = size_t{group_count_} * sessions_per_group_;
  srq_blocks_ = std::make_unique<ChunkPool[]>(block_slots);
  srq_block_group_ = std::make_unique<uint32_t[]>(block_slots);
  RDKV_RETURN_IF_ERROR(GrowSrq(0));  // receive buffers for the first connection
  RDKV_RETURN_IF_ERROR(worker_wake_.Open());
  RDKV_RETURN_IF_ERROR(cm_wake_.Open());

  if (rdma_listen(listen_id_.get(),
                  static_cast<int>(std::min<uint32_t>(options_.max_connections, 1024))) != 0) {
    return CallError("rdma_listen " + FormatHostPort(options_.host, options_.port), errno,
                     StatusCode::kUnavailable);
  }
  port_ = ntohs(rdma_get_src_port(listen_id_.get()));
  for (int i = 0; i < options_.worker_threads; ++i) {
    workers_.emplace_back(&VerbsListener::WorkerMain, this);
  }
  cm_thread_ = std::thread(&VerbsListener::CmThreadMain, this);
  LOG(INFO) << "verbs listener on " << FormatHostPort(options_.host, port_) << " ("
            << fabric_->Describe() << ", " << options_.worker_threads << " worker(s), up to "
            << options_.max_connections << " connections on " << group_count_ << " CQ(s) of "
            << sessions_per_group_ << ", " << options_.regions.size() << " region(s), "
            << (use_windows_ ? "a type-2 memory window per connection"
                             : "no memory windows: every client gets the regions' own rkeys")
            << ")";
  return Status::Ok();
}

VerbsListener::~VerbsListener() {
  cm_stop_.store(true);
  if (cm_thread_.joinable()) {
    cm_wake_.Signal();
    cm_thread_.join();
  }
  {
    MutexLock lk(&state_mu_);
    stop_ = true;
  }
  stop_flag_.store(true);
  if (!workers_.empty()) {
    worker_wake_.Signal();
    work_cv_.SignalAll();
    for (std::thread& t : workers_) t.join();
  }
  // Every client is disconnected; then QPs (they use the CQ and SRQ) go before the SRQ, its
  // buffers, the CQ and the channels.
  for (auto& [id, s] : by_id_) s->MarkDead();
  while (!by_id_.empty()) Teardown(by_id_.begin()->second);
  listen_id_.reset();
  for (uint32_t g = 0; groups_ != nullptr && g < group_count_; ++g) {  // null: Start failed
    UnregisterAsyncSink(groups_[g].srq.get());
    UnregisterAsyncSink(groups_[g].cq.get());
    groups_[g].srq.reset();
  }
  srq_blocks_.reset();
  groups_.reset();  // the CQs
  comp_channel_.reset();
  channel_.reset();
}

ListenerStats VerbsListener::stats() const {
  ListenerStats s;
  s.connections_accepted = accepted_.load(std::memory_order_relaxed);
  s.connections_refused = refused_.load(std::memory_order_relaxed);
  s.requests = requests_.load(std::memory_order_relaxed);
  s.protocol_errors = protocol_errors_.load(std::memory_order_relaxed);
  s.connections_open = authenticated_.load(std::memory_order_relaxed);
  s.handshakes_evicted = handshakes_evicted_.load(std::memory_order_relaxed);
  s.handshakes_timed_out = handshakes_timed_out_.load(std::memory_order_relaxed);
  s.idle_closed = idle_closed_.load(std::memory_order_relaxed);
  s.slow_readers_cut = slow_readers_cut_.load(std::memory_order_relaxed);
  return s;  // reads_served/refused: the NIC serves READs; the server never sees them
}

void VerbsListener::PauseWorkers(bool paused) {
  {
    MutexLock lk(&state_mu_);
    paused_ = paused;
  }
  paused_flag_.store(paused, std::memory_order_release);
  if (paused) worker_wake_.Signal();  // the polling worker leaves its wait
  work_cv_.SignalAll();
}

void VerbsListener::OnAsyncEvent(ibv_event_type type) {
  if (type == IBV_EVENT_SRQ_LIMIT_REACHED) {
    if (!srq_alarm_logged_.exchange(true)) {
      LOG(WARNING) << "verbs listener port " << port_
                   << ": SRQ below its low-water mark (clients hold most of their credits)";
    }
    return;
  }
  if (type == IBV_EVENT_SRQ_ERR || type == IBV_EVENT_CQ_ERR || type == IBV_EVENT_DEVICE_FATAL) {
    LOG(ERROR) << "verbs listener port " << port_ << ": " << ibv_event_type_str(type)
               << ": every session is closed";
    ReaderMutexLock lk(&sessions_mu_);
    for (auto& [qpn, s] : by_qpn_) s->MarkDead();
  }
}

Status VerbsListener::GrowSrq(uint32_t g) {
  RecvGroup& group = groups_[g];
  const uint32_t b = srq_blocks_used_.load(std::memory_order_acquire);
  if (b >= group_count_ * sessions_per_group_ || group.blocks >= sessions_per_group_) {
    return Status::Internal("SRQ buffer pool is full");
  }
  RDKV_ASSIGN_OR_RETURN(srq_blocks_[b], ChunkPool::Create(fabric_->pd(), kServerRecvCredits,
                                                          kChunkSize, IBV_ACCESS_LOCAL_WRITE));
  srq_block_group_[b] = g;
  srq_blocks_used_.store(b + 1, std::memory_order_release);  // before workers can see its WRs
  std::vector<ibv_recv_wr> wrs(kServerRecvCredits);
  std::vector<ibv_sge> sges(kServerRecvCredits);
  for (uint32_t i = 0; i < kServerRecvCredits; ++i) {
    sges[i].addr = reinterpret_cast<uintptr_t>(srq_blocks_[b].chunk(i));
    sges[i].length = kChunkSize;
    sges[i].lkey = srq_blocks_[b].lkey();
    wrs[i].wr_id = MakeWrId(kWrRecv, b * kServerRecvCredits + i);
    wrs[i].sg_list = &sges[i];
    wrs[i].num_sge = 1;
    wrs[i].next = i + 1 < kServerRecvCredits ? &wrs[i + 1] : nullptr;
  }
  ibv_recv_wr* bad = nullptr;
  if (int rc = ibv_post_srq_recv(group.srq.get(), wrs.data(), &bad); rc != 0) {
    return CallError("ibv_post_srq_recv", rc);
  }
  ++group.blocks;
  // Alarm (async event) when fewer than 1/8 of the group's buffers are posted.
  ibv_srq_attr attr{};
  attr.srq_limit = std::max<uint32_t>(1, group.blocks * kServerRecvCredits / 8);
  if (int rc = ibv_modify_srq(group.srq.get(), &attr, IBV_SRQ_LIMIT); rc != 0) {
    VLOG(1) << CallError("ibv_modify_srq(IBV_SRQ_LIMIT)", rc).ToString()
            << " (no SRQ low-water alarm)";
  }
  return Status::Ok();
}

void VerbsListener::Reject(CmId id, RejectReason reason, const std::string& text) {
  RejectData r;
  r.reason = reason;
  r.text = text;
  const std::vector<uint8_t> blob = EncodeReject(r);
  if (rdma_reject(id.get(), blob.data(), static_cast<uint8_t>(blob.size())) != 0) {
    LOG(WARNING) << CallError("rdma_reject", errno).ToString();
  }
  // `id` is destroyed here (rdma_destroy_id).
}

namespace {

// True when `peer` is a loopback address or one of this host's own interface addresses (an
// RDMA peer on the same machine: the verbs analogue of a loopback peer).
bool PeerIsThisHost(const sockaddr* peer) {
  if (peer == nullptr) return false;
  if (peer->sa_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(peer);
    if ((ntohl(a->sin_addr.s_addr) >> 24) == 127) return true;
  } else if (peer->sa_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(peer);
    if (IN6_IS_ADDR_LOOPBACK(&a->sin6_addr)) return true;
  } else {
    return false;
  }
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return false;
  bool local = false;
  for (ifaddrs* i = list; i != nullptr && !local; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != peer->sa_family) continue;
    if (peer->sa_family == AF_INET) {
      local = reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr ==
              reinterpret_cast<const sockaddr_in*>(peer)->sin_addr.s_addr;
    } else {
      local = std::memcmp(&reinterpret_cast<const sockaddr_in6*>(i->ifa_addr)->sin6_addr,
                          &reinterpret_cast<const sockaddr_in6*>(peer)->sin6_addr, 16) == 0;
    }
  }
  freeifaddrs(list);
  return local;
}

}  // namespace

void VerbsListener::HandleConnectRequest(rdma_cm_id* raw_id, const rdma_conn_param& param,
                                         std::span<const uint8_t> private_data) {
  CmId child = CmId::Adopt(raw_id);
  const std::string who = SockaddrText(rdma_get_peer_addr(raw_id));
  const std::string where = "verbs listener port " + std::to_string(port_);
  auto refuse = [&](RejectReason reason, const std::string& text) {
    refused_.fetch_add(1, std::memory_order_relaxed);
    LOG(WARNING) << where << ": refused " << who << ": " << text;
    Reject(std::move(child), reason, text);
  };
  // The handshake (docs/security.md "The handshake (verbs)"): this request carries the role and
  // the client's nonce; the accept carries our nonce and our proof; the client's proof comes as
  // the first SEND on the QP and only then does the WELCOME reveal the regions. Until then the
  // QP serves no READ (no remote access flags, and no window is bound).
  ConnectRequestData req;
  if (Status s = DecodeConnectRequest(private_data, &req); !s.ok()) {
    return refuse(s.code() == StatusCode::kNotSupported ? RejectReason::kBadVersion
                                                        : RejectReason::kMalformed,
                  s.message());
  }
  const bool this_host = PeerIsThisHost(rdma_get_peer_addr(raw_id));
  Result<std::string_view> key = auth::ServerKeyFor(secrets_, req.role, this_host);
  if (!key.ok()) return refuse(RejectReason::kBadToken, key.status().message());
  if (cm_stop_.load()) return refuse(RejectReason::kShuttingDown, "the server is shutting down");
  // Handshakes in progress are limited apart, in all (max_handshakes) and per source address
  // (max_handshakes_per_source): at a limit the oldest is cut, so connects that never prove
  // cannot keep a client that does out.
  const std::string source = SourceText(rdma_get_peer_addr(raw_id));
  ServerSessionImpl* oldest = nullptr;
  ServerSessionImpl* oldest_same = nullptr;
  uint32_t pending = 0, same = 0, alive = 0;
  for (auto& [cid, s] : by_id_) {
    if (!s->dead()) ++alive;
    if (s->dead() || s->auth_state() != ServerSessionImpl::AuthState::kAwaitProof) continue;
    ++pending;
    if (oldest == nullptr || s->created_ < oldest->created_) oldest = s.get();
    if (s->source_ == source) {
      ++same;
      if (oldest_same == nullptr || s->created_ < oldest_same->created_) oldest_same = s.get();
    }
  }
  auto evict = [&](ServerSessionImpl* s) {
    if (s->dead()) return;
    s->MarkDead();  // counted as refused at its teardown
    --alive;
    handshakes_evicted_.fetch_add(1, std::memory_order_relaxed);
  };
  if (oldest != nullptr && pending >= std::max<uint32_t>(1, options_.max_handshakes)) {
    evict(oldest);
  }
  if (oldest_same != nullptr && same >= std::max<uint32_t>(1, options_.max_handshakes_per_source)) {
    evict(oldest_same);
  }
  // Sessions cut but not yet torn down (their QPs drain first) do not count: an evicted
  // silent handshake makes room for the connect that evicted it at once. The receive groups
  // have room for them beyond max_connections (Start), and refuse when they have none.
  if (alive >= options_.max_connections) {
    return refuse(RejectReason::kTooManyConnections,
                  "too many connections (max " + std::to_string(options_.max_connections) + ")");
  }
  if (raw_id->verbs != fabric_->context()) {
    return refuse(RejectReason::kWrongDevice, "the request arrived on another RDMA device");
  }
  Result<auth::Nonce> nonce = auth::RandomNonce();
  if (!nonce.ok()) {
    LOG(ERROR) << where << ": " << nonce.status().ToString();
    return refuse(RejectReason::kServerError, "server cannot make a nonce");
  }
  // The least loaded group takes the session, and its SRQ keeps a block of buffers per session
  // + 1. One has room unless more than max_handshakes sessions are being torn down.
  uint32_t gi = 0;
  for (uint32_t g = 1; g < group_count_; ++g) {
    if (groups_[g].sessions < groups_[gi].sessions) gi = g;
  }
  RecvGroup& group = groups_[gi];
  if (group.sessions >= sessions_per_group_) {  // its CQ could overrun
    LOG(WARNING) << where << ": every receive group is full (" << live_sessions_
                 << " sessions, some still being torn down)";
    return refuse(RejectReason::kTooManyConnections,
                  "too many connections (sessions still being torn down)");
  }
  while (group.blocks < group.sessions + 1) {
    if (Status s = GrowSrq(gi); !s.ok()) {
      LOG(ERROR) << where << ": growing the SRQ: " << s.ToString();
      return refuse(RejectReason::kServerError, "server out of receive buffers");
    }
  }
  auto session = std::make_shared<ServerSessionImpl>(next_session_id_++, who, req.max_message);
  session->role_ = auth::GrantRole(secrets_, req.role, this_host);
  session->proven_secret_ = auth::ProvenSecret(secrets_, req.role);
  session->created_ = Clock::now();
  session->last_active_ = session->created_;
  session->source_ = source;
  session->secrets_epoch_ = secrets_epoch_;
  Result<ChunkPool> pool = ChunkPool::Create(fabric_->pd(), kServerSendSlots, kChunkSize, 0);
  if (!pool.ok()) {
    LOG(ERROR) << where << ": send buffers for " << who << ": " << pool.status().ToString();
    return refuse(RejectReason::kServerError, "server out of memory");
  }
  session->send_pool_ = std::move(pool).value();
  // This connection's windows (bound only once the client has proved itself).
  session->welcome_regions_ = options_.regions;
  if (use_windows_) {
    for (size_t i = 0; i < options_.regions.size(); ++i) {
      Result<MemoryWindow> mw = MemoryWindow::Create(fabric_->pd());
      if (!mw.ok()) {
        LOG(ERROR) << where << ": memory window for " << who << ": " << mw.status().ToString();
        return refuse(RejectReason::kServerError, "server cannot allocate a memory window");
      }
      // The key byte of the rkey changes with each bind (ibv_inc_rkey).
      session->welcome_regions_[i].rkey = ibv_inc_rkey(mw->get()->rkey);
      session->windows_.push_back(std::move(mw).value());
      session->window_mrs_.push_back(region_mrs_[i]);
    }
  }
  uint8_t ack_timeout = kAckTimeout;
  if (rdma_set_option(raw_id, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &ack_timeout,
                      sizeof(ack_timeout)) != 0) {
    VLOG(1) << CallError("rdma_set_option(RDMA_OPTION_ID_ACK_TIMEOUT)", errno).ToString();
  }
  ibv_qp_init_attr attr{};
  attr.qp_context = session.get();
  attr.send_cq = group.cq.get();
  attr.recv_cq = group.cq.get();
  attr.srq = group.srq.get();
  // The SEND slots plus one bind per window.
  attr.cap.max_send_wr = kServerSendSlots + static_cast<uint32_t>(session->windows_.size());
  attr.cap.max_send_sge = 1;
  attr.cap.max_recv_sge = 1;
  attr.qp_type = IBV_QPT_RC;
  Result<CmQueuePair> qp = CmQueuePair::Create(raw_id, fabric_->pd(), &attr);
  if (!qp.ok()) {
    LOG(ERROR) << where << ": queue pair for " << who << ": " << qp.status().ToString();
    return refuse(RejectReason::kServerError, "server cannot create a queue pair");
  }
  session->qp_ = std::move(qp).value();
  session->qp_num_ = session->qp_.get()->qp_num;
  session->group_ = gi;
  session->cm_id_ = std::move(child);

  AcceptData accept;
  accept.flags = use_windows_ ? kAcceptFlagMemoryWindows : 0;
  accept.credits = kServerRecvCredits;
  accept.max_message = static_cast<uint32_t>(options_.max_message_size);
  accept.session_id = session->id_;
  accept.server_nonce = *nonce;
  auto blob = EncodeAccept(accept);  // server_proof still zero: not in the transcript
  const auto transcript = HandshakeTranscript(
      std::span<const uint8_t, kConnectRequestSize>(private_data.data(), kConnectRequestSize),
      std::span<const uint8_t, kAcceptHeadSize>(blob.data(), kAcceptHeadSize));
  accept.server_proof = auth::ComputeProof(auth::Side::kServer, *key, req.role, req.client_nonce,
                                           accept.server_nonce, transcript);
  session->expected_proof_ = auth::ComputeProof(auth::Side::kClient, *key, req.role,
                                                req.client_nonce, accept.server_nonce, transcript);
  blob = EncodeAccept(accept);

  MsgChannel::Setup setup;
  setup.qp = session->qp_.get();
  setup.send_pool = &session->send_pool_;
  setup.peer_credits = req.credits;
  setup.granted_credits = kServerRecvCredits;
  // Answers waiting for the client's credits are kept up to this much. Unlike tcp, which stops
  // reading a session whose output backs up, the server keeps taking requests, so an honest
  // client with many large answers in flight (a catch-up copy keeps 4 scans of about 1 MiB)
  // must fit: the stall timeout (ReapSessions) is what cuts a client that takes none.
  setup.max_waiting_bytes = std::max<size_t>(size_t{64} << 20, 4 * options_.max_message_size);
  session->chan_.Init(setup);
  RegisterAsyncSink(session->qp_.get(), session.get());
  {
    WriterMutexLock lk(&sessions_mu_);
    by_qpn_[session->qp_num_] = session;
  }
  by_id_[raw_id] = session;
  ++group.sessions;
  ++live_sessions_;
  open_sessions_.store(live_sessions_, std::memory_order_relaxed);

  rdma_conn_param out{};
  out.private_data = blob.data();
  out.private_data_len = static_cast<uint8_t>(blob.size());
  // The request event reports depths from our side's view: param.responder_resources is the
  // client's initiator depth (READs it may have outstanding towards us).
  out.responder_resources = static_cast<uint8_t>(std::min<int>(
      param.responder_resources, std::min(fabric_->device_attr().max_qp_rd_atom, 255)));
  out.initiator_depth = 0;  // the server never READs
  out.retry_count = kRetryCount;
  // Carried in the CM REP: the client's QP retries its SENDs on RNR with this (see above).
  out.rnr_retry_count = kClientRnrRetry;
  if (rdma_accept(raw_id, &out) != 0) {
    LOG(WARNING) << where << ": " << CallError("rdma_accept for " + who, errno).ToString();
    refused_.fetch_add(1, std::memory_order_relaxed);
    session->MarkDead();  // torn down by ReapSessions
    return;
  }
  // rdma_accept's INIT/RTR/RTS steps give the QP remote READ (from rdma_cm's defaults, which
  // overwrite earlier flags); take it away until the proof (AdmitSession gives it back, under
  // the same lock, so whichever runs second wins correctly). With memory windows this is
  // defence in depth: no window is bound and the MR grants nothing remotely.
  {
    MutexLock lk(&session->cm_mu_);
    if (session->auth_state() == ServerSessionImpl::AuthState::kAwaitProof &&
        session->qp_.get() != nullptr) {
      ibv_qp_attr qa{};
      qa.qp_access_flags = 0;
      if (int rc = ibv_modify_qp(session->qp_.get(), &qa, IBV_QP_ACCESS_FLAGS); rc != 0) {
        LOG_FIRST_N(WARNING, 1) << where << ": "
                                << CallError("ibv_modify_qp(IBV_QP_ACCESS_FLAGS 0)", rc).ToString()
                                << ": unproven queue pairs keep rdma_cm's remote access flags";
      }
    }
  }
  VLOG(1) << where << ": handshake with " << who << " as session " << session->id_ << " (qp "
          << session->qp_num_ << ", READ depth " << int{out.responder_resources} << ", "
          << session->windows_.size() << " window(s))";
}

void VerbsListener::Teardown(
    std::shared_ptr<ServerSessionImpl> s) {  // by value: erases its map entry
  by_id_.erase(s->cm_id_.get());
  UnregisterAsyncSink(s->qp_.get());
  {
    WriterMutexLock lk(&sessions_mu_);
    by_qpn_.erase(s->qp_num_);
  }
  s->chan_.Close();
  {
    // Windows first: deallocating invalidates them (the rkey this client was given now refers
    // to nothing), and they hold the QP and the region's MR.
    MutexLock lk(&s->cm_mu_);
    s->windows_.clear();
    s->qp_.reset();
    s->send_pool_.reset();
    s->cm_id_.reset();
  }
  if (s->auth_state() == ServerSessionImpl::AuthState::kReady) {
    authenticated_.fetch_sub(1, std::memory_order_relaxed);
  } else if (s->auth_state() == ServerSessionImpl::AuthState::kAwaitProof) {
    // Gone without proving (left, refused the server's proof, cut at the deadline or evicted);
    // a wrong proof was counted when it was refused.
    refused_.fetch_add(1, std::memory_order_relaxed);
  }
  --groups_[s->group_].sessions;
  --live_sessions_;
  open_sessions_.store(live_sessions_, std::memory_order_relaxed);
}

bool VerbsListener::HandshakeOverdue(const ServerSessionImpl& s, Clock::time_point now) const {
  // The client can send its proof only once the connection is established, so its deadline
  // counts from there: in the emulated VM the accept's way back has taken seconds. A connection
  // that never gets established is cut after kEstablishDeadline (rdma_cm normally reports a
  // CONNECT_ERROR long before); max_handshakes bounds how many wait meanwhile.
  if (s.established_) return now - *s.established_ >= options_.handshake_timeout;
  return now - s.created_ >=
         std::max<Clock::duration>(options_.handshake_timeout, kEstablishDeadline);
}

void VerbsListener::ReapSessions() {
  const Clock::time_point now = Clock::now();
  std::vector<std::shared_ptr<ServerSessionImpl>> done;
  uint64_t timed_out = 0;
  for (auto& [id, s] : by_id_) {
    if (!s->dead() && s->auth_state() != ServerSessionImpl::AuthState::kReady &&
        HandshakeOverdue(*s, now)) {
      // No valid proof within the handshake deadline (or refused and not yet gone): cut.
      if (s->auth_state() == ServerSessionImpl::AuthState::kAwaitProof) ++timed_out;
      s->MarkDead();
    }
    if (!s->dead() && s->auth_state() == ServerSessionImpl::AuthState::kReady) {
      // Idle: nothing received for idle_timeout (clients that only READ send keep-alives, see
      // the WELCOME) and nothing of ours in flight.
      const uint64_t received = s->received_.load(std::memory_order_relaxed);
      if (received != s->received_seen_) {
        s->received_seen_ = received;
        s->last_active_ = now;
      } else if (options_.idle_timeout.count() > 0 &&
                 now - s->last_active_ >= options_.idle_timeout &&
                 s->chan_.sends_in_flight() == 0) {
        idle_closed_.fetch_add(1, std::memory_order_relaxed);
        ++idle_unlogged_;
        s->MarkDead();
      }
      // Answers that have waited for the client's credits for output_stall_timeout: a client
      // that does not take its answers (they are kept in memory meanwhile) is cut off.
      const int64_t waiting = s->chan_.waiting_since_ns();
      if (!s->dead() && waiting != 0 && options_.output_stall_timeout.count() > 0 &&
          now.time_since_epoch() - std::chrono::nanoseconds(waiting) >=
              options_.output_stall_timeout) {
        slow_readers_cut_.fetch_add(1, std::memory_order_relaxed);
        LOG(WARNING) << "verbs listener port " << port_ << ": closing " << s->peer_
                     << ": its answers waited " << options_.output_stall_timeout.count()
                     << " ms for credits (a client that does not take them)";
        s->MarkDead();
      }
    }
    if (!s->dead()) continue;
    if (!s->dying_) {
      if (s->cut_for_waiting_.load(std::memory_order_acquire)) {
        slow_readers_cut_.fetch_add(1, std::memory_order_relaxed);
        LOG(WARNING) << "verbs listener port " << port_ << ": closed " << s->peer_
                     << ": its answers waiting for credits passed the byte limit (a client that "
                        "takes no answers)";
      }
      s->dying_ = true;
      s->dead_since_ = now;
      s->dead_epoch_ = groups_[s->group_].empty_epoch.load(std::memory_order_acquire);
      continue;
    }
    // Destroy the QP only once the workers have seen every completion it can produce: no send
    // in flight, its group's CQ found empty twice since, and the SRQ done with it (the device's
    // LAST_WQE_REACHED event, or a grace period where the device sends none). A session whose
    // completions nobody polls (paused workers) goes after 10 s regardless; its late
    // completions then find no session and are dropped.
    const auto dead_for = now - s->dead_since_;
    const bool drained =
        s->chan_.sends_in_flight() == 0 &&
        groups_[s->group_].empty_epoch.load(std::memory_order_acquire) >= s->dead_epoch_ + 2 &&
        (s->last_wqe_reached_.load() || dead_for >= std::chrono::milliseconds(200));
    if (drained || dead_for >= std::chrono::seconds(10)) {
      done.push_back(s);
    }
  }
  for (const auto& s : done) {
    VLOG(1) << "verbs listener port " << port_ << ": session " << s->id_ << " (" << s->peer_
            << ") closed";
    Teardown(s);
  }
  // Refusals, reported here (the workers that refuse proofs do not log), at most every 10 s.
  timed_out_unlogged_ += timed_out;
  handshakes_timed_out_.fetch_add(timed_out, std::memory_order_relaxed);
  if (idle_unlogged_ > 0 && now - last_idle_log_ >= std::chrono::seconds(10)) {
    LOG(INFO) << "verbs listener port " << port_ << ": closed " << idle_unlogged_
              << " session(s) idle for " << options_.idle_timeout.count() << " ms (idle_timeout)";
    idle_unlogged_ = 0;
    last_idle_log_ = now;
  }
  const uint64_t refused = proofs_refused_.load(std::memory_order_relaxed);
  if ((refused != proofs_refused_logged_ || timed_out_unlogged_ > 0) &&
      now - last_refusal_log_ >= std::chrono::seconds(10)) {
    LOG(WARNING) << "verbs listener port " << port_ << ": refused "
                 << refused - proofs_refused_logged_
                 << " connection(s) whose proof was wrong (a wrong secret for the role, or a "
                    "replayed handshake) and cut "
                 << timed_out_unlogged_ << " that did not prove within "
                 << options_.handshake_timeout.count() << " ms";
    proofs_refused_logged_ = refused;
    timed_out_unlogged_ = 0;
    last_refusal_log_ = now;
  }
}

Result<uint64_t> VerbsListener::RotateSecrets(const std::string& auth_token,
                                              const std::string& admin_token) {
  MutexLock lk(&rotate_mu_);
  const uint64_t epoch = ++rotation_.epoch;
  rotation_.data = auth_token;
  rotation_.admin = admin_token;
  cm_wake_.Signal();
  const Clock::time_point until = Clock::now() + std::chrono::seconds(5);
  while (rotated_epoch_ < epoch) {
    if (Clock::now() > until || cm_stop_.load()) {
      return Status::TimedOut("verbs listener port " + std::to_string(port_) +
                              ": the cm thread did not apply the new secrets within 5 s");
    }
    rotate_cv_.WaitFor(&rotate_mu_, std::chrono::milliseconds(50));
  }
  return rotation_.revoked;
}

void VerbsListener::ApplyRotation() {
  std::string data, admin;
  uint64_t epoch = 0;
  {
    MutexLock lk(&rotate_mu_);
    if (rotation_.epoch == rotated_epoch_) return;
    epoch = rotation_.epoch;
    data = rotation_.data;
    admin = rotation_.admin;
  }
  const bool data_changed = secrets_.data != data;
  const bool admin_changed = secrets_.admin != admin;
  secrets_.data = std::move(data);
  secrets_.admin = std::move(admin);
  // Sessions whose key came from a replaced secret: closed now (rdma_disconnect moves the QP
  // to the error state, so its windows' rkeys read nothing from here on); torn down as usual.
  uint64_t revoked = 0;
  for (auto& [id, s] : by_id_) {
    if (s->dead() || s->secrets_epoch_ >= epoch) continue;
    if (!auth::RevokedByRotation(s->proven_secret_, s->role_, data_changed, admin_changed)) {
      continue;
    }
    if (s->auth_state() == ServerSessionImpl::AuthState::kReady) ++revoked;
    s->MarkDead();
  }
  secrets_epoch_ = epoch;
  if (revoked > 0) {
    LOG(INFO) << "verbs listener port " << port_ << ": secrets replaced; closed " << revoked
              << " session(s) whose credentials were revoked";
  }
  MutexLock lk(&rotate_mu_);
  rotated_epoch_ = epoch;
  rotation_.revoked = revoked;
  rotate_cv_.SignalAll();
}

void VerbsListener::CmThreadMain() {
  rdkv::util::NameThisThread("rdkv-verbs-cm");
  while (!cm_stop_.load()) {
    pollfd pfd[2] = {{channel_.fd(), POLLIN, 0}, {cm_wake_.fd(), POLLIN, 0}};
    if (poll(pfd, 2, 100) < 0 && errno != EINTR) {
      PLOG(ERROR) << "verbs listener cm thread: poll";
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    if (pfd[1].revents != 0) cm_wake_.Drain();
    ApplyRotation();
    while (!cm_stop_.load()) {
      rdma_cm_event* ev = nullptr;
      if (rdma_get_cm_event(channel_.get(), &ev) != 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK) PLOG(ERROR) << "rdma_get_cm_event";
        break;
      }
      const rdma_cm_event_type type = ev->event;
      const int status = ev->status;
      rdma_cm_id* id = ev->id;
      rdma_conn_param param = ev->param.conn;
      std::vector<uint8_t> private_data;
      if (type == RDMA_CM_EVENT_CONNECT_REQUEST && param.private_data != nullptr) {
        const auto* p = static_cast<const uint8_t*>(param.private_data);
        private_data.assign(p, p + param.private_data_len);
      }
      param.private_data = nullptr;
      // Ack first: the event's memory goes, the id stays (rdma_destroy_id of a rejected or
      // closed id below would otherwise wait for this very ack).
      if (rdma_ack_cm_event(ev) != 0) PLOG(ERROR) << "rdma_ack_cm_event";
      auto session = [&]() -> ServerSessionImpl* {
        auto it = by_id_.find(id);
        return it == by_id_.end() ? nullptr : it->second.get();
      };
      switch (type) {
        case RDMA_CM_EVENT_CONNECT_REQUEST:
          HandleConnectRequest(id, param, private_data);
          break;
        case RDMA_CM_EVENT_ESTABLISHED:
          if (ServerSessionImpl* s = session(); s != nullptr && !s->established_) {
            s->established_ = Clock::now();
          }
          break;
        case RDMA_CM_EVENT_TIMEWAIT_EXIT:
          break;
        case RDMA_CM_EVENT_DISCONNECTED:
        case RDMA_CM_EVENT_CONNECT_ERROR:
        case RDMA_CM_EVENT_UNREACHABLE:
        case RDMA_CM_EVENT_REJECTED:
          if (ServerSessionImpl* s = session()) s->MarkDead();
          break;
        case RDMA_CM_EVENT_DEVICE_REMOVAL:
          LOG(ERROR) << "verbs listener port " << port_ << ": RDMA device removed";
          if (id == listen_id_.get()) {
            for (auto& [cid, s] : by_id_) s->MarkDead();
          } else if (ServerSessionImpl* s = session()) {
            s->MarkDead();
          }
          break;
        default:
          VLOG(1) << "verbs listener port " << port_ << ": " << rdma_event_str(type) << " status "
                  << status;
          break;
      }
    }
    if (srq_post_failed_.exchange(false)) {
      LOG(ERROR) << "verbs listener port " << port_
                 << ": ibv_post_srq_recv failed; receive buffers were lost";
    }
    ReapSessions();
  }
}

}  // namespace rdkv::transport::verbs

namespace rdkv::transport {

Result<std::unique_ptr<Fabric>> CreateVerbsFabric(const FabricOptions& options) {
  RDKV_ASSIGN_OR_RETURN(std::unique_ptr<verbs::VerbsFabric> fabric,
                        verbs::VerbsFabric::Open(options));
  return std::unique_ptr<Fabric>(std::move(fabric));
}

}  // namespace rdkv::transport

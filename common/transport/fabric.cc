// Fabric factory and transport selection (control path).
#include <glog/logging.h>

#include "common/transport/tcp/tcp_fabric.h"
#include "common/transport/transport.h"

#if RDKV_WITH_VERBS
#include <infiniband/verbs.h>

#include "common/transport/verbs/verbs_fabric.h"
#endif

namespace rdkv::transport {

std::string_view TransportKindName(TransportKind kind) {
  return kind == TransportKind::kVerbs ? "verbs" : "tcp";
}

Result<std::unique_ptr<Fabric>> Fabric::Create(const FabricOptions& options) {
  if (options.kind == TransportKind::kVerbs) {
#if RDKV_WITH_VERBS
    return CreateVerbsFabric(options);
#else
    return Status::NotSupported(
        "this build of rdkv has no verbs transport (RDKV_WITH_VERBS=OFF): "
        "use tcp");
#endif
  }
  return CreateTcpFabric(options);
}

bool RdmaDeviceAvailable(std::string* why) {
#if !RDKV_WITH_VERBS
  if (why) *why = "this build of rdkv has no verbs transport (RDKV_WITH_VERBS=OFF)";
  return false;
#else
  int num = 0;
  ibv_device** list = ibv_get_device_list(&num);
  if (list == nullptr) {
    if (why) *why = "ibv_get_device_list failed: no RDMA support in this kernel or container";
    return false;
  }
  bool found = false;
  std::string seen;
  for (int i = 0; i < num && !found; ++i) {
    ibv_context* ctx = ibv_open_device(list[i]);
    if (ctx == nullptr) continue;
    ibv_device_attr dattr{};
    if (ibv_query_device(ctx, &dattr) == 0) {
      for (uint8_t port = 1; port <= dattr.phys_port_cnt; ++port) {
        ibv_port_attr pattr{};
        if (ibv_query_port(ctx, port, &pattr) == 0 && pattr.state == IBV_PORT_ACTIVE) {
          found = true;
          seen = std::string(ibv_get_device_name(list[i])) + " port " + std::to_string(port);
          break;
        }
      }
    }
    ibv_close_device(ctx);
  }
  ibv_free_device_list(list);
  if (why) {
    *why = found ? "RDMA device " + seen + " is active"
                 : (num == 0 ? std::string("no RDMA device found")
                             : std::to_string(num) + " RDMA device(s) but no active port");
  }
  return found;
#endif
}

Result<TransportKind> ChooseTransport(std::string_view flag_value) {
  if (flag_value == "tcp") {
    LOG(INFO) << "transport: tcp (software NIC), as requested";
    return TransportKind::kTcp;
  }
  if (flag_value == "verbs") {
    LOG(INFO) << "transport: verbs, as requested";
    return TransportKind::kVerbs;
  }
  if (flag_value == "auto") {
    std::string why;
    bool rdma = RdmaDeviceAvailable(&why);
    LOG(INFO) << "transport: " << (rdma ? "verbs" : "tcp (software NIC)")
              << " chosen automatically: " << why;
    return rdma ? TransportKind::kVerbs : TransportKind::kTcp;
  }
  return Status::InvalidArgument("unknown transport '" + std::string(flag_value) +
                                 "': use auto, verbs or tcp");
}

}  // namespace rdkv::transport

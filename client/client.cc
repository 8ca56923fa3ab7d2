// The rdkv client: Client::Connect, the options' validation, and ClientImpl, the facade that
// wires the parts together (client/client_impl.h).
#include <string>
#include <utility>

#include "client/client_impl.h"
#include "client/client_internal.h"
#include "common/transport/transport.h"
#include "common/util/units.h"
#include "rdkv/client.h"

namespace rdkv::client {

ClientImpl::ClientImpl(const ClientOptions& options, ServerAddress seed,
                       std::unique_ptr<transport::Fabric> fabric)
    : options_(options),
      fabric_(std::move(fabric)),
      pool_(fabric_.get()),
      links_(options_, std::move(seed), fabric_.get(), &pool_, &counters_),
      caller_(options_, &links_, &counters_),
      router_(&links_, &caller_),
      engine_(options_, &links_, &router_, &pool_, &counters_),
      writer_(options_, &links_, &router_, &caller_),
      admin_(options_, &links_, &router_, &caller_) {}

Status ClientImpl::Ping() {
  kv::Request req;
  req.op = kv::Op::kPing;
  return caller_.Call(links_.seed(), req, nullptr, nullptr);
}

namespace {

Status ValidateOptions(const ClientOptions& o) {
  if (o.op_timeout.count() <= 0) return Status::InvalidArgument("op_timeout must be positive");
  if (o.connect_timeout.count() <= 0) {
    return Status::InvalidArgument("connect_timeout must be positive");
  }
  if (o.read_deadline.count() <= 0)
    return Status::InvalidArgument("read_deadline must be positive");
  if (o.ownership_lease.count() <= 0) {
    return Status::InvalidArgument("ownership_lease must be positive");
  }
  if (o.max_get_attempts < 1) return Status::InvalidArgument("max_get_attempts must be at least 1");
  RDKV_RETURN_IF_ERROR(transport::CheckBusyPoll(o.busy_poll));
  if (o.connections_per_server < 1 || o.connections_per_server > 64) {
    return Status::InvalidArgument("connections_per_server must be 1..64");
  }
  if (o.max_batch_reads < 1) return Status::InvalidArgument("max_batch_reads must be at least 1");
  if (o.max_outstanding_reads < kMinBatchReads) {
    return Status::InvalidArgument("max_outstanding_reads must be at least " +
                                   std::to_string(kMinBatchReads) +
                                   " (a GET's two index bucket READs and an ownership READ)");
  }
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<Client>> ConnectWithFabric(const ClientOptions& options,
                                                  std::unique_ptr<transport::Fabric> fabric) {
  RDKV_RETURN_IF_ERROR(ValidateOptions(options));
  ServerAddress address;
  RDKV_RETURN_IF_ERROR(ParseHostPort(options.seed, &address.host, &address.port));
  auto client = std::make_unique<ClientImpl>(options, std::move(address), std::move(fabric));
  RDKV_RETURN_IF_ERROR(client->Init());
  return std::unique_ptr<Client>(std::move(client));
}

}  // namespace rdkv::client

namespace rdkv {

Result<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  RDKV_RETURN_IF_ERROR(client::ValidateOptions(options));
  if (options.seed.empty()) {
    return Status::InvalidArgument("ClientOptions.seed is empty: give a server as host:port");
  }
  std::string host;
  uint16_t port = 0;
  RDKV_RETURN_IF_ERROR(ParseHostPort(options.seed, &host, &port));
  RDKV_ASSIGN_OR_RETURN(transport::TransportKind kind,
                        transport::ChooseTransport(options.transport));
  transport::FabricOptions fo;
  fo.kind = kind;
  fo.device = options.device;
  auto fabric = transport::Fabric::Create(fo);
  if (!fabric.ok()) {
    return Status(fabric.status().code(), "cannot open the " +
                                              std::string(transport::TransportKindName(kind)) +
                                              " transport: " + fabric.status().message());
  }
  return client::ConnectWithFabric(options, std::move(fabric).value());
}

}  // namespace rdkv

// rdkv::Admin (rdkv/admin.h): the public face of the client's ClusterAdmin.
#include "rdkv/admin.h"

#include "client/client_impl.h"

namespace rdkv {

namespace {
Status NotOurs() {
  return Status::InvalidArgument("rdkv::Admin needs a Client made by rdkv::Client::Connect");
}
}  // namespace

Admin::Admin(Client& client) : impl_(dynamic_cast<client::ClientImpl*>(&client)) {}

Result<std::string> Admin::Snapshot(std::string_view name) {
  if (impl_ == nullptr) return NotOurs();
  return impl_->admin().Snapshot(name);
}

std::vector<ServerInfo> Admin::Servers(bool with_stats) {
  if (impl_ == nullptr) return {};
  return impl_->admin().Servers(with_stats);
}

uint64_t Admin::map_epoch() const {
  if (impl_ == nullptr) return 0;
  return impl_->router().epoch();
}

Result<MoveReport> Admin::MoveShards(std::span<const uint32_t> shards, uint32_t to_server,
                                     const MoveProgressFn& progress) {
  if (impl_ == nullptr) return NotOurs();
  return impl_->admin().MoveShards(shards, to_server, progress);
}

Result<ReplicaReport> Admin::Promote(uint32_t shard, uint32_t server,
                                     const MoveProgressFn& progress) {
  if (impl_ == nullptr) return NotOurs();
  return impl_->admin().ChangeReplicas(client::ClusterAdmin::ReplicaChange::kPromote, shard, server,
                                       progress);
}

Result<ReplicaReport> Admin::AddReplica(uint32_t shard, uint32_t server,
                                        const MoveProgressFn& progress) {
  if (impl_ == nullptr) return NotOurs();
  return impl_->admin().ChangeReplicas(client::ClusterAdmin::ReplicaChange::kAdd, shard, server,
                                       progress);
}

Result<ReplicaReport> Admin::AddReplicas(std::span<const ReplicaAddition> additions,
                                         const MoveProgressFn& progress) {
  if (impl_ == nullptr) return NotOurs();
  return impl_->admin().AddReplicas(additions, progress);
}

Result<ReplicaReport> Admin::AddReplicaToShards(std::span<const uint32_t> shards, uint32_t server,
                                                const MoveProgressFn& progress) {
  std::vector<ReplicaAddition> additions;
  for (uint32_t shard : shards) additions.push_back({shard, server});
  return AddReplicas(additions, progress);
}

Result<ReplicaReport> Admin::RemoveReplica(uint32_t shard, uint32_t server,
                                           const MoveProgressFn& progress) {
  if (impl_ == nullptr) return NotOurs();
  return impl_->admin().ChangeReplicas(client::ClusterAdmin::ReplicaChange::kRemove, shard, server,
                                       progress);
}

}  // namespace rdkv

#include "server/server.h"

#include <glog/logging.h>

#include <prometheus/collectable.h>
#include <prometheus/exposer.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <system_error>

#include "common/kv/layout.h"
#include "common/kv/wire.h"
#include "server/metrics.h"
#include "server/saved_map.h"
#include "server/service.h"
#include "server/store.h"

namespace rdkv::server {
namespace {

namespace fs = std::filesystem;

// The largest request or response payload this server's transport accepts (and the most it
// sends to a client that accepts more). Without a map it follows max_value_bytes
// (kv::MaxMessageBytes, the size clients use too). With one it is also room for the largest
// map any install could bring (cluster::kMaxMapJsonBytes: 4096 shards, 256 servers):
// CLUSTER_MAP and INSTALL_MAP carry the whole map in one message, and a small
// --max_value_size must not make the map unsendable.
size_t MessageLimit(const ServerOptions& options) {
  size_t limit = kv::MaxMessageBytes(options.max_value_bytes);
  if (options.cluster_map) limit = std::max(limit, kv::kMessageSlack + cluster::kMaxMapJsonBytes);
  return limit;
}

class ServerImpl final : public Server {
 public:
  ServerImpl(std::unique_ptr<transport::Fabric> fabric,
             std::unique_ptr<transport::MemoryRegion> region, std::unique_ptr<Store> store,
             std::unique_ptr<persistence::Persister> persister,
             std::unique_ptr<ClusterState> cluster, const persistence::RecoveryStats& recovered,
             const ServerOptions& options)
      : options_(options),
        fabric_(std::move(fabric)),
        region_(std::move(region)),
        store_(std::move(store)),
        persister_(std::move(persister)),
        cluster_(std::move(cluster)),
        recovered_(recovered),
        service_(store_.get(), kv::WireLimits{kv::kMaxKeyBytes, options.max_value_bytes},
                 persister_.get()) {
    service_.set_cluster(cluster_.get());
  }

  ~ServerImpl() override {
    // Deferred (sync-mode) replies go out while their clients are still connected; then stop
    // serving before the persister and the region go.
    if (persister_) persister_->Flush().IgnoreError();
    exposer_.reset();
    listener_.reset();
    persister_.reset();
  }

  // Serves /metrics (ServerOptions::metrics_port); every scrape reads stats().
  Status ServeMetrics() {
    if (!options_.metrics_port) return Status::Ok();
    const std::string bind = options_.metrics_host + ":" + std::to_string(*options_.metrics_port);
    try {
      exposer_ = std::make_unique<prometheus::Exposer>(bind, /*num_threads=*/1);
    } catch (const std::exception& e) {
      return Status::Unavailable("cannot serve /metrics on " + bind + ": " + e.what());
    }
    collector_ = MakeMetricsCollector([this] { return stats(); });
    exposer_->RegisterCollectable(collector_);
    std::vector<int> ports = exposer_->GetListeningPorts();
    metrics_port_ = ports.empty() ? 0 : static_cast<uint16_t>(ports.front());
    LOG(INFO) << "metrics: http://" << options_.metrics_host << ":" << metrics_port_ << "/metrics";
    return Status::Ok();
  }

  Status Listen() {
    transport::ListenOptions lo;
    lo.host = options_.host;
    lo.port = options_.port;
    lo.auth_token = options_.auth_token;
    lo.regions = {region_->Describe(kv::kLayoutVersion)};
    lo.worker_threads = options_.worker_threads;
    lo.max_message_size = MessageLimit(options_);
    lo.handler = [this](std::span<const uint8_t> payload, transport::ReplyHandle reply) {
      thread_local std::vector<uint8_t> response;
      if (service_.Handle(payload, &response, &reply)) {
        reply.session->Reply(reply.request_id, response)
            .IgnoreError();  // client gone: nothing to do
      }  // else deferred: the service answers through `reply` when the write is durable
    };
    RDKV_ASSIGN_OR_RETURN(listener_, fabric_->Listen(std::move(lo)));
    return Status::Ok();
  }

  uint16_t port() const override { return listener_->port(); }
  uint16_t metrics_port() const override { return metrics_port_; }

  ServerStats stats() const override {
    ServerStats s;
    StoreCounters sc = store_->counters();
    AllocatorStats as = store_->allocator_stats();
    const OpCounters& c = service_.counters();
    s.items = sc.items;
    s.item_bytes = sc.item_bytes;
    s.heap_bytes = as.heap_units * kv::kUnit;
    s.free_bytes = as.free_units * kv::kUnit;
    s.limbo_bytes = as.limbo_units * kv::kUnit;
    s.puts = c.puts.load();
    s.inserts = c.inserts.load();
    s.deletes = c.deletes.load();
    s.cas = c.cas.load();
    s.stats = c.stats.load();
    s.pings = c.pings.load();
    s.errors = c.errors.load();
    s.protocol_errors = c.protocol_errors.load();
    s.out_of_space = c.out_of_space.load();
    s.io_errors = c.io_errors.load();
    s.recovered = recovered_;
    const kv::RegionHeader& h = store_->header();
    s.region_bytes = h.region_bytes;
    s.used_bytes = as.used_units * kv::kUnit;
    s.index_slots = uint64_t{h.bucket_count} * kv::kSlotsPerBucket;
    if (listener_) s.transport = listener_->stats();
    if (persister_) s.persist = persister_->stats();
    if (cluster_) {
      std::shared_ptr<const cluster::ClusterMap> m = cluster_->map();
      s.clustered = true;
      s.map_epoch = m->epoch;
      s.shards = m->shards;
      s.owned_shards = m->ShardsOf(cluster_->server_id()).size();
    }
    s.requests = service_.request_metrics();
    return s;
  }

  std::string StatsJson() const override { return service_.StatsJson(); }
  void PauseWorkers(bool paused) override { listener_->PauseWorkers(paused); }

 private:
  const ServerOptions options_;
  std::unique_ptr<transport::Fabric> fabric_;
  std::unique_ptr<transport::MemoryRegion> region_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<persistence::Persister> persister_;  // null with durability=none
  std::unique_ptr<ClusterState> cluster_;              // null when standalone
  persistence::RecoveryStats recovered_;
  Service service_;
  std::unique_ptr<transport::Listener> listener_;
  std::shared_ptr<prometheus::Collectable> collector_;
  std::unique_ptr<prometheus::Exposer> exposer_;  // null unless metrics_port is set
  uint16_t metrics_port_ = 0;
};

}  // namespace

Result<std::unique_ptr<Server>> Server::Start(const ServerOptions& options) {
  if (options.worker_threads < 1 || options.worker_threads > 256) {
    return Status::InvalidArgument("worker threads must be 1..256");
  }
  // The map (before the region is allocated and registered: a bad saved map fails fast): the
  // given one, or the one this server saved after a later install.
  std::optional<cluster::ClusterMap> map;
  const std::string& data_dir = options.persist.data_dir;
  if (options.cluster_map && data_dir.empty()) {
    // Whatever the durability (with none the data dir holds only the map): a restart would
    // start from the --cluster_map file's older epoch and serve shards moved away since.
    return Status::InvalidArgument(
        "a cluster server needs --data_dir to keep its newest cluster map; without it a restart "
        "would take back shards it moved away");
  }
  if (options.cluster_map) {
    std::string why;
    RDKV_ASSIGN_OR_RETURN(
        map, ChooseStartupMap(*options.cluster_map, options.cluster_map_file, data_dir, &why));
    LOG(INFO) << "cluster map: " << why;
  } else if (std::error_code ec; !data_dir.empty() && fs::exists(SavedMapPath(data_dir), ec)) {
    LOG(WARNING) << SavedMapPath(data_dir) << " holds a cluster map, but this server was "
                 << "started without --cluster_map: it serves standalone and ignores the file";
  }
  transport::FabricOptions fo;
  fo.kind = options.transport;
  fo.device = options.device;
  fo.huge_pages = options.huge_pages;
  RDKV_ASSIGN_OR_RETURN(std::unique_ptr<transport::Fabric> fabric, transport::Fabric::Create(fo));
  RDKV_ASSIGN_OR_RETURN(
      std::unique_ptr<transport::MemoryRegion> region,
      fabric->AllocateRegion(options.memory_bytes, transport::RegionAccess::kRemoteRead));
  StoreOptions so;
  so.index_fraction = options.index_fraction;
  so.max_value_bytes = options.max_value_bytes;
  so.grace = options.grace;
  if (map) {
    so.shard_count = map->shards;
    so.server_id = options.server_id;
  }
  RDKV_ASSIGN_OR_RETURN(std::unique_ptr<Store> store,
                        Store::Format(region->data(), region->size(), so));
  // Ownership before recovery and listening: a client never sees shards it may not read.
  std::unique_ptr<ClusterState> cluster;
  if (map) {
    RDKV_ASSIGN_OR_RETURN(
        cluster, ClusterState::Create(store.get(), std::move(*map), options.server_id,
                                      options.ownership_lease,
                                      data_dir.empty() ? std::string() : SavedMapPath(data_dir)));
    std::shared_ptr<const cluster::ClusterMap> m = cluster->map();
    LOG(INFO) << "cluster: server " << options.server_id << " of " << m->servers.size()
              << ", map epoch " << m->epoch << ", owns " << m->ShardsOf(options.server_id).size()
              << " of " << m->shards << " shards";
  }
  const kv::RegionHeader& h = store->header();
  LOG(INFO) << "region: " << (region->size() >> 20) << " MiB"
            << (region->huge_pages() ? " on huge pages" : "") << ", " << h.bucket_count
            << " index buckets (" << h.bucket_count * kv::kSlotsPerBucket << " slots), heap "
            << (h.heap_bytes >> 20) << " MiB, fabric " << fabric->Describe();
  // Load what is on disk before listening: GETs never see a half-loaded table.
  persistence::PersistOptions po = options.persist;
  po.max_value_bytes = options.max_value_bytes;
  persistence::RecoveryStats recovered;
  RDKV_ASSIGN_OR_RETURN(std::unique_ptr<persistence::Persister> persister,
                        persistence::Persister::Start(po, store.get(), &recovered));
  auto server =
      std::make_unique<ServerImpl>(std::move(fabric), std::move(region), std::move(store),
                                   std::move(persister), std::move(cluster), recovered, options);
  RDKV_RETURN_IF_ERROR(server->Listen());
  RDKV_RETURN_IF_ERROR(server->ServeMetrics());
  return std::unique_ptr<Server>(std::move(server));
}

}  // namespace rdkv::server

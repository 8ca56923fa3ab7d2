#include "server/server.h"

#include <glog/logging.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <system_error>

#include "common/kv/layout.h"
#include "common/kv/wire.h"
#include "common/metrics/metrics_http.h"
#include "common/util/resolve.h"
#include "common/util/units.h"
#include "server/control_plane.h"
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
    if (cluster_) {
      // Every cluster server can become a primary of a replicated shard (a map install or a
      // promotion), so each has a replicator; it connects to backups on first use.
      replication::ReplicatorOptions ro;
      if (!options.admin_token.empty()) {
        ro.auth_token = options.admin_token;
        ro.role = transport::SessionRole::kAdmin;
      } else {
        ro.auth_token = options.auth_token;
        ro.role = transport::SessionRole::kData;  // admin from loopback peers only
      }
      ro.max_message_size = MessageLimit(options);
      ro.busy_poll = options.busy_poll;
      if (!options.tls.ca_file.empty()) {
        ro.tls.ca_file = options.tls.ca_file;
        ro.tls.cert_file = options.tls.cert_file;  // our client certificate (mutual TLS)
        ro.tls.key_file = options.tls.key_file;
      }
      ro.forward_timeout = options.replication_timeout;
      replicator_ = std::make_unique<replication::Replicator>(fabric_.get(), ro);
      service_.set_replicator(replicator_.get());
      service_.set_async_replicated_writes(options.async_replicated_writes);
      service_.set_max_repair_bytes(options.max_repair_bytes);
      service_.set_max_pool_writes(options.max_pool_writes);
      service_.set_before_replica_apply(options.before_replica_apply);
      service_.set_transport_workers(options.worker_threads);
      cluster_->set_map_hook(
          [this](const cluster::ClusterMap& previous, const cluster::ClusterMap& next) {
            replicator_->NoteMap(previous, next, cluster_->server_id());
          });
      cluster_->set_resync_hook(
          [this](const cluster::ClusterMap& next, const std::vector<uint32_t>& shards) {
            promoted_shards_.fetch_add(shards.size(), std::memory_order_relaxed);
            service_.ResyncPromoted(next, shards);
          });
    }
  }

  ~ServerImpl() override {
    // First: a worker may be blocked in an install waiting on the control plane.
    if (control_) control_->Stop();
    // Deferred (sync-mode) replies go out while their clients are still connected; then stop
    // serving before the persister and the region go.
    if (persister_) persister_->Flush().IgnoreError();
    metrics_http_.reset();
    listener_.reset();
    service_.WaitForWrites();  // writes still waiting for their backups persist first
    persister_.reset();
  }

  // Serves /metrics (ServerOptions::metrics_port); every scrape reads stats().
  Status ServeMetrics() {
    if (!options_.metrics_port) return Status::Ok();
    RDKV_ASSIGN_OR_RETURN(metrics_http_, metrics::MetricsHttp::Start(
                                             options_.metrics_host, *options_.metrics_port,
                                             MakeMetricsCollector([this] { return stats(); })));
    LOG(INFO) << "metrics: http://" << options_.metrics_host << ":" << metrics_http_->port()
              << "/metrics";
    return Status::Ok();
  }

  Status StartControlPlane(int64_t map_revision) {
    ControlPlaneOptions co;
    co.etcd.endpoints = options_.etcd_endpoints;
    co.etcd.ca_file = options_.etcd_ca_file;
    co.etcd.cert_file = options_.etcd_cert_file;
    co.etcd.key_file = options_.etcd_key_file;
    co.cluster_name = options_.etcd_cluster_name;
    co.server_id = options_.server_id;
    co.lease_ttl_seconds = options_.etcd_lease_ttl_seconds;
    co.ownership_lease = options_.ownership_lease;
    co.durable = options_.persist.durability == persistence::Durability::kSync;
    RDKV_ASSIGN_OR_RETURN(control_, ControlPlane::Start(co, cluster_.get(), map_revision));
    service_.set_control_plane(control_.get());
    return Status::Ok();
  }

  Status Listen() {
    transport::ListenOptions lo;
    lo.host = options_.host;
    lo.port = options_.port;
    lo.auth_token = options_.auth_token;
    lo.admin_token = options_.admin_token;
    lo.tls = options_.tls;
    lo.max_connections = options_.max_connections;
    lo.idle_timeout = options_.idle_timeout;
    lo.handshake_timeout = options_.handshake_timeout;
    lo.regions = {region_->Describe(kv::kLayoutVersion)};
    lo.worker_threads = options_.worker_threads;
    lo.busy_poll = options_.busy_poll;
    lo.busy_poll_always = options_.busy_poll_always;
    lo.max_message_size = MessageLimit(options_);
    lo.handler = [this](std::span<const uint8_t> payload, transport::ReplyHandle reply) {
      thread_local std::vector<uint8_t> response;
      if (service_.Handle(payload, &response, &reply)) {
        reply.session->Reply(reply.request_id, response)
            .IgnoreError();  // client gone: nothing to do
      }  // else deferred: the service answers through `reply` when the write is durable
    };
    lo.inline_handler = [this](std::span<const uint8_t> payload, std::vector<uint8_t>* response,
                               transport::ReplyHandle* reply) {
      return service_.TryWriteOnReceivingThread(payload, response, reply);
    };
    RDKV_ASSIGN_OR_RETURN(listener_, fabric_->Listen(std::move(lo)));
    return Status::Ok();
  }

  uint16_t port() const override { return listener_->port(); }
  uint16_t metrics_port() const override {
    return metrics_http_ != nullptr ? metrics_http_->port() : 0;
  }

  ServerStats stats() const override {
    ServerStats s;
    StoreCounters sc = store_->counters();
    AllocatorStats as = store_->allocator_stats();
    const OpCounters& c = service_.counters();
    s.items = sc.items;
    s.item_bytes = sc.item_bytes;
    s.in_place_updates = sc.in_place_updates;
    s.writes_on_receiving_thread = c.writes_on_receiving_thread.load();
    s.replicates_on_receiving_thread = c.replicates_on_receiving_thread.load();
    s.heap_bytes = as.heap_units * kv::kUnit;
    s.free_bytes = as.free_units * kv::kUnit;
    s.limbo_bytes = as.limbo_units * kv::kUnit;
    s.heap_merges = as.merges;
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
      for (uint32_t sh = 0; sh < m->shards; ++sh) {
        s.backup_shards += m->IsBackup(sh, cluster_->server_id());
        s.joining_shards += m->IsJoining(sh, cluster_->server_id());
      }
      s.fenced = cluster_->fenced();
      s.fences = cluster_->fences();
      s.write_pause_ns = cluster_->write_pause_ns();
      s.write_pauses = cluster_->write_pauses();
      s.promoted_shards = promoted_shards_.load(std::memory_order_relaxed);
      s.replicated_writes = c.replicated_writes.load();
      s.writes_parked = c.writes_parked.load();
      s.write_groups = c.write_groups.load();
      s.grouped_writes = c.grouped_writes.load();
      s.replicas_applied = c.replicas_applied.load();
      s.retries_answered = c.retries_answered.load();
      s.batches_applied = c.replicate_batches.load();
      s.overload_refused = c.pool_refused.load();
      s.stale_forwards_refused = c.stale_forwards_refused.load();
      s.answers_sent = c.answers_sent.load();
      s.answers_received = c.answers_received.load();
      s.repairs_pending = service_.repairs_pending();
      s.repair_bytes_pending = service_.repair_bytes_pending();
      s.repairs_noted = c.repairs_noted.load();
      s.repairs_done = c.repairs_done.load();
      s.repairs_dropped = c.repairs_dropped.load();
      s.repair_failures = c.repair_failures.load();
      s.retry_ids_kept = service_.retry_ids_kept();
      s.catchup_applied = c.catchup_applied.load();
      s.catchup_tombstones = service_.catchup_tombstones();
      s.scan_items = c.scan_items.load();
      s.shard_ids_sent = c.shard_ids_sent.load();
      s.copied_ids_recorded = c.copied_ids_recorded.load();
      for (const auto& [shard, at] : service_.ScanProgress())
        s.scan_progress.emplace_back(shard, at);
      if (replicator_) {
        replication::ReplicatorStats rs = replicator_->stats();
        s.forward_errors = rs.forward_errors;
        s.joining_errors = rs.joining_errors;
        s.epoch_retries = rs.epoch_retries;
        s.version_retries = rs.version_retries;
        s.batches_sent = rs.batches;
        s.batched_writes = rs.batched_writes;
        s.async_forwards = rs.async_forwards;
        for (const replication::Replicator::PeerState& p : replicator_->Peers()) {
          s.backups.push_back({p.id, p.connected, p.pending, p.oldest_pending_s});
        }
      }
    }
    s.requests = service_.request_metrics();
    return s;
  }

  std::string StatsJson() const override { return service_.StatsJson(); }
  void PauseWorkers(bool paused) override { listener_->PauseWorkers(paused); }

  Result<uint64_t> RotateSecrets(const std::string& auth_token,
                                 const std::string& admin_token) override {
    RDKV_ASSIGN_OR_RETURN(const uint64_t revoked,
                          listener_->RotateSecrets(auth_token, admin_token));
    if (replicator_ != nullptr) {
      // As at the start: the admin secret when there is one, else the data secret.
      if (!admin_token.empty()) {
        replicator_->SetCredential(admin_token, transport::SessionRole::kAdmin);
      } else {
        replicator_->SetCredential(auth_token, transport::SessionRole::kData);
      }
    }
    return revoked;
  }

 private:
  const ServerOptions options_;
  std::unique_ptr<transport::Fabric> fabric_;
  std::unique_ptr<transport::MemoryRegion> region_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<persistence::Persister> persister_;  // null with durability=none
  std::unique_ptr<ClusterState> cluster_;              // null when standalone
  persistence::RecoveryStats recovered_;
  // Shards this server became the primary of from an in-sync backup role (the resync hook;
  // destroyed after everything that installs maps).
  std::atomic<uint64_t> promoted_shards_{0};
  // Before service_ and listener_: destroyed after them (workers may be forwarding).
  std::unique_ptr<ControlPlane> control_;                // null without etcd
  std::unique_ptr<replication::Replicator> replicator_;  // null when standalone
  Service service_;
  std::unique_ptr<transport::Listener> listener_;
  std::unique_ptr<metrics::MetricsHttp> metrics_http_;  // null unless metrics_port is set
};

}  // namespace

Result<std::unique_ptr<Server>> Server::Start(const ServerOptions& options_in) {
  ServerOptions options = options_in;
  if (options.worker_threads < 1 || options.worker_threads > 256) {
    return Status::InvalidArgument("worker threads must be 1..256");
  }
  RDKV_RETURN_IF_ERROR(transport::CheckBusyPoll(options.busy_poll));
  // etcd: the map comes from there (and so does every later one, through the watch).
  std::optional<EtcdMap> etcd_map;
  if (!options.etcd_endpoints.empty()) {
    if (options.cluster_map) {
      return Status::InvalidArgument(
          "give either --etcd (the map lives in etcd) or --cluster_map (a file), not both");
    }
    etcd::EtcdOptions eo;
    eo.endpoints = options.etcd_endpoints;
    eo.ca_file = options.etcd_ca_file;
    eo.cert_file = options.etcd_cert_file;
    eo.key_file = options.etcd_key_file;
    RDKV_ASSIGN_OR_RETURN(std::unique_ptr<etcd::EtcdClient> client, etcd::EtcdClient::Create(eo));
    RDKV_ASSIGN_OR_RETURN(EtcdMap loaded, LoadMap(*client, options.etcd_cluster_name));
    const std::string& dir = options.persist.data_dir;
    if (std::error_code ec; !dir.empty() && fs::exists(SavedMapPath(dir), ec)) {
      Result<cluster::ClusterMap> saved = cluster::LoadClusterMap(SavedMapPath(dir));
      if (saved.ok() && saved->epoch > loaded.map.epoch) {
        return Status::InvalidArgument(
            "this server saved cluster map epoch " + std::to_string(saved->epoch) +
            " but etcd holds only epoch " + std::to_string(loaded.map.epoch) +
            ": etcd has lost changes (restored from an old backup?); refusing to start");
      }
    }
    LOG(INFO) << "cluster map: epoch " << loaded.map.epoch << " from etcd ("
              << MapKey(options.etcd_cluster_name) << ")";
    options.cluster_map = loaded.map;
    options.cluster_map_file = "etcd " + MapKey(options.etcd_cluster_name);
    etcd_map = std::move(loaded);
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
  // Before the region is allocated and the data dir loaded: a busy port fails the start first
  // (tcp: a TCP bind; verbs: an rdma_cm bind).
  RDKV_RETURN_IF_ERROR(fabric->CheckListenPort("--port", options.host, options.port));
  if (options.metrics_port) {
    if (*options.metrics_port != 0 && *options.metrics_port == options.port &&
        options.metrics_host == options.host && fabric->kind() == transport::TransportKind::kTcp) {
      return Status::InvalidArgument("--metrics_port " + std::to_string(options.port) +
                                     " is this server's own --port; give /metrics another one");
    }
    RDKV_RETURN_IF_ERROR(
        CheckTcpPortFree("--metrics_port", options.metrics_host, *options.metrics_port));
  }
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
  // Registered in etcd (and watching the map) before it serves anything.
  if (etcd_map) RDKV_RETURN_IF_ERROR(server->StartControlPlane(etcd_map->revision));
  RDKV_RETURN_IF_ERROR(server->Listen());
  RDKV_RETURN_IF_ERROR(server->ServeMetrics());
  return std::unique_ptr<Server>(std::move(server));
}

}  // namespace rdkv::server

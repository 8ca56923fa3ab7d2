#include "server/metrics.h"

#include <cctype>
#include <string>
#include <string_view>

#include "common/metrics/metrics_http.h"

namespace rdkv::server {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

// "NotFound" -> "not_found", "OK" -> "ok": label values in Prometheus style.
std::string ResultLabel(StatusCode code) {
  if (code == StatusCode::kOk) return "ok";
  std::string out;
  for (char c : StatusCodeName(code)) {
    if (std::isupper(static_cast<unsigned char>(c))) {
      if (!out.empty()) out += '_';
      out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    } else {
      out += c;
    }
  }
  return out;
}

// The op label: kv::kOpTable's name; slot 0 counts requests that did not decode.
std::string OpLabel(size_t op) { return op == 0 ? "invalid" : std::string(kv::kOpTable[op].name); }

using metrics::Families;

}  // namespace

std::vector<MetricFamily> ServerMetricFamilies(const ServerStats& s) {
  Families f;
  // Requests.
  std::vector<ClientMetric> requests, latency;
  for (size_t op = 0; op < kRequestOpSlots; ++op) {
    const bool write = op != 0 && kv::kOpTable[op].op_class == kv::OpClass::kWrite;
    for (size_t r = 0; r < kRequestResultSlots; ++r) {
      const uint64_t n = s.requests.answered[op][r];
      // Every op's ok series exists from the start (rates need a first sample); others once
      // they happened.
      if (n == 0 && !(r == 0 && op != 0)) continue;
      ClientMetric m = Families::CounterMetric(static_cast<double>(n));
      m.label = {{"op", OpLabel(op)}, {"result", ResultLabel(static_cast<StatusCode>(r))}};
      requests.push_back(std::move(m));
    }
    if (write || s.requests.latency[op].count > 0) {
      ClientMetric m = Families::HistogramMetric(s.requests.latency[op]);
      m.label = {{"op", OpLabel(op)}};
      latency.push_back(std::move(m));
    }
  }
  f.Add("rdkv_requests_total",
        "Two-sided requests answered, by op and result (ok or the error's code; one-sided GET "
        "READs are not requests: see rdkv_nic_reads_served_total)",
        MetricType::Counter, std::move(requests));
  f.Add("rdkv_request_duration_seconds",
        "Seconds from a worker taking a request to its answer (sync-mode writes: until durable), "
        "by op",
        MetricType::Histogram, std::move(latency));
  // Memory and index.
  f.Gauge("rdkv_items", "Live items", static_cast<double>(s.items));
  f.Gauge("rdkv_item_bytes", "Bytes of live items (headers, keys and values)",
          static_cast<double>(s.item_bytes));
  f.Counter("rdkv_in_place_updates_total",
            "Writes that rewrote the key's item where it was (same length, small items)",
            static_cast<double>(s.in_place_updates));
  f.Counter("rdkv_writes_on_receiving_thread_total",
            "Writes answered on the tcp transport's receiving thread (no handoff to a worker)",
            static_cast<double>(s.writes_on_receiving_thread));
  f.Counter("rdkv_replicates_on_receiving_thread_total",
            "REPLICATE requests a backup applied on the tcp transport's receiving thread",
            static_cast<double>(s.replicates_on_receiving_thread));
  f.Gauge("rdkv_region_bytes", "Size of the registered region (index and heap)",
          static_cast<double>(s.region_bytes));
  f.Gauge("rdkv_heap_bytes", "Size of the region's item heap", static_cast<double>(s.heap_bytes));
  f.Gauge("rdkv_heap_used_bytes", "Heap bytes held by items (size classes rounded up)",
          static_cast<double>(s.used_bytes));
  f.Gauge("rdkv_heap_free_bytes", "Heap bytes free for new items",
          static_cast<double>(s.free_bytes));
  f.Gauge("rdkv_heap_limbo_bytes", "Heap bytes freed but waiting out the grace period",
          static_cast<double>(s.limbo_bytes));
  f.Counter("rdkv_heap_merges_total",
            "Passes of the allocator that merged adjacent free heap blocks (after an allocation "
            "found no block; each sorts every free block under the allocator's lock)",
            static_cast<double>(s.heap_merges));
  f.Gauge("rdkv_index_slots", "Slots of the hash index (one item each)",
          static_cast<double>(s.index_slots));
  f.Gauge("rdkv_index_slots_used", "Slots of the hash index holding an item",
          static_cast<double>(s.items));
  // Transport.
  f.Gauge("rdkv_connections", "Clients connected now (past the handshake)",
          static_cast<double>(s.transport.connections_open));
  f.Counter("rdkv_connections_accepted_total", "Client connections accepted",
            static_cast<double>(s.transport.connections_accepted));
  f.Counter("rdkv_connections_refused_total",
            "Client connections refused (bad secret, too many, bad or unfinished handshake)",
            static_cast<double>(s.transport.connections_refused));
  // Admission (docs/security.md); tcp only (0 on verbs).
  f.Counter("rdkv_handshakes_evicted_total",
            "Unfinished handshakes closed to admit newer connections (a flood of silent sockets)",
            static_cast<double>(s.transport.handshakes_evicted));
  f.Counter("rdkv_handshakes_timed_out_total", "Sockets that did not finish the handshake in time",
            static_cast<double>(s.transport.handshakes_timed_out));
  f.Counter("rdkv_sessions_idle_closed_total", "Sessions closed by --idle_timeout_s",
            static_cast<double>(s.transport.idle_closed));
  f.Counter("rdkv_slow_readers_cut_total", "Sessions cut off for not reading their responses",
            static_cast<double>(s.transport.slow_readers_cut));
  f.Counter("rdkv_nic_busy_poll_holds_total",
            "Times a tcp NIC thread stopped busy-polling because it waited for its CPU "
            "(--busy_poll_always: never)",
            static_cast<double>(s.transport.busy_poll_holds));
  f.Counter("rdkv_nic_reads_served_total",
            "One-sided READs served by the tcp software NIC (0 on verbs: the NIC serves them)",
            static_cast<double>(s.transport.reads_served));
  f.Counter("rdkv_nic_read_bytes_total", "Bytes returned by the READs of the tcp software NIC",
            static_cast<double>(s.transport.read_bytes_served));
  f.Counter("rdkv_nic_reads_refused_total",
            "READs the tcp software NIC refused (bad rkey or out of bounds)",
            static_cast<double>(s.transport.reads_refused));
  // Cluster.
  f.Gauge("rdkv_map_epoch", "Epoch of the cluster map this server holds (0 standalone)",
          static_cast<double>(s.map_epoch));
  f.Gauge("rdkv_shards", "Shards of the cluster map (1 standalone)", static_cast<double>(s.shards));
  f.Gauge("rdkv_shards_owned", "Shards this server owns (1 standalone)",
          static_cast<double>(s.owned_shards));
  if (s.clustered) {
    // Replication (docs/design.md "Replication", "Control plane").
    f.Gauge("rdkv_shards_backup", "Shards this server is an in-sync backup of",
            static_cast<double>(s.backup_shards));
    f.Gauge("rdkv_shards_joining", "Shards this server is catching up on (not yet in sync)",
            static_cast<double>(s.joining_shards));
    f.Gauge("rdkv_fenced",
            "1 while this server has fenced itself (cannot renew its etcd lease): it serves "
            "no shard",
            s.fenced ? 1.0 : 0.0);
    f.Counter("rdkv_fences_total", "Times this server fenced itself (lost its etcd lease)",
              static_cast<double>(s.fences));
    f.Counter("rdkv_map_change_write_pause_seconds_total",
              "Time writes of every shard were held off while map changes and unfences took "
              "the ownership lock exclusively",
              static_cast<double>(s.write_pause_ns) / 1e9);
    f.Counter("rdkv_map_change_write_pauses_total",
              "Exclusive takings of the ownership lock (two per map change: lost shards, then "
              "gained ones; one per unfence)",
              static_cast<double>(s.write_pauses));
    f.Counter("rdkv_promotions_total",
              "Shards this server took over as primary from an in-sync backup role (a failover "
              "or a planned promote)",
              static_cast<double>(s.promoted_shards));
    f.Counter("rdkv_replication_forwarded_writes_total",
              "Writes this server forwarded to its backups as a primary",
              static_cast<double>(s.replicated_writes));
    f.Counter("rdkv_replication_writes_parked_total",
              "Replicated writes that waited behind an earlier write of a key of their stripe "
              "without a thread",
              static_cast<double>(s.writes_parked));
    f.Counter("rdkv_replication_write_groups_total",
              "Groups of parked writes started together (a hot key's writes in one chain)",
              static_cast<double>(s.write_groups));
    f.Counter("rdkv_replication_grouped_writes_total",
              "Writes those groups forwarded to the backups",
              static_cast<double>(s.grouped_writes));
    f.Counter("rdkv_replication_applied_total",
              "Forwarded writes (and catch-up copies) this server applied as a backup",
              static_cast<double>(s.replicas_applied));
    f.Counter("rdkv_replication_forward_errors_total",
              "Forwards an in-sync backup did not confirm (the write failed)",
              static_cast<double>(s.forward_errors));
    f.Counter("rdkv_replication_joining_errors_total",
              "Forwards a joining backup did not confirm (the write went on)",
              static_cast<double>(s.joining_errors));
    f.Counter("rdkv_replication_epoch_retries_total",
              "Forwards retried because a backup had not installed the primary's map yet",
              static_cast<double>(s.epoch_retries));
    f.Counter("rdkv_replication_version_retries_total",
              "Writes forwarded again above a newer version a backup held",
              static_cast<double>(s.version_retries));
    f.Counter("rdkv_replication_overload_refused_total",
              "Replicated writes refused because the writer pool's queue was full (nothing "
              "applied; the client may retry)",
              static_cast<double>(s.overload_refused));
    f.Counter("rdkv_replication_stale_forwards_refused_total",
              "Forwarded PUTs this backup refused as not above a delete it applied (a forward "
              "the primary had given up on, arriving late)",
              static_cast<double>(s.stale_forwards_refused));
    f.Counter("rdkv_replication_answers_sent_total",
              "Write request ids sent to backups (and taken) with a resent or repaired state, so "
              "that their retries are answered after a later promotion",
              static_cast<double>(s.answers_sent));
    f.Counter("rdkv_replication_answers_received_total",
              "Answers REPLICATEs this backup took (earlier writes' request ids)",
              static_cast<double>(s.answers_received));
    f.Counter("rdkv_retried_writes_answered_total",
              "Retried writes answered from the retry table (applied once)",
              static_cast<double>(s.retries_answered));
    f.Gauge("rdkv_retry_ids_kept", "Request ids whose answers the retry table keeps",
            static_cast<double>(s.retry_ids_kept));
    // Batching.
    f.Counter("rdkv_replication_batches_sent_total",
              "REPLICATE requests sent to backups as a primary (a batch or a single write)",
              static_cast<double>(s.batches_sent));
    f.Counter("rdkv_replication_batched_writes_total",
              "Writes those REPLICATE requests carried (per backup)",
              static_cast<double>(s.batched_writes));
    f.Counter("rdkv_replication_async_forwards_total",
              "Replicated writes forwarded with no thread waiting for the backups' answers",
              static_cast<double>(s.async_forwards));
    f.Counter("rdkv_replication_batches_applied_total",
              "REPLICATE batches this server applied as a backup",
              static_cast<double>(s.batches_applied));
    // Lag per backup (as a primary).
    std::vector<ClientMetric> pending, lag, connected;
    for (const ServerStats::Backup& b : s.backups) {
      const std::vector<prometheus::ClientMetric::Label> label = {{"backup", std::to_string(b.id)}};
      pending.push_back(Families::GaugeMetric(static_cast<double>(b.pending)));
      pending.back().label = label;
      lag.push_back(Families::GaugeMetric(b.lag_seconds));
      lag.back().label = label;
      connected.push_back(Families::GaugeMetric(b.connected ? 1 : 0));
      connected.back().label = label;
    }
    f.Add("rdkv_replication_pending_forwards",
          "Writes forwarded (queued or sent) to this backup and not answered yet, by backup "
          "server id",
          MetricType::Gauge, std::move(pending));
    f.Add("rdkv_replication_lag_seconds",
          "How long the oldest write not yet answered by this backup has waited (0: none "
          "waits; a write fails after --replication_timeout_ms), by backup server id",
          MetricType::Gauge, std::move(lag));
    f.Add("rdkv_replication_backup_connected",
          "1 while this primary has a connection to the backup, by backup server id",
          MetricType::Gauge, std::move(connected));
    // Repair of writes a backup missed.
    f.Gauge("rdkv_replication_repairs_pending",
            "Failed replicated writes awaiting repair (the repair table; writes are refused "
            "at 65536)",
            static_cast<double>(s.repairs_pending));
    f.Gauge("rdkv_replication_repair_bytes_pending",
            "Bytes of keys and values of the writes awaiting repair (writes are refused at "
            "64 MiB by default)",
            static_cast<double>(s.repair_bytes_pending));
    f.Counter("rdkv_replication_repairs_noted_total",
              "Replicated writes that failed after a forward and were kept for repair",
              static_cast<double>(s.repairs_noted));
    f.Counter("rdkv_replication_repairs_done_total",
              "Kept writes repaired (every in-sync replica has them)",
              static_cast<double>(s.repairs_done));
    f.Counter("rdkv_replication_repairs_dropped_total",
              "Kept writes dropped, superseded by a newer primary's write",
              static_cast<double>(s.repairs_dropped));
    f.Counter("rdkv_replication_repair_failures_total",
              "Repair attempts that failed again (a backup still does not answer)",
              static_cast<double>(s.repair_failures));
    // Catch-up copies.
    f.Counter("rdkv_catchup_items_applied_total",
              "REPLICATE writes taken for shards this server is joining (the catch-up copy's "
              "items and the writes forwarded meanwhile)",
              static_cast<double>(s.catchup_applied));
    f.Counter("rdkv_shard_scan_items_total",
              "Items this server sent in SHARD_SCAN answers (the source of catch-up copies and "
              "shard moves)",
              static_cast<double>(s.scan_items));
    f.Counter("rdkv_shard_ids_sent_total",
              "Write request ids this server sent in SHARD_IDS answers (the source of a catch-up "
              "copy's or a shard move's ids)",
              static_cast<double>(s.shard_ids_sent));
    f.Counter("rdkv_copied_ids_recorded_total",
              "Write request ids this server recorded from RECORD_IDS (a copy's ids, so that "
              "their retries are answered here)",
              static_cast<double>(s.copied_ids_recorded));
    std::vector<ClientMetric> progress;
    for (const auto& [shard, at] : s.scan_progress) {
      progress.push_back(Families::GaugeMetric(at));
      progress.back().label = {{"shard", std::to_string(shard)}};
    }
    f.Add("rdkv_shard_scan_progress_ratio",
          "How far the latest SHARD_SCAN of each shard (a copy out of this server) got through "
          "the index, 0..1 (1: done), by shard",
          MetricType::Gauge, std::move(progress));
  }
  // Persistence (only when the server persists).
  if (s.persist) {
    const persistence::PersisterStats& p = *s.persist;
    f.Gauge("rdkv_persist_queue_records", "Applied writes not yet handed to RocksDB",
            static_cast<double>(p.queued_records));
    f.Gauge("rdkv_persist_queue_bytes", "Bytes (keys and values) of those writes",
            static_cast<double>(p.queued_bytes));
    f.Counter("rdkv_persist_records_total", "Writes written to RocksDB",
              static_cast<double>(p.records));
    f.Counter("rdkv_persist_groups_total", "Groups (RocksDB write batches) written",
              static_cast<double>(p.groups));
    f.Counter("rdkv_persist_wal_syncs_total", "WAL fsyncs", static_cast<double>(p.syncs));
    f.Counter("rdkv_persist_admission_waits_total",
              "Writes that waited for room in the persistence queue (backpressure)",
              static_cast<double>(p.admission_waits));
    f.Counter("rdkv_persist_io_errors_total", "Disk errors of the persister",
              static_cast<double>(p.io_errors));
    f.Gauge("rdkv_persist_failing", "1 while writes are refused because the disk fails",
            p.failing ? 1 : 0);
    f.Counter("rdkv_snapshots_total", "Snapshots taken", static_cast<double>(p.snapshots));
    f.Add("rdkv_persist_group_records", "Writes per group commit (one RocksDB write batch)",
          MetricType::Histogram)
        .push_back(Families::HistogramMetric(p.group_records));
    f.Add("rdkv_persist_wal_sync_duration_seconds",
          "Seconds per WAL fsync (sync: a group's write with its fsync; async: one WAL sync)",
          MetricType::Histogram)
        .push_back(Families::HistogramMetric(p.wal_sync_seconds));
  }
  return f.Take();
}

std::shared_ptr<prometheus::Collectable> MakeMetricsCollector(
    std::function<ServerStats()> read_stats) {
  return metrics::MakeCollector(
      [read_stats = std::move(read_stats)] { return ServerMetricFamilies(read_stats()); });
}

}  // namespace rdkv::server

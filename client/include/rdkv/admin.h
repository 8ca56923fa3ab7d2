// rdkv operator calls: snapshots, the servers of a cluster, moving shards. Applications need
// only rdkv/client.h; tools and operators add this header.
//
//   #include <rdkv/admin.h>
//   auto client = rdkv::Client::Connect(opts);            // as for an application
//   rdkv::Admin admin(**client);
//   auto paths = admin.Snapshot("nightly");               // Result<std::string>
//   for (const rdkv::ServerInfo& s : admin.Servers(/*with_stats=*/false)) { ... }
//   auto moved = admin.MoveShards(shards, /*to_server=*/2, nullptr);
//
// Ownership: an Admin borrows its Client, which must outlive it; it owns nothing else and is
// cheap to make (one per call is fine). It works only with a Client made by Client::Connect
// (for any other implementation every call fails with kInvalidArgument, Servers returns none
// and map_epoch 0).
// Thread-safety: as the Client: every call is safe from any thread and with the Client's own
// calls (MoveShards: see there).
// Errors: every call returns a Status or Result (rdkv/status.h); the error names the server.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "rdkv/client.h"
#include "rdkv/status.h"

namespace rdkv {

namespace client {
class ClientImpl;
}  // namespace client

// Progress of Admin::MoveShards: one human-readable line per event ("step 2/4: shard 3:
// 1200 items copied from server 0 to server 1"), and during a long copy a progress line about
// once a second, starting "  copy: " ("  copy: 40.0k/100k items (40%), 20.0k items/s, ETA 3 s
// (shard 5)"; the total is estimated from the old owners' statistics).
using MoveProgressFn = std::function<void(std::string_view line)>;

// What Admin::MoveShards did.
struct MoveReport {
  uint64_t from_epoch = 0;  // the map epoch every server had when the new move began
  uint64_t to_epoch = 0;    // the map epoch every server has now
  uint32_t to_server = 0;
  std::vector<uint32_t> moved;    // shards given to to_server by this call
  std::vector<uint32_t> skipped;  // asked for but already owned by to_server
  // An earlier move that had been interrupted (the servers reported different map epochs)
  // and that this call finished first; empty `resumed` when there was none.
  std::vector<uint32_t> resumed;    // its shards
  uint64_t resumed_from_epoch = 0;  // the epoch its shards were moved from
  uint64_t resumed_to_epoch = 0;    // the epoch it installed everywhere
  uint64_t items_copied = 0;        // items imported into new owners (resume included)
  uint64_t bytes_copied = 0;        // their keys and values
  uint64_t ids_copied = 0;          // request ids of recent writes copied with them
  uint64_t items_dropped = 0;       // stale copies deleted from old owners (step 4)
  // Seconds spent in each step (resume included): [0] install the new map on the old owners,
  // [1] copy, [2] install it on the new owner and every other server, [3] drop the old copies.
  double step_seconds[4] = {};
  double total_seconds = 0;
};

// What Admin::Promote, AddReplica and RemoveReplica did.
struct ReplicaReport {
  uint64_t from_epoch = 0;     // the newest map epoch when the call began
  uint64_t to_epoch = 0;       // the epoch it installed (== from_epoch: nothing to do)
  uint64_t items_copied = 0;   // AddReplica: items copied into the new replica
  uint64_t bytes_copied = 0;   // their keys and values
  uint64_t ids_copied = 0;     // request ids of recent writes copied with them
  uint64_t items_dropped = 0;  // RemoveReplica: items dropped from the removed replica
  double copy_seconds = 0;     // the copies' wall time (AddReplicas: the copies run at once)
  double seconds = 0;
};

// One replica to add (Admin::AddReplicas): `server` becomes a replica of `shard`.
struct ReplicaAddition {
  uint32_t shard = 0;
  uint32_t server = 0;
  friend bool operator==(const ReplicaAddition&, const ReplicaAddition&) = default;
};
// How many shards Admin::AddReplicas copies at once.
inline constexpr size_t kReplicaCopiesInFlight = 4;

// One server of the cluster as a client sees it (Admin::Servers).
struct ServerInfo {
  uint32_t id = 0;
  std::string address;  // host:port from the map (the seed when standalone)
  bool reachable = false;
  std::string error;                     // why it is not reachable
  std::vector<uint32_t> shards;          // shards the client's map gives it (as primary)
  std::vector<uint32_t> backup_shards;   // shards it is an in-sync backup of
  std::vector<uint32_t> joining_shards;  // shards it is catching up on (not yet in sync)
  uint64_t map_epoch = 0;                // the map epoch the server reports (0: standalone)
  std::string stats;                     // its statistics JSON (when asked for)
};

class Admin {
 public:
  // `client` must outlive this Admin.
  explicit Admin(Client& client);

  // Asks every server (in a cluster) or the seed to take a consistent snapshot of its data (a
  // RocksDB checkpoint; docs/persistence.md) named `name` (empty: a generated name). Returns
  // one line per server, "<address> <snapshot path>". kNotSupported from a server that runs
  // with durability=none; the first error stops nothing, it is returned (prefixed with the
  // server's address) after all were asked. A snapshot is not a write: it is not counted in
  // ClientStats::writes.
  Result<std::string> Snapshot(std::string_view name);

  // Every server of the map (standalone: the seed), contacted now: reachable or not (with the
  // error), its shards in the client's map, the map epoch it reports and, when with_stats,
  // its statistics JSON. Refreshes the client's map when a server reports a newer epoch.
  std::vector<ServerInfo> Servers(bool with_stats);

  // The epoch of the map the client routes by (0 standalone).
  uint64_t map_epoch() const;

  // Moves `shards` to server `to_server` as one operation (docs/design.md "Moving a shard"),
  // then refreshes the client's map. In order:
  //  0. asks every server of the cluster for its map; all must answer, or kUnavailable naming
  //     the first that did not, before anything changes. If they report different epochs an
  //     earlier move was interrupted: it is finished first (MoveReport::resumed).
  //  1. installs the map (epoch + 1, the shards owned by to_server) on each old owner, which
  //     from then on refuses writes to the shards;
  //  2. copies the shards: DROP_SHARD on to_server (stale or partial copies; raises its
  //     version counter above the old owner's), SHARD_SCAN on the old owner, IMPORT of every
  //     item into to_server with its version (several in flight at once);
  //  3. installs the map on to_server, then on every other server;
  //  4. DROP_SHARD on the old owners.
  // The moving shards are unavailable from 1 to 3: writes and GETs are refused (clients retry
  // until op_timeout, then fail with kWrongOwner); never a wrong value or a NotFound.
  // Shards already owned by to_server are skipped (their stale copies on other servers are
  // dropped again, which completes an interrupted step 4). kInvalidArgument for an empty list,
  // a shard number out of range or a server id not in the map; kNotSupported when the seed is
  // standalone. Any other failure names the step that failed and leaves the cluster between
  // two epochs; calling MoveShards again (with the same arguments) resumes and completes it.
  // Each request of a move may take up to max(op_timeout, 30 s) before it counts as failed.
  // A replicated cluster (a map with backups) moves each shard as replica changes instead
  // (AddReplica of to_server, Promote, RemoveReplica of the old primary): the shard keeps
  // serving GETs and writes throughout, only the promotion pauses writes for about a lease;
  // MoveReport's step_seconds are then [1] add and copy, [2] promote, [3] remove.
  // `progress` (may be empty) is called on the calling thread. Thread-safe with the other
  // calls, but run one move at a time across all clients: nothing serializes two moves.
  Result<MoveReport> MoveShards(std::span<const uint32_t> shards, uint32_t to_server,
                                const MoveProgressFn& progress);

  // --- replicated clusters (docs/design.md "Replication") ---
  // Each asks every server for its map (a server that does not answer is skipped: these
  // calls are how a dead server is taken out; at least one must answer) and works from the
  // newest one. First it finishes an earlier change that did not reach every server that
  // answered (an interrupted call: each server behind gets the newest map, the servers that
  // gain a shard by it last), so running an interrupted call again completes it. A change
  // that loses the map to another writer (the coordinator, another admin command) between
  // that read and its commit fails kBusy, and so does an install that finds a server holding
  // another map of the same epoch or a newer one; run it again (Promote, and the in-sync step
  // of AddReplica(s), do so themselves). Without etcd nothing serializes two changes: run one
  // at a time.
  //
  // Makes `server`, an in-sync backup of `shard`, its primary (the old primary becomes its
  // first backup): installs the new map (epoch + 1) on the old primary (it stops serving the
  // shard after one lease), then everywhere else, then on the new one. Writes to the shard
  // pause for about one lease. kInvalidArgument when `server` is not an in-sync backup. When
  // the old primary's commit loses to another writer's map (nothing installed), starts again
  // from the newest map, up to 5 attempts (said on `progress`); kBusy after the last.
  Result<ReplicaReport> Promote(uint32_t shard, uint32_t server, const MoveProgressFn& progress);
  // Adds `server` as a replica of `shard`: joining (it receives every new write), a copy of
  // the shard's items from the primary (writes go on meanwhile), then in sync. Running it
  // again after a failure resumes. kInvalidArgument when the shard would have more than
  // kMaxReplicas (5) replicas.
  Result<ReplicaReport> AddReplica(uint32_t shard, uint32_t server, const MoveProgressFn& progress);
  // AddReplica for several (shard, server) pairs at once, in two map changes in all (every
  // pair joining, then every copied pair in sync), the copies running at once in between (up
  // to kReplicaCopiesInFlight shards at a time): restoring R after a failure costs two map
  // changes and the copies side by side, not two changes and a copy per shard. Pairs whose
  // server already holds the shard are skipped (and repeated pairs); a pair already joining
  // (an interrupted copy) starts over, in one more map change: out of joining, then added as
  // a fresh one, emptied first; the report sums the copies. Arguments are checked for every pair
  // before anything changes (errors as AddReplica's). A pair fails alone, the others go on: its
  // server cannot take the newest map or drop its stale copy, its copy fails, the map moved
  // its shard to another primary meanwhile, another writer removed the replica and added it
  // again (it joined at a later map epoch: that writer's copy counts, kBusy), or its primary
  // refuses it (a forward it missed since it started joining, no whole copy read from that
  // primary process since, or a primary restarted or promoted after the join). Then the pairs
  // that could are made in sync, the failed ones stay joining (or never joined), and the first
  // failure is returned naming both sets; running the same call again starts the failed ones
  // over. When the in-sync change loses the map to another writer (nothing installed), the
  // copies stand and the change is checked (the same rules) and made again on the newest map,
  // up to 5 attempts (said on `progress`); after the last, kBusy with the pairs left joining (a
  // new call copies them anew).
  Result<ReplicaReport> AddReplicas(std::span<const ReplicaAddition> additions,
                                    const MoveProgressFn& progress);
  // AddReplicas of `server` to each of `shards`.
  Result<ReplicaReport> AddReplicaToShards(std::span<const uint32_t> shards, uint32_t server,
                                           const MoveProgressFn& progress);
  // Removes backup `server` from `shard` (the primary first, so writes stop waiting for it),
  // then drops its copy. kInvalidArgument for the primary (promote another replica first).
  Result<ReplicaReport> RemoveReplica(uint32_t shard, uint32_t server,
                                      const MoveProgressFn& progress);

 private:
  client::ClientImpl* impl_;  // null when `client` is not the library's
};

}  // namespace rdkv

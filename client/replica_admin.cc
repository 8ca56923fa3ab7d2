#include "client/replica_admin.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "common/kv/admin_wire.h"
#include "common/util/mutex.h"

namespace rdkv::client {

namespace {

using Clock = std::chrono::steady_clock;

std::string Name(const cluster::ClusterMap& m, uint32_t id) {
  const cluster::ServerEntry* e = m.FindServer(id);
  return "server " + std::to_string(id) + (e != nullptr ? " (" + e->address + ")" : "");
}

// The map each server of `known` that answered holds, by server id. A server that does not
// answer is skipped (said on `progress`): replica changes are how a dead server is taken out.
// At least one must answer.
// The map server `e` holds (MAP_FETCH). The error of the call when it does not answer;
// kNotSupported for a standalone server.
Result<cluster::ClusterMap> MapOn(AdminChannel& channel, const cluster::ServerEntry& e) {
  uint64_t epoch = 0;
  std::string body;
  RDKV_RETURN_IF_ERROR(channel.Call(e, kv::EncodeMapFetch({}), &epoch, &body));
  RDKV_ASSIGN_OR_RETURN(kv::MapAnswer answer, kv::DecodeMapAnswer(epoch, body));
  if (answer.map_json.empty()) {
    return Status::NotSupported("server " + std::to_string(e.id) + " serves standalone");
  }
  RDKV_ASSIGN_OR_RETURN(cluster::ClusterMap m, cluster::ParseClusterMap(answer.map_json));
  m.NormalizeReplicas();
  return m;
}

bool Unreachable(const Status& s) {
  return s.Is(StatusCode::kUnavailable) || s.Is(StatusCode::kConnectionLost) ||
         s.Is(StatusCode::kTimedOut);
}

Result<std::map<uint32_t, cluster::ClusterMap>> ServersMaps(AdminChannel& channel,
                                                            const cluster::ClusterMap& known,
                                                            const MoveProgressFn& progress) {
  std::map<uint32_t, cluster::ClusterMap> maps;
  Status last;
  for (const cluster::ServerEntry& e : known.servers) {
    Result<cluster::ClusterMap> m = MapOn(channel, e);
    if (!m.ok() && Unreachable(m.status())) {
      last = m.status();
      if (progress) {
        progress("  server " + std::to_string(e.id) + " (" + e.address +
                 ") did not answer for its map: " + m.status().ToString());
      }
      continue;
    }
    if (!m.ok()) return m.status();
    maps.emplace(e.id, std::move(m).value());
  }
  if (maps.empty()) {
    return Status::Unavailable("no server of the cluster answered for its map (" + last.ToString() +
                               "); nothing was changed");
  }
  return maps;
}

// The newest map the servers of `known` report (ServersMaps), or `known` when it is newer.
Result<cluster::ClusterMap> NewestMap(AdminChannel& channel, const cluster::ClusterMap& known,
                                      const MoveProgressFn& progress) {
  RDKV_ASSIGN_OR_RETURN(auto maps, ServersMaps(channel, known, progress));
  cluster::ClusterMap newest = known;
  for (auto& [id, m] : maps) {
    if (m.epoch > newest.epoch) newest = std::move(m);
  }
  newest.NormalizeReplicas();
  return newest;
}

// Installs `map` on `ids` (below).
Status InstallOn(AdminChannel& channel, const cluster::ClusterMap& map,
                 const std::vector<uint32_t>& ids, const MoveProgressFn& progress,
                 bool required = true);

// Finishes an earlier replica change that did not reach every server: its command was
// interrupted (Ctrl-C, a timeout, a server that failed to save the map), or it skipped a server
// that is back. Each server that answers with a map older than the newest one gets the newest,
// the servers that gain no shard by it first and those that gain one last: the order of every
// change, so a shard's old primary has let go before its new one takes it. Without this,
// running an interrupted promote again found it already in the newest map, said so, and left
// the shard with no primary serving it.
//
// Only replica changes: a server that would become the primary of a shard it does not hold as
// an in-sync backup in its own map is the target of an unfinished shard move (R = 1: the map
// goes to the old owner, the items are copied, then the map goes to the new owner); giving it
// the map before its copy is done would serve a partial shard. Then nothing is installed and
// `progress` says to run that move again (it resumes). A server that does not answer, or
// cannot take the map, is skipped and named: the command goes on (it may be the one that
// takes that server out). Fails when no server answers, or with `check`'s error: the command's
// own arguments, checked against the newest map before anything is installed.
Status FinishEarlierChange(AdminChannel& channel, const cluster::ClusterMap& known,
                           const MoveProgressFn& progress,
                           const std::function<Status(const cluster::ClusterMap&)>& check) {
  RDKV_ASSIGN_OR_RETURN(auto maps, ServersMaps(channel, known, progress));
  const cluster::ClusterMap* newest = nullptr;
  for (const auto& [id, m] : maps) {
    if (newest == nullptr || m.epoch > newest->epoch) newest = &m;
  }
  RDKV_RETURN_IF_ERROR(check(*newest));
  std::vector<uint32_t> first, last;
  std::string behind, unbacked;
  for (const auto& [id, m] : maps) {
    if (m.epoch >= newest->epoch) continue;
    bool gains = false;
    for (uint32_t shard = 0; shard < newest->shards; ++shard) {
      if (newest->OwnerOf(shard) != id || (shard < m.shards && m.OwnerOf(shard) == id)) continue;
      gains = true;
      if (shard >= m.shards || !m.IsBackup(shard, id)) {
        unbacked += (unbacked.empty() ? "" : ", ") + std::string("shard ") + std::to_string(shard) +
                    " to " + Name(*newest, id);
      }
    }
    (gains ? last : first).push_back(id);
    behind +=
        (behind.empty() ? "" : ", ") + Name(*newest, id) + " at epoch " + std::to_string(m.epoch);
  }
  if (first.empty() && last.empty()) return Status::Ok();
  if (!unbacked.empty()) {
    if (progress) {
      progress("map epoch " + std::to_string(newest->epoch) + " has not reached " + behind +
               ": a shard move (" + unbacked +
               ") is unfinished; run that `cluster move` again to finish it (its copy is redone)");
    }
    return Status::Ok();
  }
  if (progress) {
    progress("map epoch " + std::to_string(newest->epoch) + " has not reached " + behind +
             " (an earlier change was interrupted): installing it there first");
  }
  const cluster::ClusterMap target = *newest;
  for (const std::vector<uint32_t>* ids : {&first, &last}) {
    for (uint32_t id : *ids) {
      Status s = InstallOn(channel, target, {id}, progress, /*required=*/false);
      if (!s.ok() && progress) progress("  " + s.ToString() + " (skipped)");
    }
  }
  return Status::Ok();
}

Status CheckArgs(const cluster::ClusterMap& m, uint32_t shard, uint32_t server) {
  if (shard >= m.shards) {
    return Status::InvalidArgument("shard " + std::to_string(shard) + " is out of range (0.." +
                                   std::to_string(m.shards - 1) + ")");
  }
  if (m.FindServer(server) == nullptr) {
    return Status::InvalidArgument("server " + std::to_string(server) + " is not in the map");
  }
  return Status::Ok();
}

// Installs `map` on `ids` in order, one after the other. `required` false: a server that cannot
// be reached is skipped (said on `progress`; it gets a newer map from etcd's watch, or with the
// next change) instead of failing the call.
Status InstallOn(AdminChannel& channel, const cluster::ClusterMap& map,
                 const std::vector<uint32_t>& ids, const MoveProgressFn& progress, bool required) {
  const std::string json = map.ToJson();
  cluster::ClusterMap normalized = map;
  normalized.NormalizeReplicas();
  const std::string normalized_json = normalized.ToJson();  // as MapOn returns a server's
  for (uint32_t id : ids) {
    const cluster::ServerEntry* e = map.FindServer(id);
    if (e == nullptr) continue;
    uint64_t installed = 0;
    Status s = channel.Call(*e, kv::EncodeMapInstall({json}), &installed, nullptr);
    if (s.Is(StatusCode::kInvalidArgument) && s.message().find("not newer") != std::string::npos) {
      // It holds this epoch or a newer one. This very map (an earlier, interrupted run, or a
      // change that another command is finishing) is fine; another map means another change
      // got there first: start again from the newest map, as after a lost etcd transaction.
      Result<cluster::ClusterMap> held = MapOn(channel, *e);
      if (!held.ok()) {
        s = held.status();  // unreachable now: skipped below where that is allowed
      } else if (held->epoch == map.epoch && held->ToJson() == normalized_json) {
        s = Status::Ok();
      } else {
        s = Status::Busy(Name(map, id) + " holds " +
                         (held->epoch == map.epoch ? "a different map of epoch " : "map epoch ") +
                         std::to_string(held->epoch) +
                         " (another map change ran at the same time); run one change at a "
                         "time, from the newest map");
      }
    }
    const bool unreachable = Unreachable(s);
    if (!required && unreachable) {
      if (progress) {
        progress("  map epoch " + std::to_string(map.epoch) + " not installed on " + Name(map, id) +
                 " (unreachable: " + s.ToString() + ")");
      }
      continue;
    }
    if (!s.ok()) {
      return Status(s.code(), "installing map epoch " + std::to_string(map.epoch) + " on " +
                                  Name(map, id) + ": " + s.message());
    }
    if (progress) progress("  map epoch " + std::to_string(map.epoch) + " on " + Name(map, id));
  }
  return Status::Ok();
}

// Every server of `map` not in `first`, in id order.
std::vector<uint32_t> Others(const cluster::ClusterMap& map, const std::vector<uint32_t>& first) {
  std::vector<uint32_t> out;
  for (const cluster::ServerEntry& e : map.servers) {
    if (std::find(first.begin(), first.end(), e.id) == first.end()) out.push_back(e.id);
  }
  return out;
}

void Erase(std::vector<uint32_t>* v, uint32_t id) { std::erase(*v, id); }

// A map change's commit lost to another writer (`lost`, kBusy) in attempt `attempt`: says so on
// `progress`, with what happens next (`again`, e.g. "starting again"), and waits before the
// next attempt (100 ms times the attempt).
void PauseAfterLostMap(int attempt, const Status& lost, std::string_view again,
                       const MoveProgressFn& progress) {
  const std::chrono::milliseconds pause(100 * attempt);
  if (progress) {
    progress("  " + lost.ToString() + "; " + std::string(again) + " from the newest map in " +
             std::to_string(pause.count()) + " ms (attempt " + std::to_string(attempt + 1) +
             " of " + std::to_string(kMapRaceAttempts) + ")");
  }
  std::this_thread::sleep_for(pause);
}

}  // namespace

Result<ReplicaReport> RunPromote(AdminChannel& channel, const cluster::ClusterMap& known,
                                 uint32_t shard, uint32_t server, const MoveProgressFn& progress) {
  const Clock::time_point start = Clock::now();
  ReplicaReport report;
  cluster::ClusterMap next;
  uint32_t old_primary = 0;
  RDKV_RETURN_IF_ERROR(FinishEarlierChange(
      channel, known, progress, [&](const auto& m) { return CheckArgs(m, shard, server); }));
  for (int attempt = 1;; ++attempt) {
    RDKV_ASSIGN_OR_RETURN(cluster::ClusterMap cur, NewestMap(channel, known, progress));
    RDKV_RETURN_IF_ERROR(CheckArgs(cur, shard, server));
    if (attempt == 1) report.from_epoch = cur.epoch;
    old_primary = cur.OwnerOf(shard);
    if (old_primary == server) {
      report.to_epoch = cur.epoch;
      if (progress)
        progress("shard " + std::to_string(shard) + ": already primary on " + Name(cur, server));
      return report;
    }
    if (!cur.IsBackup(shard, server)) {
      return Status::InvalidArgument("cannot promote " + Name(cur, server) + " for shard " +
                                     std::to_string(shard) +
                                     ": it is not an in-sync backup of it (replicas: " +
                                     [&] {
                                       std::string r;
                                       for (uint32_t id : cur.ReplicasOf(shard))
                                         r += (r.empty() ? "" : ",") + std::to_string(id);
                                       return r;
                                     }() +
                                     ")");
    }
    next = cur;
    next.epoch = cur.epoch + 1;
    next.owners[shard] = server;
    Erase(&next.backups[shard], server);
    next.backups[shard].insert(next.backups[shard].begin(), old_primary);
    if (progress) {
      progress("promote shard " + std::to_string(shard) + ": " + Name(cur, old_primary) + " -> " +
               Name(cur, server) + ", map epoch " + std::to_string(next.epoch));
    }
    // The old primary first (it clears its bit, waits one lease, then refuses the shard's
    // writes); in an etcd cluster it commits the map there first. kBusy from it: another
    // writer (the coordinator, another command) changed the map since `cur` was read, and
    // nothing of this attempt was installed: start again from the newest map.
    Status first = InstallOn(channel, next, {old_primary}, progress);
    if (first.ok()) break;
    if (Unreachable(first)) {
      return Status(first.code(), first.message() +
                                      ". The old primary must take the new map first (it lets "
                                      "the shard go); nothing was changed. Bring it back and run "
                                      "this again; with etcd, kvcoord fails a dead primary over "
                                      "by its lease");
    }
    if (!first.Is(StatusCode::kBusy) || attempt == kMapRaceAttempts) return first;
    PauseAfterLostMap(attempt, first, "starting again", progress);
  }
  // Then the other replicas (they accept forwards from the new primary from then on), and the
  // new primary last: before it sets its bit it resends its recently replicated writes to its
  // backups (docs/design.md "Replication").
  RDKV_RETURN_IF_ERROR(InstallOn(channel, next, Others(next, {old_primary, server}), progress,
                                 /*required=*/false));
  RDKV_RETURN_IF_ERROR(InstallOn(channel, next, {server}, progress));
  report.to_epoch = next.epoch;
  report.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return report;
}

namespace {

// The body of one REPLICATE batch of a catch-up copy (the replicator's own largest batch). A
// cluster whose --max_value_size is lower refuses it: the copy then goes one item per request.
constexpr size_t kCopyBatchBytes = 64 * 1024;

// One request of a copy: a batch of a page's entries, or one entry that fits no batch.
struct CopyJob {
  std::vector<size_t> entries;                       // indexes into the page
  kv::ReplicateBatchBuilder batch{kCopyBatchBytes};  // empty (count 0) for a single entry
};

kv::ReplicateRequest CopiedItem(const kv::ScanEntry& e, uint64_t epoch, uint32_t primary) {
  kv::ReplicateRequest m;
  m.key = e.key;
  m.value = e.value;
  m.version = e.version;
  m.map_epoch = epoch;
  m.sender_id = primary;
  return m;
}

// The page cut into batches in its order (an entry too large for a batch goes alone); one job
// per entry when `batching` is false.
std::vector<CopyJob> CopyJobs(const std::vector<kv::ScanEntry>& entries, uint64_t epoch,
                              uint32_t primary, bool batching) {
  std::vector<CopyJob> jobs;
  CopyJob open;  // the batch being filled
  for (size_t i = 0; i < entries.size(); ++i) {
    const kv::ReplicateRequest m = CopiedItem(entries[i], epoch, primary);
    if (batching && open.batch.Add(m)) {
      open.entries.push_back(i);
      continue;
    }
    if (!open.entries.empty()) jobs.push_back(std::exchange(open, CopyJob{}));
    if (batching && open.batch.Add(m)) {
      open.entries.push_back(i);
    } else {
      jobs.emplace_back().entries.push_back(i);  // too large for any batch, or no batching
    }
  }
  if (!open.entries.empty()) jobs.push_back(std::move(open));
  // A batch of one goes as a plain REPLICATE: it is no cheaper as a batch, and a batch's own
  // bytes could take an item near the value limit over it.
  for (CopyJob& job : jobs) {
    if (job.entries.size() == 1) job.batch.Clear();
  }
  return jobs;
}

// One item as a plain REPLICATE. kVersionMismatch is success: the replica has a newer write.
Status SendCopiedItem(AdminChannel& channel, const cluster::ServerEntry& to, const kv::ScanEntry& e,
                      uint64_t epoch, uint32_t primary) {
  Status c = channel.Call(to, kv::EncodeReplicate(CopiedItem(e, epoch, primary)), nullptr, nullptr);
  return c.Is(StatusCode::kVersionMismatch) ? Status::Ok() : c;
}

// Sends one job and checks every entry's result. A batch refused whole as too large
// (kInvalidArgument: the replica's value limit is lower; the client refuses it before sending,
// from the limit the replica announced) clears *batching and goes again one item per
// REPLICATE.
Status SendCopyJob(AdminChannel& channel, const cluster::ServerEntry& to, const CopyJob& job,
                   const std::vector<kv::ScanEntry>& entries, uint64_t epoch, uint32_t primary,
                   std::atomic<bool>* batching) {
  if (job.batch.count() == 0) {
    return SendCopiedItem(channel, to, entries[job.entries[0]], epoch, primary);
  }
  uint64_t version = 0;
  std::string body;
  Status s = channel.Call(to, job.batch.Encode(epoch, primary), &version, &body);
  if (s.Is(StatusCode::kInvalidArgument)) {
    batching->store(false);
    for (size_t i : job.entries) {
      RDKV_RETURN_IF_ERROR(SendCopiedItem(channel, to, entries[i], epoch, primary));
    }
    return Status::Ok();
  }
  if (!s.ok()) {
    return Status(s.code(), "a batch of " + std::to_string(job.entries.size()) +
                                " copied items: " + s.message());
  }
  Result<std::vector<kv::ReplicateBatchResult>> results =
      kv::DecodeReplicateBatchAnswer(version, body, job.entries.size());
  if (!results.ok()) return results.status();
  // A batch's answer holds a code per item and no text: an item refused goes again alone, so
  // that a refusal that stands comes back with the replica's reason and the item's key.
  for (size_t k = 0; k < results->size(); ++k) {
    const kv::ReplicateBatchResult& r = (*results)[k];
    if (r.code == StatusCode::kOk || r.code == StatusCode::kVersionMismatch) continue;
    RDKV_RETURN_IF_ERROR(SendCopiedItem(channel, to, entries[job.entries[k]], epoch, primary));
  }
  return Status::Ok();
}

// Step 2 of adding `server` to `shard` (joining in `joining`): every item the primary holds
// now, with its version; the replica applies an item only over an older version (and never
// over a delete it was forwarded meanwhile). Adds to report's counts.
Status CopyShard(AdminChannel& channel, const cluster::ClusterMap& joining, uint32_t shard,
                 uint32_t server, ReplicaReport* out, const MoveProgressFn& progress) {
  const uint32_t primary = joining.OwnerOf(shard);
  ReplicaReport report;  // this shard's counts
  const cluster::ServerEntry* from = joining.FindServer(primary);
  const cluster::ServerEntry* to = joining.FindServer(server);
  std::string scratch;
  uint64_t cursor = 0;
  const Clock::time_point copy_start = Clock::now();
  Clock::time_point last_line = copy_start;
  kv::WireLimits limits;
  limits.max_value_bytes = kv::kMaxValueBytes;
  // Cleared for the rest of the copy when the new replica refuses a batch whole as too large
  // (its --max_value_size is below kCopyBatchBytes): the items then go one per REPLICATE.
  std::atomic<bool> batching{true};
  bool said_unbatched = false;
  while (cursor != kv::kScanDone) {
    uint64_t next = 0;
    std::string body;
    Status s =
        channel.Call(*from, kv::EncodeShardScan({shard, cursor, server}, &scratch), &next, &body);
    if (!s.ok()) {
      return Status(s.code(), "copying shard " + std::to_string(shard) + " from " +
                                  Name(joining, primary) + ": " + s.message() +
                                  " (run the same command again to resume)");
    }
    Result<kv::ShardScanAnswer> answer = kv::DecodeShardScanAnswer(cursor, next, body, limits);
    if (!answer.ok()) return answer.status();
    // The page's items go to the new replica in REPLICATE batches (kCopyBatchBytes each), from
    // up to kImportsInFlight threads at once (items of one page are different keys; a replica
    // applies each only over an older version, in any order).
    const std::vector<kv::ScanEntry>& entries = answer->entries;
    const std::vector<CopyJob> jobs = CopyJobs(entries, joining.epoch, primary, batching.load());
    if (Status c = RunInLanes(0, jobs.size(),
                              [&](size_t j) {
                                return SendCopyJob(channel, *to, jobs[j], entries, joining.epoch,
                                                   primary, &batching);
                              });
        !c.ok()) {
      return Status(c.code(), "copying shard " + std::to_string(shard) + " into " +
                                  Name(joining, server) + ": " + c.message() +
                                  " (run the same command again to resume)");
    }
    if (!batching.load() && !said_unbatched && progress) {
      said_unbatched = true;
      progress("  copy: a batch of copied items is too large for " + Name(joining, server) +
               " (its --max_value_size is below " + std::to_string(kCopyBatchBytes) +
               " bytes): one item per request from here");
    }
    for (const kv::ScanEntry& e : entries) {
      ++report.items_copied;
      report.bytes_copied += e.key.size() + e.value.size();
    }
    cursor = answer->next_cursor;
    if (progress && Clock::now() - last_line > std::chrono::seconds(1)) {
      last_line = Clock::now();
      progress("  copy: shard " + std::to_string(shard) + " into " + Name(joining, server) + ": " +
               std::to_string(report.items_copied) + " items");
    }
  }
  // Then the request ids the primary keeps for the shard: all of those of writes before the
  // join are in its table now (docs/design.md "Ids travel with copies").
  std::string warning;
  const Clock::time_point ids_start = Clock::now();
  if (Status s = CopyRetryIds(channel, *from, *to, shard, &report.ids_copied, &warning); !s.ok()) {
    return Status(s.code(), s.message() + " (run the same command again to resume)");
  }
  if (!warning.empty() && progress) progress("  warning: " + warning);
  const Clock::time_point end = Clock::now();
  const double seconds = std::chrono::duration<double>(end - copy_start).count();
  if (progress) {
    progress("  shard " + std::to_string(shard) + ": copied " +
             std::to_string(report.items_copied) + " items (" +
             std::to_string(report.bytes_copied) + " bytes) and " +
             std::to_string(report.ids_copied) + " request ids in " + std::to_string(seconds) +
             " s (the ids " +
             std::to_string(std::chrono::duration<double>(end - ids_start).count()) + " s)");
  }
  out->items_copied += report.items_copied;
  out->bytes_copied += report.bytes_copied;
  out->ids_copied += report.ids_copied;
  out->copy_seconds += seconds;
  return Status::Ok();
}

}  // namespace

Result<ReplicaReport> RunAddReplica(AdminChannel& channel, const cluster::ClusterMap& known,
                                    uint32_t shard, uint32_t server,
                                    const MoveProgressFn& progress) {
  const ReplicaAddition one[] = {{shard, server}};
  return RunAddReplicas(channel, known, one, progress);
}

namespace {

void AddOnce(std::vector<uint32_t>* v, uint32_t id) {
  if (std::find(v->begin(), v->end(), id) == v->end()) v->push_back(id);
}

// "shard 3", or "shards 0,3,5".
std::string ShardsText(const std::vector<uint32_t>& ids) {
  std::string out = ids.size() == 1 ? "shard " : "shards ";
  for (size_t i = 0; i < ids.size(); ++i) out += (i == 0 ? "" : ",") + std::to_string(ids[i]);
  return out;
}

// The pairs grouped by target server, servers in the order they first appear, each server's
// shards in the order given.
std::vector<std::pair<uint32_t, std::vector<uint32_t>>> ByServer(
    const std::vector<ReplicaAddition>& pairs) {
  std::vector<std::pair<uint32_t, std::vector<uint32_t>>> out;
  for (const ReplicaAddition& a : pairs) {
    auto it =
        std::find_if(out.begin(), out.end(), [&](const auto& e) { return e.first == a.server; });
    if (it == out.end()) it = out.insert(out.end(), {a.server, {}});
    it->second.push_back(a.shard);
  }
  return out;
}

// "shard 3 -> server 2, shard 4 -> server 2".
std::string PairsText(const std::vector<ReplicaAddition>& pairs) {
  std::string out;
  for (const ReplicaAddition& a : pairs) {
    out += (out.empty() ? "" : ", ") + ("shard " + std::to_string(a.shard)) + " -> server " +
           std::to_string(a.server);
  }
  return out;
}

// What the copy threads of CopyShards share with the calling thread: the pairs not started
// yet, the lines for `progress` (called on the calling thread only) and how many copies run.
struct CopyBoard {
  Mutex mu;
  CondVar changed;
  size_t next GUARDED_BY(mu) = 0;
  size_t running GUARDED_BY(mu) = 0;
  std::vector<std::string> lines GUARDED_BY(mu);
};

// Step 2 for every pair (joining in `joining`): up to kReplicaCopiesInFlight copies at once,
// pairs of different target servers first (`pairs` is in that order). One status per pair;
// the copies' counts are summed into `out` (copy_seconds: the wall time of the whole step).
std::vector<Status> CopyShards(AdminChannel& channel, const cluster::ClusterMap& joining,
                               const std::vector<ReplicaAddition>& pairs, ReplicaReport* out,
                               const MoveProgressFn& progress) {
  std::vector<Status> status(pairs.size());
  std::vector<ReplicaReport> reports(pairs.size());
  CopyBoard board;
  const MoveProgressFn queue_line = [&board](std::string_view line) {
    MutexLock lock(&board.mu);
    board.lines.emplace_back(line);
    board.changed.SignalAll();
  };
  const Clock::time_point start = Clock::now();
  const size_t threads = std::min(kReplicaCopiesInFlight, pairs.size());
  std::vector<std::thread> copiers;
  {
    MutexLock lock(&board.mu);
    board.running = threads;
  }
  for (size_t t = 0; t < threads; ++t) {
    copiers.emplace_back([&] {
      for (;;) {
        size_t i = 0;
        {
          MutexLock lock(&board.mu);
          if (board.next == pairs.size()) {
            --board.running;
            board.changed.SignalAll();
            return;
          }
          i = board.next++;
        }
        status[i] = CopyShard(channel, joining, pairs[i].shard, pairs[i].server, &reports[i],
                              progress ? queue_line : MoveProgressFn());
      }
    });
  }
  for (;;) {
    std::vector<std::string> lines;
    bool done = false;
    {
      MutexLock lock(&board.mu);
      while (board.lines.empty() && board.running > 0) board.changed.Wait(&board.mu);
      lines.swap(board.lines);
      done = board.running == 0;
    }
    for (const std::string& line : lines) progress(line);
    if (done) break;
  }
  for (std::thread& t : copiers) t.join();
  for (const ReplicaReport& r : reports) {
    out->items_copied += r.items_copied;
    out->bytes_copied += r.bytes_copied;
    out->ids_copied += r.ids_copied;
  }
  out->copy_seconds += std::chrono::duration<double>(Clock::now() - start).count();
  return status;
}

// The order to install a joining map in: each new replica before the primaries that will
// forward to it, where the pairs allow; in a cycle (A a new replica of a shard B is primary of,
// and B of one A is primary of) the first one left goes first: its forwards to a replica that
// has not installed the map yet are answered kBusy and resent until it has. Then nobody else.
std::vector<uint32_t> JoiningInstallOrder(const cluster::ClusterMap& m,
                                          const std::vector<ReplicaAddition>& pairs) {
  std::vector<uint32_t> todo;  // the new replicas, then the primaries, each once
  for (const ReplicaAddition& a : pairs) AddOnce(&todo, a.server);
  for (const ReplicaAddition& a : pairs) AddOnce(&todo, m.OwnerOf(a.shard));
  std::vector<uint32_t> order;
  auto installed = [&](uint32_t id) {
    return std::find(order.begin(), order.end(), id) != order.end();
  };
  // Whether `id` would forward to a new replica that has not installed the map yet.
  auto forwards_early = [&](uint32_t id) {
    for (const ReplicaAddition& a : pairs) {
      if (m.OwnerOf(a.shard) == id && !installed(a.server)) return true;
    }
    return false;
  };
  while (!todo.empty()) {
    auto next =
        std::find_if(todo.begin(), todo.end(), [&](uint32_t id) { return !forwards_early(id); });
    if (next == todo.end()) next = todo.begin();  // a cycle
    order.push_back(*next);
    todo.erase(next);
  }
  return order;
}

// `base` with every pair of `pairs` moved from joining to in sync, at epoch base.epoch + 1.
cluster::ClusterMap WithInSync(const cluster::ClusterMap& base,
                               const std::vector<ReplicaAddition>& pairs) {
  cluster::ClusterMap next = base;
  next.epoch = base.epoch + 1;
  for (const ReplicaAddition& a : pairs) {
    Erase(&next.joining[a.shard], a.server);
    next.backups[a.shard].push_back(a.server);
  }
  return next;
}

// A pair that did not become in sync, and why.
struct PairFailure {
  ReplicaAddition pair;
  Status status;
};

// Which copied pairs may become in sync in a map built on `newest` (what the servers hold now):
// those still joining since the same epoch (not removed and added again: a new pair, whose
// copy is another's) under the primary their copy came from (in `joining`), whose primary's
// check passes: MAP_INSTALL check-only, which refuses a joining replica that missed a forwarded
// write since it started joining, or of which no whole copy was read from that primary
// process since (Replicator::MayBecomeInSync). Every primary is asked before anything changes: with
// several primaries in one map change, the first install commits it (etcd), so a later primary's
// refusal would come too late. Then every new replica is asked the same for its own pairs: it
// refuses one whose join this server process did not see begin (it restarted since: the copy's
// last items may be gone; Replicator::MayClaimOwnCopy). One check per server; the pairs of a
// server that refuses are checked one by one. The others go to *failures.
std::vector<ReplicaAddition> PairsReadyForInSync(AdminChannel& channel,
                                                 const cluster::ClusterMap& joining,
                                                 const cluster::ClusterMap& newest,
                                                 const std::vector<ReplicaAddition>& copied,
                                                 std::vector<PairFailure>* failures) {
  std::vector<ReplicaAddition> candidates;
  std::vector<uint32_t> primaries;
  for (const ReplicaAddition& a : copied) {
    if (a.shard >= newest.shards || !newest.IsJoining(a.shard, a.server) ||
        newest.OwnerOf(a.shard) != joining.OwnerOf(a.shard)) {
      failures->push_back(
          {a, Status::Unavailable("the map changed during the copy of shard " +
                                  std::to_string(a.shard) + " into " + Name(newest, a.server) +
                                  ": it is no longer joining under the primary it was copied "
                                  "from (run the same command again to copy it anew)")});
      continue;
    }
    if (const uint64_t now = newest.JoinedAt(a.shard, a.server),
        copied_for = joining.JoinedAt(a.shard, a.server);
        now != copied_for) {
      failures->push_back(
          {a, Status::Busy("shard " + std::to_string(a.shard) + " into " + Name(newest, a.server) +
                           ": another writer removed the replica and "
                           "added it again (joining since map epoch " +
                           std::to_string(now) + ", copied for its join at epoch " +
                           std::to_string(copied_for) +
                           "); that writer's copy is the one that counts")});
      continue;
    }
    candidates.push_back(a);
    AddOnce(&primaries, newest.OwnerOf(a.shard));
  }
  auto check = [&](uint32_t server, const std::vector<ReplicaAddition>& pairs) {
    const cluster::ServerEntry* e = newest.FindServer(server);
    if (e == nullptr) {
      return Status::InvalidArgument("server " + std::to_string(server) + " is not in the map");
    }
    return channel.Call(*e, kv::EncodeMapInstall({WithInSync(newest, pairs).ToJson(), true}),
                        nullptr, nullptr);
  };
  // Asks `server` about the pairs of `group` that `of` picks: all at once, then one by one
  // when it refuses; the ones it accepts go to `out`.
  auto ask = [&](uint32_t server, const std::vector<ReplicaAddition>& group,
                 const std::function<bool(const ReplicaAddition&)>& of,
                 std::vector<ReplicaAddition>* out) {
    std::vector<ReplicaAddition> mine;
    for (const ReplicaAddition& a : group) {
      if (of(a)) mine.push_back(a);
    }
    if (mine.empty()) return;
    if (check(server, mine).ok()) {
      out->insert(out->end(), mine.begin(), mine.end());
      return;
    }
    for (const ReplicaAddition& a : mine) {
      Status s = check(server, {a});
      if (s.ok()) {
        out->push_back(a);
      } else {
        failures->push_back({a, Status(s.code(), "shard " + std::to_string(a.shard) + " on " +
                                                     Name(newest, a.server) + ": " + s.message())});
      }
    }
  };
  std::vector<ReplicaAddition> vouched;
  for (uint32_t p : primaries) {
    ask(
        p, candidates, [&](const ReplicaAddition& a) { return newest.OwnerOf(a.shard) == p; },
        &vouched);
  }
  // Then each new replica for its own copies: one that restarted since its join may lack the
  // copy's last items although its primaries missed nothing (Replicator::MayClaimOwnCopy).
  std::vector<uint32_t> replicas;
  for (const ReplicaAddition& a : vouched) AddOnce(&replicas, a.server);
  std::vector<ReplicaAddition> ready;
  for (uint32_t r : replicas) {
    ask(
        r, vouched, [&](const ReplicaAddition& a) { return a.server == r; }, &ready);
  }
  return ready;
}

// One map change (epoch + 1) taking `pairs` out of joining: installed on their primaries first
// (they stop forwarding to them), then on the rest. Returns the new map.
Result<cluster::ClusterMap> LeaveJoining(AdminChannel& channel, const cluster::ClusterMap& cur,
                                         const std::vector<ReplicaAddition>& pairs,
                                         const MoveProgressFn& progress) {
  cluster::ClusterMap next = cur;
  next.epoch = cur.epoch + 1;
  std::vector<uint32_t> primaries;
  for (const ReplicaAddition& a : pairs) {
    Erase(&next.joining[a.shard], a.server);
    AddOnce(&primaries, cur.OwnerOf(a.shard));
  }
  if (progress) {
    progress("out of joining at map epoch " + std::to_string(next.epoch) + ": " + PairsText(pairs));
  }
  RDKV_RETURN_IF_ERROR(InstallOn(channel, next, primaries, progress));
  RDKV_RETURN_IF_ERROR(
      InstallOn(channel, next, Others(next, primaries), progress, /*required=*/false));
  return next;
}

// The error of an AddReplicas call that left pairs out: the first failure's code and text,
// then which pairs are not in sync and which are (`done`, with `done_where`).
Status FailuresStatus(const std::vector<PairFailure>& failures,
                      const std::vector<ReplicaAddition>& done, const std::string& done_where) {
  const Status& first = failures.front().status;
  std::vector<ReplicaAddition> failed;
  for (const PairFailure& f : failures) failed.push_back(f.pair);
  std::string text = first.message() + " (not in sync: " + PairsText(failed);
  if (!done.empty()) text += "; in sync: " + PairsText(done) + done_where;
  return Status(first.code(), text + ")");
}

}  // namespace

Result<ReplicaReport> RunAddReplicas(AdminChannel& channel, const cluster::ClusterMap& known,
                                     std::span<const ReplicaAddition> wanted,
                                     const MoveProgressFn& progress) {
  const Clock::time_point start = Clock::now();
  if (wanted.empty()) return Status::InvalidArgument("no shard to add a replica to");
  RDKV_RETURN_IF_ERROR(FinishEarlierChange(channel, known, progress, [&](const auto& m) {
    for (const ReplicaAddition& a : wanted) RDKV_RETURN_IF_ERROR(CheckArgs(m, a.shard, a.server));
    return Status::Ok();
  }));
  RDKV_ASSIGN_OR_RETURN(cluster::ClusterMap cur, NewestMap(channel, known, progress));
  for (const ReplicaAddition& a : wanted) RDKV_RETURN_IF_ERROR(CheckArgs(cur, a.shard, a.server));
  ReplicaReport report;
  report.from_epoch = cur.epoch;
  report.to_epoch = cur.epoch;
  std::vector<ReplicaAddition> pairs;  // to add, each once, in the order given
  std::vector<size_t> joining_added(cur.shards, 0);
  for (const ReplicaAddition& a : wanted) {
    if (std::find(pairs.begin(), pairs.end(), a) != pairs.end()) continue;
    if (cur.OwnerOf(a.shard) == a.server || cur.IsBackup(a.shard, a.server)) {
      if (progress) {
        progress(Name(cur, a.server) + " already holds shard " + std::to_string(a.shard));
      }
      continue;
    }
    if (!cur.IsJoining(a.shard, a.server)) ++joining_added[a.shard];
    if (cur.ReplicasOf(a.shard).size() + cur.joining[a.shard].size() + joining_added[a.shard] >
        cluster::kMaxReplicas) {
      return Status::InvalidArgument("shard " + std::to_string(a.shard) + " would have more than " +
                                     std::to_string(cluster::kMaxReplicas) + " replicas");
    }
    pairs.push_back(a);
  }
  if (pairs.empty()) return report;
  // A pair already joining (an interrupted copy) starts over: out of joining first, then added
  // as a fresh one (emptied, joining, copied). Copying into what it holds is not enough: a
  // DELETE forward it missed while nobody copied leaves the old item there, and the copy only
  // adds what the primary has.
  {
    std::vector<ReplicaAddition> resumed;
    for (const ReplicaAddition& a : pairs) {
      if (cur.IsJoining(a.shard, a.server)) resumed.push_back(a);
    }
    if (!resumed.empty()) {
      RDKV_ASSIGN_OR_RETURN(cur, LeaveJoining(channel, cur, resumed, progress));
    }
  }
  std::vector<PairFailure> failures;
  // 0. Every new replica gets the newest map first (one that was down missed the change that
  //    removed it). A replica starts empty: whatever a fresh one holds of its shard is stale
  //    (an earlier replica or move), and an old item of a key deleted since would come back
  //    with the copy. A server that cannot take the map, or a shard it cannot drop, fails its
  //    pairs alone.
  cluster::ClusterMap joining = cur;
  {
    std::vector<uint32_t> targets;
    for (const ReplicaAddition& a : pairs) AddOnce(&targets, a.server);
    std::vector<uint32_t> unready;
    for (uint32_t t : targets) {
      Status s = InstallOn(channel, cur, {t}, progress);
      if (s.ok()) continue;
      unready.push_back(t);
      for (const ReplicaAddition& a : pairs) {
        if (a.server == t) failures.push_back({a, s});
      }
    }
    std::vector<ReplicaAddition> kept;
    for (const ReplicaAddition& a : pairs) {
      if (std::find(unready.begin(), unready.end(), a.server) != unready.end()) continue;
      std::string drop_scratch;
      uint64_t stale = 0;
      Status d = channel.Call(*cur.FindServer(a.server),
                              kv::EncodeDropShard({a.shard, 0}, &drop_scratch), &stale, nullptr);
      if (!d.ok()) {
        failures.push_back(
            {a,
             Status(d.code(), "dropping stale data of shard " + std::to_string(a.shard) + " on " +
                                  Name(cur, a.server) + " before it joins: " + d.message())});
        continue;
      }
      joining.SetJoining(a.shard, a.server, cur.epoch + 1);  // the epoch joining.epoch gets
      kept.push_back(a);
    }
    pairs = std::move(kept);
  }
  if (pairs.empty()) return FailuresStatus(failures, {}, "");
  // Copies of different target servers run first, side by side: pair k of each server in turn.
  {
    const auto by_server = ByServer(pairs);
    std::vector<ReplicaAddition> spread;
    for (size_t k = 0; spread.size() < pairs.size(); ++k) {
      for (const auto& [server, shards] : by_server) {
        if (k < shards.size()) spread.push_back({shards[k], server});
      }
    }
    pairs = std::move(spread);
  }
  // 1. Joining, for every pair in one map change, on the new replicas and their primaries in
  //    JoiningInstallOrder, then the rest. A new replica that cannot take it fails its pairs
  //    alone, which leave joining again in one more map change (a replica on an older map
  //    would answer its primaries' forwards kBusy and hold up every write of those shards for
  //    the forward timeout); a primary that cannot ends the call: its shards' writes would not
  //    reach their new replicas.
  joining.epoch = cur.epoch + 1;
  if (progress) {
    progress("add replicas (" + PairsText(pairs) + "): joining at map epoch " +
             std::to_string(joining.epoch));
  }
  const std::vector<uint32_t> first = JoiningInstallOrder(cur, pairs);
  std::vector<ReplicaAddition> left_out;
  for (uint32_t id : first) {
    Status s = InstallOn(channel, joining, {id}, progress);
    if (s.ok()) continue;
    const bool primary = std::any_of(pairs.begin(), pairs.end(), [&](const ReplicaAddition& a) {
      return joining.OwnerOf(a.shard) == id;
    });
    if (primary) {
      return Status(s.code(), s.message() + " (nothing is in sync: " + PairsText(pairs) +
                                  " joining at map epoch " + std::to_string(joining.epoch) +
                                  " on the servers before it; running the same call again "
                                  "starts them over)");
    }
    std::erase_if(pairs, [&](const ReplicaAddition& a) {
      if (a.server != id) return false;
      failures.push_back({a, s});
      left_out.push_back(a);
      return true;
    });
  }
  RDKV_RETURN_IF_ERROR(
      InstallOn(channel, joining, Others(joining, first), progress, /*required=*/false));
  if (!left_out.empty()) {
    RDKV_ASSIGN_OR_RETURN(joining, LeaveJoining(channel, joining, left_out, progress));
  }
  // 2. Copy the shards, several at once.
  const std::vector<Status> copy_status = CopyShards(channel, joining, pairs, &report, progress);
  std::vector<ReplicaAddition> copied;
  for (size_t i = 0; i < pairs.size(); ++i) {
    if (copy_status[i].ok()) {
      copied.push_back(pairs[i]);
    } else {
      failures.push_back({pairs[i], copy_status[i]});
    }
  }
  // 3. In sync, for every copied pair that may be, in one map change built on the newest map
  //    (a failover or admission during the copies changed it: pairs it left alone are kept):
  //    their primaries first (from here they wait for the new replicas' answers), then the
  //    rest. A pair that fails stays joining; the failures are returned after the others are
  //    in sync.
  std::vector<ReplicaAddition> done;
  cluster::ClusterMap in_sync = joining;
  if (!copied.empty()) {
    std::vector<PairFailure> not_ready;  // the last attempt's pairs that may not be in sync
    std::vector<uint32_t> primaries;
    // Where the change failed: its map and the servers that hold it.
    auto failed_at = [&](const Status& s, const std::vector<uint32_t>& installed) {
      std::string where = installed.empty() ? "no server" : "server(s)";
      for (uint32_t id : installed) where += " " + std::to_string(id);
      return Status(s.code(), s.message() + "; map epoch " + std::to_string(in_sync.epoch) +
                                  " (in sync: " + PairsText(done) + ") is installed on " + where +
                                  " (with etcd it may be committed already)");
    };
    // The last attempt's ready pairs stay joining, failed with `why` (named first).
    auto leave_joining = [&](const Status& why) {
      std::vector<PairFailure> busy;
      for (const ReplicaAddition& a : done) busy.push_back({a, why});
      failures.insert(failures.begin(), busy.begin(), busy.end());
      done.clear();
    };
    for (int attempt = 1;; ++attempt) {
      cluster::ClusterMap newest = joining;
      if (Result<cluster::ClusterMap> m = NewestMap(channel, joining, progress); m.ok()) {
        newest = std::move(m).value();
      }
      // Every attempt asks again which copied pairs may be in sync: one removed and added
      // again meanwhile joins at a later epoch (its copy is another's), and a primary replaced
      // or restarted cannot vouch for its replica.
      not_ready.clear();
      done = PairsReadyForInSync(channel, joining, newest, copied, &not_ready);
      if (done.empty()) break;
      primaries.clear();
      for (const ReplicaAddition& a : done) AddOnce(&primaries, newest.OwnerOf(a.shard));
      in_sync = WithInSync(newest, done);
      // The first primary's install commits the change (with etcd, there first). kBusy from
      // it: another writer (the coordinator, another command) changed the map since `newest`
      // was read, and nothing of this attempt was installed. The change is checked and made
      // again on the newest map, the copies kept.
      Status first = InstallOn(channel, in_sync, {primaries[0]}, progress);
      if (first.ok()) break;
      if (!first.Is(StatusCode::kBusy)) return failed_at(first, {});
      if (attempt == kMapRaceAttempts) {
        leave_joining(Status::Busy(first.message() + "; nothing was installed in " +
                                   std::to_string(kMapRaceAttempts) +
                                   " attempts; the pairs stay joining"));
        break;
      }
      PauseAfterLostMap(attempt, first, "marking in sync again", progress);
    }
    failures.insert(failures.end(), not_ready.begin(), not_ready.end());
    if (!done.empty()) {
      // The other primaries (the servers before each hold the new map already: with etcd it
      // is committed, and every server gets it from its watch), then the rest.
      std::vector<uint32_t> installed = {primaries[0]};
      for (size_t i = 1; i < primaries.size(); ++i) {
        Status s = InstallOn(channel, in_sync, {primaries[i]}, progress);
        if (!s.ok()) return failed_at(s, installed);
        installed.push_back(primaries[i]);
      }
      RDKV_RETURN_IF_ERROR(InstallOn(channel, in_sync, Others(in_sync, primaries), progress,
                                     /*required=*/false));
      if (progress) {
        for (const auto& [server, shards] : ByServer(done)) {
          progress(Name(in_sync, server) + " is an in-sync replica of " + ShardsText(shards) +
                   " at map epoch " + std::to_string(in_sync.epoch));
        }
      }
    }
  }
  if (!failures.empty()) {
    return FailuresStatus(failures, done, " at map epoch " + std::to_string(in_sync.epoch));
  }
  report.to_epoch = in_sync.epoch;
  report.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return report;
}

Result<ReplicaReport> RunRemoveReplica(AdminChannel& channel, const cluster::ClusterMap& known,
                                       uint32_t shard, uint32_t server,
                                       const MoveProgressFn& progress) {
  const Clock::time_point start = Clock::now();
  RDKV_RETURN_IF_ERROR(FinishEarlierChange(
      channel, known, progress, [&](const auto& m) { return CheckArgs(m, shard, server); }));
  RDKV_ASSIGN_OR_RETURN(cluster::ClusterMap cur, NewestMap(channel, known, progress));
  RDKV_RETURN_IF_ERROR(CheckArgs(cur, shard, server));
  ReplicaReport report;
  report.from_epoch = cur.epoch;
  if (cur.OwnerOf(shard) == server) {
    return Status::InvalidArgument("cannot remove " + Name(cur, server) + " from shard " +
                                   std::to_string(shard) +
                                   ": it is the primary; promote another replica first");
  }
  if (!cur.IsBackup(shard, server) && !cur.IsJoining(shard, server)) {
    report.to_epoch = cur.epoch;
    if (progress) progress(Name(cur, server) + " is no replica of shard " + std::to_string(shard));
    return report;
  }
  cluster::ClusterMap next = cur;
  next.epoch = cur.epoch + 1;
  Erase(&next.backups[shard], server);
  Erase(&next.joining[shard], server);
  const uint32_t primary = cur.OwnerOf(shard);
  // The primary first (it stops waiting for the replica), the replica last. The removed
  // replica's copy stays until a DROP_SHARD (it is invisible: its bit is clear).
  RDKV_RETURN_IF_ERROR(InstallOn(channel, next, {primary}, progress));
  RDKV_RETURN_IF_ERROR(InstallOn(channel, next, Others(next, {primary}), progress,
                                 /*required=*/false));
  const cluster::ServerEntry* e = next.FindServer(server);
  std::string scratch;
  uint64_t dropped = 0;
  Status d = channel.Call(*e, kv::EncodeDropShard({shard, 0}, &scratch), &dropped, nullptr);
  if (!d.ok() && progress) progress("  dropping the removed copy failed: " + d.ToString());
  report.items_dropped = dropped;
  report.to_epoch = next.epoch;
  report.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return report;
}

Result<MoveReport> RunReplicaMove(AdminChannel& channel, const cluster::ClusterMap& known,
                                  std::span<const uint32_t> shards, uint32_t to_server,
                                  const MoveProgressFn& progress) {
  const Clock::time_point start = Clock::now();
  if (shards.empty()) return Status::InvalidArgument("no shard to move");
  RDKV_RETURN_IF_ERROR(FinishEarlierChange(channel, known, progress, [&](const auto& m) {
    for (uint32_t shard : shards) RDKV_RETURN_IF_ERROR(CheckArgs(m, shard, to_server));
    return Status::Ok();
  }));
  RDKV_ASSIGN_OR_RETURN(cluster::ClusterMap cur, NewestMap(channel, known, progress));
  for (uint32_t shard : shards) RDKV_RETURN_IF_ERROR(CheckArgs(cur, shard, to_server));
  // A move replaces the old primary by the target, keeping the replica count. A target that
  // is already an in-sync backup cannot replace anyone: the move would promote it and drop the
  // old primary, one replica fewer, which an operator asks for by name or not at all.
  std::string already;
  for (uint32_t shard : shards) {
    if (cur.OwnerOf(shard) != to_server && cur.IsBackup(shard, to_server)) {
      already += (already.empty() ? "" : ",") + std::to_string(shard);
    }
  }
  if (!already.empty()) {
    return Status::InvalidArgument(
        Name(cur, to_server) + " is already an in-sync backup of shard(s) " + already +
        ": moving them there would leave each with one replica fewer. Nothing was changed. To "
        "make it the primary and keep the old one as a backup: cluster promote SHARD " +
        std::to_string(to_server) +
        " (or cluster drain OLD_PRIMARY); to drop the old primary "
        "as well, cluster remove-replica SHARD OLD_PRIMARY after it; to move the shard to a "
        "server that holds no copy, name that server");
  }
  MoveReport report;
  report.from_epoch = cur.epoch;
  report.to_server = to_server;
  for (uint32_t shard : shards) {
    RDKV_ASSIGN_OR_RETURN(cur, NewestMap(channel, cur, progress));
    const uint32_t old_primary = cur.OwnerOf(shard);
    if (old_primary == to_server) {
      report.skipped.push_back(shard);
      continue;
    }
    if (progress) {
      progress("shard " + std::to_string(shard) + ": replica move from " + Name(cur, old_primary) +
               " to " + Name(cur, to_server) + " (add, catch up, promote, remove)");
    }
    Clock::time_point t = Clock::now();
    // Not a backup (checked above for the map this call began with; a backup since then is
    // one this add step resumes or finds in sync).
    if (!cur.IsBackup(shard, to_server)) {
      RDKV_ASSIGN_OR_RETURN(ReplicaReport added,
                            RunAddReplica(channel, cur, shard, to_server, progress));
      report.items_copied += added.items_copied;
      report.bytes_copied += added.bytes_copied;
      report.ids_copied += added.ids_copied;
    }
    report.step_seconds[1] += std::chrono::duration<double>(Clock::now() - t).count();
    t = Clock::now();
    RDKV_RETURN_IF_ERROR(RunPromote(channel, cur, shard, to_server, progress).status());
    report.step_seconds[2] += std::chrono::duration<double>(Clock::now() - t).count();
    t = Clock::now();
    RDKV_ASSIGN_OR_RETURN(ReplicaReport removed,
                          RunRemoveReplica(channel, cur, shard, old_primary, progress));
    report.items_dropped += removed.items_dropped;
    report.step_seconds[3] += std::chrono::duration<double>(Clock::now() - t).count();
    report.to_epoch = removed.to_epoch;
    report.moved.push_back(shard);
  }
  if (report.to_epoch == 0) report.to_epoch = cur.epoch;
  report.total_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return report;
}

}  // namespace rdkv::client

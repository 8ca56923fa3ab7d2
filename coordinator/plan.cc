#include "coordinator/plan.h"

#include <algorithm>
#include <set>

#include "common/cluster/etcd_map.h"

namespace rdkv::coordinator {

Result<Registration> ParseRegistration(uint32_t id, const std::string& json) {
  Result<cluster::RegistrationValue> v = cluster::ParseRegistrationJson(json);
  if (!v.ok()) {
    return Status::InvalidArgument("registration of server " + std::to_string(id) + ": " +
                                   v.status().message());
  }
  Registration r;
  r.id = id;
  r.address = v->address;
  r.incarnation = v->incarnation;
  r.durable = v->durable;
  r.released = v->released;
  r.epoch = v->epoch;
  return r;
}

namespace {

bool HasRole(const cluster::ClusterMap& m, uint32_t id) {
  for (uint32_t s = 0; s < m.shards; ++s) {
    if (m.owners[s] == id || m.IsBackup(s, id) || m.IsJoining(s, id)) return true;
  }
  return false;
}

std::string Name(uint32_t id) { return "server " + std::to_string(id); }

}  // namespace

FailoverPlan PlanFailover(const cluster::ClusterMap& map_in,
                          const std::map<uint32_t, Registration>& registrations) {
  FailoverPlan plan;
  plan.next = map_in;
  cluster::ClusterMap& next = plan.next;
  next.NormalizeReplicas();

  // Who is unavailable, who is to be admitted.
  std::set<uint32_t> unavailable;
  // Restarted with durable data: every acknowledged write is on its disk, but not what lived
  // only in its memory: the request ids of its writes (a retry would apply again), and a
  // replicated write it published (a GET may have returned it) before its own WAL sync, which
  // its backups hold. So it leaves every replica set where another in-sync replica remains,
  // and keeps only the shards it alone holds.
  std::set<uint32_t> durable_restarts;
  for (cluster::ServerEntry& e : next.servers) {
    auto reg = registrations.find(e.id);
    if (reg == registrations.end()) {
      // Never admitted: the cluster is still starting (or the server never came); a failure
      // needs an incarnation that once served.
      if (e.incarnation != 0 && HasRole(next, e.id)) {
        unavailable.insert(e.id);
        plan.reasons.push_back(Name(e.id) + " (incarnation " + std::to_string(e.incarnation) +
                               ") has no registration: its etcd lease expired, so it has fenced "
                               "itself (or died)");
      }
      continue;
    }
    const Registration& r = reg->second;
    if (r.incarnation == 0 || r.incarnation == e.incarnation) continue;
    if (e.incarnation != 0 && !r.durable && HasRole(next, e.id)) {
      unavailable.insert(e.id);
      plan.reasons.push_back(Name(e.id) + " restarted (incarnation " +
                             std::to_string(e.incarnation) + " -> " +
                             std::to_string(r.incarnation) +
                             ") without durable data: it may have lost acknowledged writes, so it "
                             "leaves every replica set it can be spared from");
    } else if (e.incarnation != 0) {
      const bool role = HasRole(next, e.id);
      if (role) durable_restarts.insert(e.id);
      plan.reasons.push_back(
          Name(e.id) + " restarted (incarnation " + std::to_string(e.incarnation) + " -> " +
          std::to_string(r.incarnation) + ")" +
          (role ? " with durable data (durability=sync): it leaves the replica sets that keep "
                  "another in-sync replica (its request ids, and writes it published before "
                  "its own sync, were only in its memory) and keeps the shards it alone holds"
                : "; it holds no replica (it rejoins through catch-up copies)"));
    }
    e.incarnation = r.incarnation;
    plan.admitted.push_back(e.id);
    plan.changed = true;
  }
  plan.failed.assign(unavailable.begin(), unavailable.end());

  for (uint32_t s = 0; s < next.shards; ++s) {
    std::vector<uint32_t> replicas = next.ReplicasOf(s);
    std::vector<uint32_t> kept;
    for (uint32_t id : replicas) {
      if (!unavailable.count(id) && !durable_restarts.count(id)) kept.push_back(id);
    }
    if (kept.empty()) {
      // Only restarted servers hold the shard: the durable ones keep it (their disks hold its
      // acknowledged writes).
      for (uint32_t id : replicas) {
        if (durable_restarts.count(id)) kept.push_back(id);
      }
    }
    std::vector<uint32_t>& joining = next.joining[s];
    const size_t joining_before = joining.size();
    std::erase_if(joining, [&](uint32_t id) { return unavailable.count(id) > 0; });
    if (joining.size() != joining_before) plan.changed = true;
    if (kept.size() == replicas.size()) continue;
    if (kept.empty()) {
      // Nothing else holds the shard's acknowledged writes: keep the primary and wait for it.
      kept.push_back(replicas.front());
      plan.stranded.push_back(s);
      plan.reasons.push_back("shard " + std::to_string(s) + ": no available in-sync replica; " +
                             Name(replicas.front()) +
                             " stays its primary (the shard is unavailable until it serves "
                             "again, or lost if it restarted without durable data)");
    } else if (kept.front() != replicas.front()) {
      plan.promoted.push_back(s);
      plan.reasons.push_back("shard " + std::to_string(s) + ": " + Name(kept.front()) +
                             " promoted (in-sync backup) in place of " + Name(replicas.front()));
    }
    // A stranded shard whose only replica is the unavailable server stays as it is: no change,
    // so no new epoch on every poll while the server is gone.
    if (kept == replicas) continue;
    plan.changed = true;
    next.owners[s] = kept.front();
    next.backups[s].assign(kept.begin() + 1, kept.end());
  }
  if (!next.coordinated) {
    next.coordinated = true;
    plan.changed = true;
    plan.reasons.push_back("the failover coordinator manages this cluster from now on");
  }
  if (plan.changed) next.epoch = map_in.epoch + 1;
  return plan;
}

std::optional<ReplicaTask> NextReplicaTask(const cluster::ClusterMap& map,
                                           const std::map<uint32_t, Registration>& registrations) {
  auto available = [&](uint32_t id) {
    auto r = registrations.find(id);
    const cluster::ServerEntry* e = map.FindServer(id);
    return r != registrations.end() && e != nullptr && e->incarnation != 0 &&
           r->second.incarnation == e->incarnation;
  };
  // Interrupted copies: joining replicas nobody is copying to any more.
  ReplicaTask task;
  for (uint32_t s = 0; s < map.shards && s < map.joining.size(); ++s) {
    for (uint32_t id : map.joining[s]) {
      if (!available(id) || !available(map.owners[s])) continue;
      task.additions.push_back({s, id});
      ++task.resumed;
    }
  }
  std::map<uint32_t, size_t> load;
  for (const cluster::ServerEntry& e : map.servers) {
    if (available(e.id)) load[e.id] = 0;
  }
  for (uint32_t s = 0; s < map.shards; ++s) {
    for (uint32_t id : map.ReplicasOf(s)) {
      if (load.count(id)) ++load[id];
    }
    if (s < map.joining.size()) {
      for (uint32_t id : map.joining[s]) {
        if (load.count(id)) ++load[id];
      }
    }
  }
  for (uint32_t s = 0; s < map.shards && map.replication_factor > 1; ++s) {
    const std::vector<uint32_t> replicas = map.ReplicasOf(s);
    const size_t joining = s < map.joining.size() ? map.joining[s].size() : 0;
    if (replicas.size() + joining >= map.replication_factor) continue;
    if (!available(map.owners[s])) continue;  // a copy needs a serving primary
    std::optional<uint32_t> best;
    for (const auto& [id, n] : load) {
      if (std::find(replicas.begin(), replicas.end(), id) != replicas.end()) continue;
      if (map.IsJoining(s, id)) continue;
      if (!best || n < load[*best]) best = id;
    }
    if (!best) continue;
    ++load[*best];
    task.additions.push_back({s, *best});
  }
  if (task.additions.empty()) return std::nullopt;
  return task;
}

}  // namespace rdkv::coordinator

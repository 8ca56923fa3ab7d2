// PlanFailover and NextReplicaTask (coordinator/plan.h): the failover coordinator's decisions
// as a pure function of the map and the registrations.
#include "coordinator/plan.h"

#include "common/cluster/etcd_map.h"

#include <gtest/gtest.h>

namespace rdkv::coordinator {
namespace {

// 3 servers, 6 shards, R=3 (shard s: primary s%3, then the next two), every server admitted
// with incarnation 100+id.
cluster::ClusterMap Admitted3() {
  cluster::ClusterMap m =
      cluster::MakeUniformMap({"127.0.0.1:7000", "127.0.0.1:7001", "127.0.0.1:7002"}, 6, 3);
  for (cluster::ServerEntry& e : m.servers) e.incarnation = 100 + e.id;
  m.coordinated = true;
  return m;
}

std::map<uint32_t, Registration> Regs(std::initializer_list<uint32_t> ids, bool durable = false) {
  std::map<uint32_t, Registration> r;
  for (uint32_t id : ids) {
    r[id] = Registration{id, "127.0.0.1:700" + std::to_string(id), 100 + id, durable, 1, 1};
  }
  return r;
}

TEST(PlanFailover, NothingChangesWhileEveryAdmittedServerIsRegistered) {
  FailoverPlan p = PlanFailover(Admitted3(), Regs({0, 1, 2}));
  EXPECT_FALSE(p.changed);
  EXPECT_EQ(p.next.epoch, 1u);
  EXPECT_TRUE(p.failed.empty());
}

TEST(PlanFailover, AServerWithoutRegistrationLosesItsRolesAndItsShardsGetTheFirstBackup) {
  const cluster::ClusterMap m = Admitted3();
  FailoverPlan p = PlanFailover(m, Regs({0, 2}));
  ASSERT_TRUE(p.changed);
  EXPECT_EQ(p.next.epoch, m.epoch + 1);
  EXPECT_EQ(p.failed, std::vector<uint32_t>{1});
  // Shards 1 and 4 had primary 1, backups 2 and 0: server 2 takes over.
  EXPECT_EQ(p.promoted, (std::vector<uint32_t>{1, 4}));
  for (uint32_t s = 0; s < 6; ++s) {
    std::vector<uint32_t> replicas = p.next.ReplicasOf(s);
    EXPECT_EQ(replicas.size(), 2u) << "shard " << s;
    for (uint32_t id : replicas) EXPECT_NE(id, 1u) << "shard " << s;
    // The survivors keep their order: the first in-sync backup leads.
    std::vector<uint32_t> before = m.ReplicasOf(s);
    std::erase(before, 1u);
    EXPECT_EQ(replicas, before) << "shard " << s;
  }
  EXPECT_TRUE(cluster::ValidateReplicas(p.next).ok());
  // Membership is kept (the server comes back as a catching-up replica).
  EXPECT_NE(p.next.FindServer(1), nullptr);
}

TEST(PlanFailover, AServerNeverAdmittedIsNotAFailure) {
  cluster::ClusterMap m = Admitted3();
  m.servers[2].incarnation = 0;  // never registered since the coordinator took over
  FailoverPlan p = PlanFailover(m, Regs({0, 1}));
  EXPECT_FALSE(p.changed);
}

TEST(PlanFailover, ARestartWithoutDurableDataIsDemotedAndAdmitted) {
  const cluster::ClusterMap m = Admitted3();
  std::map<uint32_t, Registration> regs = Regs({0, 1, 2});
  regs[0].incarnation = 555;  // server 0 restarted, durability none
  FailoverPlan p = PlanFailover(m, regs);
  ASSERT_TRUE(p.changed);
  EXPECT_EQ(p.failed, std::vector<uint32_t>{0});
  EXPECT_EQ(p.admitted, std::vector<uint32_t>{0});
  EXPECT_EQ(p.next.FindServer(0)->incarnation, 555u);
  for (uint32_t s = 0; s < 6; ++s) {
    for (uint32_t id : p.next.ReplicasOf(s)) EXPECT_NE(id, 0u) << "shard " << s;
  }
  EXPECT_EQ(p.next.OwnerOf(0), 1u);
  EXPECT_EQ(p.next.OwnerOf(3), 1u);
}

// A restart with durable data keeps every acknowledged write, but not its request ids or a
// replicated write it published before its own sync (both only in memory, both on its backups):
// it leaves the replica sets where another in-sync replica remains, as a restart without
// durable data does, and is admitted. It is not reported failed.
TEST(PlanFailover, ARestartWithDurableDataLeavesTheShardsOthersAlsoHold) {
  const cluster::ClusterMap m = Admitted3();
  std::map<uint32_t, Registration> regs = Regs({0, 1, 2});
  regs[0].incarnation = 555;
  regs[0].durable = true;
  FailoverPlan p = PlanFailover(m, regs);
  ASSERT_TRUE(p.changed);
  EXPECT_TRUE(p.failed.empty());
  EXPECT_EQ(p.admitted, std::vector<uint32_t>{0});
  EXPECT_EQ(p.next.FindServer(0)->incarnation, 555u);
  for (uint32_t s = 0; s < 6; ++s) {
    for (uint32_t id : p.next.ReplicasOf(s)) EXPECT_NE(id, 0u) << "shard " << s;
  }
  EXPECT_EQ(p.next.OwnerOf(0), 1u);
  EXPECT_FALSE(p.promoted.empty());
  EXPECT_TRUE(p.stranded.empty());
}

// ... and keeps the shards nothing else holds (unreplicated ones): its disk has their writes.
TEST(PlanFailover, ARestartWithDurableDataKeepsTheShardsItAloneHolds) {
  cluster::ClusterMap m = Admitted3();
  m.AssignBackups(1);  // unreplicated
  m.replication_factor = 0;
  std::map<uint32_t, Registration> regs = Regs({0, 1, 2});
  regs[0].incarnation = 555;
  regs[0].durable = true;
  FailoverPlan p = PlanFailover(m, regs);
  ASSERT_TRUE(p.changed);  // the new incarnation is admitted
  EXPECT_TRUE(p.failed.empty());
  EXPECT_TRUE(p.stranded.empty());
  for (uint32_t s = 0; s < 6; ++s) EXPECT_EQ(p.next.ReplicasOf(s), m.ReplicasOf(s));
}

TEST(PlanFailover, AShardWithNoOtherInSyncReplicaKeepsItsPrimaryAndIsReported) {
  cluster::ClusterMap m = Admitted3();
  m.AssignBackups(1);  // unreplicated
  m.replication_factor = 0;
  FailoverPlan p = PlanFailover(m, Regs({1, 2}));
  // Nothing to change: the shards keep their only replica (no new epoch for nothing).
  EXPECT_FALSE(p.changed);
  EXPECT_EQ(p.failed, std::vector<uint32_t>{0});
  EXPECT_EQ(p.stranded, (std::vector<uint32_t>{0, 3}));
  EXPECT_EQ(p.next.OwnerOf(0), 0u);
  EXPECT_TRUE(p.promoted.empty());
}

// The coordinator plans again every poll from the map it committed: a plan applied to its own
// result must change nothing, or a stranded shard makes it commit a new epoch every poll (seen
// in bench/failover-bench.sh on an overloaded host: 490 epochs in 70 s).
TEST(PlanFailover, PlanningAgainFromTheResultChangesNothing) {
  cluster::ClusterMap m = Admitted3();
  m.backups[1] = {};                            // shard 1: server 1 alone
  m.backups[4] = {2};                           // shard 4: servers 1 and 2
  FailoverPlan p = PlanFailover(m, Regs({0}));  // 1 and 2 gone
  ASSERT_TRUE(p.changed);
  EXPECT_EQ(p.stranded, (std::vector<uint32_t>{1, 4}));
  EXPECT_EQ(p.next.ReplicasOf(4), std::vector<uint32_t>{1});  // 2 dropped, 1 kept as primary
  FailoverPlan again = PlanFailover(p.next, Regs({0}));
  EXPECT_FALSE(again.changed);
  EXPECT_EQ(again.next.epoch, p.next.epoch);
  EXPECT_EQ(again.stranded, (std::vector<uint32_t>{1, 4}));
}

TEST(PlanFailover, JoiningReplicasOfAFailedServerAreDropped) {
  cluster::ClusterMap m = Admitted3();
  m.AssignBackups(2);
  m.joining[0] = {2};  // shard 0: 0, backup 1, joining 2
  FailoverPlan p = PlanFailover(m, Regs({0, 1}));
  ASSERT_TRUE(p.changed);
  EXPECT_TRUE(p.next.joining[0].empty());
}

TEST(PlanFailover, TheFirstPlanMarksTheMapCoordinatedAndAdmitsEveryRegisteredServer) {
  cluster::ClusterMap m =
      cluster::MakeUniformMap({"127.0.0.1:7000", "127.0.0.1:7001", "127.0.0.1:7002"}, 6, 2);
  FailoverPlan p = PlanFailover(m, Regs({0, 1}));  // server 2 not up yet
  ASSERT_TRUE(p.changed);
  EXPECT_TRUE(p.next.coordinated);
  EXPECT_TRUE(p.failed.empty());
  EXPECT_EQ(p.admitted, (std::vector<uint32_t>{0, 1}));
  EXPECT_EQ(p.next.FindServer(2)->incarnation, 0u);
  // The JSON round trip keeps what the coordinator wrote.
  Result<cluster::ClusterMap> back = cluster::ParseClusterMap(p.next.ToJson());
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_TRUE(back->coordinated);
  EXPECT_EQ(back->replication_factor, 2u);
  EXPECT_EQ(back->FindServer(1)->incarnation, 101u);
}

TEST(NextReplicaTask, AddsTheLeastLoadedAvailableServerToAShardBelowTheFactor) {
  cluster::ClusterMap m = Admitted3();
  FailoverPlan p = PlanFailover(m, Regs({0, 2}));  // server 1 failed
  // Server 1 is back (same incarnation after a partition): every shard lacks one replica.
  std::optional<ReplicaTask> t = NextReplicaTask(p.next, Regs({0, 1, 2}));
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->resumed, 0u);
  // All six shards in one task (two map changes), not one task per shard.
  std::vector<ReplicaAddition> all;
  for (uint32_t s = 0; s < 6; ++s) all.push_back({s, 1});
  EXPECT_EQ(t->additions, all);
  // While it is down, no server can be added (0 and 2 hold every shard already).
  EXPECT_FALSE(NextReplicaTask(p.next, Regs({0, 2})).has_value());
}

TEST(NextReplicaTask, ResumesAnInterruptedCopyFirst) {
  cluster::ClusterMap m = Admitted3();
  m.AssignBackups(2);
  m.replication_factor = 3;
  m.joining[4] = {0};  // shard 4: primary 1, backup 2, joining 0
  m.joining[5] = {0};
  std::optional<ReplicaTask> t = NextReplicaTask(m, Regs({0, 1, 2}));
  ASSERT_TRUE(t.has_value());
  // The interrupted copies first, then one new replica for each other shard below R (0-3 have
  // two replicas of three), all in the same task.
  ASSERT_EQ(t->resumed, 2u);
  ASSERT_EQ(t->additions.size(), 6u);
  EXPECT_EQ(t->additions[0], (ReplicaAddition{4, 0}));
  EXPECT_EQ(t->additions[1], (ReplicaAddition{5, 0}));
  for (size_t i = 2; i < 6; ++i) {
    const ReplicaAddition& a = t->additions[i];
    EXPECT_EQ(a.shard, i - 2);
    const std::vector<uint32_t> r = m.ReplicasOf(a.shard);
    EXPECT_EQ(std::count(r.begin(), r.end(), a.server), 0) << "shard " << a.shard;
  }
  // A joining replica whose server is gone is not resumed (the failover takes it out), and a
  // shard whose primary is gone waits.
  std::optional<ReplicaTask> without0 = NextReplicaTask(m, Regs({1, 2}));
  ASSERT_TRUE(without0.has_value());
  EXPECT_EQ(without0->resumed, 0u);
  for (const ReplicaAddition& a : without0->additions) {
    EXPECT_NE(a.server, 0u);
    EXPECT_NE(m.OwnerOf(a.shard), 0u);
  }
}

TEST(NextReplicaTask, TwoReturningServersShareTheShards) {
  // 4 servers, 8 shards, R=3 wanted but every shard has only its primary and one backup: each
  // shard needs one more replica, and the two least loaded servers split the work instead of
  // the first one taking every shard.
  cluster::ClusterMap m = cluster::MakeUniformMap(
      {"127.0.0.1:7000", "127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"}, 8, 2);
  for (cluster::ServerEntry& e : m.servers) e.incarnation = 100 + e.id;
  m.coordinated = true;
  m.replication_factor = 3;
  std::map<uint32_t, Registration> regs = Regs({0, 1, 2});
  regs[3] = Registration{3, "127.0.0.1:7003", 103, false, 1, 1};
  std::optional<ReplicaTask> t = NextReplicaTask(m, regs);
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->resumed, 0u);
  // One task for every shard (one pair of map changes, the copies side by side).
  ASSERT_EQ(t->additions.size(), 8u);
  std::map<uint32_t, size_t> per_server;
  for (size_t i = 0; i < t->additions.size(); ++i) {
    const ReplicaAddition& a = t->additions[i];
    EXPECT_EQ(a.shard, i);
    const std::vector<uint32_t> r = m.ReplicasOf(a.shard);
    EXPECT_EQ(std::count(r.begin(), r.end(), a.server), 0) << "shard " << a.shard;
    ++per_server[a.server];
  }
  EXPECT_GE(per_server.size(), 2u) << "one server was given every shard";
  for (const auto& [server, n] : per_server) EXPECT_LE(n, 4u) << "server " << server;
}

TEST(NextReplicaTask, NothingWithoutAReplicationFactor) {
  cluster::ClusterMap m = Admitted3();
  m.AssignBackups(2);
  m.replication_factor = 0;
  EXPECT_FALSE(NextReplicaTask(m, Regs({0, 1, 2})).has_value());
}

TEST(ParseRegistration, ReadsTheServersJsonAndRefusesMalformedValues) {
  Result<Registration> r = ParseRegistration(
      3, R"({"address":"10.0.0.1:7400","released":4,"epoch":5,"incarnation":77,"durable":true})");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->id, 3u);
  EXPECT_EQ(r->address, "10.0.0.1:7400");
  EXPECT_EQ(r->incarnation, 77u);
  EXPECT_TRUE(r->durable);
  EXPECT_EQ(r->released, 4u);
  EXPECT_FALSE(ParseRegistration(3, "not json").ok());
  EXPECT_FALSE(ParseRegistration(3, R"({"released":1})").ok());
  EXPECT_FALSE(ParseRegistration(3, R"({"address":"a:1","incarnation":-1})").ok());
  EXPECT_FALSE(ParseRegistration(3, R"({"address":"a:1","durable":"yes"})").ok());
}

// The servers' one writer of the format (common/cluster/etcd_map.h) and the coordinator's reader
// agree field by field; bench/control_plane_sim registers through the same writer.
TEST(ParseRegistration, ReadsWhatRegistrationJsonWrites) {
  const std::string json = cluster::RegistrationJson({.address = "10.0.0.7:7000",
                                                      .released = 41,
                                                      .epoch = 40,
                                                      .incarnation = 0xfeedbeefcafe,
                                                      .durable = true});
  Result<Registration> r = ParseRegistration(7, json);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->id, 7u);
  EXPECT_EQ(r->address, "10.0.0.7:7000");
  EXPECT_EQ(r->released, 41u);
  EXPECT_EQ(r->epoch, 40u);
  EXPECT_EQ(r->incarnation, 0xfeedbeefcafeu);
  EXPECT_TRUE(r->durable);
}

// The gain gate's test: who has not yet released an epoch (a missing or malformed `released`
// counts as not released; the caller's own key is skipped).
TEST(NotReleased, NamesTheOtherServersBehindTheEpoch) {
  auto kv = [](const std::string& key, uint64_t released) {
    etcd::KeyValue k;
    k.key = key;
    k.value = cluster::RegistrationJson({.address = "a:1", .released = released, .epoch = 0});
    return k;
  };
  std::vector<etcd::KeyValue> kvs = {kv("/rdkv/c/servers/0", 5), kv("/rdkv/c/servers/1", 4),
                                     kv("/rdkv/c/servers/2", 3)};
  kvs.push_back(etcd::KeyValue{.key = "/rdkv/c/servers/3", .value = "{}"});
  EXPECT_EQ(cluster::NotReleased(kvs, "/rdkv/c/servers/2", 4), "/rdkv/c/servers/3");
  EXPECT_EQ(cluster::NotReleased(kvs, "/rdkv/c/servers/0", 5),
            "/rdkv/c/servers/1, /rdkv/c/servers/2, /rdkv/c/servers/3");
  kvs.pop_back();
  EXPECT_EQ(cluster::NotReleased(kvs, "/rdkv/c/servers/2", 4), "");
}

}  // namespace
}  // namespace rdkv::coordinator

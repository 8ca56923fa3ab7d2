// The cluster map and the servers' registrations in etcd (docs/design.md "Control plane:
// servers, the map and fencing"): the key names of a cluster and the two calls every tool
// needs (read the map; store a cluster's first map). Shared by kvserver and kvcli.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/cluster/cluster_map.h"
#include "common/etcd/etcd_client.h"
#include "rdkv/status.h"

namespace rdkv::cluster {

// /rdkv/<cluster_name>/map, /rdkv/<cluster_name>/servers/, /rdkv/<cluster_name>/servers/<id>.
std::string MapKey(const std::string& cluster_name);
std::string ServersPrefix(const std::string& cluster_name);
std::string ServerKey(const std::string& cluster_name, uint32_t id);

struct EtcdMap {
  ClusterMap map;            // normalized (replica lists one per shard)
  int64_t mod_revision = 0;  // the map key's
  int64_t revision = 0;      // the store's when read
};
// Reads and parses the map. kNotFound (saying how to import one) when there is none;
// kInvalidArgument when it does not parse; the client's errors when etcd cannot be reached.
Result<EtcdMap> LoadMap(etcd::EtcdClient& client, const std::string& cluster_name);
// Stores `map` as the cluster's first map: kAlreadyExists (naming its epoch) when one is there.
Status ImportMap(etcd::EtcdClient& client, const std::string& cluster_name, const ClusterMap& map);

// A server's registration: the value at ServerKey, written by the server under its etcd lease
// (server/control_plane.h; ParseRegistrationJson is its one reader). `released` is the
// newest epoch whose lost shards the server has let go, `epoch` the newest it installed
// completely, `incarnation` its process (random per start), `durable` whether a restart keeps
// every acknowledged write.
struct RegistrationValue {
  std::string address;
  uint64_t released = 0;
  uint64_t epoch = 0;
  uint64_t incarnation = 0;
  bool durable = false;
};
// The one encoding of a registration (JSON {"address", "released", "epoch", "incarnation",
// "durable"}); every writer uses it.
std::string RegistrationJson(const RegistrationValue& r);
// The one decoding: kInvalidArgument naming the field when `json` is not a registration (an
// object with a string "address"; the numbers unsigned and "durable" a boolean when present,
// absent ones 0/false: a server too old to send them).
Result<RegistrationValue> ParseRegistrationJson(const std::string& json);

// The gain gate's test (docs/design.md "Control plane"): of the registrations `kvs` (a GetPrefix
// of ServersPrefix), the keys other than `self_key` whose `released` is below `epoch` (or
// missing), comma-separated; "" when every other registered server has released `epoch`.
std::string NotReleased(const std::vector<etcd::KeyValue>& kvs, const std::string& self_key,
                        uint64_t epoch);

// The addresses the servers registered (by id order); empty when none is registered.
Result<std::vector<std::string>> RegisteredAddresses(etcd::EtcdClient& client,
                                                     const std::string& cluster_name);

}  // namespace rdkv::cluster

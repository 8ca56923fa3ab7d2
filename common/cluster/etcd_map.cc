#include "common/cluster/etcd_map.h"

#include <nlohmann/json.hpp>

#include "common/util/json_bounded.h"

namespace rdkv::cluster {

std::string MapKey(const std::string& cluster_name) { return "/rdkv/" + cluster_name + "/map"; }
std::string ServersPrefix(const std::string& cluster_name) {
  return "/rdkv/" + cluster_name + "/servers/";
}
std::string ServerKey(const std::string& cluster_name, uint32_t id) {
  return ServersPrefix(cluster_name) + std::to_string(id);
}

Result<EtcdMap> LoadMap(etcd::EtcdClient& client, const std::string& cluster_name) {
  const std::string key = MapKey(cluster_name);
  RDKV_ASSIGN_OR_RETURN(etcd::GetResult got, client.Get(key));
  if (!got.kv) {
    return Status::NotFound("etcd has no cluster map at " + key +
                            ": import one with `kvcli --etcd=... --cluster_name=" + cluster_name +
                            " cluster import-map FILE`");
  }
  Result<ClusterMap> map = ParseClusterMap(got.kv->value);
  if (!map.ok()) {
    return Status::InvalidArgument("the cluster map in etcd at " + key +
                                   " does not parse: " + map.status().message());
  }
  EtcdMap out;
  out.map = std::move(map).value();
  out.map.NormalizeReplicas();
  out.mod_revision = got.kv->mod_revision;
  out.revision = got.revision;
  return out;
}

Status ImportMap(etcd::EtcdClient& client, const std::string& cluster_name, const ClusterMap& map) {
  RDKV_ASSIGN_OR_RETURN(etcd::PutIfResult r,
                        client.PutIf(MapKey(cluster_name), map.ToJson(), /*absent*/ 0));
  if (!r.succeeded) {
    std::string epoch = "?";
    if (r.current) {
      Result<ClusterMap> cur = ParseClusterMap(r.current->value);
      if (cur.ok()) epoch = std::to_string(cur->epoch);
    }
    return Status::AlreadyExists("etcd already holds a cluster map for cluster '" + cluster_name +
                                 "' (epoch " + epoch +
                                 "); change it with the cluster commands instead");
  }
  return Status::Ok();
}

std::string RegistrationJson(const RegistrationValue& r) {
  nlohmann::json v = {{"address", r.address},
                      {"released", r.released},
                      {"epoch", r.epoch},
                      {"incarnation", r.incarnation},
                      {"durable", r.durable}};
  return v.dump();
}

Result<RegistrationValue> ParseRegistrationJson(const std::string& json) {
  nlohmann::json v = ParseJsonBounded(json);
  if (!v.is_object()) return Status::InvalidArgument("not a JSON object");
  RegistrationValue r;
  if (!v.contains("address") || !v["address"].is_string()) {
    return Status::InvalidArgument("no string 'address'");
  }
  r.address = v["address"].get<std::string>();
  auto number = [&](const char* field, uint64_t* out) -> Status {
    if (!v.contains(field)) return Status::Ok();
    if (!v[field].is_number_unsigned()) {
      return Status::InvalidArgument(std::string("'") + field + "' is not unsigned");
    }
    *out = v[field].get<uint64_t>();
    return Status::Ok();
  };
  RDKV_RETURN_IF_ERROR(number("released", &r.released));
  RDKV_RETURN_IF_ERROR(number("epoch", &r.epoch));
  RDKV_RETURN_IF_ERROR(number("incarnation", &r.incarnation));
  if (v.contains("durable")) {
    if (!v["durable"].is_boolean()) return Status::InvalidArgument("'durable' is not a boolean");
    r.durable = v["durable"].get<bool>();
  }
  return r;
}

std::string NotReleased(const std::vector<etcd::KeyValue>& kvs, const std::string& self_key,
                        uint64_t epoch) {
  std::string behind;
  for (const etcd::KeyValue& kv : kvs) {
    if (kv.key == self_key) continue;
    Result<RegistrationValue> r = ParseRegistrationJson(kv.value);
    const bool released = r.ok() && r->released >= epoch;  // unreadable: not released
    if (!released) behind += (behind.empty() ? "" : ", ") + kv.key;
  }
  return behind;
}

Result<std::vector<std::string>> RegisteredAddresses(etcd::EtcdClient& client,
                                                     const std::string& cluster_name) {
  RDKV_ASSIGN_OR_RETURN(etcd::RangeResult r, client.GetPrefix(ServersPrefix(cluster_name)));
  std::vector<std::string> out;
  for (const etcd::KeyValue& kv : r.kvs) {
    Result<RegistrationValue> reg = ParseRegistrationJson(kv.value);
    if (reg.ok()) out.push_back(reg->address);
  }
  return out;
}

}  // namespace rdkv::cluster

#include "common/cluster/cluster_map.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "common/util/units.h"

namespace rdkv::cluster {

const ServerEntry* ClusterMap::FindServer(uint32_t id) const {
  for (const ServerEntry& s : servers) {
    if (s.id == id) return &s;
  }
  return nullptr;
}

std::vector<uint32_t> ClusterMap::ShardsOf(uint32_t id) const {
  std::vector<uint32_t> out;
  for (uint32_t s = 0; s < shards; ++s) {
    if (owners[s] == id) out.push_back(s);
  }
  return out;
}

namespace {

nlohmann::json ToJsonValue(const ClusterMap& m) {
  nlohmann::json j;
  j["epoch"] = m.epoch;
  j["shards"] = m.shards;
  j["servers"] = nlohmann::json::array();
  for (const ServerEntry& s : m.servers)
    j["servers"].push_back({{"id", s.id}, {"address", s.address}});
  j["owners"] = m.owners;
  return j;
}

}  // namespace

std::string ClusterMap::ToJson() const { return ToJsonValue(*this).dump(); }

std::string ClusterMap::ToPrettyJson() const { return ToJsonValue(*this).dump(2); }

Result<ClusterMap> ParseClusterMap(std::string_view text) {
  auto bad = [](const std::string& what) {
    return Status::InvalidArgument("cluster map: " + what);
  };
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return bad("not valid JSON");
  if (!j.is_object()) return bad("top level must be an object");
  static const std::set<std::string> known = {"epoch", "shards", "servers", "owners"};
  for (auto& [k, v] : j.items()) {
    if (!known.count(k)) return bad("unknown field '" + k + "'");
  }
  ClusterMap m;
  if (!j.contains("epoch") || !j["epoch"].is_number_unsigned() || j["epoch"].get<uint64_t>() == 0) {
    return bad("'epoch' must be a positive integer");
  }
  m.epoch = j["epoch"].get<uint64_t>();
  if (!j.contains("shards") || !j["shards"].is_number_unsigned()) {
    return bad("'shards' must be an integer 1.." + std::to_string(kMaxShards));
  }
  uint64_t shards = j["shards"].get<uint64_t>();
  if (shards == 0 || shards > kMaxShards) {
    return bad("'shards' must be an integer 1.." + std::to_string(kMaxShards));
  }
  m.shards = static_cast<uint32_t>(shards);
  if (!j.contains("servers") || !j["servers"].is_array() || j["servers"].empty() ||
      j["servers"].size() > kMaxServers) {
    return bad("'servers' must be a list of 1.." + std::to_string(kMaxServers) + " servers");
  }
  std::set<uint32_t> ids;
  for (const auto& s : j["servers"]) {
    if (!s.is_object() || !s.contains("id") || !s["id"].is_number_unsigned() ||
        !s.contains("address") || !s["address"].is_string()) {
      return bad("each server needs an integer 'id' and a string 'address'");
    }
    uint64_t id = s["id"].get<uint64_t>();
    if (id >= kMaxServers) return bad("server id " + std::to_string(id) + " is not in 0..255");
    if (!ids.insert(static_cast<uint32_t>(id)).second) {
      return bad("server id " + std::to_string(id) + " appears twice");
    }
    ServerEntry e{static_cast<uint32_t>(id), s["address"].get<std::string>()};
    if (e.address.size() > kMaxAddressBytes) {
      return bad("server " + std::to_string(id) + ": address longer than " +
                 std::to_string(kMaxAddressBytes) + " bytes");
    }
    for (char c : e.address) {
      if (c < '!' || c > '~' || c == '"' || c == '\\') {
        return bad("server " + std::to_string(id) +
                   ": address has a character that is not printable ASCII, or '\"' or '\\'");
      }
    }
    std::string host;
    uint16_t port;
    Status hp = ParseHostPort(e.address, &host, &port);
    if (!hp.ok()) return bad("server " + std::to_string(id) + ": " + hp.message());
    m.servers.push_back(std::move(e));
  }
  if (j.contains("owners")) {
    const auto& o = j["owners"];
    if (!o.is_array() || o.size() != m.shards) {
      return bad("'owners' must list one server id per shard (" + std::to_string(m.shards) + ")");
    }
    for (size_t s = 0; s < o.size(); ++s) {
      if (!o[s].is_number_unsigned() || !ids.count(o[s].get<uint32_t>())) {
        return bad("owner of shard " + std::to_string(s) + " is not a server id in the map");
      }
      m.owners.push_back(o[s].get<uint32_t>());
    }
  } else {
    for (uint32_t s = 0; s < m.shards; ++s) m.owners.push_back(m.servers[s % m.servers.size()].id);
  }
  return m;
}

Result<ClusterMap> LoadClusterMap(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status::FromErrno("cannot open cluster map " + path, errno);
  std::stringstream ss;
  ss << in.rdbuf();
  Result<ClusterMap> m = ParseClusterMap(ss.str());
  if (!m.ok()) return Status::InvalidArgument(path + ": " + m.status().message());
  return m;
}

ClusterMap MakeUniformMap(const std::vector<std::string>& addresses, uint32_t shards) {
  ClusterMap m;
  m.epoch = 1;
  m.shards = shards;
  for (uint32_t i = 0; i < addresses.size(); ++i) m.servers.push_back({i, addresses[i]});
  for (uint32_t s = 0; s < shards; ++s)
    m.owners.push_back(s % static_cast<uint32_t>(addresses.size()));
  return m;
}

}  // namespace rdkv::cluster

#include "common/cluster/cluster_map.h"

#include <algorithm>
#include <charconv>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "common/util/json_bounded.h"
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

std::vector<uint32_t> ClusterMap::ReplicasOf(uint32_t shard) const {
  std::vector<uint32_t> out{owners[shard]};
  if (shard < backups.size()) out.insert(out.end(), backups[shard].begin(), backups[shard].end());
  return out;
}

bool ClusterMap::IsBackup(uint32_t shard, uint32_t id) const {
  if (shard >= backups.size()) return false;
  for (uint32_t b : backups[shard]) {
    if (b == id) return true;
  }
  return false;
}

bool ClusterMap::IsJoining(uint32_t shard, uint32_t id) const {
  if (shard >= joining.size()) return false;
  for (uint32_t b : joining[shard]) {
    if (b == id) return true;
  }
  return false;
}

uint64_t ClusterMap::JoinedAt(uint32_t shard, uint32_t id) const {
  if (!IsJoining(shard, id)) return 0;
  auto it = joined_at.find({shard, id});
  return it == joined_at.end() ? 0 : it->second;
}

void ClusterMap::SetJoining(uint32_t shard, uint32_t id, uint64_t epoch) {
  NormalizeReplicas();
  if (IsJoining(shard, id)) return;  // its join stands: a new one leaves joining first
  joining[shard].push_back(id);
  joined_at[{shard, id}] = epoch;
}

size_t ClusterMap::MaxReplicas() const {
  size_t r = 1;
  for (const auto& b : backups) r = std::max(r, b.size() + 1);
  return r;
}

void ClusterMap::NormalizeReplicas() {
  backups.resize(shards);
  joining.resize(shards);
}

void ClusterMap::AssignBackups(uint32_t r) {
  NormalizeReplicas();
  const size_t n = servers.size();
  r = std::clamp<uint32_t>(r, 1, static_cast<uint32_t>(std::min<size_t>(n, kMaxReplicas)));
  for (uint32_t s = 0; s < shards; ++s) {
    size_t at = 0;
    while (at < n && servers[at].id != owners[s]) ++at;
    backups[s].clear();
    for (uint32_t k = 1; k < r; ++k) backups[s].push_back(servers[(at + k) % n].id);
  }
  replication_factor = r > 1 ? r : 0;
}

Status ValidateReplicas(const ClusterMap& m) {
  if (m.backups.size() != m.shards || m.joining.size() != m.shards) {
    return Status::InvalidArgument("cluster map: replica lists must have one entry per shard");
  }
  for (uint32_t s = 0; s < m.shards; ++s) {
    std::set<uint32_t> seen{m.owners[s]};
    for (const auto* list : {&m.backups[s], &m.joining[s]}) {
      for (uint32_t id : *list) {
        if (m.FindServer(id) == nullptr) {
          return Status::InvalidArgument("cluster map: shard " + std::to_string(s) +
                                         " has replica " + std::to_string(id) +
                                         ", which is not a server id in the map");
        }
        if (!seen.insert(id).second) {
          return Status::InvalidArgument("cluster map: server " + std::to_string(id) +
                                         " appears twice among shard " + std::to_string(s) +
                                         "'s replicas");
        }
      }
    }
    if (seen.size() > kMaxReplicas) {
      return Status::InvalidArgument("cluster map: shard " + std::to_string(s) + " has " +
                                     std::to_string(seen.size()) + " replicas; at most " +
                                     std::to_string(kMaxReplicas));
    }
  }
  return Status::Ok();
}

namespace {

nlohmann::json ToJsonValue(const ClusterMap& m) {
  nlohmann::json j;
  j["epoch"] = m.epoch;
  j["shards"] = m.shards;
  j["servers"] = nlohmann::json::array();
  for (const ServerEntry& s : m.servers) {
    nlohmann::json e = {{"id", s.id}, {"address", s.address}};
    if (s.incarnation != 0) e["incarnation"] = s.incarnation;
    j["servers"].push_back(std::move(e));
  }
  j["owners"] = m.owners;
  if (m.replication_factor != 0) j["replication_factor"] = m.replication_factor;
  if (m.coordinated) j["coordinated"] = true;
  bool replicated = false, joining = false;
  for (const auto& b : m.backups) replicated |= !b.empty();
  for (const auto& b : m.joining) joining |= !b.empty();
  if (replicated || joining) {
    j["replicas"] = nlohmann::json::array();
    for (uint32_t s = 0; s < m.shards; ++s) j["replicas"].push_back(m.ReplicasOf(s));
  }
  if (joining) {
    j["joining"] = nlohmann::json::object();
    for (uint32_t s = 0; s < m.shards; ++s) {
      if (s < m.joining.size() && !m.joining[s].empty())
        j["joining"][std::to_string(s)] = m.joining[s];
    }
    nlohmann::json stamps = nlohmann::json::object();
    for (uint32_t s = 0; s < m.shards && s < m.joining.size(); ++s) {
      for (uint32_t id : m.joining[s]) {
        if (uint64_t at = m.JoinedAt(s, id); at != 0) {
          stamps[std::to_string(s)][std::to_string(id)] = at;
        }
      }
    }
    if (!stamps.empty()) j["joined_at"] = std::move(stamps);
  }
  return j;
}

}  // namespace

std::string ClusterMap::ToJson() const { return ToJsonValue(*this).dump(); }

std::string ClusterMap::ToPrettyJson() const { return ToJsonValue(*this).dump(2); }

Result<ClusterMap> ParseClusterMap(std::string_view text) {
  auto bad = [](const std::string& what) {
    return Status::InvalidArgument("cluster map: " + what);
  };
  nlohmann::json j = ParseJsonBounded(text);
  if (j.is_discarded()) return bad("not valid JSON");
  if (!j.is_object()) return bad("top level must be an object");
  static const std::set<std::string> known = {
      "epoch",      "shards",  "servers",   "owners",
      "replicas",   "joining", "joined_at", "replication_factor",
      "coordinated"};
  for (auto& [k, v] : j.items()) {
    if (!known.count(k)) return bad("unknown field '" + k + "'");
  }
  ClusterMap m;
  if (!j.contains("epoch") || !j["epoch"].is_number_unsigned() || j["epoch"].get<uint64_t>() == 0 ||
      j["epoch"].get<uint64_t>() > kMaxMapEpoch) {
    return bad("'epoch' must be an integer 1.." + std::to_string(kMaxMapEpoch));
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
    if (s.contains("incarnation")) {
      if (!s["incarnation"].is_number_unsigned()) {
        return bad("server " + std::to_string(id) + ": 'incarnation' must be an unsigned integer");
      }
      e.incarnation = s["incarnation"].get<uint64_t>();
    }
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
      // Compared as 64 bits: a larger number must not pass as its low 32 bits.
      if (!o[s].is_number_unsigned() || o[s].get<uint64_t>() >= kMaxServers ||
          !ids.count(o[s].get<uint32_t>())) {
        return bad("owner of shard " + std::to_string(s) + " is not a server id in the map");
      }
      m.owners.push_back(o[s].get<uint32_t>());
    }
  } else {
    for (uint32_t s = 0; s < m.shards; ++s) m.owners.push_back(m.servers[s % m.servers.size()].id);
  }
  m.NormalizeReplicas();
  auto id_list = [&](const nlohmann::json& v, const std::string& what,
                     std::vector<uint32_t>* out) -> Status {
    if (!v.is_array() || v.size() > kMaxReplicas) {
      return bad(what + " must be a list of at most " + std::to_string(kMaxReplicas) +
                 " server ids");
    }
    for (const auto& id : v) {
      if (!id.is_number_unsigned() || id.get<uint64_t>() >= kMaxServers ||
          !ids.count(id.get<uint32_t>())) {
        return bad(what + " has an entry that is not a server id in the map");
      }
      out->push_back(id.get<uint32_t>());
    }
    return Status::Ok();
  };
  if (j.contains("replicas")) {
    const auto& r = j["replicas"];
    if (!r.is_array() || r.size() != m.shards) {
      return bad("'replicas' must list one replica list per shard (" + std::to_string(m.shards) +
                 ")");
    }
    for (uint32_t s = 0; s < m.shards; ++s) {
      std::vector<uint32_t> list;
      RDKV_RETURN_IF_ERROR(id_list(r[s], "replicas of shard " + std::to_string(s), &list));
      if (list.empty()) return bad("replicas of shard " + std::to_string(s) + " is empty");
      if (j.contains("owners") && list[0] != m.owners[s]) {
        return bad("replicas of shard " + std::to_string(s) + " start with server " +
                   std::to_string(list[0]) + " but its owner is " + std::to_string(m.owners[s]));
      }
      m.owners[s] = list[0];
      m.backups[s].assign(list.begin() + 1, list.end());
    }
  }
  if (j.contains("replication_factor")) {
    const auto& rf = j["replication_factor"];
    if (!rf.is_number_unsigned() || rf.get<uint64_t>() > kMaxReplicas) {
      return bad("'replication_factor' must be an integer 0.." + std::to_string(kMaxReplicas));
    }
    m.replication_factor = rf.get<uint32_t>();
  }
  if (j.contains("coordinated")) {
    if (!j["coordinated"].is_boolean()) return bad("'coordinated' must be true or false");
    m.coordinated = j["coordinated"].get<bool>();
  }
  if (j.contains("joining")) {
    const auto& jn = j["joining"];
    if (!jn.is_object()) return bad("'joining' must be an object {\"shard\": [server ids]}");
    for (auto& [k, v] : jn.items()) {
      uint32_t s = 0;
      auto [end, ec] = std::from_chars(k.data(), k.data() + k.size(), s);
      if (ec != std::errc() || end != k.data() + k.size() || s >= m.shards ||
          std::to_string(s) != k) {
        return bad("'joining' key '" + k + "' is not a shard number below " +
                   std::to_string(m.shards));
      }
      RDKV_RETURN_IF_ERROR(id_list(v, "joining of shard " + k, &m.joining[s]));
    }
  }
  if (j.contains("joined_at")) {
    const auto& ja = j["joined_at"];
    auto number = [](const std::string& k, uint32_t below, uint32_t* out) {
      auto [end, ec] = std::from_chars(k.data(), k.data() + k.size(), *out);
      return ec == std::errc() && end == k.data() + k.size() && *out < below &&
             std::to_string(*out) == k;
    };
    const std::string shape = "'joined_at' must be an object {\"shard\": {\"server id\": epoch}}";
    if (!ja.is_object()) return bad(shape);
    for (auto& [k, per_server] : ja.items()) {
      uint32_t s = 0;
      if (!number(k, m.shards, &s)) {
        return bad("'joined_at' key '" + k + "' is not a shard number below " +
                   std::to_string(m.shards));
      }
      if (!per_server.is_object()) return bad(shape);
      for (auto& [ks, at] : per_server.items()) {
        uint32_t id = 0;
        if (!number(ks, kMaxServers, &id) || !m.IsJoining(s, id)) {
          return bad("'joined_at' of shard " + k + " names '" + ks +
                     "', which is not one of its joining servers");
        }
        if (!at.is_number_unsigned() || at.get<uint64_t>() == 0 || at.get<uint64_t>() > m.epoch) {
          return bad("'joined_at' of shard " + k + ", server " + ks + " must be an epoch 1.." +
                     std::to_string(m.epoch));
        }
        m.joined_at[{s, id}] = at.get<uint64_t>();
      }
    }
  }
  RDKV_RETURN_IF_ERROR(ValidateReplicas(m));
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

ClusterMap MakeUniformMap(const std::vector<std::string>& addresses, uint32_t shards,
                          uint32_t replication_factor) {
  ClusterMap m;
  m.epoch = 1;
  m.shards = shards;
  const uint32_t n = static_cast<uint32_t>(addresses.size());
  for (uint32_t i = 0; i < n; ++i) m.servers.push_back({i, addresses[i]});
  for (uint32_t s = 0; s < shards; ++s) m.owners.push_back(s % n);
  m.AssignBackups(replication_factor);
  return m;
}

}  // namespace rdkv::cluster

#include "client/router.h"

#include <glog/logging.h>

#include <algorithm>
#include <string>
#include <thread>
#include <utility>

namespace rdkv::client {

namespace {

// Fetches `link`'s cluster map: OK with an empty body from a standalone server.
Status FetchMap(Caller& caller, Link& link, uint64_t* epoch, std::string* body) {
  kv::Request req;
  req.op = kv::Op::kClusterMap;
  return caller.Call(link, req, epoch, body);
}

}  // namespace

Status Router::Init() {
  Link& seed = links_->seed();
  RDKV_RETURN_IF_ERROR(links_->SessionOf(seed).status());
  std::string body;
  uint64_t epoch = 0;
  Status s = FetchMap(*caller_, seed, &epoch, &body);
  if (!s.ok()) {
    // A server older than clusters does not know the op: standalone.
    if (s.Is(StatusCode::kInvalidArgument) || s.Is(StatusCode::kNotSupported)) return Status::Ok();
    return s;
  }
  if (body.empty()) return Status::Ok();
  auto map = cluster::ParseClusterMap(body);
  if (!map.ok()) {
    return Status::ProtocolError(
        links_->Name(seed) + " sent a cluster map that does not parse: " + map.status().message());
  }
  Install(std::move(map).value());
  return Status::Ok();
}

std::shared_ptr<const Routing> Router::routing() const {
  MutexLock l(&mu_);
  return routing_;
}

std::shared_ptr<const cluster::ClusterMap> Router::map() const {
  MutexLock l(&mu_);
  return routing_ == nullptr ? nullptr : routing_->map;
}

uint64_t Router::epoch() const {
  MutexLock l(&mu_);
  return routing_ == nullptr ? 0 : routing_->map->epoch;
}

void Router::Install(cluster::ClusterMap map) {
  MutexLock l(&mu_);
  InstallLocked(std::move(map));
}

void Router::InstallLocked(cluster::ClusterMap map) {
  if (routing_ != nullptr && map.epoch <= routing_->map->epoch) return;
  auto rt = std::make_shared<Routing>();
  rt->map = std::make_shared<const cluster::ClusterMap>(std::move(map));
  rt->owners.reserve(rt->map->shards);
  for (uint32_t s = 0; s < rt->map->shards; ++s) {
    uint32_t id = rt->map->OwnerOf(s);
    const cluster::ServerEntry* e = rt->map->FindServer(id);
    rt->owners.push_back(links_->LinkFor(id, e != nullptr ? e->address : std::string("?")));
  }
  routing_ = std::move(rt);
  links_->set_cluster(true);
  cluster_.store(true, std::memory_order_release);
}

Status Router::Refresh(Link* from) {
  std::vector<Link*> order;
  if (from != nullptr) order.push_back(from);
  order.push_back(&links_->seed());
  if (auto current = map(); current != nullptr) {
    for (const auto& e : current->servers) order.push_back(links_->LinkFor(e.id, e.address));
  }
  Status last = Status::Unavailable("no server to ask for the cluster map");
  for (Link* link : order) {
    std::string body;
    uint64_t epoch = 0;
    Status s = FetchMap(*caller_, *link, &epoch, &body);
    if (!s.ok()) {
      last = s;
      continue;
    }
    auto parsed = cluster::ParseClusterMap(body);
    if (!parsed.ok()) {
      last =
          Status::ProtocolError(links_->Name(*link) + " sent a cluster map that does not parse: " +
                                parsed.status().message());
      continue;
    }
    Install(std::move(parsed).value());
    return Status::Ok();
  }
  return last;
}

void Router::AfterRedirect(Link* redirected, int n) {
  Status r = Refresh(redirected);
  if (!r.ok()) LOG(WARNING) << "rdkv client: refreshing the cluster map: " << r.ToString();
  std::this_thread::sleep_for(std::chrono::microseconds(std::min(500 << std::min(n, 6), 20000)));
}

}  // namespace rdkv::client

#include "client/links.h"

#include <glog/logging.h>

#include <algorithm>
#include <utility>

namespace rdkv::client {

using Clock = std::chrono::steady_clock;

namespace {
// How often a cluster client tries again to reach a server it found unreachable.
constexpr std::chrono::milliseconds kReconnectBackoff{500};
}  // namespace

Links::Links(const ClientOptions& options, ServerAddress seed, transport::Fabric* fabric,
             ScratchPool* pool, Counters* counters)
    : options_(options),
      fabric_(fabric),
      pool_(pool),
      counters_(counters),
      seed_(std::make_unique<Link>(0, std::move(seed), options.location_cache_entries,
                                   options.connections_per_server)) {}

Links::~Links() {
  auto close = [](Link& link) {
    MutexLock l(&link.mu);
    for (size_t i = 0; i < link.slot_count; ++i) link.SetSession(i, nullptr);
  };
  MutexLock l(&mu_);
  for (auto& [name, link] : links_) close(*link);
  close(*seed_);
}

namespace {
// A small number per thread, handed out in the order threads first ask: spreads the threads of
// a process evenly over a link's connections.
size_t ThreadSlot() {
  static std::atomic<size_t> next{0};
  thread_local const size_t slot = next.fetch_add(1, std::memory_order_relaxed);
  return slot;
}
}  // namespace

Link* Links::LinkFor(uint32_t id, const std::string& address) {
  std::string key = std::to_string(id) + "@" + address;
  MutexLock l(&mu_);
  auto it = links_.find(key);
  if (it != links_.end()) return it->second.get();
  ServerAddress a;
  if (!ParseHostPort(address, &a.host, &a.port).ok()) a = ServerAddress{address, 0};
  auto link = std::make_unique<Link>(id, std::move(a), options_.location_cache_entries,
                                     options_.connections_per_server);
  Link* raw = link.get();
  links_.emplace(std::move(key), std::move(link));
  return raw;
}

std::string Links::Name(const Link& link) const {
  if (!cluster() || &link == seed_.get()) return "server " + link.address.ToString();
  return "server " + std::to_string(link.id) + " (" + link.address.ToString() + ")";
}

namespace {
// Any slot's usable session, or null.
std::shared_ptr<Session> UsableSlot(const std::vector<Link::Slot>& slots) {
  for (const Link::Slot& s : slots) {
    if (s.session != nullptr && s.session->usable()) return s.session;
  }
  return nullptr;
}
}  // namespace

Result<std::shared_ptr<Session>> Links::SessionOf(Link& link) {
  const size_t index = ThreadSlot() % link.slot_count;
  {  // The fast path (every operation's): the thread's own slot, open and usable. The copy is
     // all that happens under the spin lock: usable() may read the socket (tcp's liveness
     // check), and an unusable copy let go of here is never the last reference (the slot
     // still holds it).
    std::shared_ptr<Session> mine;
    {
      Link::Published& p = link.published[index];
      SpinLockHold h(&p.mu);
      mine = p.session;
    }
    if (mine != nullptr && mine->usable()) return mine;
  }
  MutexLock l(&link.mu);
  Clock::time_point now;
  for (;;) {
    Link::Slot& slot = link.slots[index];
    if (slot.session != nullptr && slot.session->usable()) return slot.session;
    std::shared_ptr<Session> other = UsableSlot(link.slots);
    if (slot.connecting) {
      if (other != nullptr) return other;
      link.opened.Wait(&link.mu);
      continue;
    }
    now = Clock::now();
    if (other != nullptr && slot.failed_at != Clock::time_point{} &&
        now - slot.failed_at < kReconnectBackoff) {
      return other;  // this slot could not be opened just now; the server is up
    }
    if (other == nullptr && cluster() && link.down && now - link.last_try < kReconnectBackoff) {
      return link.last_error;
    }
    break;
  }
  Link::Slot& slot = link.slots[index];  // the vector never changes size
  link.last_try = now;
  slot.connecting = true;
  const bool reconnect = slot.connected_once;
  std::shared_ptr<Session> old = link.SetSession(index, nullptr);
  l.Unlock();
  old.reset();  // the old connection closes once its last user is done
  auto opened = OpenSession(fabric_, link.address, options_, pool_);
  l.Lock();
  slot.connecting = false;
  link.opened.SignalAll();
  if (!opened.ok()) {
    slot.failed_at = Clock::now();
    // Another connection to the server works (e.g. it refused this one at --max_connections):
    // use it rather than failing the call.
    if (std::shared_ptr<Session> other = UsableSlot(link.slots)) return other;
    const Status& s = opened.status();
    // The server's own refusals keep their code; anything about reaching it is kUnavailable.
    bool keep = s.Is(StatusCode::kPermissionDenied) || s.Is(StatusCode::kProtocolError) ||
                s.Is(StatusCode::kInvalidArgument) || s.Is(StatusCode::kNotSupported);
    std::string msg = Name(link) + ": " + s.message();
    if (reconnect) msg = "reconnecting: " + msg;
    if (!keep && !s.Is(StatusCode::kUnavailable)) {
      msg += " (" + std::string(StatusCodeName(s.code())) + ")";
    }
    link.down = true;
    link.last_error = Status(keep ? s.code() : StatusCode::kUnavailable, std::move(msg));
    return link.last_error;
  }
  slot.failed_at = Clock::time_point{};
  link.down = false;
  std::shared_ptr<Session> session = std::move(opened).value();
  const kv::RegionHeader& h = session->header();
  slot.connected_once = true;
  if (reconnect) {
    Add(counters_->reconnects);
    LOG(INFO) << "rdkv client: reconnected to " << session->conn().peer()
              << (h.incarnation != link.incarnation ? " (new server incarnation)" : "");
  }
  if (h.incarnation != link.incarnation) {
    link.cache.Clear();  // every cached offset belongs to the old table
    link.incarnation = h.incarnation;
  }
  max_value_bytes_.store(h.max_value_bytes, std::memory_order_relaxed);
  ScratchShape shape = ScratchShapeFor(BatchLimit(options_), h.max_value_bytes);
  // In a cluster the scratches fit the largest items of every server (whichever links connect
  // at the same time).
  if (cluster()) {
    pool_->GrowShape(shape);
  } else {
    pool_->SetShape(shape);
  }
  link.SetSession(index, session);  // the slot had none (set to null above)
  return session;
}

}  // namespace rdkv::client

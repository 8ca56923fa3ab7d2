// Watch: the streaming /v3/watch transfer, its messages, and the reconnect loop.
#include "common/etcd/watch.h"

#include <limits>

#include <nlohmann/json.hpp>

#include "common/etcd/codec.h"
#include "common/etcd/http.h"
#include "common/util/thread_name.h"

namespace rdkv::etcd {

using Json = nlohmann::json;

Result<std::unique_ptr<Watch>> Watch::Start(EtcdOptions etcd, WatchOptions options,
                                            Callback callback) {
  if (!callback) return Status::InvalidArgument("etcd watch: the callback is empty");
  if (options.start_revision < 0) {
    return Status::InvalidArgument("etcd watch: start_revision must be >= 0");
  }
  // EtcdClient::Create checks and normalizes the endpoints the same way.
  RDKV_ASSIGN_OR_RETURN(auto client, EtcdClient::Create(etcd));
  std::unique_ptr<Watch> w(new Watch(client->options(), std::move(options), std::move(callback)));
  w->thread_ = std::thread([p = w.get()] {
    rdkv::util::NameThisThread("rdkv-etcd-watch");
    p->Run();
  });
  return w;
}

Watch::Watch(EtcdOptions etcd, WatchOptions options, Callback callback)
    : etcd_(std::move(etcd)),
      options_(std::move(options)),
      callback_(std::move(callback)),
      next_revision_(options_.start_revision) {}

Watch::~Watch() {
  stop_.store(true, std::memory_order_release);
  {
    MutexLock l(&mu_);
    stop_cv_.SignalAll();
  }
  if (thread_.joinable()) thread_.join();
}

void Watch::SleepUnlessStopped(std::chrono::milliseconds d) {
  const auto deadline = std::chrono::steady_clock::now() + d;
  MutexLock l(&mu_);
  while (!stop_.load(std::memory_order_acquire) && std::chrono::steady_clock::now() < deadline) {
    stop_cv_.WaitUntil(&mu_, deadline);
  }
}

void Watch::Run() {
  std::chrono::milliseconds backoff{50};
  size_t endpoint = 0;
  while (!stop_.load(std::memory_order_acquire)) {
    stream_created_ = false;
    if (!StreamOnce(endpoints_[endpoint])) break;
    connected_.store(false, std::memory_order_release);
    if (stop_.load(std::memory_order_acquire)) break;
    // A stream that got as far as "created" proves the endpoint worked: retry quickly.
    backoff = stream_created_ ? std::chrono::milliseconds(50)
                              : std::min(backoff * 2, std::chrono::milliseconds(1000));
    endpoint = (endpoint + 1) % endpoints_.size();
    SleepUnlessStopped(backoff);
  }
  connected_.store(false, std::memory_order_release);
}

bool Watch::StreamOnce(const std::string& endpoint) {
  Json create = {{"key", internal::Base64Encode(options_.key)}};
  if (options_.prefix) {
    create["range_end"] = internal::Base64Encode(internal::PrefixRangeEnd(options_.key));
    if (options_.key.empty()) create["key"] = internal::Base64Encode(std::string(1, '\0'));
  }
  int64_t from = next_revision_.load(std::memory_order_acquire);
  if (from > 0) create["start_revision"] = std::to_string(from);
  Json req = {{"create_request", create}};

  std::string buffer;
  bool keep_going = true;
  auto on_chunk = [&](std::string_view chunk) {
    size_t scan_from = buffer.size();  // the bytes before hold no newline
    buffer.append(chunk);
    size_t pos;
    // The gateway writes one JSON object per line.
    while ((pos = buffer.find('\n', scan_from)) != std::string::npos) {
      std::string line = buffer.substr(0, pos);
      buffer.erase(0, pos + 1);
      scan_from = 0;
      if (line.empty()) continue;
      const Next next = OnMessage(endpoint, line);
      if (next == Next::kEnd) keep_going = false;
      if (next != Next::kContinue) return false;  // cuts this stream
    }
    // No line is that long: not a watch stream. Cut it (and connect again) instead of
    // growing the buffer without bound.
    if (buffer.size() > internal::kMaxReplyBytes) {
      callback_(Status::ProtocolError("etcd watch via " + endpoint + ": a line longer than " +
                                      std::to_string(internal::kMaxReplyBytes >> 20) +
                                      " MiB; reconnecting"));
      return false;
    }
    return true;
  };
  internal::HttpConnection conn({etcd_.ca_file, etcd_.cert_file, etcd_.key_file});
  internal::HttpResponse r =
      conn.Post(endpoint + "/v3/watch", req.dump(), std::chrono::milliseconds(0), on_chunk, &stop_,
                /*require_leader=*/true);
  if (!keep_going) return false;
  // A last object without its newline (the stream ended right after it).
  if (!buffer.empty() && r.failure == internal::HttpResponse::Failure::kNone) {
    if (OnMessage(endpoint, buffer) == Next::kEnd) return false;
  }
  return true;
}

Watch::Next Watch::OnMessage(const std::string& endpoint, std::string_view line) {
  internal::WatchMessage m = internal::ParseWatchMessage(line);
  // Garbage or an error (e.g. no leader): read on; the stream ends by itself after an error.
  if (m.ignored) return Next::kContinue;
  if (m.created) {
    if (created_once_) reconnects_.fetch_add(1, std::memory_order_relaxed);
    created_once_ = true;
    // A create that is canceled at once does not prove the endpoint works: the next stream
    // waits the growing back-off.
    stream_created_ = !m.canceled;
    connected_.store(true, std::memory_order_release);
    // "From now": everything after the revision the watch was created at.
    if (next_revision_.load() == 0 && m.header_revision.has_value() && *m.header_revision >= 0 &&
        *m.header_revision < std::numeric_limits<int64_t>::max()) {
      next_revision_.store(*m.header_revision + 1, std::memory_order_release);
    }
  }
  if (m.canceled) {
    if (m.compact_revision > 0) {
      callback_(Status::NotFound("etcd watch of '" + options_.key + "' from revision " +
                                 std::to_string(next_revision_.load()) +
                                 ": the revision was compacted (etcd keeps " +
                                 std::to_string(m.compact_revision) +
                                 " and later); read the current state and watch again"));
      ended_.store(true, std::memory_order_release);
      return Next::kEnd;
    }
    // Canceled for another reason (the member left, lost its leader, a permission): this
    // stream will carry nothing more, though it may stay open. Open another.
    return Next::kReconnect;
  }
  const int64_t from = next_revision_.load(std::memory_order_acquire);
  int64_t last = 0;
  for (Result<WatchEvent>& e : m.events) {
    if (!e.ok()) {
      callback_(Status::ProtocolError("etcd watch via " + endpoint + ": " + e.status().message()));
      continue;
    }
    if (e->kv.mod_revision <= 0 || e->kv.mod_revision == std::numeric_limits<int64_t>::max()) {
      callback_(Status::ProtocolError("etcd watch via " + endpoint + ": an event at revision " +
                                      std::to_string(e->kv.mod_revision)));
      continue;
    }
    if (e->kv.mod_revision < from) continue;  // already delivered before a reconnect
    last = std::max(last, e->kv.mod_revision);
    callback_(std::move(e));
    if (stop_.load(std::memory_order_acquire)) break;
  }
  if (last > 0) next_revision_.store(last + 1, std::memory_order_release);
  return Next::kContinue;
}

}  // namespace rdkv::etcd

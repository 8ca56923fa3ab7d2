// Watch: the streaming /v3/watch transfer, its messages, and the reconnect loop.
#include "common/etcd/watch.h"

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
    buffer.append(chunk);
    size_t pos;
    // The gateway writes one JSON object per line.
    while ((pos = buffer.find('\n')) != std::string::npos) {
      std::string line = buffer.substr(0, pos);
      buffer.erase(0, pos + 1);
      if (line.empty()) continue;
      if (!OnMessage(endpoint, line)) {
        keep_going = false;
        return false;
      }
    }
    return true;
  };
  internal::HttpConnection conn({etcd_.ca_file, etcd_.cert_file, etcd_.key_file});
  internal::HttpResponse r =
      conn.Post(endpoint + "/v3/watch", req.dump(), std::chrono::milliseconds(0), on_chunk, &stop_);
  if (!keep_going) return false;
  // A last object without its newline (the stream ended right after it).
  if (!buffer.empty() && r.failure == internal::HttpResponse::Failure::kNone) {
    if (!OnMessage(endpoint, buffer)) return false;
  }
  return true;
}

bool Watch::OnMessage(const std::string& endpoint, std::string_view line) {
  internal::WatchMessage m = internal::ParseWatchMessage(line);
  if (m.ignored) return true;  // garbage or an error (e.g. no leader): the stream is retried
  if (m.created) {
    if (created_once_) reconnects_.fetch_add(1, std::memory_order_relaxed);
    created_once_ = true;
    stream_created_ = true;
    connected_.store(true, std::memory_order_release);
    // "From now": everything after the revision the watch was created at.
    if (next_revision_.load() == 0 && m.header_revision.has_value()) {
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
      return false;
    }
    return true;  // canceled for another reason (e.g. the member left): reconnect
  }
  const int64_t from = next_revision_.load(std::memory_order_acquire);
  int64_t last = 0;
  for (Result<WatchEvent>& e : m.events) {
    if (!e.ok()) {
      callback_(Status::ProtocolError("etcd watch via " + endpoint + ": " + e.status().message()));
      continue;
    }
    if (e->kv.mod_revision < from) continue;  // already delivered before a reconnect
    last = std::max(last, e->kv.mod_revision);
    callback_(std::move(e));
    if (stop_.load(std::memory_order_acquire)) break;
  }
  if (last > 0) next_revision_.store(last + 1, std::memory_order_release);
  return true;
}

}  // namespace rdkv::etcd

// Watch: every change of a key or of a prefix, from a start revision, delivered in order on the
// watch's own thread, across lost connections and failed etcd members.
//
//   auto w = Watch::Start(options, {.key = "/rdkv/servers/", .prefix = true, .start_revision = r},
//                         [](const Result<WatchEvent>& e) { ... });
//
// Resume rule: after a lost stream the watch reconnects (the next endpoint, with back-off from
// 50 ms up to 1 s) and asks again from (last delivered mod_revision + 1), so no event is lost or
// delivered twice. The events of one revision (a txn) arrive in one message and are delivered
// together before the resume point moves past them.
//
// Errors through the callback: a start revision that etcd has compacted away is reported once as
// kNotFound naming the compact revision (read the current state with Get/GetPrefix and start a
// new watch from its revision + 1); the watch then ends. Lost connections are not errors: they
// are retried for as long as the watch lives (see reconnects()).
//
// Thread-safety: the callback runs on the watch's thread, one call at a time; it must not destroy
// the Watch. The accessors may be called from any thread. The destructor stops the thread within
// ~100 ms (the streaming transfer polls a stop flag) and waits for a callback in progress.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "common/etcd/etcd_client.h"
#include "common/util/mutex.h"
#include "rdkv/status.h"

namespace rdkv::etcd {

struct WatchEvent {
  enum class Type { kPut, kDelete };
  Type type = Type::kPut;
  KeyValue kv;  // for a delete: key and mod_revision (the delete's revision) only
};

struct WatchOptions {
  std::string key;
  bool prefix = false;         // true: every key starting with `key`
  int64_t start_revision = 0;  // first revision to deliver; 0 = changes after the watch starts
};

class Watch {
 public:
  using Callback = std::function<void(const Result<WatchEvent>&)>;

  // Checks the options (as EtcdClient::Create) and starts the thread; connecting happens on it.
  // kInvalidArgument on bad options or an empty callback.
  static Result<std::unique_ptr<Watch>> Start(EtcdOptions etcd, WatchOptions options,
                                              Callback callback);
  ~Watch();
  Watch(const Watch&) = delete;
  Watch& operator=(const Watch&) = delete;

  // The revision the watch resumes from: last delivered mod_revision + 1 (0 before the first
  // stream was created when start_revision was 0).
  int64_t next_revision() const { return next_revision_.load(std::memory_order_acquire); }
  // Number of streams opened after the first (reconnects), and whether one is open now.
  int64_t reconnects() const { return reconnects_.load(std::memory_order_relaxed); }
  bool connected() const { return connected_.load(std::memory_order_acquire); }
  // True once the watch has ended (compaction); it delivers nothing more.
  bool ended() const { return ended_.load(std::memory_order_acquire); }

 private:
  Watch(EtcdOptions etcd, WatchOptions options, Callback callback);
  void Run();
  // One stream on `endpoint` until it ends; false when the watch must end (compaction, stop).
  bool StreamOnce(const std::string& endpoint);
  // What the stream does after a message.
  enum class Next {
    kContinue,   // read on
    kReconnect,  // this stream is done (canceled by the member): open another
    kEnd,        // the watch ends (compaction)
  };
  // Handles one JSON message of the stream.
  Next OnMessage(const std::string& endpoint, std::string_view line);
  // Sleeps up to `d`, less when stopped.
  void SleepUnlessStopped(std::chrono::milliseconds d);

  const EtcdOptions etcd_;  // normalized endpoints and the TLS files
  const std::vector<std::string>& endpoints_ = etcd_.endpoints;
  const WatchOptions options_;
  const Callback callback_;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> next_revision_;
  std::atomic<int64_t> reconnects_{0};
  std::atomic<bool> connected_{false};
  std::atomic<bool> ended_{false};
  bool created_once_ = false;    // watch thread only
  bool stream_created_ = false;  // watch thread only: the current stream was created
  Mutex mu_;
  CondVar stop_cv_;
  std::thread thread_;
};

}  // namespace rdkv::etcd

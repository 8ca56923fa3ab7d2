// Server side of the tcp transport: the software NIC.
//
// Threads (see docs/transport-tcp.md):
//   * one accept thread: accepts sockets and hands each to a NIC thread (round robin);
//   * kNicThreads "NIC" threads, each with its own epoll set: they read the frames of their
//     connections, run the handshake, serve READs inline from the registered bytes (rkey and
//     bounds checked against the fabric's registry), and queue two-sided requests. They never
//     call the request handler;
//   * `worker_threads` workers: they run ListenOptions::handler for queued requests.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "common/transport/tcp/region_registry.h"
#include "common/transport/transport.h"

namespace rdkv::transport::tcp {

class TcpListenerImpl;

// Creates a listener bound and serving before it returns.
Result<std::unique_ptr<Listener>> CreateTcpListener(ListenOptions options,
                                                    std::shared_ptr<RegionRegistry> registry);

}  // namespace rdkv::transport::tcp

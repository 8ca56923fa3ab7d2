// The client's counters (ClientStats), shared by its parts and bumped without locks.
//
// Thread-safety: every member is an atomic; Add and Snapshot are safe from any thread.
#pragma once

#include <atomic>
#include <cstdint>

#include "rdkv/client.h"

namespace rdkv::client {

struct Counters {
  std::atomic<uint64_t> gets{0}, get_reads{0}, get_round_trips{0}, get_retries{0}, cache_hits{0},
      torn_reads{0}, writes{0}, errors{0}, cache_misses{0}, slow_reads{0}, reconnects{0},
      retired_accepts{0};
  // GETs that GetEngine::TryIndexGet's rules finished (a value, NotFound, or an error those
  // rules set; not a failed READ's error nor a re-route's): tests tell its answers from the
  // engine's by it. Not in ClientStats: it is how, not what.
  std::atomic<uint64_t> single_key_index{0};

  // The totals as the public struct.
  ClientStats Snapshot() const {
    ClientStats s;
    s.gets = gets.load(std::memory_order_relaxed);
    s.get_reads = get_reads.load(std::memory_order_relaxed);
    s.get_round_trips = get_round_trips.load(std::memory_order_relaxed);
    s.get_retries = get_retries.load(std::memory_order_relaxed);
    s.cache_hits = cache_hits.load(std::memory_order_relaxed);
    s.torn_reads = torn_reads.load(std::memory_order_relaxed);
    s.writes = writes.load(std::memory_order_relaxed);
    s.errors = errors.load(std::memory_order_relaxed);
    s.cache_misses = cache_misses.load(std::memory_order_relaxed);
    s.slow_reads = slow_reads.load(std::memory_order_relaxed);
    s.reconnects = reconnects.load(std::memory_order_relaxed);
    s.retired_accepts = retired_accepts.load(std::memory_order_relaxed);
    return s;
  }
};

inline void Add(std::atomic<uint64_t>& c, uint64_t n = 1) {
  if (n != 0) c.fetch_add(n, std::memory_order_relaxed);
}

}  // namespace rdkv::client

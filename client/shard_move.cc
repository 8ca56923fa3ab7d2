#include "client/shard_move.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "client/client_internal.h"
#include "common/util/json_bounded.h"
#include "common/util/mutex.h"
#include "common/util/progress.h"
#include "common/util/thread_annotations.h"

namespace rdkv::client {
namespace {

using Clock = std::chrono::steady_clock;
// How long a copy waits for a target busy with another copy of the same shard to go quiet
// (servers refuse a new copy until 3 s after the last request of the previous one).
constexpr std::chrono::milliseconds kBusyCopyWait{10000};
// Progress lines of a long copy (step 2): at most one a second.
constexpr std::chrono::milliseconds kCopyProgressInterval{1000};

std::string ServerName(const cluster::ServerEntry& e) {
  return "server " + std::to_string(e.id) + " (" + e.address + ")";
}

// "3", "0-7, 9, 12-13".
std::string ShardList(const std::vector<uint32_t>& sorted) {
  std::string out;
  for (size_t i = 0; i < sorted.size();) {
    size_t j = i;
    while (j + 1 < sorted.size() && sorted[j + 1] == sorted[j] + 1) ++j;
    if (!out.empty()) out += ", ";
    out += std::to_string(sorted[i]);
    if (j > i) out += "-" + std::to_string(sorted[j]);
    i = j + 1;
  }
  return out;
}

bool SameMap(const cluster::ClusterMap& a, const cluster::ClusterMap& b) {
  if (a.epoch != b.epoch || a.shards != b.shards || a.owners != b.owners ||
      a.servers.size() != b.servers.size()) {
    return false;
  }
  for (size_t i = 0; i < a.servers.size(); ++i) {
    if (a.servers[i].id != b.servers[i].id || a.servers[i].address != b.servers[i].address) {
      return false;
    }
  }
  for (uint32_t s = 0; s < a.shards; ++s) {
    if (a.ReplicasOf(s) != b.ReplicasOf(s)) return false;
    const std::vector<uint32_t> none;
    const auto& ja = s < a.joining.size() ? a.joining[s] : none;
    const auto& jb = s < b.joining.size() ? b.joining[s] : none;
    if (ja != jb) return false;
    for (uint32_t id : ja) {
      if (a.JoinedAt(s, id) != b.JoinedAt(s, id)) return false;
    }
  }
  return true;
}

// What every server said its map is.
struct Survey {
  std::map<uint32_t, cluster::ServerEntry> servers;  // every server any map names, by id
  std::map<uint32_t, cluster::ClusterMap> maps;      // the map each one reported
};

// Asks every server of `known` (and of every map an answer names) for its map. Nothing is
// changed; any server that does not answer fails the survey.
Result<Survey> AskEveryServer(AdminChannel& channel, const cluster::ClusterMap& known) {
  Survey survey;
  std::vector<cluster::ServerEntry> pending(known.servers.rbegin(), known.servers.rend());
  while (!pending.empty()) {
    cluster::ServerEntry e = std::move(pending.back());
    pending.pop_back();
    if (survey.servers.count(e.id) != 0) continue;
    survey.servers[e.id] = e;
    uint64_t epoch = 0;
    std::string body;
    Status s = channel.Call(e, kv::EncodeMapFetch({}), &epoch, &body);
    if (!s.ok()) {
      return Status::Unavailable("cannot move shards: " + ServerName(e) +
                                 " did not answer for its cluster map (" + s.ToString() +
                                 "); every server must be reachable before a move starts. "
                                 "Nothing was changed");
    }
    Result<kv::MapAnswer> answer = kv::DecodeMapAnswer(epoch, body);
    if (!answer.ok()) {
      return Status::ProtocolError(
          ServerName(e) + " sent a malformed cluster map answer: " + answer.status().message());
    }
    if (answer->map_json.empty()) {
      return Status::NotSupported(ServerName(e) + " serves standalone (no cluster map)");
    }
    Result<cluster::ClusterMap> map = cluster::ParseClusterMap(answer->map_json);
    if (!map.ok()) {
      return Status::ProtocolError(
          ServerName(e) + " sent a cluster map that does not parse: " + map.status().message());
    }
    // Every map of one cluster has its shard count (fixed when the cluster was made): the
    // steps compare maps shard by shard.
    if (map->shards != known.shards) {
      return Status::Internal(ServerName(e) + " reports a map of " + std::to_string(map->shards) +
                              " shards; this client's has " + std::to_string(known.shards) +
                              " (another cluster's server at that address?). Nothing was "
                              "changed");
    }
    for (auto it = map->servers.rbegin(); it != map->servers.rend(); ++it) {
      if (survey.servers.count(it->id) == 0) pending.push_back(*it);
    }
    survey.maps[e.id] = std::move(map).value();
  }
  return survey;
}

// Runs map transitions and keeps the report. One per MoveShards call.
class Mover {
 public:
  Mover(AdminChannel& channel, const MoveProgressFn& progress, MoveReport* report,
        const Survey& survey)
      : channel_(channel), progress_(progress), report_(report), servers_(survey.servers) {
    for (const auto& [id, map] : survey.maps) epoch_of_[id] = map.epoch;
  }

  // Brings every server to `to`. Shards whose owner differs between `from` and `to` move from
  // their `from` owner to their `to` owner in the four steps of docs/design.md. Some servers
  // may already have `to` (an interrupted earlier run): a new owner that has it already holds
  // the complete copy (and may have taken writes since), and its shards are not copied again.
  Status Transition(const cluster::ClusterMap& from, const cluster::ClusterMap& to) {
    std::vector<uint32_t> moving;
    std::set<uint32_t> sources, destinations;
    for (uint32_t s = 0; s < to.shards; ++s) {
      if (from.OwnerOf(s) == to.OwnerOf(s)) continue;
      moving.push_back(s);
      sources.insert(from.OwnerOf(s));
      destinations.insert(to.OwnerOf(s));
    }
    const std::string json = to.ToJson();
    auto failed = [&](int step, const std::string& what, const Status& s) {
      std::string hint =
          step < 4
              ? "The cluster is left between map epochs " + std::to_string(from.epoch) + " and " +
                    std::to_string(to.epoch) + " and writes to shard(s) " + ShardList(moving) +
                    " are refused until the move completes: run the same move again to "
                    "resume it"
              : "Every server has map epoch " + std::to_string(to.epoch) +
                    ", but stale copies remain on the old owner: run the same move again "
                    "to drop them";
      return Status(s.code(), "step " + std::to_string(step) + "/4 (" + what +
                                  ") failed: " + s.message() + ". " + hint);
    };

    // 1. The old owners stop serving the shards (each answers after its lease).
    Timer t1(&report_->step_seconds[0]);
    Say("step 1/4: install map epoch " + std::to_string(to.epoch) + " on the old owner(s)");
    uint32_t failed_on = 0;
    Status installed = InstallWhereOlder(std::vector<uint32_t>(sources.begin(), sources.end()),
                                         to.epoch, json, &failed_on);
    if (!installed.ok()) return failed(1, "install on " + Name(failed_on), installed);
    t1.Stop();

    // 2. Copy each shard into its new owner.
    Timer t2(&report_->step_seconds[1]);
    Say("step 2/4: copy shard(s) " + ShardList(moving));
    std::map<uint32_t, uint64_t> counter_of;  // old owners' version counters, after step 1
    // Progress of the copy: the items to copy are estimated from each old owner's statistics
    // (its items / the shards it owns); a line every kCopyProgressInterval.
    uint64_t estimate = 0;
    for (uint32_t shard : moving) {
      if (epoch_of_[to.OwnerOf(shard)] < to.epoch) estimate += ItemsPerShard(from.OwnerOf(shard));
    }
    ProgressMeter meter("  copy", "items", estimate, kCopyProgressInterval);
    copy_meter_ = &meter;
    copy_done_ = 0;
    struct Unset {
      ProgressMeter** p;
      ~Unset() { *p = nullptr; }
    } unset{&copy_meter_};
    for (uint32_t shard : moving) {
      uint32_t a = from.OwnerOf(shard), b = to.OwnerOf(shard);
      if (epoch_of_[b] >= to.epoch) {
        Say("  shard " + std::to_string(shard) + ": already copied (" + Name(b) +
            " has map epoch " + std::to_string(to.epoch) + ")");
        continue;
      }
      if (counter_of.count(a) == 0) {
        Result<uint64_t> c = VersionCounter(a);
        if (!c.ok()) {
          return failed(2, "read the version counter of " + Name(a), c.status());
        }
        counter_of[a] = *c;
      }
      {
        // b does not own the shard (its map is older than `to`): whatever it holds of it is
        // stale, left by an earlier move away from b or by an interrupted copy, and would come
        // back to life next to the copy. The same call raises b's version counter above a's:
        // keys of the shard deleted on a left no item to carry their versions.
        // b refuses (kBusy) while another copy into it of this shard is active (another move,
        // or this one's interrupted copy a moment ago): wait for it to go quiet, a while.
        uint64_t stale = 0;
        Status s = Drop(b, shard, &stale, counter_of[a]);
        const Clock::time_point give_up = Clock::now() + kBusyCopyWait;
        if (s.Is(StatusCode::kBusy)) {
          Say("  shard " + std::to_string(shard) + ": " + Name(b) +
              " is busy with another copy of "
              "it; waiting up to " +
              std::to_string(kBusyCopyWait.count() / 1000) + " s");
        }
        while (s.Is(StatusCode::kBusy) && Clock::now() < give_up) {
          std::this_thread::sleep_for(std::chrono::milliseconds(250));
          s = Drop(b, shard, &stale, counter_of[a]);
        }
        if (!s.ok()) {
          return failed(2, "drop stale copy of shard " + std::to_string(shard) + " on " + Name(b),
                        s);
        }
        if (stale > 0) {
          Say("  shard " + std::to_string(shard) + ": " + std::to_string(stale) +
              " stale item(s) on " + Name(b) + " (an earlier or interrupted move) dropped first");
        }
      }
      uint64_t items = 0, bytes = 0, ids = 0;
      Status s = Copy(shard, a, b, &items, &bytes);
      // The ids after the items: the target takes the shard only in step 3, after both.
      std::string warning;
      if (s.ok()) s = CopyRetryIds(channel_, servers_.at(a), servers_.at(b), shard, &ids, &warning);
      if (!warning.empty()) Say("  warning: " + warning);
      report_->items_copied += items;
      report_->bytes_copied += bytes;
      report_->ids_copied += ids;
      if (!s.ok()) {
        return failed(
            2, "copy shard " + std::to_string(shard) + " from " + Name(a) + " to " + Name(b), s);
      }
      Say("  shard " + std::to_string(shard) + ": " + std::to_string(items) + " item(s), " +
          std::to_string(bytes) + " bytes and " + std::to_string(ids) +
          " request id(s) copied from " + Name(a) + " to " + Name(b));
    }
    t2.Stop();

    // 3. The new owners serve the shards; then everyone else learns the map.
    Timer t3(&report_->step_seconds[2]);
    Say("step 3/4: install map epoch " + std::to_string(to.epoch) +
        " on the new owner(s), then on every other server");
    std::vector<uint32_t> rest;
    for (const auto& [id, entry] : servers_) {
      if (destinations.count(id) == 0) rest.push_back(id);
    }
    installed = InstallWhereOlder(std::vector<uint32_t>(destinations.begin(), destinations.end()),
                                  to.epoch, json, &failed_on);
    if (installed.ok()) installed = InstallWhereOlder(rest, to.epoch, json, &failed_on);
    if (!installed.ok()) return failed(3, "install on " + Name(failed_on), installed);
    t3.Stop();

    // 4. The old owners' stale copies go.
    Timer t4(&report_->step_seconds[3]);
    Say("step 4/4: drop the old copies");
    for (uint32_t shard : moving) {
      uint32_t a = from.OwnerOf(shard);
      uint64_t dropped = 0;
      Status s = Drop(a, shard, &dropped);
      if (!s.ok()) {
        return failed(4, "drop shard " + std::to_string(shard) + " on " + Name(a), s);
      }
      report_->items_dropped += dropped;
      Say("  shard " + std::to_string(shard) + ": " + std::to_string(dropped) +
          " item(s) dropped on " + Name(a));
    }
    return Status::Ok();
  }

  // `shards` stay with their owner in `map`, the map every server has now: a copy of them on
  // any other server is stale (an earlier move's step 4 did not finish) and is dropped.
  Status DropStaleCopies(const cluster::ClusterMap& map, const std::vector<uint32_t>& shards) {
    Timer t(&report_->step_seconds[3]);
    for (uint32_t shard : shards) {
      for (const auto& [id, entry] : servers_) {
        if (id == map.OwnerOf(shard)) continue;
        uint64_t dropped = 0;
        Status s = Drop(id, shard, &dropped);
        if (!s.ok()) {
          return Status(s.code(), "dropping stale copies of shard " + std::to_string(shard) +
                                      " on " + Name(id) + " failed: " + s.message() +
                                      ". The map is complete; run the same move again to "
                                      "drop them");
        }
        report_->items_dropped += dropped;
        if (dropped > 0) {
          Say("  shard " + std::to_string(shard) + ": " + std::to_string(dropped) +
              " stale item(s) left by an earlier move dropped on " + Name(id));
        }
      }
    }
    return Status::Ok();
  }

  void Say(const std::string& line) {
    if (progress_) progress_(line);
  }

 private:
  // Adds the seconds from construction to Stop() (or destruction) to *sink.
  class Timer {
   public:
    explicit Timer(double* sink) : sink_(sink), start_(Clock::now()) {}
    ~Timer() { Stop(); }
    void Stop() {
      if (sink_ == nullptr) return;
      *sink_ += std::chrono::duration<double>(Clock::now() - start_).count();
      sink_ = nullptr;
    }

   private:
    double* sink_;
    Clock::time_point start_;
  };

  std::string Name(uint32_t id) const {
    auto it = servers_.find(id);
    return it == servers_.end() ? "server " + std::to_string(id) : ServerName(it->second);
  }

  Status Call(uint32_t id, const kv::Request& request, uint64_t* version, std::string* body) {
    auto it = servers_.find(id);
    if (it == servers_.end()) {
      return Status::InvalidArgument("server " + std::to_string(id) +
                                     " is in no map any server reported");
    }
    return channel_.Call(it->second, request, version, body);
  }

  // Installs the map on each of `ids` whose map is older, all at once (an old owner answers
  // after its lease). On failure *failed_on is the first server (in `ids` order) that failed.
  Status InstallWhereOlder(const std::vector<uint32_t>& ids, uint64_t epoch,
                           const std::string& json, uint32_t* failed_on) {
    std::vector<uint32_t> todo;
    for (uint32_t id : ids) {
      if (epoch_of_[id] >= epoch) {
        Say("  " + Name(id) + " already has map epoch " + std::to_string(epoch_of_[id]));
      } else {
        todo.push_back(id);
      }
    }
    std::vector<Status> results(todo.size());
    std::vector<double> millis(todo.size());
    auto install = [&](size_t i) {
      Clock::time_point t0 = Clock::now();
      results[i] = Call(todo[i], kv::EncodeMapInstall({json}), nullptr, nullptr);
      millis[i] = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    };
    std::vector<std::thread> threads;
    for (size_t i = 1; i < todo.size(); ++i) threads.emplace_back(install, i);
    if (!todo.empty()) install(0);
    for (std::thread& t : threads) t.join();
    Status first;
    for (size_t i = 0; i < todo.size(); ++i) {
      if (!results[i].ok()) {
        if (first.ok()) {
          first = results[i];
          *failed_on = todo[i];
        }
        continue;
      }
      epoch_of_[todo[i]] = epoch;
      Say("  " + Name(todo[i]) + ": map epoch " + std::to_string(epoch) + " installed (" +
          std::to_string(static_cast<int64_t>(millis[i])) + " ms)");
    }
    return first;
  }

  // DROP_SHARD; `version_floor` > 0 also raises the server's version counter above it.
  Status Drop(uint32_t id, uint32_t shard, uint64_t* dropped, uint64_t version_floor = 0) {
    std::string scratch, body;
    uint64_t version = 0;
    RDKV_RETURN_IF_ERROR(
        Call(id, kv::EncodeDropShard({shard, version_floor}, &scratch), &version, &body));
    Result<kv::DropShardAnswer> answer = kv::DecodeDropShardAnswer(version, body);
    if (!answer.ok()) {
      return Status::ProtocolError(
          Name(id) + " sent a malformed DROP_SHARD answer: " + answer.status().message());
    }
    *dropped = answer->dropped;
    return Status::Ok();
  }

  // About how many items server `id` holds per shard it owns (its STATS "items" /
  // "cluster.owned_shards"); 0 when it does not say (progress then shows no total).
  uint64_t ItemsPerShard(uint32_t id) {
    std::string body;
    if (!Call(id, kv::Request{kv::Op::kStats, {}, {}, 0}, nullptr, &body).ok()) return 0;
    nlohmann::json j = ParseJsonBounded(body);
    if (!j.is_object() || !j.contains("items") || !j["items"].is_number_unsigned()) return 0;
    uint64_t owned = 1;
    if (j.contains("cluster") && j["cluster"].is_object() &&
        j["cluster"].contains("owned_shards") &&
        j["cluster"]["owned_shards"].is_number_unsigned()) {
      owned = std::max<uint64_t>(1, j["cluster"]["owned_shards"].get<uint64_t>());
    }
    return j["items"].get<uint64_t>() / owned;
  }

  // The last version server `id` handed out (its STATS "version_counter").
  Result<uint64_t> VersionCounter(uint32_t id) {
    std::string body;
    RDKV_RETURN_IF_ERROR(Call(id, kv::Request{kv::Op::kStats, {}, {}, 0}, nullptr, &body));
    nlohmann::json j = ParseJsonBounded(body);
    if (!j.is_object() || !j.contains("version_counter") ||
        !j["version_counter"].is_number_unsigned()) {
      return Status::ProtocolError(Name(id) +
                                   " reports no version counter in its statistics (a kvserver "
                                   "older than shard moves?)");
    }
    return j["version_counter"].get<uint64_t>();
  }

  // SHARD_SCAN on `from`, IMPORT of each answer's items into `to`, several in flight.
  Status Copy(uint32_t shard, uint32_t from, uint32_t to, uint64_t* items, uint64_t* bytes) {
    const cluster::ServerEntry& target = servers_.at(to);
    std::string scratch, batch;
    uint64_t cursor = 0;
    do {
      batch.clear();
      uint64_t next = 0;
      RDKV_RETURN_IF_ERROR(
          Call(from, kv::EncodeShardScan({shard, cursor}, &scratch), &next, &batch));
      // Values up to the protocol's largest: the source's own limit is not known here.
      Result<kv::ShardScanAnswer> answer = kv::DecodeShardScanAnswer(
          cursor, next, batch, kv::WireLimits{kv::kMaxKeyBytes, kv::kMaxValueBytes});
      if (!answer.ok()) {
        return Status::ProtocolError(Name(from) + " sent a malformed SHARD_SCAN answer for shard " +
                                     std::to_string(shard) + ": " + answer.status().message());
      }
      RDKV_RETURN_IF_ERROR(ImportAll(target, answer->entries));
      *items += answer->entries.size();
      copy_done_ += answer->entries.size();
      if (copy_meter_ != nullptr && copy_meter_->Due()) {
        // An estimate below the items copied so far is raised to them (and 10% more).
        if (copy_done_ >= copy_meter_->total())
          copy_meter_->set_total(copy_done_ + copy_done_ / 10);
        Say(copy_meter_->Line(copy_done_) + " (shard " + std::to_string(shard) + ")");
      }
      for (const kv::ScanEntry& e : answer->entries) *bytes += e.key.size() + e.value.size();
      cursor = answer->next_cursor;
    } while (cursor != kv::kScanDone);
    return Status::Ok();
  }

  // Imports `entries` into `target` with up to kImportsInFlight requests in flight; the first
  // failure stops the rest.
  Status ImportAll(const cluster::ServerEntry& target, const std::vector<kv::ScanEntry>& entries) {
    if (entries.empty()) return Status::Ok();
    std::atomic<size_t> next{0};
    std::atomic<bool> failed{false};
    FirstFailure first;
    auto work = [&] {
      while (!failed.load(std::memory_order_relaxed)) {
        size_t i = next.fetch_add(1, std::memory_order_relaxed);
        if (i >= entries.size()) return;
        const kv::ScanEntry& e = entries[i];
        Status s =
            channel_.Call(target, kv::EncodeImport({e.key, e.value, e.version}), nullptr, nullptr);
        if (!s.ok()) {
          first.Note(Status(s.code(), "IMPORT of " + DescribeKey(e.key) + " into " +
                                          ServerName(target) + ": " + s.message()));
          failed.store(true, std::memory_order_relaxed);
          return;
        }
      }
    };
    std::vector<std::thread> helpers;
    size_t in_flight = std::min(kImportsInFlight, entries.size());
    for (size_t i = 1; i < in_flight; ++i) helpers.emplace_back(work);
    work();
    for (std::thread& t : helpers) t.join();
    return first.Get();
  }

  // The first of the failures that ImportAll's threads note.
  class FirstFailure {
   public:
    void Note(Status s) EXCLUDES(mu_) {
      MutexLock l(&mu_);
      if (first_.ok()) first_ = std::move(s);
    }
    Status Get() const EXCLUDES(mu_) {
      MutexLock l(&mu_);
      return first_;
    }

   private:
    mutable Mutex mu_;
    Status first_ GUARDED_BY(mu_);
  };

  AdminChannel& channel_;
  const MoveProgressFn& progress_;
  ProgressMeter* copy_meter_ = nullptr;  // during step 2
  uint64_t copy_done_ = 0;               // items copied in step 2
  MoveReport* report_;
  const std::map<uint32_t, cluster::ServerEntry> servers_;
  std::map<uint32_t, uint64_t> epoch_of_;  // the map epoch each server has now
};

}  // namespace

Status RunInLanes(size_t first, size_t count, const std::function<Status(size_t)>& job) {
  const size_t lanes = first < count ? std::min(kImportsInFlight, count - first) : 0;
  std::vector<Status> lane_status(lanes);
  std::vector<std::thread> senders;
  for (size_t lane = 0; lane < lanes; ++lane) {
    senders.emplace_back([&, lane] {
      for (size_t j = first + lane; j < count; j += lanes) {
        if (Status s = job(j); !s.ok()) {
          lane_status[lane] = std::move(s);
          return;
        }
      }
    });
  }
  for (std::thread& t : senders) t.join();
  for (Status& s : lane_status) {
    if (!s.ok()) return std::move(s);
  }
  return Status::Ok();
}

Status CopyRetryIds(AdminChannel& channel, const cluster::ServerEntry& from,
                    const cluster::ServerEntry& to, uint32_t shard, uint64_t* ids,
                    std::string* warning) {
  std::string scratch, body;
  uint64_t cursor = 0;
  const std::string what = "copying the request ids of shard " + std::to_string(shard) + " from " +
                           ServerName(from) + " to " + ServerName(to) + ": ";
  // Only the first request to each server can meet one that predates the ops.
  auto predates = [&](const Status& s, const cluster::ServerEntry& server, std::string_view op) {
    if (!s.Is(StatusCode::kProtocolError) || s.message().rfind("unknown operation", 0) != 0) {
      return false;
    }
    *warning = "shard " + std::to_string(shard) + ": " + ServerName(server) + " does not know " +
               std::string(op) + " (a kvserver from before request ids travelled with copies): " +
               "copied without the request ids of its recent writes, whose retries may be " +
               "applied again; upgrade every server";
    return true;
  };
  // One RECORD_IDS of `chunk` (whole packed ids, at most kMaxIdsPerRecord).
  auto record = [&](std::string_view chunk) -> Status {
    std::string own_scratch;
    uint64_t recorded = 0;
    Status s =
        channel.Call(to, kv::EncodeRecordIds({shard, chunk}, &own_scratch), &recorded, nullptr);
    if (!s.ok()) return s;
    const size_t sent = chunk.size() / kv::kAnsweredWriteBytes;
    if (recorded != sent) {
      return Status::ProtocolError("recorded " + std::to_string(recorded) + " of " +
                                   std::to_string(sent) + " ids");
    }
    return Status::Ok();
  };
  constexpr size_t kChunkBytes = kv::kMaxIdsPerRecord * kv::kAnsweredWriteBytes;
  bool first_record = true;
  while (cursor != kv::kScanDone) {
    uint64_t next = 0;
    body.clear();
    Status s = channel.Call(from, kv::EncodeShardIds({shard, cursor}, &scratch), &next, &body);
    if (cursor == 0 && predates(s, from, "SHARD_IDS")) return Status::Ok();
    if (!s.ok()) return Status(s.code(), what + "SHARD_IDS: " + s.message());
    Result<kv::ShardIdsAnswer> page = kv::DecodeShardIdsAnswer(cursor, next, body);
    if (!page.ok()) return Status(page.status().code(), what + page.status().message());
    // The page in RECORD_IDS of kMaxIdsPerRecord, up to kImportsInFlight at once; the copy's
    // very first one alone (it tells a target that predates the op).
    std::vector<std::string_view> chunks;
    for (size_t at = 0; at < body.size(); at += kChunkBytes) {
      chunks.push_back(std::string_view(body).substr(at, kChunkBytes));
    }
    size_t start = 0;
    if (first_record && !chunks.empty()) {
      first_record = false;
      s = record(chunks[0]);
      if (predates(s, to, "RECORD_IDS")) return Status::Ok();
      if (!s.ok()) return Status(s.code(), what + "RECORD_IDS: " + s.message());
      start = 1;
    }
    if (Status c = RunInLanes(start, chunks.size(), [&](size_t j) { return record(chunks[j]); });
        !c.ok()) {
      return Status(c.code(), what + "RECORD_IDS: " + c.message());
    }
    *ids += page->ids.size();
    cursor = page->next_cursor;
  }
  return Status::Ok();
}

Result<MoveReport> RunShardMove(AdminChannel& channel, const cluster::ClusterMap& known,
                                std::span<const uint32_t> shards, uint32_t to_server,
                                const MoveProgressFn& progress) {
  const Clock::time_point start = Clock::now();
  if (shards.empty()) return Status::InvalidArgument("no shards to move were given");
  std::vector<uint32_t> wanted(shards.begin(), shards.end());
  std::sort(wanted.begin(), wanted.end());
  wanted.erase(std::unique(wanted.begin(), wanted.end()), wanted.end());
  if (wanted.back() >= known.shards) {
    return Status::InvalidArgument(
        "shard " + std::to_string(wanted.back()) + " does not exist: the cluster has " +
        std::to_string(known.shards) + " shards (0.." + std::to_string(known.shards - 1) + ")");
  }
  auto unknown_server = [&](const cluster::ClusterMap& map) {
    std::string ids;
    for (const cluster::ServerEntry& e : map.servers) {
      ids += (ids.empty() ? "" : ", ") + std::to_string(e.id);
    }
    return Status::InvalidArgument("server id " + std::to_string(to_server) +
                                   " is not in the cluster map (epoch " +
                                   std::to_string(map.epoch) + ": servers " + ids + ")");
  };
  if (known.FindServer(to_server) == nullptr) return unknown_server(known);

  RDKV_ASSIGN_OR_RETURN(Survey survey, AskEveryServer(channel, known));
  // The newest map, the one just below it, and a check that equal epochs mean equal maps.
  std::map<uint64_t, const cluster::ClusterMap*> by_epoch;
  for (const auto& [id, map] : survey.maps) {
    auto [it, fresh] = by_epoch.emplace(map.epoch, &map);
    if (!fresh && !SameMap(*it->second, map)) {
      return Status::Internal("two servers report different maps with the same epoch " +
                              std::to_string(map.epoch) + " (one of them is server " +
                              std::to_string(id) +
                              "): this is not a state a move leaves; install one map with a "
                              "higher epoch on every server by hand");
    }
  }
  const cluster::ClusterMap& newest = *by_epoch.rbegin()->second;
  if (newest.FindServer(to_server) == nullptr) return unknown_server(newest);

  MoveReport report;
  report.to_server = to_server;
  Mover mover(channel, progress, &report, survey);
  if (by_epoch.size() > 1) {
    // An interrupted move: its shards still move from their owners in the epoch before it.
    const cluster::ClusterMap& previous = *std::next(by_epoch.rbegin())->second;
    for (uint32_t s = 0; s < newest.shards; ++s) {
      if (previous.OwnerOf(s) != newest.OwnerOf(s)) report.resumed.push_back(s);
    }
    report.resumed_from_epoch = previous.epoch;
    report.resumed_to_epoch = newest.epoch;
    std::string epochs;
    for (const auto& [id, map] : survey.maps) {
      epochs += (epochs.empty() ? "server " : ", server ") + std::to_string(id) + ": " +
                std::to_string(map.epoch);
    }
    mover.Say("the servers report different map epochs (" + epochs +
              "): an earlier move from epoch " + std::to_string(previous.epoch) + " to " +
              std::to_string(newest.epoch) + " was interrupted; finishing it first (shard(s) " +
              (report.resumed.empty() ? std::string("none") : ShardList(report.resumed)) + ")");
    if (by_epoch.size() > 2) {
      mover.Say("servers with a map older than epoch " + std::to_string(previous.epoch) +
                " only receive epoch " + std::to_string(newest.epoch) +
                "; shards are copied from their epoch " + std::to_string(previous.epoch) +
                " owners");
    }
    Status s = mover.Transition(previous, newest);
    if (!s.ok()) {
      return Status(s.code(), "finishing the interrupted move to map epoch " +
                                  std::to_string(newest.epoch) + ": " + s.message());
    }
  }

  cluster::ClusterMap next = newest;
  for (uint32_t s : wanted) {
    if (newest.OwnerOf(s) == to_server) {
      report.skipped.push_back(s);
    } else {
      next.owners[s] = to_server;
      report.moved.push_back(s);
    }
  }
  report.from_epoch = newest.epoch;
  report.to_epoch = newest.epoch;
  if (!report.skipped.empty()) {
    mover.Say("shard(s) " + ShardList(report.skipped) + " already belong to server " +
              std::to_string(to_server) + ": skipped");
  }
  if (!report.moved.empty()) {
    next.epoch = newest.epoch + 1;
    mover.Say("moving shard(s) " + ShardList(report.moved) + " to server " +
              std::to_string(to_server) + ": map epoch " + std::to_string(newest.epoch) + " -> " +
              std::to_string(next.epoch));
    RDKV_RETURN_IF_ERROR(mover.Transition(newest, next));
    report.to_epoch = next.epoch;
  }
  if (!report.skipped.empty()) RDKV_RETURN_IF_ERROR(mover.DropStaleCopies(next, report.skipped));
  report.total_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return report;
}

}  // namespace rdkv::client

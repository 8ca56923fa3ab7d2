#include "coordinator/coordinator.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <glog/logging.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <nlohmann/json.hpp>

#include "common/cluster/etcd_map.h"
#include "rdkv/admin.h"
#include "rdkv/client.h"

namespace rdkv::coordinator {

using Clock = std::chrono::steady_clock;

namespace {

enum class ProbeResult { kAnswered, kRefused, kUnknown };

// One TCP connect to host:port within `timeout`: refused means no process listens there.
ProbeResult ProbeTcp(const std::string& address, std::chrono::milliseconds timeout) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) return ProbeResult::kUnknown;
  std::string host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  const std::string port = address.substr(colon + 1);
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* ai = nullptr;
  if (getaddrinfo(host.c_str(), port.c_str(), &hints, &ai) != 0 || ai == nullptr) {
    return ProbeResult::kUnknown;
  }
  ProbeResult result = ProbeResult::kUnknown;
  int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd >= 0) {
    int rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
    if (rc == 0) {
      result = ProbeResult::kAnswered;
    } else if (errno == ECONNREFUSED) {
      result = ProbeResult::kRefused;
    } else if (errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      if (poll(&p, 1, static_cast<int>(timeout.count())) == 1) {
        int err = 0;
        socklen_t len = sizeof(err);
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        result = err == 0              ? ProbeResult::kAnswered
                 : err == ECONNREFUSED ? ProbeResult::kRefused
                                       : ProbeResult::kUnknown;
      }
    }
    close(fd);
  }
  freeaddrinfo(ai);
  return result;
}

std::string DefaultName() {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  return std::string(host) + ":" + std::to_string(getpid());
}

std::string Join(const std::vector<uint32_t>& v) {
  std::string s;
  for (uint32_t x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
  return s;
}

// "server 2: shards 0,3; server 3: shard 1", servers in the order they first appear.
std::string Describe(const std::vector<ReplicaAddition>& additions) {
  std::vector<std::pair<uint32_t, std::vector<uint32_t>>> by_server;
  for (const ReplicaAddition& a : additions) {
    auto it = std::find_if(by_server.begin(), by_server.end(),
                           [&](const auto& e) { return e.first == a.server; });
    if (it == by_server.end()) it = by_server.insert(by_server.end(), {a.server, {}});
    it->second.push_back(a.shard);
  }
  std::string s;
  for (const auto& [server, shards] : by_server) {
    s += (s.empty() ? "server " : "; server ") + std::to_string(server) +
         (shards.size() == 1 ? ": shard " : ": shards ") + Join(shards);
  }
  return s;
}

}  // namespace

Coordinator::Coordinator(CoordinatorOptions options, std::unique_ptr<etcd::EtcdClient> client)
    : options_(std::move(options)),
      client_(std::move(client)),
      election_key_("/rdkv/" + options_.cluster_name + "/coordinator") {}

Result<std::unique_ptr<Coordinator>> Coordinator::Start(CoordinatorOptions options) {
  if (options.name.empty()) options.name = DefaultName();
  if (options.lease_ttl_seconds < 1) {
    return Status::InvalidArgument("the coordinator's lease TTL must be at least 1 s");
  }
  RDKV_ASSIGN_OR_RETURN(std::unique_ptr<etcd::EtcdClient> client,
                        etcd::EtcdClient::Create(options.etcd));
  std::unique_ptr<Coordinator> c(new Coordinator(std::move(options), std::move(client)));
  Coordinator* self = c.get();
  if (c->options_.metrics_port) {
    RDKV_ASSIGN_OR_RETURN(
        c->metrics_http_,
        metrics::MetricsHttp::Start(
            c->options_.metrics_host, *c->options_.metrics_port,
            metrics::MakeCollector([self] { return CoordinatorMetricFamilies(self->stats()); })));
    LOG(INFO) << "metrics: http://" << c->options_.metrics_host << ":" << c->metrics_http_->port()
              << "/metrics";
  }
  c->run_thread_ = std::thread([self] { self->Run(); });
  LOG(INFO) << "coordinator " << c->options_.name << ": standing for election in cluster '"
            << c->options_.cluster_name << "' (" << c->election_key_ << ", lease TTL "
            << c->options_.lease_ttl_seconds << " s)";
  return c;
}

Coordinator::~Coordinator() { Stop(); }

void Coordinator::Stop() {
  if (stopping_.exchange(true)) return;
  if (run_thread_.joinable()) run_thread_.join();
  std::thread replica;
  {
    MutexLock lock(&mu_);
    replica = std::move(replica_thread_);
  }
  if (replica.joinable()) replica.join();
  lease_.reset();  // revokes: the next coordinator is elected at once
  MutexLock lock(&mu_);
  stats_.leader = false;
}

CoordinatorStats Coordinator::stats() const {
  CoordinatorStats s;
  {
    MutexLock lock(&mu_);
    s = stats_;
  }
  s.replica_running = replica_running_.load(std::memory_order_acquire);
  s.decision_seconds = decision_seconds_.Snapshot();
  s.rereplication_seconds = rereplication_seconds_.Snapshot();
  return s;
}

uint16_t Coordinator::metrics_port() const {
  return metrics_http_ != nullptr ? metrics_http_->port() : 0;
}

std::vector<prometheus::MetricFamily> CoordinatorMetricFamilies(const CoordinatorStats& s) {
  metrics::Families f;
  f.Gauge("rdkv_coordinator_is_leader",
          "1 while this kvcoord is the elected coordinator of its cluster", s.leader ? 1 : 0);
  f.Counter("rdkv_coordinator_terms_total", "Times this kvcoord was elected",
            static_cast<double>(s.terms));
  f.Counter("rdkv_coordinator_decisions_total",
            "Maps committed by this coordinator (failover decisions and admissions)",
            static_cast<double>(s.maps_committed));
  f.Counter("rdkv_coordinator_failovers_total",
            "Servers taken out of their replica sets (lease expired, or restarted without "
            "durable data)",
            static_cast<double>(s.servers_failed));
  f.Counter("rdkv_coordinator_promotions_total", "Shards given a new primary (a backup promoted)",
            static_cast<double>(s.shards_promoted));
  f.Counter("rdkv_coordinator_probe_revocations_total",
            "Server leases revoked because the server's port refused a connection",
            static_cast<double>(s.probe_revocations));
  f.Counter("rdkv_coordinator_rereplications_total",
            "Catch-up copies (a replica added to a shard below the replication factor) that "
            "finished",
            static_cast<double>(s.replicas_added));
  f.Counter("rdkv_coordinator_rereplication_errors_total",
            "Catch-up copies that failed (tried again later)",
            static_cast<double>(s.replica_errors));
  f.Gauge("rdkv_coordinator_rereplication_running", "1 while a catch-up copy is under way",
          s.replica_running ? 1 : 0);
  f.Gauge("rdkv_coordinator_map_epoch",
          "Epoch of the cluster map the leader read in its latest round (0: not the leader yet)",
          static_cast<double>(s.map_epoch));
  f.Gauge("rdkv_coordinator_stranded_shards",
          "Shards with no available in-sync replica (kept on their unavailable primary)",
          static_cast<double>(s.stranded_shards));
  f.Gauge("rdkv_coordinator_under_replicated_shards",
          "Shards with fewer replicas (in sync and joining) than the map's replication_factor",
          static_cast<double>(s.under_replicated_shards));
  f.Add("rdkv_coordinator_decision_duration_seconds",
        "Seconds from a round's first etcd read to its map committed, for rounds that committed "
        "a decision",
        prometheus::MetricType::Histogram)
      .push_back(metrics::Families::HistogramMetric(s.decision_seconds));
  f.Add("rdkv_coordinator_rereplication_duration_seconds",
        "Seconds per catch-up copy, finished or failed", prometheus::MetricType::Histogram)
      .push_back(metrics::Families::HistogramMetric(s.rereplication_seconds));
  return f.Take();
}

void Coordinator::Run() {
  while (!stopping_) {
    if (!Campaign()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      continue;
    }
    Step();
    std::this_thread::sleep_for(options_.poll_interval);
  }
}

bool Coordinator::Campaign() {
  if (lease_ != nullptr && lease_->lost()) {
    if (term_revision_ != 0) {
      LOG(WARNING) << "coordinator " << options_.name
                   << ": lost its etcd lease; no longer the coordinator";
      MutexLock lock(&mu_);
      stats_.leader = false;
    }
    lease_.reset();
    term_revision_ = 0;
  }
  if (term_revision_ != 0) return true;
  if (lease_ == nullptr) {
    etcd::LeaseKeeperOptions lo;
    lo.ttl_seconds = options_.lease_ttl_seconds;
    Result<std::unique_ptr<etcd::LeaseKeeper>> lease =
        etcd::LeaseKeeper::Start(options_.etcd, lo, [](const Status&) {});
    if (!lease.ok()) {
      LOG_EVERY_N(WARNING, 50) << "coordinator " << options_.name
                               << ": cannot get an etcd lease: " << lease.status().ToString();
      return false;
    }
    lease_ = std::move(lease).value();
  }
  nlohmann::json v = {{"name", options_.name}};
  Result<etcd::PutIfResult> put = client_->PutIf(
      election_key_, v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), 0,
      lease_->lease_id());
  if (!put.ok()) {
    LOG_EVERY_N(WARNING, 50) << "coordinator " << options_.name
                             << ": election: " << put.status().ToString();
    return false;
  }
  if (!put->succeeded) {
    // The key is held. Under this process's own lease it is an earlier try of ours that
    // applied but whose answer was lost (the call then said the outcome was unknown): the
    // term is ours, and began when the key was created. Any other lease is another
    // coordinator's.
    if (!put->current || put->current->lease != lease_->lease_id()) return false;
    term_revision_ = put->current->create_revision;
    LOG(INFO) << "coordinator " << options_.name
              << ": the election key is held under this process's lease (an earlier try "
                 "applied, its answer was lost)";
  } else {
    term_revision_ = put->revision;
  }
  {
    MutexLock lock(&mu_);
    stats_.leader = true;
    ++stats_.terms;
  }
  LOG(INFO) << "coordinator " << options_.name << ": elected (term " << term_revision_ << ")";
  Event("elected",
        options_.name + " is the coordinator (term " + std::to_string(term_revision_) + ")");
  return true;
}

void Coordinator::Step() {
  const Clock::time_point t_read = Clock::now();
  Result<etcd::RangeResult> got = client_->GetPrefix(cluster::ServersPrefix(options_.cluster_name));
  if (!got.ok()) return;
  std::map<uint32_t, Registration> regs;
  std::map<uint32_t, int64_t> leases;
  const std::string prefix = cluster::ServersPrefix(options_.cluster_name);
  for (const etcd::KeyValue& kv : got->kvs) {
    if (!kv.key.starts_with(prefix)) continue;
    uint32_t id = 0;
    const char* begin = kv.key.data() + prefix.size();
    const char* end = kv.key.data() + kv.key.size();
    auto [p, ec] = std::from_chars(begin, end, id);
    if (ec != std::errc() || p != end) continue;
    Result<Registration> r = ParseRegistration(id, kv.value);
    if (!r.ok()) {
      LOG_EVERY_N(WARNING, 100) << "coordinator: ignoring " << kv.key << ": "
                                << r.status().ToString();
      continue;
    }
    regs[id] = *r;
    leases[id] = kv.lease;
  }
  Result<cluster::EtcdMap> m = cluster::LoadMap(*client_, options_.cluster_name);
  if (!m.ok()) {
    LOG_EVERY_N(WARNING, 100) << "coordinator: reading the map: " << m.status().ToString();
    return;
  }
  const Clock::time_point t_plan = Clock::now();
  if (options_.probe_interval.count() > 0 && options_.transport == "tcp" &&
      Clock::now() >= next_probe_) {
    next_probe_ = Clock::now() + options_.probe_interval;
    std::map<uint32_t, Registration> admitted;
    for (const auto& [id, r] : regs) {
      const cluster::ServerEntry* e = m->map.FindServer(id);
      if (e != nullptr && e->incarnation != 0 && e->incarnation == r.incarnation) {
        admitted[id] = r;
      }
    }
    // A revoked lease takes its registration with it: plan without it at once.
    for (uint32_t id : Probe(admitted, leases)) regs.erase(id);
  }

  FailoverPlan plan = PlanFailover(m->map, regs);
  {
    uint64_t under = 0;
    for (uint32_t sh = 0; sh < m->map.shards; ++sh) {
      size_t replicas = 1;
      if (sh < m->map.backups.size()) replicas += m->map.backups[sh].size();
      if (sh < m->map.joining.size()) replicas += m->map.joining[sh].size();
      under += replicas < m->map.replication_factor;
    }
    MutexLock lock(&mu_);
    stats_.map_epoch = m->map.epoch;
    stats_.stranded_shards = plan.stranded.size();
    stats_.under_replicated_shards = under;
  }
  if (plan.changed) {
    const Clock::time_point t0 = Clock::now();
    const size_t registrations = regs.size();
    Result<etcd::PutIfResult> put =
        client_->PutIfGuarded(cluster::MapKey(options_.cluster_name), plan.next.ToJson(),
                              m->mod_revision, etcd::CreateGuard{election_key_, term_revision_});
    if (!put.ok()) {
      LOG(WARNING) << "coordinator: committing map epoch " << plan.next.epoch << ": "
                   << put.status().ToString();
      return;
    }
    if (!put->succeeded) {
      Result<etcd::GetResult> key = client_->Get(election_key_);
      if (key.ok() && (!key->kv || key->kv->create_revision != term_revision_)) {
        LOG(WARNING) << "coordinator " << options_.name
                     << ": deposed (the election key changed); map epoch " << plan.next.epoch
                     << " not committed";
        term_revision_ = 0;
        MutexLock lock(&mu_);
        stats_.leader = false;
      }
      return;  // else the map changed meanwhile: plan again from the new one
    }
    auto ms = [](Clock::time_point a, Clock::time_point b) {
      return std::chrono::duration<double, std::milli>(b - a).count();
    };
    DecisionTiming timing;
    timing.epoch = plan.next.epoch;
    timing.failed = plan.failed;
    timing.registrations = registrations;
    timing.read_ms = ms(t_read, t_plan);
    timing.plan_ms = ms(t_plan, t0);
    timing.commit_ms = ms(t0, Clock::now());
    decision_seconds_.Observe(std::chrono::duration<double>(Clock::now() - t_read).count());
    for (const std::string& reason : plan.reasons) LOG(INFO) << "coordinator: " << reason;
    LOG(INFO) << "coordinator: committed map epoch " << plan.next.epoch << " (etcd revision "
              << put->revision << ", " << timing.commit_ms << " ms; read " << timing.read_ms
              << " ms and planned " << timing.plan_ms << " ms before, " << registrations
              << " registrations)"
              << (plan.failed.empty() ? "" : "; failed servers " + Join(plan.failed))
              << (plan.promoted.empty() ? "" : "; promoted shards " + Join(plan.promoted))
              << (plan.admitted.empty() ? "" : "; admitted servers " + Join(plan.admitted));
    {
      MutexLock lock(&mu_);
      stats_.map_epoch = plan.next.epoch;
      ++stats_.maps_committed;
      stats_.servers_failed += plan.failed.size();
      stats_.shards_promoted += plan.promoted.size();
      stats_.last_decision = timing;
    }
    if (options_.on_decision) options_.on_decision(timing);
    std::string text = "map epoch " + std::to_string(plan.next.epoch) + ":";
    for (const std::string& reason : plan.reasons) text += " " + reason + ";";
    Event(plan.failed.empty() ? "admitted" : "failover", text);
    return;
  }
  if (!plan.stranded.empty()) {
    LOG_EVERY_N(WARNING, 200) << "coordinator: shard(s) " << Join(plan.stranded)
                              << " have no available in-sync replica: they wait for server(s) "
                              << Join(plan.failed) << " to serve again";
  }
  if (options_.rereplicate && !replica_running_.load(std::memory_order_acquire)) {
    std::optional<ReplicaTask> task = NextReplicaTask(m->map, regs);
    if (task) StartReplicaTask(*task, regs);
  }
}

std::vector<uint32_t> Coordinator::Probe(const std::map<uint32_t, Registration>& regs,
                                         const std::map<uint32_t, int64_t>& leases) {
  std::vector<uint32_t> revoked;
  for (const auto& [id, r] : regs) {
    if (ProbeTcp(r.address, options_.probe_timeout) != ProbeResult::kRefused) continue;
    auto lease = leases.find(id);
    if (lease == leases.end() || lease->second == 0) continue;
    LOG(WARNING) << "coordinator: server " << id << " (" << r.address
                 << ") refuses connections: its process is gone; revoking its etcd lease "
                 << lease->second << " instead of waiting for the TTL";
    Status s = client_->LeaseRevoke(lease->second);
    if (!s.ok() && !s.Is(StatusCode::kNotFound)) {
      LOG(WARNING) << "coordinator: revoking the lease of server " << id << ": " << s.ToString();
      continue;
    }
    revoked.push_back(id);
    {
      MutexLock lock(&mu_);
      ++stats_.probe_revocations;
    }
    Event("detected", "server " + std::to_string(id) + " (" + r.address +
                          ") refused a connection: lease revoked");
  }
  return revoked;
}

void Coordinator::StartReplicaTask(const ReplicaTask& task,
                                   const std::map<uint32_t, Registration>& regs) {
  std::vector<std::string> seeds;
  for (const auto& [id, r] : regs) seeds.push_back(r.address);
  if (seeds.empty()) return;
  MutexLock lock(&mu_);
  if (replica_thread_.joinable()) replica_thread_.join();  // finished: replica_running_ false
  replica_running_.store(true, std::memory_order_release);
  LOG(INFO) << "coordinator: adding replicas (" << Describe(task.additions) << ")"
            << (task.resumed > 0
                    ? "; " + std::to_string(task.resumed) + " of them resume an interrupted copy"
                    : "");
  replica_thread_ = std::thread([this, task, seeds] {
    const Clock::time_point t0 = Clock::now();
    ClientOptions o;
    o.transport = options_.transport;
    o.auth_token = options_.auth_token;
    o.admin_token = options_.admin_token;
    o.tls.ca_file = options_.tls_ca_file;
    o.tls.cert_file = options_.tls_cert_file;
    o.tls.key_file = options_.tls_key_file;
    o.connect_timeout = std::chrono::milliseconds(2000);
    Result<std::unique_ptr<Client>> client = Status::Unavailable("no server registered");
    for (const std::string& seed : seeds) {
      o.seed = seed;
      client = Client::Connect(o);
      if (client.ok()) break;
    }
    Result<ReplicaReport> report = client.status();
    if (client.ok()) {
      Admin admin(**client);
      report = admin.AddReplicas(
          task.additions, [](std::string_view line) { LOG(INFO) << "coordinator: " << line; });
    }
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    rereplication_seconds_.Observe(s);
    if (report.ok()) {
      LOG(INFO) << "coordinator: in-sync replicas (" << Describe(task.additions)
                << "): " << report->items_copied << " items copied in " << s << " s, map epoch "
                << report->to_epoch;
      Event("replicated", Describe(task.additions) + ": in sync (" +
                              std::to_string(report->items_copied) + " items, " +
                              std::to_string(s) + " s)");
      MutexLock lock(&mu_);
      stats_.replicas_added += task.additions.size();
    } else {
      LOG(WARNING) << "coordinator: adding replicas (" << Describe(task.additions)
                   << ") failed after " << s << " s (those not in sync are tried again later): "
                   << report.status().ToString();
      MutexLock lock(&mu_);
      ++stats_.replica_errors;
    }
    if (!report.ok()) std::this_thread::sleep_for(std::chrono::milliseconds(500));
    replica_running_.store(false, std::memory_order_release);
  });
}

void Coordinator::Event(const std::string& kind, const std::string& text) {
  const auto now = std::chrono::system_clock::now();
  const uint64_t us =
      std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count();
  char key_suffix[32];
  snprintf(key_suffix, sizeof(key_suffix), "%020llu", static_cast<unsigned long long>(us));
  nlohmann::json v = {
      {"time_us", us}, {"coordinator", options_.name}, {"kind", kind}, {"text", text}};
  const std::string prefix = "/rdkv/" + options_.cluster_name + "/events/";
  // An event's text may quote a server's error, which need not be UTF-8.
  Status s = client_
                 ->Put(prefix + key_suffix,
                       v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace))
                 .status();
  if (!s.ok()) LOG(WARNING) << "coordinator: recording an event: " << s.ToString();
  // Keep the newest 1000.
  static thread_local unsigned counter = 0;
  if (++counter % 64 != 0) return;
  Result<etcd::RangeResult> all = client_->GetPrefix(prefix);
  if (!all.ok() || all->kvs.size() <= 1000) return;
  for (size_t i = 0; i + 1000 < all->kvs.size(); ++i) (void)client_->Delete(all->kvs[i].key);
}

}  // namespace rdkv::coordinator

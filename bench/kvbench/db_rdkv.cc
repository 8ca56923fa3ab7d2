// -db rdkv: the rdkv client library. One Client for the process (it is thread-safe and shares its
// connections_per_server connections per server between threads, as applications are told to
// use it); GETs are one-sided READs, writes are requests to the owning server.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>

#include "bench/kvbench/db.h"
#include "common/util/secret.h"
#include "rdkv/client.h"

namespace rdkv::kvbench {

namespace {

class RdkvDB final : public DB {
 public:
  explicit RdkvDB(Client* client) : client_(client) {}

  OpStatus Read(std::string_view key, std::string* value) override {
    auto r = client_->Get(key);
    if (r.ok()) {
      *value = std::move(r->value);
      return OpStatus::Ok();
    }
    return Map(r.status());
  }
  OpStatus Update(std::string_view key, std::string_view value) override {
    auto r = client_->Put(key, value);
    return r.ok() ? OpStatus::Ok() : Map(r.status());
  }
  OpStatus Insert(std::string_view key, std::string_view value) override {
    auto r = client_->Insert(key, value);
    return r.ok() ? OpStatus::Ok() : Map(r.status());
  }

 private:
  static OpStatus Map(const Status& s) {
    if (s.Is(StatusCode::kNotFound)) return OpStatus::NotFound();
    return OpStatus::Error(std::string(StatusCodeName(s.code())));
  }
  Client* client_;
};

class RdkvBackend final : public Backend {
 public:
  explicit RdkvBackend(std::unique_ptr<Client> client) : client_(std::move(client)) {}
  std::string name() const override { return "rdkv"; }
  Result<std::unique_ptr<DB>> NewDB() override {
    return std::unique_ptr<DB>(std::make_unique<RdkvDB>(client_.get()));
  }
  void PhaseStart() override { before_ = client_->stats(); }
  BackendReport PhaseReport() override {
    const ClientStats a = client_->stats();
    const ClientStats& b = before_;
    BackendReport r;
    r.section = "RDKV";
    const double gets = static_cast<double>(a.gets - b.gets);
    const double reads = static_cast<double>(a.get_reads - b.get_reads);
    const double rtts = static_cast<double>(a.get_round_trips - b.get_round_trips);
    r.values = {
        {"GETs", gets},
        {"READs", reads},
        {"READsPerGET", gets > 0 ? reads / gets : 0.0},
        {"RTTsPerGET", gets > 0 ? rtts / gets : 0.0},
        {"GETRetries", static_cast<double>(a.get_retries - b.get_retries)},
        {"LocationCacheHits", static_cast<double>(a.cache_hits - b.cache_hits)},
        {"LocationCacheMisses", static_cast<double>(a.cache_misses - b.cache_misses)},
        {"TornReads", static_cast<double>(a.torn_reads - b.torn_reads)},
        {"SlowReads", static_cast<double>(a.slow_reads - b.slow_reads)},
        {"Writes", static_cast<double>(a.writes - b.writes)},
        {"ClientErrors", static_cast<double>(a.errors - b.errors)},
        {"Reconnects", static_cast<double>(a.reconnects - b.reconnects)},
        {"RetiredAccepts", static_cast<double>(a.retired_accepts - b.retired_accepts)},
    };
    return r;
  }

 private:
  std::unique_ptr<Client> client_;
  ClientStats before_;
};

}  // namespace

Result<std::unique_ptr<Backend>> MakeRdkvBackend(const Properties& props) {
  ClientOptions o;
  o.seed = props.Get("rdkv.seed", "127.0.0.1:7400");
  o.transport = props.Get("rdkv.transport", "auto");
  o.device = props.Get("rdkv.device", "");
  {
    auto secret = LoadSecret(props.Get("rdkv.auth_token_file", ""), "RDKV_AUTH_TOKEN",
                             props.Get("rdkv.auth_token", ""), "rdkv.auth_token");
    if (!secret.ok()) return secret.status();
    o.auth_token = std::move(secret).value();
  }
  o.tls.ca_file = props.Get("rdkv.tls_ca_file", "");
  o.tls.cert_file = props.Get("rdkv.tls_cert_file", "");
  o.tls.key_file = props.Get("rdkv.tls_key_file", "");
  // Integer properties: absent leaves the default; below `min` is refused (Client::Connect
  // checks the upper bounds).
  auto number = [&](const char* name, long min, const char* what, long* out) -> Status {
    if (!props.Has(name)) return Status::Ok();
    const std::string v = props.Get(name);
    char* end = nullptr;
    const long n = std::strtol(v.c_str(), &end, 10);
    if (v.empty() || *end != '\0' || n < min) {
      return Status::InvalidArgument(std::string("property ") + name + " = '" + v + "': " + what);
    }
    *out = n;
    return Status::Ok();
  };
  long ms = o.op_timeout.count(), us = o.busy_poll.count(), conns = o.connections_per_server;
  RDKV_RETURN_IF_ERROR(number("rdkv.op_timeout_ms", 1, "a positive number of milliseconds", &ms));
  RDKV_RETURN_IF_ERROR(number("rdkv.busy_poll_us", 0, "microseconds, 0 or more", &us));
  RDKV_RETURN_IF_ERROR(
      number("rdkv.connections_per_server", 1, "a number of connections, 1 or more", &conns));
  o.op_timeout = std::chrono::milliseconds(ms);
  o.busy_poll = std::chrono::microseconds(us);
  o.connections_per_server = static_cast<uint32_t>(std::min(conns, 1000L));
  if (o.transport != "auto" && o.transport != "tcp" && o.transport != "verbs") {
    return Status::InvalidArgument("property rdkv.transport = '" + o.transport +
                                   "': must be auto, tcp or verbs");
  }
  auto client = Client::Connect(o);
  if (!client.ok()) {
    return Status(client.status().code(), "rdkv: cannot connect to " + o.seed + " (transport " +
                                              o.transport + "): " + client.status().ToString());
  }
  return std::unique_ptr<Backend>(std::make_unique<RdkvBackend>(std::move(*client)));
}

}  // namespace rdkv::kvbench

// -db memcached: libmemcached, one memcached_st (one connection) per client thread, ASCII
// protocol with TCP_NODELAY. A record is one item (get / set).
#include <libmemcached/memcached.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string>

#include "bench/kvbench/db.h"

namespace rdkv::kvbench {

namespace {

struct MemcFree {
  void operator()(memcached_st* m) const { memcached_free(m); }
};
using Memc = std::unique_ptr<memcached_st, MemcFree>;

std::string Kind(memcached_st* m, memcached_return_t rc) {
  std::string s = memcached_strerror(m, rc);  // "CONNECTION FAILURE" -> "CONNECTION_FAILURE"
  std::replace(s.begin(), s.end(), ' ', '_');
  return s;
}

Result<Memc> Open(const std::string& host, int port) {
  Memc m(memcached_create(nullptr));
  if (!m) return Status::Unavailable("memcached: cannot allocate a client");
  memcached_return_t rc = memcached_server_add(m.get(), host.c_str(), static_cast<in_port_t>(port));
  if (rc != MEMCACHED_SUCCESS) {
    return Status::InvalidArgument("memcached: bad server " + host + ":" + std::to_string(port) +
                                   ": " + memcached_strerror(m.get(), rc));
  }
  (void)memcached_behavior_set(m.get(), MEMCACHED_BEHAVIOR_TCP_NODELAY, 1);
  (void)memcached_behavior_set(m.get(), MEMCACHED_BEHAVIOR_CONNECT_TIMEOUT, 5000);
  (void)memcached_behavior_set(m.get(), MEMCACHED_BEHAVIOR_POLL_TIMEOUT, 5000);
  return m;
}

class MemcachedDB final : public DB {
 public:
  explicit MemcachedDB(Memc m) : m_(std::move(m)) {}

  OpStatus Read(std::string_view key, std::string* value) override {
    size_t len = 0;
    uint32_t flags = 0;
    memcached_return_t rc = MEMCACHED_SUCCESS;
    char* v = memcached_get(m_.get(), key.data(), key.size(), &len, &flags, &rc);
    if (rc == MEMCACHED_NOTFOUND) return OpStatus::NotFound();
    if (rc != MEMCACHED_SUCCESS) {
      std::free(v);
      return OpStatus::Error(Kind(m_.get(), rc));
    }
    if (v) {
      value->assign(v, len);
      std::free(v);
    } else {
      value->clear();
    }
    return OpStatus::Ok();
  }
  OpStatus Update(std::string_view key, std::string_view value) override { return Set(key, value); }
  OpStatus Insert(std::string_view key, std::string_view value) override { return Set(key, value); }

 private:
  OpStatus Set(std::string_view key, std::string_view value) {
    memcached_return_t rc =
        memcached_set(m_.get(), key.data(), key.size(), value.data(), value.size(), 0, 0);
    return rc == MEMCACHED_SUCCESS ? OpStatus::Ok() : OpStatus::Error(Kind(m_.get(), rc));
  }
  Memc m_;
};

class MemcachedBackend final : public Backend {
 public:
  MemcachedBackend(std::string host, int port) : host_(std::move(host)), port_(port) {}
  std::string name() const override { return "memcached"; }
  Result<std::unique_ptr<DB>> NewDB() override {
    auto m = Open(host_, port_);
    if (!m.ok()) return m.status();
    return std::unique_ptr<DB>(std::make_unique<MemcachedDB>(std::move(*m)));
  }

 private:
  std::string host_;
  int port_;
};

}  // namespace

Result<int> ParsePortProperty(const Properties& props, const std::string& name, int fallback);

Result<std::unique_ptr<Backend>> MakeMemcachedBackend(const Properties& props) {
  const std::string host = props.Get("memcached.host", "127.0.0.1");
  auto port = ParsePortProperty(props, "memcached.port", 11211);
  if (!port.ok()) return port.status();
  // Fail early with a clear message when nothing answers.
  auto m = Open(host, *port);
  if (!m.ok()) return m.status();
  memcached_return_t rc = MEMCACHED_SUCCESS;
  size_t len = 0;
  uint32_t flags = 0;
  char* v = memcached_get(m->get(), "kvbench:probe", 13, &len, &flags, &rc);
  std::free(v);
  if (rc != MEMCACHED_SUCCESS && rc != MEMCACHED_NOTFOUND) {
    return Status::Unavailable("memcached: cannot use " + host + ":" + std::to_string(*port) +
                               ": " + memcached_strerror(m->get(), rc));
  }
  return std::unique_ptr<Backend>(std::make_unique<MemcachedBackend>(host, *port));
}

}  // namespace rdkv::kvbench

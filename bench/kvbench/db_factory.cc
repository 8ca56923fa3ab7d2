#include <charconv>
#include <memory>
#include <string>

#include "bench/kvbench/db.h"

namespace rdkv::kvbench {

#ifdef KVBENCH_HAVE_RDKV
Result<std::unique_ptr<Backend>> MakeRdkvBackend(const Properties& props);
#endif
#ifdef KVBENCH_HAVE_REDIS
Result<std::unique_ptr<Backend>> MakeRedisBackend(const Properties& props);
#endif
#ifdef KVBENCH_HAVE_MEMCACHED
Result<std::unique_ptr<Backend>> MakeMemcachedBackend(const Properties& props);
#endif

Result<int> ParsePortProperty(const Properties& props, const std::string& name, int fallback) {
  if (!props.Has(name)) return fallback;
  const std::string v = props.Get(name);
  int port = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), port);
  if (v.empty() || ec != std::errc() || p != v.data() + v.size() || port < 1 || port > 65535) {
    return Status::InvalidArgument("property " + name + " = '" + v + "': a port, 1..65535");
  }
  return port;
}

std::vector<std::string> AvailableBackends() {
  std::vector<std::string> v;
#ifdef KVBENCH_HAVE_RDKV
  v.push_back("rdkv");
#endif
#ifdef KVBENCH_HAVE_REDIS
  v.push_back("redis");
#endif
#ifdef KVBENCH_HAVE_MEMCACHED
  v.push_back("memcached");
#endif
  return v;
}

Result<std::unique_ptr<Backend>> MakeBackend(const std::string& db, const Properties& props) {
#ifdef KVBENCH_HAVE_RDKV
  if (db == "rdkv") return MakeRdkvBackend(props);
#endif
#ifdef KVBENCH_HAVE_REDIS
  if (db == "redis") return MakeRedisBackend(props);
#endif
#ifdef KVBENCH_HAVE_MEMCACHED
  if (db == "memcached") return MakeMemcachedBackend(props);
#endif
  if (db == "rdkv" || db == "redis" || db == "memcached") {
    return Status::NotSupported("this kvbench was built without the " + db +
                                " backend (rdkv: the rdkv_client target; redis: libhiredis-dev; "
                                "memcached: libmemcached-dev; deploy/install-deps.sh --bench)");
  }
  return Status::InvalidArgument("unknown -db '" + db + "': rdkv, redis or memcached");
}

}  // namespace rdkv::kvbench

// hello: a first rdkv application. Connects to a kvserver, then Put / Get / Cas / Delete one
// key and prints what happens; then, as an operator tool would (rdkv/admin.h), lists the
// servers the client sees. Exits 0 when every result is the expected one, 1 otherwise.
//
//   hello HOST:PORT [TRANSPORT]       TRANSPORT: auto (default), tcp or verbs
#include <rdkv/admin.h>
#include <rdkv/client.h>

#include <cstdio>
#include <string>
#include <vector>

namespace {

int failures = 0;

void Expect(bool ok, const std::string& what) {
  std::printf("%-52s %s\n", what.c_str(), ok ? "ok" : "UNEXPECTED");
  if (!ok) ++failures;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    std::fprintf(stderr, "usage: %s HOST:PORT [auto|tcp|verbs]\n", argv[0]);
    return 2;
  }
  rdkv::ClientOptions options;
  options.seed = argv[1];
  if (argc == 3) options.transport = argv[2];

  // One Client per process; it is thread-safe and owns its connection.
  rdkv::Result<std::unique_ptr<rdkv::Client>> connected = rdkv::Client::Connect(options);
  if (!connected.ok()) {
    std::fprintf(stderr, "cannot connect to %s: %s\n", argv[1],
                 connected.status().ToString().c_str());
    return 1;
  }
  rdkv::Client& kv = **connected;
  const std::string key = "hello:greeting";

  rdkv::Result<uint64_t> v1 = kv.Put(key, "hello, world");
  Expect(v1.ok(),
         "Put(" + key + ") -> version " + (v1.ok() ? std::to_string(*v1) : v1.status().ToString()));
  if (!v1.ok()) return 1;

  rdkv::Result<rdkv::GetResult> got = kv.Get(key);
  Expect(got.ok() && got->value == "hello, world" && got->version == *v1,
         "Get -> " + (got.ok() ? "'" + got->value + "' version " + std::to_string(got->version)
                               : got.status().ToString()));

  rdkv::Result<uint64_t> v2 = kv.Cas(key, *v1, "hello again");
  Expect(v2.ok() && *v2 > *v1,
         "Cas(expected " + std::to_string(*v1) + ") -> " +
             (v2.ok() ? "version " + std::to_string(*v2) : v2.status().ToString()));

  rdkv::Result<uint64_t> stale = kv.Cas(key, *v1, "lost update");
  Expect(stale.status().Is(rdkv::StatusCode::kVersionMismatch),
         "Cas(stale " + std::to_string(*v1) + ") -> " + stale.status().ToString());

  got = kv.Get(key);
  Expect(got.ok() && got->value == "hello again",
         "Get -> " + (got.ok() ? "'" + got->value + "'" : got.status().ToString()));

  rdkv::Status deleted = kv.Delete(key);
  Expect(deleted.ok(), "Delete -> " + deleted.ToString());

  got = kv.Get(key);
  Expect(got.status().Is(rdkv::StatusCode::kNotFound),
         "Get after Delete -> " + got.status().ToString());

  // Operator calls take the connected Client; applications need only rdkv/client.h.
  rdkv::Admin admin(kv);
  std::vector<rdkv::ServerInfo> servers = admin.Servers(/*with_stats=*/false);
  Expect(servers.size() == 1 && servers[0].reachable,
         "Admin::Servers -> " + std::to_string(servers.size()) + " server(s), map epoch " +
             std::to_string(admin.map_epoch()));

  rdkv::ClientStats stats = kv.stats();
  std::printf("%llu GETs took %llu one-sided READs\n", static_cast<unsigned long long>(stats.gets),
              static_cast<unsigned long long>(stats.get_reads));
  std::printf("%s\n", failures == 0 ? "hello: all results as expected" : "hello: FAILED");
  return failures == 0 ? 0 : 1;
}

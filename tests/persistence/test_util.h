// Helpers for the persistence tests: a temporary directory, an in-process "node" (region,
// Store, Persister, Service: the kvserver without its transport), and a fingerprint of a
// directory tree to prove a failed start left it untouched.
#pragma once

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "common/kv/wire.h"
#include "server/persistence/persister.h"
#include "server/service.h"
#include "server/store.h"

namespace rdkv::testing {

namespace fs = std::filesystem;
using server::Service;
using server::Store;
using server::persistence::Durability;
using server::persistence::Persister;
using server::persistence::PersistOptions;
using server::persistence::RecoveryStats;

class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "rdkv-persist") {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/" + prefix + "-XXXXXX";
    char* p = mkdtemp(tmpl.data());
    EXPECT_NE(p, nullptr);
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string sub(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

struct Reply {
  Status status;
  uint64_t version = 0;
  std::string body;
};

class Node {
 public:
  static Result<std::unique_ptr<Node>> Start(PersistOptions o, size_t region_bytes = 8u << 20,
                                             uint64_t max_value_bytes = 64u << 10) {
    auto n = std::unique_ptr<Node>(new Node());
    n->region_.assign(region_bytes, 0);
    server::StoreOptions so;
    so.max_value_bytes = max_value_bytes;
    so.grace = std::chrono::milliseconds(1);
    RDKV_ASSIGN_OR_RETURN(n->store_, Store::Format(n->region_.data(), region_bytes, so));
    o.max_value_bytes = max_value_bytes;
    RDKV_ASSIGN_OR_RETURN(n->persister_, Persister::Start(o, n->store_.get(), &n->recovered_));
    n->service_ = std::make_unique<Service>(
        n->store_.get(), kv::WireLimits{kv::kMaxKeyBytes, max_value_bytes}, n->persister_.get());
    return n;
  }
  ~Node() {
    persister_.reset();  // drains: completions still call into the service
    service_.reset();
  }

  Reply Call(kv::Op op, std::string_view key, std::string_view value = {}, uint64_t expected = 0) {
    std::vector<uint8_t> req, resp;
    kv::EncodeRequest({op, key, value, expected}, &req);
    service_->Handle(req, &resp);
    Result<kv::Response> r = kv::DecodeResponse(resp);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    if (!r.ok()) return {r.status(), 0, {}};
    return {r->status, r->version, std::string(r->body)};
  }
  Reply Put(std::string_view k, std::string_view v) { return Call(kv::Op::kPut, k, v); }
  Reply Insert(std::string_view k, std::string_view v) { return Call(kv::Op::kInsert, k, v); }
  Reply Cas(std::string_view k, uint64_t expected, std::string_view v) {
    return Call(kv::Op::kCas, k, v, expected);
  }
  Reply Delete(std::string_view k) { return Call(kv::Op::kDelete, k); }

  Store& store() { return *store_; }
  Service& service() { return *service_; }
  Persister* persister() { return persister_.get(); }
  const RecoveryStats& recovered() const { return recovered_; }

 private:
  Node() = default;
  std::vector<uint8_t> region_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<Persister> persister_;
  std::unique_ptr<Service> service_;
  RecoveryStats recovered_;
};

// Every file under `dir` with its size, modification time and contents.
inline std::map<std::string, std::string> Fingerprint(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const fs::directory_entry& e : fs::recursive_directory_iterator(dir)) {
    struct stat st {};
    ::lstat(e.path().c_str(), &st);
    std::ostringstream f;
    f << st.st_mode << ' ' << st.st_size << ' ' << st.st_mtim.tv_sec << '.' << st.st_mtim.tv_nsec;
    if (e.is_regular_file()) {
      std::ifstream in(e.path(), std::ios::binary);
      f << ' ' << std::hash<std::string>{}(std::string(std::istreambuf_iterator<char>(in), {}));
    }
    out[fs::relative(e.path(), dir).string()] = f.str();
  }
  return out;
}

}  // namespace rdkv::testing

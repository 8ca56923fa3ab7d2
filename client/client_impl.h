// ClientImpl: the Client the library hands out, a facade over parts of one job each (see
// docs/design.md "Parts"): Links (connections), Caller (one request/response), Router (the
// map and re-routing), GetEngine (GETs by one-sided READs), Writer (writes) and ClusterAdmin
// (operator calls, reached through rdkv::Admin).
//
// Ownership: owns the fabric and every part; members are destroyed bottom-up, so the links
// (connections) go before the scratch pool and the fabric.
// Thread-safety: as Client (every call from any thread).
#pragma once

#include <memory>

#include "client/call.h"
#include "client/cluster_admin.h"
#include "client/counters.h"
#include "client/get_engine.h"
#include "client/links.h"
#include "client/read_buffers.h"
#include "client/router.h"
#include "client/writer.h"
#include "common/transport/transport.h"
#include "rdkv/client.h"

namespace rdkv::client {

class ClientImpl final : public Client {
 public:
  ClientImpl(const ClientOptions& options, ServerAddress seed,
             std::unique_ptr<transport::Fabric> fabric);

  // Connects to the seed and asks it for the cluster map (Router::Init).
  Status Init() { return router_.Init(); }

  Result<GetResult> Get(std::string_view key) override { return engine_.Get(key); }
  std::vector<Result<GetResult>> MultiGet(std::span<const std::string_view> keys) override {
    return engine_.MultiGet(keys);
  }
  Result<uint64_t> Put(std::string_view key, std::string_view value) override {
    return writer_.Write(kv::Op::kPut, key, value, 0);
  }
  Result<uint64_t> Insert(std::string_view key, std::string_view value) override {
    return writer_.Write(kv::Op::kInsert, key, value, 0);
  }
  Status Delete(std::string_view key) override {
    return writer_.Write(kv::Op::kDelete, key, {}, 0).status();
  }
  Result<uint64_t> Cas(std::string_view key, uint64_t expected_version,
                       std::string_view value) override {
    return writer_.Write(kv::Op::kCas, key, value, expected_version);
  }
  Result<std::string> Stats() override { return admin_.Stats(); }
  Status Ping() override;
  ClientStats stats() const override { return counters_.Snapshot(); }
  uint64_t max_value_bytes() const override { return links_.max_value_bytes(); }

  // For rdkv::Admin.
  ClusterAdmin& admin() { return admin_; }
  const Router& router() const { return router_; }

 private:
  const ClientOptions options_;
  std::unique_ptr<transport::Fabric> fabric_;
  ScratchPool pool_;
  Counters counters_;
  Links links_;
  Caller caller_;
  Router router_;
  GetEngine engine_;
  Writer writer_;
  ClusterAdmin admin_;
};

}  // namespace rdkv::client

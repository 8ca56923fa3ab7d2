// TcpFabric: the software NIC's "device". Regions are MappedMemory with random keys, kept in a
// registry the NIC threads check every READ against; Listen/Connect build the tcp listener and
// connection (tcp_listener.cc, tcp_connection.cc). See docs/transport-tcp.md.
#include "common/transport/tcp/tcp_fabric.h"

#include "common/transport/memory.h"
#include "common/transport/tcp/region_registry.h"
#include "common/transport/tcp/tcp_connection.h"
#include "common/transport/tcp/tcp_listener.h"
#include "common/util/resolve.h"

namespace rdkv::transport {

namespace {

using tcp::RegionRegistry;

class TcpMemoryRegion final : public MemoryRegion {
 public:
  TcpMemoryRegion(MappedMemory memory, std::shared_ptr<RegionRegistry> registry,
                  RegionAccess access)
      : memory_(std::move(memory)), registry_(std::move(registry)) {
    keys_ = registry_->Register(memory_.data(), memory_.size(), access);
  }
  // Deregisters first (waiting for any READ copying out of it), then unmaps.
  ~TcpMemoryRegion() override { registry_->Unregister(keys_); }

  uint8_t* data() const override { return memory_.data(); }
  size_t size() const override { return memory_.size(); }
  uint32_t lkey() const override { return keys_.lkey; }
  uint32_t rkey() const override { return keys_.rkey; }
  bool huge_pages() const override { return memory_.huge_pages(); }

 private:
  MappedMemory memory_;
  std::shared_ptr<RegionRegistry> registry_;
  RegionRegistry::Keys keys_;
};

class TcpFabric final : public Fabric {
 public:
  explicit TcpFabric(const FabricOptions& options)
      : options_(options), registry_(std::make_shared<RegionRegistry>()) {}

  TransportKind kind() const override { return TransportKind::kTcp; }
  std::string Describe() const override { return "tcp (software NIC)"; }

  Result<std::unique_ptr<MemoryRegion>> AllocateRegion(size_t size, RegionAccess access) override {
    auto memory = MappedMemory::Allocate(size, options_.huge_pages);
    if (!memory.ok()) return memory.status();
    return std::unique_ptr<MemoryRegion>(
        std::make_unique<TcpMemoryRegion>(std::move(memory).value(), registry_, access));
  }

  Result<std::unique_ptr<Listener>> Listen(ListenOptions options) override {
    return tcp::CreateTcpListener(std::move(options), registry_);
  }

  Result<std::unique_ptr<Connection>> Connect(const ConnectOptions& options) override {
    return tcp::CreateTcpConnection(options, registry_);
  }

  Status CheckListenPort(const std::string& what, const std::string& host,
                         uint16_t port) override {
    return CheckTcpPortFree(what, host, port);
  }

 private:
  const FabricOptions options_;
  const std::shared_ptr<RegionRegistry> registry_;
};

}  // namespace

Result<std::unique_ptr<Fabric>> CreateTcpFabric(const FabricOptions& options) {
  return std::unique_ptr<Fabric>(std::make_unique<TcpFabric>(options));
}

}  // namespace rdkv::transport

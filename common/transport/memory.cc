#include "common/transport/memory.h"

#include <glog/logging.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <utility>

namespace rdkv::transport {

namespace {
constexpr size_t kHugePage = 2u << 20;
std::atomic<bool> g_logged_fallback{false};

size_t RoundUp(size_t v, size_t to) { return (v + to - 1) / to * to; }
}  // namespace

MappedMemory::~MappedMemory() {
  if (data_ != nullptr) munmap(data_, mapped_size_);
}

MappedMemory::MappedMemory(MappedMemory&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)),
      size_(std::exchange(o.size_, 0)),
      mapped_size_(std::exchange(o.mapped_size_, 0)),
      huge_(std::exchange(o.huge_, false)) {}

MappedMemory& MappedMemory::operator=(MappedMemory&& o) noexcept {
  if (this != &o) {
    if (data_ != nullptr) munmap(data_, mapped_size_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    mapped_size_ = std::exchange(o.mapped_size_, 0);
    huge_ = std::exchange(o.huge_, false);
  }
  return *this;
}

Result<MappedMemory> MappedMemory::Allocate(size_t size, bool try_huge_pages) {
  if (size == 0) return Status::InvalidArgument("cannot allocate a zero-byte region");
  MappedMemory m;
  m.size_ = size;
  if (try_huge_pages && size >= kHugePage) {
    size_t len = RoundUp(size, kHugePage);
    void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB | MAP_POPULATE, -1, 0);
    if (p != MAP_FAILED) {
      m.data_ = static_cast<uint8_t*>(p);
      m.mapped_size_ = len;
      m.huge_ = true;
      return m;
    }
    int err = errno;
    if (!g_logged_fallback.exchange(true)) {
      LOG(INFO) << "huge pages unavailable for a " << size << "-byte region (" << strerror(err)
                << "; see /proc/sys/vm/nr_hugepages): using normal pages with THP advice";
    }
  }
  size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  size_t len = RoundUp(size, page);
  void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return Status::FromErrno("mmap of " + std::to_string(len) + " bytes", errno);
  if (try_huge_pages) madvise(p, len, MADV_HUGEPAGE);  // advice only; failure is harmless
  m.data_ = static_cast<uint8_t*>(p);
  m.mapped_size_ = len;
  return m;
}

}  // namespace rdkv::transport

// Page-aligned anonymous memory for registered regions, with huge pages when the system has them.
#pragma once

#include <cstddef>
#include <cstdint>

#include "rdkv/status.h"

namespace rdkv::transport {

// Owns one mmap'd block. Move-only. Zero-filled on allocation.
class MappedMemory {
 public:
  MappedMemory() = default;
  ~MappedMemory();
  MappedMemory(MappedMemory&& other) noexcept;
  MappedMemory& operator=(MappedMemory&& other) noexcept;
  MappedMemory(const MappedMemory&) = delete;
  MappedMemory& operator=(const MappedMemory&) = delete;

  // Tries explicit 2 MiB huge pages (MAP_HUGETLB) when `try_huge_pages` and the size is at
  // least one huge page; falls back to normal pages with transparent-huge-page advice, logging
  // the reason once per process. kIoError when even normal pages cannot be mapped.
  static Result<MappedMemory> Allocate(size_t size, bool try_huge_pages);

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  bool huge_pages() const { return huge_; }

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;         // what the caller asked for
  size_t mapped_size_ = 0;  // rounded up to the page size used
  bool huge_ = false;
};

}  // namespace rdkv::transport

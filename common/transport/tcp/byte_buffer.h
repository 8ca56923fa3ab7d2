// A growable FIFO byte buffer for socket I/O: bytes are appended at the tail and consumed at the
// head. Capacity only grows (and only when a frame larger than anything seen before passes), so
// in steady state appending and consuming allocate nothing. Not thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>

namespace rdkv::transport::tcp {

class ByteBuffer {
 public:
  explicit ByteBuffer(size_t initial_capacity = 0) { Reserve(initial_capacity); }

  // Bytes appended and not yet consumed.
  std::span<const uint8_t> readable() const { return {buf_.get() + head_, tail_ - head_}; }
  size_t size() const { return tail_ - head_; }
  bool empty() const { return head_ == tail_; }
  size_t capacity() const { return cap_; }

  void Consume(size_t n) {
    head_ += n;
    if (head_ == tail_) head_ = tail_ = 0;
  }
  void Clear() { head_ = tail_ = 0; }

  // Makes at least `n` contiguous bytes writable after the tail (compacting, then growing).
  // Returns the writable span; call Commit() with how many were written.
  std::span<uint8_t> PrepareWrite(size_t n) {
    if (cap_ - tail_ < n) {
      if (cap_ - size() >= n && head_ > 0) {
        Compact();
      } else {
        Grow(size() + n);
      }
    }
    return {buf_.get() + tail_, cap_ - tail_};
  }
  void Commit(size_t n) { tail_ += n; }

  void Append(const void* data, size_t n) {
    if (n == 0) return;
    std::memcpy(PrepareWrite(n).data(), data, n);
    Commit(n);
  }

  // Ensures a capacity of at least `total` bytes (e.g. a whole frame whose header has arrived).
  void Reserve(size_t total) {
    if (total > cap_) Grow(total);
  }

 private:
  void Compact() {
    size_t n = size();
    if (n > 0 && head_ > 0) std::memmove(buf_.get(), buf_.get() + head_, n);
    head_ = 0;
    tail_ = n;
  }
  void Grow(size_t need) {
    size_t cap = cap_ == 0 ? 4096 : cap_;
    while (cap < need) cap *= 2;
    std::unique_ptr<uint8_t[]> nb(
        new uint8_t[cap]);  // not zero-filled: every byte is written first
    size_t n = size();
    if (n > 0) std::memcpy(nb.get(), buf_.get() + head_, n);
    buf_ = std::move(nb);
    cap_ = cap;
    head_ = 0;
    tail_ = n;
  }

  std::unique_ptr<uint8_t[]> buf_;
  size_t cap_ = 0;
  size_t head_ = 0;
  size_t tail_ = 0;
};

}  // namespace rdkv::transport::tcp

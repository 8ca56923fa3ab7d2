// libFuzzer target: what a client decodes from bytes it READ from a server's region in layout
// version 2 (common/kv/layout.h): the two candidate buckets of a key (BucketsOf, for any hash and
// bucket count), the slot words of two bucket images and the bounds check a slot must pass before
// its item is READ (SlotItemOffset), and the item check (CheckItem) of the bytes such a READ
// would return. None may crash, read out of bounds, or accept what it should not.
//
// Input: bucket_count u32 | heap_bytes u32 | key_len u8 | key | 2 bucket images (1024 B, zero
// padded) | item bytes (the rest).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <vector>

#include "common/kv/layout.h"

namespace kv = rdkv::kv;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 9) return 0;
  uint32_t buckets;
  uint32_t heap;
  std::memcpy(&buckets, data, 4);
  std::memcpy(&heap, data + 4, 4);
  size_t key_len = data[8];
  data += 9;
  size -= 9;
  if (key_len == 0 || key_len > size) return 0;
  std::string_view key(reinterpret_cast<const char*>(data), key_len);
  data += key_len;
  size -= key_len;

  // The candidate buckets: in range and different for every hash and bucket count >= 2.
  const uint64_t hash = kv::KeyHash(key);
  const uint64_t n = uint64_t{buckets} + 2;
  const kv::Buckets b = kv::BucketsOf(hash, kv::SecondHash(key), n);
  if (b.b[0] >= n || b.b[1] >= n || b.b[0] == b.b[1]) std::abort();

  // The bucket images as a READ returned them (whatever the server, or a torn write, left).
  std::vector<uint8_t> images(kv::kChoices * kv::kBucketBytes, 0);
  const size_t take = std::min(size, images.size());
  std::memcpy(images.data(), data, take);
  data += take;
  size -= take;
  kv::RegionHeader h{};
  h.heap_offset = kv::kHeaderBytes + n * kv::kBucketBytes;
  h.heap_bytes = uint64_t{heap} * kv::kUnit;
  const uint16_t fp = kv::FingerprintOf(hash);
  if (fp == 0) std::abort();
  // The item bytes a candidate's READ would return: each length the slot could ask for.
  const std::vector<uint8_t> item(data, data + size);
  // The candidate masks a GET takes are exactly the used slots with the key's fingerprint.
  uint64_t masks[kv::kChoices];
  for (size_t c = 0; c < kv::kChoices; ++c) {
    masks[c] = kv::MatchFingerprints(images.data() + c * kv::kBucketBytes, fp);
  }
  for (size_t s = 0; s < kv::kCandidateSlots; ++s) {
    uint64_t word;
    std::memcpy(&word, images.data() + s * 8, 8);
    const bool candidate = word != 0 && kv::UnpackSlot(word).fingerprint == fp;
    const bool in_mask = (masks[s / kv::kSlotsPerBucket] >> (s % kv::kSlotsPerBucket) & 1u) != 0;
    if (candidate != in_mask) std::abort();
    if (word == 0) continue;
    const kv::SlotFields f = kv::UnpackSlot(word);
    if (kv::PackSlot(f) != word) std::abort();  // the slot word round-trips
    if (f.fingerprint != fp) continue;
    auto off = kv::SlotItemOffset(h, f);
    if (!off.has_value()) continue;
    const uint64_t len = uint64_t{f.units} * kv::kUnit;
    if (*off < h.heap_offset || *off + len > h.heap_offset + h.heap_bytes) std::abort();
    const size_t n_read = std::min<size_t>(item.size(), len);
    std::string_view value;
    uint64_t version = 0;
    if (kv::CheckItem(item.data(), n_read, key, &value, &version) == kv::ItemCheck::kOk) {
      // Accepted: the value lies inside the bytes read, after the header and the key.
      const char* lo = reinterpret_cast<const char*>(item.data());
      if (value.data() < lo + sizeof(kv::ItemHeader) + key.size() ||
          value.data() + value.size() > lo + n_read) {
        std::abort();
      }
      kv::ItemHeader ih;
      std::memcpy(&ih, item.data(), sizeof(ih));
      if (ih.state != kv::kStateLive || ih.version != version) std::abort();
    }
  }
  return 0;
}

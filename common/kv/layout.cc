#include "common/kv/layout.h"

// Inlined here (the same XXH3 as the shared library's, which the layout tests compare against):
// every GET hashes its key and checksums its item, and a call through the PLT into
// libxxhash costs more than hashing a small key.
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace rdkv::kv {

uint64_t KeyHash(std::string_view key) { return XXH3_64bits(key.data(), key.size()); }

uint64_t SecondHash(std::string_view key) {
  return XXH3_64bits_withSeed(key.data(), key.size(), kSecondHashSeed);
}

uint64_t Checksum(const void* data, size_t n) { return XXH3_64bits(data, n); }

uint64_t StateMix(uint32_t state) { return XXH3_64bits_withSeed(&state, sizeof(state), 0x5eed); }

uint64_t ItemChecksum(const ItemHeader& h, std::string_view key, std::string_view value) {
  // The header from key_bytes up to the checksum; the state enters through StateMix.
  static_assert(offsetof(ItemHeader, state) == 0 && offsetof(ItemHeader, key_bytes) == 4);
  constexpr size_t kHeaderPart = offsetof(ItemHeader, checksum) - 4;
  // Small items (every GET of a small value checks one): one call over a contiguous copy, the
  // same hash as the streaming form below (XXH3's streaming and one-shot forms agree), at a
  // fraction of its cost.
  constexpr size_t kContiguous = 256;
  if (kHeaderPart + key.size() + value.size() <= kContiguous) {
    uint8_t buf[kContiguous];
    std::memcpy(buf, reinterpret_cast<const uint8_t*>(&h) + 4, kHeaderPart);
    if (!key.empty()) std::memcpy(buf + kHeaderPart, key.data(), key.size());
    if (!value.empty()) std::memcpy(buf + kHeaderPart + key.size(), value.data(), value.size());
    return XXH3_64bits(buf, kHeaderPart + key.size() + value.size()) ^ StateMix(h.state);
  }
  XXH3_state_t st;
  XXH3_64bits_reset(&st);
  XXH3_64bits_update(&st, reinterpret_cast<const uint8_t*>(&h) + 4, kHeaderPart);
  XXH3_64bits_update(&st, key.data(), key.size());
  XXH3_64bits_update(&st, value.data(), value.size());
  return XXH3_64bits_digest(&st) ^ StateMix(h.state);
}

uint64_t MatchFingerprints(const uint8_t* bucket, uint16_t fingerprint) {
  uint64_t mask = 0;
#if defined(__SSE2__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  // Two slots per 16-byte load. A slot's fingerprint is its top 16 bits, so after a 16-bit
  // compare the top bit of each 64-bit lane says whether that slot's fingerprint matched, and
  // movemask_pd collects those two bits.
  const __m128i want = _mm_set1_epi16(static_cast<int16_t>(fingerprint));
  auto pair = [&](size_t s) {
    const __m128i words = _mm_loadu_si128(reinterpret_cast<const __m128i*>(bucket + s * 8));
    return static_cast<uint64_t>(_mm_movemask_pd(_mm_castsi128_pd(_mm_cmpeq_epi16(words, want))));
  };
  for (size_t s = 0; s < kSlotsPerBucket; s += 8) {
    const uint64_t eight = pair(s) | pair(s + 2) << 2 | pair(s + 4) << 4 | pair(s + 6) << 6;
    mask |= eight << s;
  }
#else
  for (size_t s = 0; s < kSlotsPerBucket; ++s) {
    uint64_t word;
    std::memcpy(&word, bucket + s * 8, 8);
    if (UnpackSlot(word).fingerprint == fingerprint) mask |= uint64_t{1} << s;
  }
#endif
  return mask;
}

uint64_t HeaderChecksum(const RegionHeader& h) {
  return Checksum(&h, offsetof(RegionHeader, header_checksum));
}

ItemCheck CheckItem(const uint8_t* bytes, size_t n, std::string_view key, std::string_view* value,
                    uint64_t* version) {
  if (n < sizeof(ItemHeader)) return ItemCheck::kTooShort;
  ItemHeader h;
  std::memcpy(&h, bytes, sizeof(h));
  // Lengths first: a torn or reused header may hold anything.
  if (h.key_bytes != key.size() || h.key_bytes > kMaxKeyBytes) return ItemCheck::kWrongKey;
  uint64_t need = uint64_t{sizeof(ItemHeader)} + h.key_bytes + h.value_bytes;
  if (need > n || h.units == 0 || uint64_t{h.units} * kUnit < need) return ItemCheck::kBadLengths;
  const char* k = reinterpret_cast<const char*>(bytes + sizeof(ItemHeader));
  if (std::string_view(k, h.key_bytes) != key) return ItemCheck::kWrongKey;
  std::string_view v(k + h.key_bytes, h.value_bytes);
  if (ItemChecksum(h, key, v) != h.checksum) return ItemCheck::kBadChecksum;
  if (h.state != kStateLive && h.state != kStateDead) return ItemCheck::kPending;
  *value = v;
  *version = h.version;
  return h.state == kStateLive ? ItemCheck::kOk : ItemCheck::kDead;
}

Geometry ComputeGeometry(uint64_t region_bytes, double index_fraction) {
  Geometry g;
  g.index_offset = kHeaderBytes;
  if (region_bytes < kHeaderBytes + 2 * kBucketBytes + 64 * kUnit) return g;  // too small
  index_fraction = std::clamp(index_fraction, 0.001, 0.5);
  uint64_t index_budget = static_cast<uint64_t>(static_cast<double>(region_bytes) * index_fraction);
  g.bucket_count = std::max<uint64_t>(2, index_budget / kBucketBytes);
  g.heap_offset = g.index_offset + g.bucket_count * kBucketBytes;
  g.heap_offset = (g.heap_offset + kUnit - 1) / kUnit * kUnit;
  if (g.heap_offset >= region_bytes) return Geometry{};
  g.heap_bytes = (region_bytes - g.heap_offset) / kUnit * kUnit;
  // Offsets are 32 bits of kUnit units (128 GiB of heap).
  g.heap_bytes = std::min<uint64_t>(g.heap_bytes, (uint64_t{1} << 32) * kUnit);
  return g;
}

}  // namespace rdkv::kv

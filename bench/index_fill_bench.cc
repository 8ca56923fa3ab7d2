// Index v2 (issue 13): how full the index gets before its first refusal, and how many bytes a
// small item costs.
//
// Phase 1 (slot use at the first refusal, uniformly random 16-byte keys, 32-byte values): the
// real Store (layout version 2: two candidate buckets of 64 slots) against an exact model of
// layout version 1's placement on the same number of slots (home bucket (hash >> 20) % n of
// 8-slot buckets, first empty slot of the 16-slot window b, b+1), in the same process with the
// same keys. Printed as fractions and as the ratio v2 / v1.
//
// Phase 2 (bytes per item): a region of --region_mib with the default --index_fraction filled
// with the same small items until the first refusal: which part ran out, heap bytes per item
// (allocator units in use / items), index bytes per item, region bytes per item.
//
//   build/ci/bench/index_fill_bench [--buckets=16384] [--seeds=3] [--region_mib=256]
#include <gflags/gflags.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/kv/layout.h"
#include "server/store.h"

DEFINE_uint64(buckets, 16384,
              "Phase 1: index buckets of 64 slots (the v1 model gets as many slots)");
DEFINE_int32(seeds, 3, "Phase 1: runs with different random keys");
DEFINE_uint64(region_mib, 256, "Phase 2: region size with the default index fraction");

namespace {

using rdkv::server::Store;
using rdkv::server::StoreOptions;
namespace kv = rdkv::kv;

std::string RandomKey(std::mt19937_64& rng) {
  std::string key(16, '\0');
  uint64_t a = rng(), b = rng();
  std::memcpy(key.data(), &a, 8);
  std::memcpy(key.data() + 8, &b, 8);
  return key;
}

// Layout version 1's placement, exactly: 8-slot buckets, window = home bucket and the next.
double V1FirstRefusal(uint64_t slots, uint64_t seed) {
  const uint64_t n = slots / 8;
  std::vector<uint8_t> used(n + 1, 0);
  std::mt19937_64 rng(seed);
  for (uint64_t placed = 0;; ++placed) {
    std::string key = RandomKey(rng);
    uint64_t b = (kv::KeyHash(key) >> 20) % n;
    if (used[b] < 8) {
      ++used[b];
    } else if (used[b + 1] < 8) {
      ++used[b + 1];
    } else {
      return double(placed) / double(slots);
    }
  }
}

struct Fill {
  uint64_t items = 0;
  std::string refusal;
  uint64_t bucket_count = 0;
  uint64_t used_units = 0;
  uint64_t heap_bytes = 0;
};

Fill FillStore(uint64_t region_bytes, double index_fraction, uint64_t seed) {
  std::vector<uint8_t> region(region_bytes);
  StoreOptions o;
  o.index_fraction = index_fraction;
  auto store = Store::Format(region.data(), region_bytes, o);
  if (!store.ok()) {
    std::fprintf(stderr, "format: %s\n", store.status().ToString().c_str());
    std::exit(1);
  }
  Fill f;
  f.bucket_count = (*store)->header().bucket_count;
  f.heap_bytes = (*store)->header().heap_bytes;
  std::mt19937_64 rng(seed);
  std::string value(32, 'v');
  while (true) {
    std::string key = RandomKey(rng);
    auto r = (*store)->Insert(key, value);
    if (r.ok()) {
      ++f.items;
      continue;
    }
    if (r.status().Is(rdkv::StatusCode::kAlreadyExists)) continue;
    f.refusal = r.status().ToString();
    break;
  }
  f.used_units = (*store)->allocator_stats().used_units;
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  const uint64_t slots = FLAGS_buckets * kv::kSlotsPerBucket;
  // A heap with room for every slot's item (128 bytes each), so the index refuses first.
  const uint64_t index_bytes = FLAGS_buckets * kv::kBucketBytes;
  const uint64_t region_bytes = kv::kHeaderBytes + index_bytes + slots * 128 + (1 << 20);
  const double fraction = (double(index_bytes) + 0.5 * kv::kBucketBytes) / double(region_bytes);
  std::printf("phase 1: %llu slots, uniformly random 16-byte keys, 32-byte values\n",
              static_cast<unsigned long long>(slots));
  double sum1 = 0, sum2 = 0;
  for (int s = 1; s <= FLAGS_seeds; ++s) {
    double v1 = V1FirstRefusal(slots, s);
    Fill f = FillStore(region_bytes, fraction, s);
    double v2 = double(f.items) / double(f.bucket_count * kv::kSlotsPerBucket);
    sum1 += v1;
    sum2 += v2;
    std::printf("  seed %d: v1 model %.4f, v2 Store %.4f (%llu of %llu slots); first refusal: %s\n",
                s, v1, v2, static_cast<unsigned long long>(f.items),
                static_cast<unsigned long long>(f.bucket_count * kv::kSlotsPerBucket),
                f.refusal.c_str());
  }
  std::printf("slot use at first refusal: v1 %.4f, v2 %.4f, ratio v2/v1 %.2f\n", sum1 / FLAGS_seeds,
              sum2 / FLAGS_seeds, sum2 / sum1);

  const uint64_t r2 = FLAGS_region_mib << 20;
  Fill f = FillStore(r2, kv::kDefaultIndexFraction, 99);
  const double items = double(f.items);
  std::printf(
      "phase 2: %llu MiB region, default index_fraction %.4f: %llu items of 16+32 bytes before "
      "the first refusal (%s)\n"
      "  heap bytes per item %.1f, index bytes per item %.1f, region bytes per item %.1f, "
      "index slot use %.4f, heap use %.4f\n",
      static_cast<unsigned long long>(FLAGS_region_mib), kv::kDefaultIndexFraction,
      static_cast<unsigned long long>(f.items), f.refusal.c_str(),
      double(f.used_units * kv::kUnit) / items, double(f.bucket_count * kv::kBucketBytes) / items,
      double(r2) / items, items / double(f.bucket_count * kv::kSlotsPerBucket),
      double(f.used_units * kv::kUnit) / double(f.heap_bytes));
  return 0;
}

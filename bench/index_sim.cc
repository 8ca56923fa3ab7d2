// A simulation of index v2's placement rule (docs/design.md "Region layout"), fast enough for
// tables far larger than this host's memory holds as a real region: n buckets of S slots, each
// key with two distinct random candidate buckets (by default; INDEX_SIM_CHOICES below), an
// insert into the emptier (the first on a tie), refused when both are full. Only counts are
// kept.
//
//   index_sim BUCKETS SLOTS_PER_BUCKET [FILL CHURN_ROUNDS [SEED]]
// Without FILL: fills until the first refusal and prints the slot use there. With FILL (0..1)
// and CHURN_ROUNDS: fills to FILL, then deletes a random key and inserts a new one
// CHURN_ROUNDS x (keys) times, counting refusals, then fills on to the first refusal.
// INDEX_SIM_CHOICES=adjacent (environment): the second candidate is the bucket after the first
// (both in one READ of twice the bytes), =one: a single candidate bucket; default: independent.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <string_view>
#include <vector>

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: index_sim BUCKETS SLOTS_PER_BUCKET [FILL CHURN_ROUNDS [SEED]]\n");
    return 2;
  }
  const uint64_t n = std::strtoull(argv[1], nullptr, 10);
  const int slots = std::atoi(argv[2]);
  const double fill = argc > 3 ? std::atof(argv[3]) : 0;
  const int rounds = argc > 4 ? std::atoi(argv[4]) : 0;
  const uint64_t seed = argc > 5 ? std::strtoull(argv[5], nullptr, 10) : 7;
  if (n < 2 || slots < 1) return 2;
  const char* choices_env = std::getenv("INDEX_SIM_CHOICES");
  const std::string_view choices = choices_env == nullptr ? "two" : choices_env;
  if (choices != "two" && choices != "adjacent" && choices != "one") {
    std::fprintf(stderr, "INDEX_SIM_CHOICES must be two, adjacent or one\n");
    return 2;
  }
  std::vector<int> used(n, 0);
  std::vector<uint64_t> where;  // the bucket of each stored key
  std::mt19937_64 rng(seed);
  auto insert = [&]() {
    uint64_t a = rng() % n, b = rng() % n;
    if (choices == "adjacent") b = (a + 1) % n;
    if (choices == "one") b = a;
    if (b == a && choices != "one") b = (a + 1) % n;
    uint64_t t = used[b] < used[a] ? b : a;
    if (used[t] >= slots) return false;
    ++used[t];
    where.push_back(t);
    return true;
  };
  const double total = double(n) * slots;
  while (double(where.size()) < fill * total) {
    if (!insert()) {
      std::printf("refused while filling to %.2f, at %.4f\n", fill, double(where.size()) / total);
      return 0;
    }
  }
  uint64_t refusals = 0;
  const uint64_t churn = uint64_t(rounds) * where.size();
  for (uint64_t i = 0; i < churn; ++i) {
    uint64_t k = rng() % where.size();
    --used[where[k]];
    where[k] = where.back();
    where.pop_back();
    if (!insert()) ++refusals;
  }
  while (insert()) {
  }
  std::printf(
      "%s choices, %llu buckets x %d slots: churn %d x keys at %.2f: %llu refusals; first refusal "
      "at "
      "%.4f slot use\n",
      std::string(choices).c_str(), static_cast<unsigned long long>(n), slots, rounds, fill,
      static_cast<unsigned long long>(refusals), double(where.size()) / total);
  return 0;
}

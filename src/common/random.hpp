// Seeded random numbers for synthetic weights, activations and tests: SplitMix64, which is fast,
// has no state beyond one word, and gives independent streams from distinct seeds.
#pragma once

#include <cmath>
#include <cstdint>

namespace mxmoe {

class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}

  uint64_t next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1).
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  // Uniform integer in [0, n).
  uint32_t below(uint32_t n) { return static_cast<uint32_t>((next() >> 32) * n >> 32); }
  // Standard normal (Box-Muller).
  double normal() {
    const double u1 = 1.0 - uniform();
    const double u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

 private:
  uint64_t state_;
};

// A seed for stream `index` derived from `seed`, so that parallel generation is deterministic.
inline uint64_t derive_seed(uint64_t seed, uint64_t index) {
  return SplitMix64(seed ^ (0x632be59bd9b4e019ull * (index + 1))).next();
}

}  // namespace mxmoe

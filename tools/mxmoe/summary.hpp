// How `mxmoe run` summarises an output tensor (its norm and a checksum of its bf16 bits), and the
// token sample the checks compare.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <span>
#include <vector>

#include "mxmoe/bf16.hpp"

namespace mxmoe::cli {

inline uint64_t fnv1a(std::span<const Bf16> values) {
  uint64_t hash = 0xcbf29ce484222325ull;
  for (Bf16 v : values) {
    for (int byte = 0; byte < 2; ++byte) hash = (hash ^ ((v.bits >> (8 * byte)) & 0xff)) * 0x100000001b3ull;
  }
  return hash;
}

inline void print_output_summary(std::span<const Bf16> out, int num_tokens, int hidden) {
  double sum = 0.0;
  for (Bf16 v : out) sum += static_cast<double>(bf16_to_float(v)) * bf16_to_float(v);
  std::printf("output: [%d, %d] bf16, norm %.6g, checksum %016llx\n", num_tokens, hidden, std::sqrt(sum),
              static_cast<unsigned long long>(fnv1a(out)));
}

// Up to `limit` token indices spread evenly over [0, num_tokens).
inline std::vector<int> sample_tokens(int num_tokens, int limit) {
  const int n = std::min(num_tokens, limit);
  std::vector<int> tokens(n);
  for (int s = 0; s < n; ++s) tokens[s] = static_cast<int>(static_cast<int64_t>(s) * num_tokens / n);
  return tokens;
}

// Rows `tokens` of the row-major [T, width] array `rows`, one after another.
template <typename T>
std::vector<T> sample_rows(std::span<const T> rows, std::span<const int> tokens, size_t width) {
  std::vector<T> out;
  out.reserve(tokens.size() * width);
  for (int t : tokens) {
    const auto first = rows.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(t) * width);
    out.insert(out.end(), first, first + static_cast<std::ptrdiff_t>(width));
  }
  return out;
}

}  // namespace mxmoe::cli

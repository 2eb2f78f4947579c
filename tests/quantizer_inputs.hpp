// Inputs for the quantiser tests (the host-device block encoder on the CPU, the GPU quantiser): MX
// blocks of the kinds that decide a block encoder's corner cases, dense experts made of them in
// transformers' layout, and the CPU quantiser's answer for such experts.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "common/random.hpp"
#include "mxmoe/bf16.hpp"
#include "mxmoe/mx_format.hpp"

namespace mxmoe::test {

// `blocks` blocks of 32 values, each of one kind, by turns: ordinary values (normal, times 2^-20 to
// 2^20), zeros of both signs, subnormal floats, values up to 2^127 (and FLT_MAX), every E2M1 midpoint
// (a tie) and code value at a random scale, one element among zeros, a NaN or an infinity among
// ordinary values, and values that straddle the E8M0 range's ends (amax below 2^-125).
inline std::vector<float> hard_blocks(size_t blocks, uint64_t seed) {
  constexpr float kSteps[] = {0.0f, 0.25f, 0.5f, 0.75f, 1.0f, 1.25f, 1.5f, 1.75f,
                              2.0f, 2.5f,  3.0f, 3.5f,  4.0f, 5.0f,  6.0f};
  SplitMix64 rng(seed);
  std::vector<float> values(blocks * kMxBlock);
  auto sign = [&] { return rng.below(2) ? -1.0f : 1.0f; };
  for (size_t b = 0; b < blocks; ++b) {
    float* v = values.data() + b * kMxBlock;
    const int exponent = static_cast<int>(rng.below(41)) - 20;
    switch (b % 9) {
      case 0:
        for (int i = 0; i < kMxBlock; ++i) v[i] = std::ldexp(static_cast<float>(rng.normal()), exponent);
        break;
      case 1:
        for (int i = 0; i < kMxBlock; ++i) v[i] = sign() * 0.0f;
        break;
      case 2:  // subnormal floats, some blocks with one small normal
        for (int i = 0; i < kMxBlock; ++i)
          v[i] = sign() * std::ldexp(static_cast<float>(rng.uniform()), -126 - static_cast<int>(rng.below(24)));
        if (rng.below(2)) v[rng.below(kMxBlock)] = std::ldexp(1.5f, -126);
        break;
      case 3:  // huge
        for (int i = 0; i < kMxBlock; ++i)
          v[i] = sign() * std::ldexp(static_cast<float>(1.0 + rng.uniform()), 100 + static_cast<int>(rng.below(27)));
        if (rng.below(4) == 0) v[rng.below(kMxBlock)] = std::numeric_limits<float>::max();
        break;
      case 4:  // ties and exact codes at a scale whose amax is 6 or 4 (or less: the scale then drops)
        for (int i = 0; i < kMxBlock; ++i) v[i] = sign() * std::ldexp(kSteps[rng.below(std::size(kSteps))], exponent);
        v[rng.below(kMxBlock)] = sign() * std::ldexp(rng.below(2) ? 6.0f : 4.0f, exponent);
        break;
      case 5:
        for (int i = 0; i < kMxBlock; ++i) v[i] = sign() * 0.0f;
        v[rng.below(kMxBlock)] = std::ldexp(static_cast<float>(rng.normal()), exponent);
        break;
      case 6: {
        for (int i = 0; i < kMxBlock; ++i) v[i] = std::ldexp(static_cast<float>(rng.normal()), exponent);
        const float specials[] = {NAN, INFINITY, -INFINITY};
        v[rng.below(kMxBlock)] = specials[rng.below(3)];
        break;
      }
      case 7:  // amax near the bottom of the scale range: scale codes 0-3
        for (int i = 0; i < kMxBlock; ++i)
          v[i] = std::ldexp(static_cast<float>(rng.normal()), -124 - static_cast<int>(rng.below(6)));
        break;
      default:  // ties relative to a random amax
        for (int i = 0; i < kMxBlock; ++i)
          v[i] = sign() * std::ldexp(kSteps[rng.below(std::size(kSteps))], exponent - 1);
        break;
    }
  }
  return values;
}

// The values rounded to bf16, as bits and as floats.
inline std::vector<Bf16> to_bf16(std::span<const float> values) {
  std::vector<Bf16> out(values.size());
  for (size_t i = 0; i < values.size(); ++i) out[i] = float_to_bf16(values[i]);
  return out;
}
inline std::vector<float> to_float(std::span<const Bf16> values) {
  std::vector<float> out(values.size());
  for (size_t i = 0; i < values.size(); ++i) out[i] = bf16_to_float(values[i]);
  return out;
}

// Dense experts [experts, k, rows] (transformers' layout) whose blocks along k are hard_blocks.
inline std::vector<float> hard_dense_experts(int experts, int k, int rows, uint64_t seed) {
  const std::vector<float> blocks = hard_blocks(static_cast<size_t>(experts) * rows * k / kMxBlock, seed);
  std::vector<float> dense(blocks.size());
  for (size_t e = 0; e < static_cast<size_t>(experts); ++e) {
    for (size_t r = 0; r < static_cast<size_t>(rows); ++r) {
      for (size_t j = 0; j < static_cast<size_t>(k); ++j) {
        dense[(e * k + j) * rows + r] = blocks[(e * rows + r) * k + j];
      }
    }
  }
  return dense;
}

// The CPU quantiser's checkpoint-layout blocks [experts, rows, k / 32, 16] and scales for dense
// experts [experts, k, rows]: each row along k through quantize_mxfp4.
struct Quantized {
  std::vector<uint8_t> blocks, scales;
};
inline Quantized quantize_dense_on_cpu(std::span<const float> dense, int experts, int k, int rows) {
  Quantized q{std::vector<uint8_t>(dense.size() / 2), std::vector<uint8_t>(dense.size() / kMxBlock)};
  std::vector<float> row(k);
  for (size_t e = 0; e < static_cast<size_t>(experts); ++e) {
    for (size_t r = 0; r < static_cast<size_t>(rows); ++r) {
      for (size_t j = 0; j < static_cast<size_t>(k); ++j) row[j] = dense[(e * k + j) * rows + r];
      const size_t at = e * rows + r;
      quantize_mxfp4(row, std::span(q.blocks).subspan(at * k / 2, k / 2),
                     std::span(q.scales).subspan(at * k / kMxBlock, k / kMxBlock));
    }
  }
  return q;
}

}  // namespace mxmoe::test

// Dequantization of the packed MXFP4 weight records (format/record_layout.hpp: what a record holds
// and why) into mma.sync fragments. The bit extraction compiles for the host too, so that tests
// check it against the packing.
#pragma once

#include "format/record_layout.hpp"

namespace mxmoe::kernels {

MXMOE_HOST_DEVICE unsigned rotate_left(unsigned word, int bits) {
  return bits == 0 ? word : (word << bits) | (word >> (32 - bits));
}

// Register `reg`'s two elements of `word` as bf16x2 bits worth value * 2^-126 (low half: a0/a2/...).
MXMOE_HOST_DEVICE unsigned e2m1_pair_bits(unsigned word, int reg) {
  constexpr unsigned kPairBits = 0x81C081C0u;  // bf16x2 bits 6-8 and 15 of both halves
  if (reg < 3) return rotate_left(word, pair_rotation(reg, 0)) & kPairBits;
  return (rotate_left(word, pair_rotation(3, 0)) & (kPairBits & ~0x01000100u)) |
         (rotate_left(word, pair_rotation(3, 2)) & 0x01000100u);
}

// bf16 bits of the E8M0 scale 2^(s - 127): exponent field s; s = 0 is the subnormal 2^-127 and
// s = 255 is NaN.
MXMOE_HOST_DEVICE unsigned e8m0_to_bf16_bits(unsigned s) {
  return (s << 7) | ((s == 0u || s == 255u) ? 0x40u : 0u);
}

}  // namespace mxmoe::kernels

#if defined(__CUDACC__)
#include "kernels/device_utils.cuh"

namespace mxmoe::kernels {

// One record's share of a lane (16 value bytes, its quad's 4 scale bytes) as four k-steps of
// m16n8k16 A fragments: a[j] feeds the MMA at K offset 16 j. The extraction (~2 integer ops per
// pair) yields value * 2^-126; one bf16x2 multiply by 2^(s - 1) makes it value * 2^(s - 127). That
// factor is a normal bf16 for scale codes 1-128 (block maxima up to 8, so every real weight):
// dequantize_record_one_multiply, valid where scale_codes_take_one_multiply holds. Any other code
// takes two multiplies, by 2^126 and by 2^(s - 127), which is exact for every code, 0 and 255 (NaN)
// included: dequantize_record_two_multiplies. Cost per 32 weights: 16 extractions, 16 multiplies
// (32 on the rare path), and the factors: one add plus a byte permute and a shift per factor build
// 2^(s - 1) in both halves.
__device__ __forceinline__ void dequantize_record_one_multiply(uint4 values, unsigned scale_word, unsigned (&a)[4][4]) {
  const unsigned words[4] = {values.x, values.y, values.z, values.w};
  const unsigned exponents = scale_word + 0x7E7E7E7Eu;  // s + 126 per byte: 2^(s - 1)'s exponent field
  unsigned factor[4];  // [rows g, b0], [rows g + 8, b0], [rows g, b1], [rows g + 8, b1]
#pragma unroll
  for (int i = 0; i < 4; ++i) factor[i] = __byte_perm(exponents, 0u, 0x4040u | (0x0101u * i)) << 7;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
#pragma unroll
    for (int reg = 0; reg < 4; ++reg) {
      const unsigned upper_rows = (reg == 1 || reg == 3) ? 1 : 0;
      a[j][reg] = bf16x2_mul(e2m1_pair_bits(words[j], reg), factor[2 * (j / 2) + upper_rows]);
    }
  }
}
__device__ __forceinline__ void dequantize_record_two_multiplies(uint4 values, unsigned scale_word,
                                                                 unsigned (&a)[4][4]) {
  constexpr unsigned kTwoTo126 = 0x7E807E80u;
  const unsigned words[4] = {values.x, values.y, values.z, values.w};
  unsigned factor[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const unsigned bits = e8m0_to_bf16_bits((scale_word >> (8 * i)) & 0xFFu);
    factor[i] = bits | (bits << 16);
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) {
#pragma unroll
    for (int reg = 0; reg < 4; ++reg) {
      const unsigned upper_rows = (reg == 1 || reg == 3) ? 1 : 0;
      a[j][reg] = bf16x2_mul(bf16x2_mul(e2m1_pair_bits(words[j], reg), kTwoTo126), factor[2 * (j / 2) + upper_rows]);
    }
  }
}
// One record by one multiply where `one_multiply` (scale_codes_take_one_multiply holds for its scale
// word: a per-record test, or the host's answer for the whole matrix), else by two.
__device__ __forceinline__ void dequantize_record(uint4 values, unsigned scale_word, unsigned (&a)[4][4],
                                                  bool one_multiply) {
  if (one_multiply) {
    dequantize_record_one_multiply(values, scale_word, a);
  } else {
    dequantize_record_two_multiplies(values, scale_word, a);
  }
}

// kRecords records of a lane at once, by one path for all: one multiply where `one_multiply` (every
// scale code of the matrix in range, as the host found: all real weights; LayerArgs::
// scales_one_multiply), so that the records' extractions are one basic block, whose independent
// dependency chains the compiler interleaves, with no test of their scales.
template <int kRecords>
__device__ __forceinline__ void dequantize_records(const uint4 (&values)[kRecords], const unsigned (&scale_words)[kRecords],
                                                   unsigned (&a)[kRecords][4][4], bool one_multiply) {
  if (one_multiply) {
#pragma unroll
    for (int r = 0; r < kRecords; ++r) dequantize_record_one_multiply(values[r], scale_words[r], a[r]);
  } else {
#pragma unroll
    for (int r = 0; r < kRecords; ++r) dequantize_record_two_multiplies(values[r], scale_words[r], a[r]);
  }
}

}  // namespace mxmoe::kernels
#endif

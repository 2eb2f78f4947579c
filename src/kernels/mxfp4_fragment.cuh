// The packed MXFP4 weight layout every mxmoe kernel reads, and its dequantization into mma.sync
// fragments. Compiles for the host too, so that packing and tests share these definitions.
//
// A weight matrix [rows, K] (rows a multiple of 16, K a multiple of 32, padded to 64) is cut into
// records of 16 rows x 64 K, stored row-tile major (all K records of rows 0-15, then rows 16-31...):
//
//   record = 512 bytes of E2M1 values, then 32 bytes of E8M0 scales  (544 bytes, 16-byte aligned)
//
// Values: lane l of a warp owns bytes [16 l, 16 l + 16): one 32-bit word per 16-wide k-step j of the
// record. With g = l / 4 and c = 2 (l % 4), word j holds exactly the eight elements that the
// m16n8k16 A fragment (row-major 16 x 16 tile at K offset 16 j) gives lane l:
//   fragment register i      elements (row, k - 16 j)
//   0  a0 a1                 (g, c), (g, c + 1)
//   1  a2 a3                 (g + 8, c), (g + 8, c + 1)
//   2  a4 a5                 (g, c + 8), (g, c + 9)
//   3  a6 a7                 (g + 8, c + 8), (g + 8, c + 9)
// so one 16-byte load per lane per record feeds four MMAs with no shuffles. Within the word the
// E2M1 code bits are not nibbles: each register's two elements are spread so that a rotation and
// a mask turn them into a bf16x2 register (e2m1_pair_bits, e2m1_code_bit).
// Scales: word g (bytes 512 + 4 g) = [s(g, b0), s(g + 8, b0), s(g, b1), s(g + 8, b1)], where b0
// covers k-steps 0-1 and b1 k-steps 2-3; lanes of a quad read the same word.
// The same fragment is also the B operand of a weight-as-B MMA, so the layout does not fix an
// orientation; mxmoe's kernels put weight rows on the MMA's M side and tokens on its N side.
#pragma once

#if defined(__CUDACC__)
#define MXMOE_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define MXMOE_HOST_DEVICE inline
#endif

namespace mxmoe::kernels {

constexpr int kRecordRows = 16;
constexpr int kRecordK = 64;
constexpr int kRecordValueBytes = 512;
constexpr int kRecordScaleBytes = 32;
constexpr int kRecordBytes = kRecordValueBytes + kRecordScaleBytes;

// Where the code bits sit. Element `half` (0: a0/a2/a4/a6, 1: the other) of fragment register
// `reg` is wanted as bf16 bits worth value * 2^-126: code bit b (0: mantissa, 1-2: exponent, 3:
// sign) at bf16x2 bit 6 + b (b < 3) or 15, plus 16 for the high half, so exponent field 0 gives the
// E2M1 subnormal 0.5 as the bf16 subnormal 2^-127. In the stored word that bit sits
// pair_rotation(reg, b) places lower (mod 32), and the four registers' rotations (0, 4, 10, and 6 /
// 14 for register 3's exponent bit 1) tile the word's 32 bits exactly. Registers 0-2 so cost one
// rotate and one mask and register 3 four operations: 9 per word, where nibbles cost 15.
MXMOE_HOST_DEVICE int pair_rotation(int reg, int bit) {
  return reg == 0 ? 0 : reg == 1 ? 4 : reg == 2 ? 10 : (bit == 2 ? 14 : 6);
}
MXMOE_HOST_DEVICE int e2m1_code_bit(int reg, int half, int bit) {
  const int target = (bit < 3 ? 6 + bit : 15) + 16 * half;
  return (target - pair_rotation(reg, bit) + 32) % 32;
}
MXMOE_HOST_DEVICE unsigned rotate_left(unsigned word, int bits) {
  return bits == 0 ? word : (word << bits) | (word >> (32 - bits));
}

// The word bits that store E2M1 `code` as element `half` of register `reg`, and the reverse.
MXMOE_HOST_DEVICE unsigned e2m1_place_code(unsigned code, int reg, int half) {
  unsigned word = 0;
  for (int bit = 0; bit < 4; ++bit) word |= ((code >> bit) & 1u) << e2m1_code_bit(reg, half, bit);
  return word;
}
MXMOE_HOST_DEVICE unsigned e2m1_code_at(unsigned word, int reg, int half) {
  unsigned code = 0;
  for (int bit = 0; bit < 4; ++bit) code |= ((word >> e2m1_code_bit(reg, half, bit)) & 1u) << bit;
  return code;
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

// Whether all four E8M0 codes of a scale word lie in [1, 128], where 2^(s - 1) is a normal bf16
// (dequantize_record's one-multiply path). Adding 127 to a byte sets its top bit, and carries out
// of none, iff its code is in range; a carry only ever follows a byte that already failed, so one
// add and one mask test the four codes at once.
MXMOE_HOST_DEVICE bool scale_codes_take_one_multiply(unsigned scale_word) {
  return ((scale_word + 0x7F7F7F7Fu) & 0x80808080u) == 0x80808080u;
}

// Row r of record (row_tile t) of a matrix whose packed rows are FC1's: record rows 0-7 are the glu
// rows of outputs 8 t .. 8 t + 7 and record rows 8-15 the linear rows of the same outputs, so the
// thread that holds glu(j) in its accumulators also holds lin(j). Returns the checkpoint row
// (checkpoint FC1 rows interleave glu = 2 j, linear = 2 j + 1).
MXMOE_HOST_DEVICE int fc1_checkpoint_row(int packed_row) {
  const int output = 8 * (packed_row / 16) + packed_row % 8;
  return 2 * output + ((packed_row % 16) >= 8 ? 1 : 0);
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
__device__ __forceinline__ void dequantize_record(uint4 values, unsigned scale_word, unsigned (&a)[4][4]) {
  if (scale_codes_take_one_multiply(scale_word)) {
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

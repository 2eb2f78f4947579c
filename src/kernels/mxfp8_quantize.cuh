// Activations to MXFP8 on the GPU, by the OCP MX rules the CPU code follows
// (include/mxmoe/mx_format.hpp, quantize_mxfp8): per 32 along K, scale = 2^(floor(log2(amax)) - 8)
// with its E8M0 code clamped to [0, 254], elements rounded to nearest even and saturated to
// +-448; a block holding a NaN or an infinity gets scale 255 and zero elements. The rows come out
// in the MXFP8 row layout of format/record_layout.hpp (position p of a block holds
// k = mma_order_k(p), the MMA order of block_scaled_mma.cuh).
//
// A quad of lanes holds one 32-K block, lane q the 8 values at k = 8 q .. 8 q + 7 (bf16 from the
// layer's input, fp32 from FC1's SwiGLU). Budget per lane: 2 shuffles for the block's max, 4
// two-element conversions (cvt.rn.satfinite.e4m3x2, sm_89+), 1 shuffle to trade half-words with
// its pair, ~30 integer and float operations.
//
// FP8 activations (ActivationFormat::kFp8) take the same rows: DeepSeek-V4's quantiser's one
// power-of-two scale per 128 along K (kernels/fp8_rounding.cuh's rule, the CPU's
// round_to_fp8_activations) written as the E8M0 code of each of the 128-block's four 32-blocks.
// The block-scaled MMA then multiplies exactly the FP8 activations' values. Four quads (16 lanes)
// hold a 128-block there: 2 more shuffles for its max.
#pragma once

#include "format/record_layout.hpp"
#include "kernels/block_scaled_mma.cuh"

namespace mxmoe::kernels {

constexpr int kE4m3ElementEmax = 8;  // E4M3's largest exponent (448 = 1.75 x 2^8)

}  // namespace mxmoe::kernels

#if defined(__CUDACC__)
#include "kernels/device_utils.cuh"
#include "kernels/fp8_rounding.cuh"

namespace mxmoe::kernels {

// MXFP8 rows at `base` with room for `rows` rows: the codes and the scale words.
struct Mxfp8Rows {
  unsigned char* codes;
  unsigned* scales;
  long long rows;
  int k_tiles;

  __device__ __forceinline__ Mxfp8Rows(void* base, long long rows_capacity, int k_tiles_per_row)
      : codes(static_cast<unsigned char*>(base)),
        scales(reinterpret_cast<unsigned*>(static_cast<unsigned char*>(base) +
                                           mxfp8_codes_bytes(rows_capacity, k_tiles_per_row))),
        rows(rows_capacity),
        k_tiles(k_tiles_per_row) {}
  __device__ __forceinline__ unsigned char* slice(long long row, int kt) const {
    return codes + (row * k_tiles + kt) * kMxfp8SliceBytes;
  }
  __device__ __forceinline__ unsigned* scale(long long row, int kt) const { return scales + kt * rows + row; }
};

// The lane's share of its quad's block (`values`: its 8, k = 8 q ..): the block's E8M0 code, and
// the two words of the block's 8 (in MMA order) that lane q stores, words 4 (q / 2) + 2 (q % 2)
// and the next. Call with the whole warp.
struct Mxfp8Share {
  unsigned scale_code;
  unsigned words[2];
};

// The largest |value| of the lanes' `lanes`-lane group (4: a 32-block, 16: a 128-block) as float
// bits (|v| as bits orders as |v| does; exponent 255: inf or NaN).
template <int kLanes>
__device__ __forceinline__ unsigned group_amax_bits(const float (&values)[8]) {
  unsigned amax_bits = 0;
#pragma unroll
  for (int j = 0; j < 8; ++j) amax_bits = max(amax_bits, __float_as_uint(values[j]) & 0x7FFFFFFFu);
#pragma unroll
  for (int offset = 1; offset < kLanes; offset *= 2) amax_bits = max(amax_bits, __shfl_xor_sync(0xFFFFFFFFu, amax_bits, offset));
  return amax_bits;
}

// The share of a block whose E8M0 code is `scale_code` (255: NaN, zero elements): the elements
// v / 2^(scale_code - 127) as E4M3 (nearest even, saturating), placed for the MMA.
__device__ __forceinline__ Mxfp8Share pack_mxfp8_share(const float (&values)[8], unsigned scale_code) {
  const int q = threadIdx.x % 4;
  const bool special = scale_code == 255u;
  Mxfp8Share share;
  share.scale_code = scale_code;
  // v / 2^(scale - 127), a power of two from 2^-119 to 2^127, exact but for results below the
  // float normals (rounded as the CPU's ldexp rounds them, and far below E4M3's smallest element).
  const float factor = __uint_as_float((254u - min(scale_code, 254u)) << 23);
  unsigned halves[4];  // codes of elements (2 t, 2 t + 1)
#pragma unroll
  for (int t = 0; t < 4; ++t) {
    halves[t] = e4m3x2(special ? 0.0f : values[2 * t] * factor, special ? 0.0f : values[2 * t + 1] * factor);
  }
  // Block word 4 u + t = [halves t of lane 2 u | halves t of lane 2 u + 1] (mma_order_k): the even
  // lane of a pair keeps words t = 0, 1, the odd one t = 2, 3, each trading the other two halves.
  const bool odd = q % 2;
  const unsigned given = odd ? halves[0] | halves[1] << 16 : halves[2] | halves[3] << 16;
  const unsigned taken = __shfl_xor_sync(0xFFFFFFFFu, given, 1);
  share.words[0] = odd ? (taken & 0xFFFFu) | halves[2] << 16 : halves[0] | (taken & 0xFFFFu) << 16;
  share.words[1] = odd ? (taken >> 16) | halves[3] << 16 : halves[1] | (taken >> 16) << 16;
  return share;
}

// MXFP8: the OCP rule per 32-block (a quad); a block's max of exponent 255 is a NaN or an infinity.
__device__ __forceinline__ Mxfp8Share quantize_mxfp8_share(const float (&values)[8]) {
  const int exponent = static_cast<int>(group_amax_bits<4>(values) >> 23);  // biased; 0: zero or subnormal
  return pack_mxfp8_share(values, exponent == 255 ? 255u : static_cast<unsigned>(max(exponent - kE4m3ElementEmax, 0)));
}

// FP8 activations: `values` bf16 values (the quantiser reads bf16 rows), s = 2^ceil(log2(max(amax,
// 1e-4) / 448)) over the 16 lanes' 128-block (fp8_scale_exponent), code s + 127 in
// [105, 247]; a block holding a NaN or an infinity NaN throughout (code 255). Elements past K are
// zeros and do not move the block's max.
// The two half-warps may hold different blocks (one NaN), so the code is selected, not branched
// on: every lane reaches the packing's one shuffle.
__device__ __forceinline__ Mxfp8Share quantize_fp8_share(const float (&values)[8]) {
  const unsigned amax_bits = group_amax_bits<16>(values);
  return pack_mxfp8_share(values, amax_bits >= 0x7F800000u ? 255u : static_cast<unsigned>(fp8_scale_exponent(amax_bits) + 127));
}

// 8 bf16 (`values`: bf16 (2 j + 1):(2 j) in word j) widened exactly.
__device__ __forceinline__ void widen_bf16x8(uint4 values, float (&wide)[8]) {
  const unsigned pairs[4] = {values.x, values.y, values.z, values.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    wide[2 * j] = __uint_as_float(pairs[j] << 16);
    wide[2 * j + 1] = __uint_as_float(pairs[j] & 0xFFFF0000u);
  }
}

// Stores lane q's share of block `block` (counted along the row) of MXFP8 row `row`: its two words
// at their places in the slice, and from lane 0 of the quad the scale byte (with the zero byte
// above it) at byte 2 (block % 2) of the slice's scale word.
__device__ __forceinline__ void store_mxfp8_share(const Mxfp8Rows& out, long long row, int block,
                                                  const Mxfp8Share& share) {
  const int q = threadIdx.x % 4, word = 4 * (q / 2) + 2 * (q % 2);
  unsigned char* slice = out.slice(row, block / 2);
  *reinterpret_cast<unsigned*>(slice + mxfp8_slice_word_byte(block % 2, word)) = share.words[0];
  *reinterpret_cast<unsigned*>(slice + mxfp8_slice_word_byte(block % 2, word + 1)) = share.words[1];
  if (q == 0) {
    reinterpret_cast<unsigned short*>(out.scale(row, block / 2))[block % 2] = static_cast<unsigned short>(share.scale_code);
  }
}

}  // namespace mxmoe::kernels
#endif

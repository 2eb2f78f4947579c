// FP8 activations (ActivationFormat::kFp8) for the bf16 families: bf16 values rounded to the bf16
// values DeepSeek-V4's E4M3 quantiser decodes them to (E4M3 times a power of two: exact in bf16),
// by the rule the CPU code follows (include/mxmoe/mx_format.hpp, round_to_fp8_activations): per
// row, blocks of 128 along K (the last one shorter where K is not a multiple), scale
// s = 2^ceil(log2(max(amax, 1e-4) * (1 / 448))), elements v / s rounded to E4M3 (nearest even), a
// block holding a NaN or an infinity NaN throughout.
//
// A group of lanes holds one 128-block (lanes past the block's end hold zeros, which do not move
// its largest magnitude): a warp in the rounding launch over rows in global memory
// (route/fp8_round_rows_kernel.cuh), 8 lanes in the GEMV-style families, which round the rows they
// stage in shared memory (expert_gemm.cuh) instead of a launch of their own. Budget: a shuffle per
// halving of the group for the block's largest magnitude, ~5 operations an element (the hardware's
// E4M3 conversion and back).
#pragma once

namespace mxmoe::kernels {

constexpr int kFp8RoundBlock = 128;  // kFp8ActivationBlock
constexpr unsigned kBf16Nan = 0x7FC0u;

}  // namespace mxmoe::kernels

#if defined(__CUDACC__)
namespace mxmoe::kernels {

// The exponent of a 128-block's scale, ceil(log2(max(amax, 1e-4) / 448)) in [-22, 120], from the
// block's largest magnitude as float bits (below 0x7F800000: no NaN or infinity), as
// fp8_activation_scale computes it: t >= 1e-4 / 448 is a normal float, so its exponent field,
// plus one where its mantissa is not zero, is the ceiling.
__device__ __forceinline__ int fp8_scale_exponent(unsigned amax_bits) {
  const unsigned t_bits = __float_as_uint(fmaxf(__uint_as_float(amax_bits), 1e-4f) * (1.0f / 448.0f));
  return static_cast<int>(t_bits >> 23) - 127 + ((t_bits & 0x7FFFFFu) != 0 ? 1 : 0);
}

// Two floats as E4M3 bytes, `low` in byte 0 (round to nearest even, saturating; sm_89 and later).
__device__ __forceinline__ unsigned e4m3x2(float low, float high) {
  unsigned short bits;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(bits) : "f"(high), "f"(low));
  return bits;
}

// Two floats rounded to their nearest E4M3 values (ties to even; |v| <= 448, which the scale's
// choice guarantees), as floats: the hardware conversion to E4M3 and back through f16, which holds
// every E4M3 value exactly.
__device__ __forceinline__ float2 round_to_e4m3x2(float low, float high) {
  const unsigned short codes = static_cast<unsigned short>(e4m3x2(low, high));
  unsigned halves;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(halves) : "h"(codes));
  float2 out;
  asm("cvt.f32.f16 %0, %1;\n" : "=f"(out.x) : "h"(static_cast<unsigned short>(halves & 0xFFFFu)));
  asm("cvt.f32.f16 %0, %1;\n" : "=f"(out.y) : "h"(static_cast<unsigned short>(halves >> 16)));
  return out;
}

// A lane's share of its kLanes-lane group's 128-block, 2 kWords bf16 (element 2 j in the low half
// of word j), rounded to FP8 activations' values: the block's largest magnitude by log2(kLanes)
// shuffles within the group. Call with the whole warp.
template <int kLanes, int kWords>
__device__ __forceinline__ void round_fp8_share(unsigned (&words)[kWords]) {
  static_assert(kLanes * kWords * 2 == kFp8RoundBlock, "a group holds one 128-block");
  // |v| as float bits orders as |v| does; exponent 255: infinity or NaN.
  unsigned amax_bits = 0;
#pragma unroll
  for (int j = 0; j < kWords; ++j) amax_bits = max(amax_bits, max((words[j] << 16) & 0x7FFFFFFFu, words[j] & 0x7FFF0000u));
#pragma unroll
  for (int offset = kLanes / 2; offset > 0; offset /= 2) {
    amax_bits = max(amax_bits, __shfl_xor_sync(0xFFFFFFFFu, amax_bits, offset));
  }
  if (amax_bits >= 0x7F800000u) {
#pragma unroll
    for (int j = 0; j < kWords; ++j) words[j] = kBf16Nan | kBf16Nan << 16;
    return;
  }
  const int scale_exponent = fp8_scale_exponent(amax_bits);
  const float scale = __uint_as_float(static_cast<unsigned>(scale_exponent + 127) << 23);
  const float inverse = __uint_as_float(static_cast<unsigned>(127 - scale_exponent) << 23);
#pragma unroll
  for (int j = 0; j < kWords; ++j) {
    const float2 e4m3 = round_to_e4m3x2(__uint_as_float(words[j] << 16) * inverse, __uint_as_float(words[j] & 0xFFFF0000u) * inverse);
    // E4M3 times the scale has at most 4 significant bits: its upper half is the bf16.
    words[j] = __float_as_uint(e4m3.x * scale) >> 16 | (__float_as_uint(e4m3.y * scale) & 0xFFFF0000u);
  }
}

// Rows [0, rows) of `staged` (bf16, `row_stride` elements apart, rows 16-byte aligned), over their
// first `k_len` elements (a multiple of 16), rounded in place: 8 lanes per 128-block, 16 elements
// (two 16-byte words) a lane, so that a warp rounds four blocks at once with 3 shuffles. The blocks
// are the rows' own where element 0 is at a multiple of 128 of K and k_len reaches K's end or is a
// multiple of 128 (elements past K are zeros). Every warp of the CTA calls it; the caller
// synchronises before and after.
__device__ __forceinline__ void round_staged_rows_to_fp8(unsigned short* staged, int rows, int row_stride, int k_len) {
  constexpr int kLanes = 8, kBlocksPerWarp = 32 / kLanes;
  const int warps = blockDim.x / 32, lane = threadIdx.x % 32;
  const int blocks_per_row = (k_len + kFp8RoundBlock - 1) / kFp8RoundBlock, blocks = rows * blocks_per_row;
  for (int first = threadIdx.x / 32 * kBlocksPerWarp; first < blocks; first += warps * kBlocksPerWarp) {
    const int block = first + lane / kLanes;
    const int row = block / blocks_per_row, k = block % blocks_per_row * kFp8RoundBlock + 16 * (lane % kLanes);
    auto* at = reinterpret_cast<uint4*>(staged + row * row_stride + k);
    const bool mine = block < blocks && k < k_len;
    unsigned words[8] = {};
    if (mine) {
      const uint4 lo = at[0], hi = at[1];
      words[0] = lo.x, words[1] = lo.y, words[2] = lo.z, words[3] = lo.w;
      words[4] = hi.x, words[5] = hi.y, words[6] = hi.z, words[7] = hi.w;
    }
    round_fp8_share<kLanes>(words);
    if (mine) {
      at[0] = make_uint4(words[0], words[1], words[2], words[3]);
      at[1] = make_uint4(words[4], words[5], words[6], words[7]);
    }
  }
}

}  // namespace mxmoe::kernels
#endif

// bf16 activations to MXFP8 on the GPU, by the OCP MX rules the CPU code follows
// (include/mxmoe/mx_format.hpp, quantize_mxfp8): per 32 along K, scale = 2^(floor(log2(amax)) - 8)
// with its E8M0 code clamped to [0, 254], elements rounded to nearest even and saturated to
// +-448; a block holding a NaN or an infinity gets scale 255 and zero elements. The elements come
// out in the MMA order of block_scaled_mma.cuh (position p of a block holds k = mma_order_k(p)).
//
// A quad of lanes holds one 32-K block, lane q the 8 bf16 at k = 8 q .. 8 q + 7. Budget per lane:
// 2 shuffles for the block's max, 4 two-element conversions (cvt.rn.satfinite.e4m3x2, sm_89+),
// 1 shuffle to trade half-words with its pair, ~30 integer and float operations.
#pragma once

#include "kernels/block_scaled_mma.cuh"

namespace mxmoe::kernels {

constexpr int kE4m3ElementEmax = 8;  // E4M3's largest exponent (448 = 1.75 x 2^8)

}  // namespace mxmoe::kernels

#if defined(__CUDACC__)
#include "kernels/device_utils.cuh"

namespace mxmoe::kernels {

// Two floats as E4M3 bytes, `low` in byte 0 (round to nearest even, saturating).
__device__ __forceinline__ unsigned e4m3x2(float low, float high) {
  unsigned short bits;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(bits) : "f"(high), "f"(low));
  return bits;
}

// The lane's share of its quad's block (`values`: its 8 bf16, k = 8 q ..): the block's E8M0 code,
// and the two words of the block's 8 (in MMA order) that lane q stores, words 4 (q / 2) + 2 (q % 2)
// and the next. Call with the whole warp.
struct Mxfp8Share {
  unsigned scale_code;
  unsigned words[2];
};
__device__ __forceinline__ Mxfp8Share quantize_mxfp8_share(uint4 values) {
  const int q = threadIdx.x % 4;
  const unsigned pairs[4] = {values.x, values.y, values.z, values.w};  // bf16 (2 j + 1):(2 j)
  unsigned amax_bits = 0, special = 0;  // |v| as bf16 bits orders as |v| does; exponent 255: inf or NaN
#pragma unroll
  for (int j = 0; j < 4; ++j) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const unsigned magnitude = (pairs[j] >> (16 * half)) & 0x7FFFu;
      amax_bits = max(amax_bits, magnitude);
      special |= (magnitude & 0x7F80u) == 0x7F80u;
    }
  }
#pragma unroll
  for (int offset = 1; offset <= 2; offset *= 2) {
    amax_bits = max(amax_bits, __shfl_xor_sync(0xFFFFFFFFu, amax_bits, offset));
    special |= __shfl_xor_sync(0xFFFFFFFFu, special, offset);
  }
  Mxfp8Share share;
  const int exponent = static_cast<int>(amax_bits >> 7);  // the float's biased exponent; 0: zero or subnormal
  share.scale_code = special ? 255u : static_cast<unsigned>(max(exponent - kE4m3ElementEmax, 0));
  // v / 2^(scale - 127), a power of two from 2^-119 to 2^127, exact but for results below the
  // float normals (rounded as the CPU's ldexp rounds them, and far below E4M3's smallest element).
  const float factor = __uint_as_float((254u - min(share.scale_code, 254u)) << 23);
  unsigned halves[4];  // codes of elements (2 t, 2 t + 1)
#pragma unroll
  for (int t = 0; t < 4; ++t) {
    const float low = special ? 0.0f : bf16_bits_to_float(pairs[t] & 0xFFFFu) * factor;
    const float high = special ? 0.0f : bf16_bits_to_float(pairs[t] >> 16) * factor;
    halves[t] = e4m3x2(low, high);
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

}  // namespace mxmoe::kernels
#endif

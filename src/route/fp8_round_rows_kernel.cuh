// FP8 activations for the bf16 families: rows of an expert GEMM's input rounded in place of the
// E4M3 quantiser, to the bf16 values it decodes to (E4M3 times a power of two: exact in bf16), by
// the rule the CPU code follows (include/mxmoe/mx_format.hpp, round_to_fp8_activations): per row,
// blocks of 128 along K (the last one shorter where K is not a multiple), scale
// s = 2^ceil(log2(max(amax, 1e-4) * (1 / 448))), elements v / s rounded to E4M3 (nearest even), a
// block holding a NaN or an infinity NaN throughout. The runner rounds x before FC1 and FC1's bf16
// output before FC2, so that every bf16 family computes with FP8 activations' values.
//
// A warp takes one 128-block of a row, a lane 4 consecutive elements (8 bytes). Budget per lane:
// 8 bytes read and written, 5 shuffles for the block's largest magnitude, ~12 operations an
// element. Bandwidth-bound: rows x K x 4 bytes of traffic.
#pragma once

#include "kernels/device_utils.cuh"

namespace mxmoe::kernels {

constexpr int kFp8RoundWarps = 8;     // 128-blocks per CTA, one per warp
constexpr int kFp8RoundBlock = 128;   // kFp8ActivationBlock
constexpr unsigned kBf16Nan = 0x7FC0u;

// E4M3's value nearest to `y` (|y| <= 448 by the scale's choice; ties to even): the quantum is
// 2^(e - 3) for y's exponent e, 2^-9 below E4M3's normals (e < -6). y / quantum is exact (a power
// of two apart), so rintf rounds once.
__device__ __forceinline__ float round_to_e4m3(float y) {
  const int exponent = static_cast<int>((__float_as_uint(y) >> 23) & 0xFFu) - 127;
  const int quantum_exponent = max(exponent, -6) - 3;
  const float quantum = __uint_as_float(static_cast<unsigned>(quantum_exponent + 127) << 23);
  const float inverse = __uint_as_float(static_cast<unsigned>(127 - quantum_exponent) << 23);
  return rintf(y * inverse) * quantum;
}

// Grid: x = blocks of kFp8RoundWarps over rows x ceil(row_length / 128). Rows at and past
// *row_count (when given: the routing's sorted rows) are left alone. `in` may be `out`.
__global__ void __launch_bounds__(kFp8RoundWarps * 32)
    fp8_round_rows_kernel(const unsigned short* in, unsigned short* out, int row_length, long long rows,
                          const int* row_count) {
  wait_for_prerequisite_grids();  // the rows' writer
  allow_dependent_grids();
  const int blocks_per_row = (row_length + kFp8RoundBlock - 1) / kFp8RoundBlock, lane = threadIdx.x % 32;
  const long long item = static_cast<long long>(blockIdx.x) * kFp8RoundWarps + threadIdx.x / 32;
  const long long row = item / blocks_per_row;
  if (row >= (row_count ? static_cast<long long>(*row_count) : rows)) return;
  const int first = static_cast<int>(item % blocks_per_row) * kFp8RoundBlock + 4 * lane;
  const bool mine = first < row_length;  // row_length is a multiple of 32: a lane has 4 or none
  const long long at = row * row_length + first;
  const uint2 bits = mine ? *reinterpret_cast<const uint2*>(in + at) : make_uint2(0, 0);
  const float v[4] = {__uint_as_float(bits.x << 16), __uint_as_float(bits.x & 0xFFFF0000u),
                      __uint_as_float(bits.y << 16), __uint_as_float(bits.y & 0xFFFF0000u)};
  // |v| as float bits orders as |v| does; exponent 255: infinity or NaN.
  unsigned amax_bits = 0;
#pragma unroll
  for (int j = 0; j < 4; ++j) amax_bits = max(amax_bits, __float_as_uint(v[j]) & 0x7FFFFFFFu);
  for (int offset = 16; offset > 0; offset /= 2) amax_bits = max(amax_bits, __shfl_xor_sync(0xFFFFFFFFu, amax_bits, offset));
  if (!mine) return;
  unsigned words[2];
  if (amax_bits >= 0x7F800000u) {
    words[0] = words[1] = kBf16Nan | kBf16Nan << 16;
  } else {
    // ceil(log2(t)) from t's bits (t >= 1e-4 / 448 is a normal float), as fp8_activation_scale.
    const float t = fmaxf(__uint_as_float(amax_bits), 1e-4f) * (1.0f / 448.0f);
    const unsigned t_bits = __float_as_uint(t);
    const int scale_exponent = static_cast<int>(t_bits >> 23) - 127 + ((t_bits & 0x7FFFFFu) != 0 ? 1 : 0);
    const float scale = __uint_as_float(static_cast<unsigned>(scale_exponent + 127) << 23);
    const float inverse = __uint_as_float(static_cast<unsigned>(127 - scale_exponent) << 23);
    unsigned short rounded[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      // E4M3 times the scale has at most 4 significant bits: its upper half is the bf16.
      rounded[j] = static_cast<unsigned short>(__float_as_uint(round_to_e4m3(v[j] * inverse) * scale) >> 16);
    }
    words[0] = rounded[0] | static_cast<unsigned>(rounded[1]) << 16;
    words[1] = rounded[2] | static_cast<unsigned>(rounded[3]) << 16;
  }
  *reinterpret_cast<uint2*>(out + at) = make_uint2(words[0], words[1]);
}

}  // namespace mxmoe::kernels

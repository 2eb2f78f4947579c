// FP8 activations for the bf16 families as a launch of its own (kernels/fp8_rounding.cuh: the rule):
// rows of an expert GEMM's input rounded in place of the E4M3 quantiser. The runner rounds x before
// FC1 and FC1's bf16 output before FC2 where the stage's family does not round the rows it stages
// itself (KernelFamily::rounds_fp8_when_staging), so that every bf16 family computes with FP8
// activations' values.
//
// A warp takes one 128-block of a row, a lane 4 consecutive elements. Bandwidth-bound: rows x K x
// 4 bytes of traffic.
#pragma once

#include "kernels/device_utils.cuh"
#include "kernels/fp8_rounding.cuh"

namespace mxmoe::kernels {

constexpr int kFp8RoundWarps = 8;  // 128-blocks per CTA, one per warp

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
  unsigned words[2] = {bits.x, bits.y};
  round_fp8_share<32>(words);
  if (mine) *reinterpret_cast<uint2*>(out + at) = make_uint2(words[0], words[1]);
}

}  // namespace mxmoe::kernels

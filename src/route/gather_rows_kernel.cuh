// The gather of x into sorted-row order, for the families whose FC1 reads its input so
// (KernelFamily::reads_sorted_input): sorted row r is x row sorted_pairs[r] / top_k. It runs after
// the routing, so a token tile's rows are then one block of memory that one tensor copy brings in.
// A plan with MXFP8 activations gathers them quantised (gather_quantize_rows_kernel).
#pragma once

#include "kernels/device_utils.cuh"
#include "kernels/mxfp8_quantize.cuh"
#include "route/route_buffers.hpp"

namespace mxmoe::kernels {

constexpr int kGatherWarps = 8;  // sorted rows per CTA, one per warp
// Grid: x = blocks of kGatherWarps sorted rows over every pair (an upper bound; rows past the
// routing's count exit).

// Budget: writes pairs x H x 2 bytes and reads each x row top_k times (from L2 after the first):
// at gpt-oss-20b T = 4096, 94 MB written: at the read ceiling a few % of FC1's time.
__global__ void __launch_bounds__(kGatherWarps * 32)
    gather_rows_kernel(const uint4* x, int row_chunks, int top_k, int num_experts, RouteBuffers route,
                       uint4* sorted) {
  wait_for_prerequisite_grids();  // the routing
  allow_dependent_grids();
  const int row = blockIdx.x * kGatherWarps + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (row >= route.expert_offsets[num_experts]) return;
  const uint4* source = x + static_cast<long long>(route.sorted_pairs[row] / top_k) * row_chunks;
  uint4* destination = sorted + static_cast<long long>(row) * row_chunks;
  for (int c = lane; c < row_chunks; c += 32) destination[c] = source[c];
}

// The gather quantised to MXFP8 (kernels/mxfp8_quantize.cuh), for the block-scaled family's FC1:
// sorted row r becomes MXFP8 row r of `sorted` (room for `rows_capacity` rows of K = hidden), a
// warp per row, a quad per 32-K block, 8 blocks a step; a last half slice's padding block is
// stored as zeros. kFp8: as FP8 activations (one scale per 128-K block, four quads: a step holds
// two whole 128-blocks). Budget: reads pairs x H x 2 bytes (each x row top_k times, from L2 after
// the first), writes pairs x H x 1.06 bytes, ~5 operations per element: about the plain gather's
// time.
template <bool kFp8>
__global__ void __launch_bounds__(kGatherWarps * 32)
    gather_quantize_rows_kernel(const unsigned short* x, int hidden, int top_k, int num_experts, RouteBuffers route,
                                void* sorted, long long rows_capacity) {
  wait_for_prerequisite_grids();  // the routing
  allow_dependent_grids();
  const int row = blockIdx.x * kGatherWarps + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (row >= route.expert_offsets[num_experts]) return;
  const int k_tiles = (hidden + 63) / 64;
  const Mxfp8Rows out(sorted, rows_capacity, k_tiles);
  const unsigned short* source = x + static_cast<long long>(route.sorted_pairs[row] / top_k) * hidden;
  for (int first = 0; first < 2 * k_tiles; first += 8) {
    const int block = first + lane / 4;
    const uint4 values = kScaleBlock * block < hidden
                             ? *reinterpret_cast<const uint4*>(source + kScaleBlock * block + 8 * (lane % 4))
                             : make_uint4(0, 0, 0, 0);
    float wide[8];
    widen_bf16x8(values, wide);
    const Mxfp8Share share = kFp8 ? quantize_fp8_share(wide) : quantize_mxfp8_share(wide);
    if (block < 2 * k_tiles) store_mxfp8_share(out, row, block, share);
  }
}

}  // namespace mxmoe::kernels

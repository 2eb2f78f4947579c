// The weighted un-permute: out[t] = sum over slots s of w(t, s) * (sum over k-splits of y[split][row(t, s)]),
// slots in order and splits in order, so the result is bit-identical run after run.
#pragma once

#include <cuda_bf16.h>

#include "kernels/device_utils.cuh"
#include "route/route_buffers.hpp"

namespace mxmoe::kernels {

constexpr int kUnpermuteThreads = 128;  // each thread: 8 consecutive outputs of one token
constexpr int kUnpermuteSlots = 32;     // slots whose rows and weights are staged at a time
// Grid: x = tokens, y = column blocks of 8 x kUnpermuteThreads.

// Budget: reads top_k x splits fp32 rows of H per token, writes H bf16; bandwidth-bound, small
// beside the expert weights at decode, where it is a latency term: the token's rows and weights
// are staged first (one round trip), so that every slot's row loads can be in flight at once.
__global__ void __launch_bounds__(kUnpermuteThreads)
    unpermute_kernel(const float* y, long long split_stride, int k_split, int hidden, int top_k, RouteBuffers route,
                     __nv_bfloat16* out) {
  __shared__ int rows[kUnpermuteSlots];
  __shared__ float weights[kUnpermuteSlots];
  wait_for_prerequisite_grids();  // FC2's partial outputs
  allow_dependent_grids();
  const int token = blockIdx.x;
  const int column = 8 * (blockIdx.y * kUnpermuteThreads + threadIdx.x);
  float acc[8] = {};
  for (int first = 0; first < top_k; first += kUnpermuteSlots) {
    const int slots = min(kUnpermuteSlots, top_k - first);
    __syncthreads();  // the previous chunk's rows are read
    if (static_cast<int>(threadIdx.x) < slots) {
      const int pair = token * top_k + first + threadIdx.x;
      rows[threadIdx.x] = route.pair_rows[pair];
      weights[threadIdx.x] = route.topk_weights[pair];
    }
    __syncthreads();
    if (column >= hidden) continue;
#pragma unroll 4
    for (int slot = 0; slot < slots; ++slot) {
      const float* row = y + static_cast<long long>(rows[slot]) * hidden + column;
      float sum[8] = {};
      for (int split = 0; split < k_split; ++split) {
        const float4 lo = *reinterpret_cast<const float4*>(row + split * split_stride);
        const float4 hi = *reinterpret_cast<const float4*>(row + split * split_stride + 4);
        sum[0] += lo.x, sum[1] += lo.y, sum[2] += lo.z, sum[3] += lo.w;
        sum[4] += hi.x, sum[5] += hi.y, sum[6] += hi.z, sum[7] += hi.w;
      }
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[i] += weights[slot] * sum[i];
    }
  }
  if (column >= hidden) return;
  uint4 packed;
  unsigned* words = reinterpret_cast<unsigned*>(&packed);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    words[i] = float_to_bf16_bits(acc[2 * i]) | (static_cast<unsigned>(float_to_bf16_bits(acc[2 * i + 1])) << 16);
  }
  *reinterpret_cast<uint4*>(out + static_cast<long long>(token) * hidden + column) = packed;
}

}  // namespace mxmoe::kernels

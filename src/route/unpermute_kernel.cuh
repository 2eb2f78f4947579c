// The weighted un-permute: out[t] = sum over slots s of w(t, s) * (sum over k-splits of y[split][row(t, s)]),
// slots in order and splits in order, so the result is bit-identical run after run; slots that go to
// no expert (row -1) add nothing. y is FC2's fp32 partials, or its bf16 rows where it ran in one K
// split (`bf16_rows`; Fc2Output::output_bf16).
#pragma once

#include <cuda_bf16.h>

#include "kernels/device_utils.cuh"
#include "route/route_buffers.hpp"

namespace mxmoe::kernels {

constexpr int kUnpermuteThreads = 128;  // each thread: 8 consecutive outputs of one token
constexpr int kUnpermuteSlots = 32;     // slots whose rows and weights are staged at a time
constexpr int kUnpermuteBatch = 8;      // bf16 rows loaded together
// Grid: x = tokens, y = column blocks of 8 x kUnpermuteThreads.

// Budget: reads top_k x splits fp32 rows (or top_k bf16 rows) of H per token, writes H bf16; bandwidth-bound, small
// beside the expert weights at decode, where it is a latency term. The token's rows and weights
// are staged before the wait on FC2 (the routing was complete before FC2 began: a routing kernel's,
// or the one FC1's first CTA writes for a batch that routes itself), so that after it every slot's
// row loads can be in flight at once.
__global__ void __launch_bounds__(kUnpermuteThreads)
    unpermute_kernel(const void* y, int bf16_rows, long long split_stride, int k_split, int hidden, int top_k,
                     RouteBuffers route, __nv_bfloat16* out) {
  __shared__ int rows[kUnpermuteSlots];
  __shared__ float weights[kUnpermuteSlots];
  const int token = blockIdx.x;
  const int column = 8 * (blockIdx.y * kUnpermuteThreads + threadIdx.x);
  auto stage_slots = [&](int first, int slots) {
    if (static_cast<int>(threadIdx.x) < slots) {
      const int pair = token * top_k + first + threadIdx.x;
      rows[threadIdx.x] = route.pair_rows[pair];
      weights[threadIdx.x] = route.topk_weights[pair];
    }
  };
  stage_slots(0, min(kUnpermuteSlots, top_k));
  __syncthreads();
  wait_for_prerequisite_grids();  // FC2's partial outputs
  allow_dependent_grids();
  float acc[8] = {};
  for (int first = 0; first < top_k; first += kUnpermuteSlots) {
    const int slots = min(kUnpermuteSlots, top_k - first);
    if (first > 0) {
      __syncthreads();  // the previous chunk's rows are read
      stage_slots(first, slots);
      __syncthreads();
    }
    if (column >= hidden) continue;
    if (bf16_rows) {
      // Every slot's row is loaded before the first is added: one L2 round trip for the token's
      // kUnpermuteBatch slots, not one a slot.
      for (int base = 0; base < slots; base += kUnpermuteBatch) {
        uint4 packed[kUnpermuteBatch];
#pragma unroll
        for (int b = 0; b < kUnpermuteBatch; ++b) {
          const int slot = base + b;
          if (slot < slots && rows[slot] >= 0) {
            packed[b] = *reinterpret_cast<const uint4*>(static_cast<const unsigned short*>(y) +
                                                        static_cast<long long>(rows[slot]) * hidden + column);
          }
        }
#pragma unroll
        for (int b = 0; b < kUnpermuteBatch; ++b) {
          const int slot = base + b;
          if (slot >= slots || rows[slot] < 0) continue;  // past the chunk, or a pair that goes to no expert
          const unsigned words[4] = {packed[b].x, packed[b].y, packed[b].z, packed[b].w};
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            acc[2 * i] += weights[slot] * __uint_as_float(words[i] << 16);
            acc[2 * i + 1] += weights[slot] * __uint_as_float(words[i] & 0xFFFF0000u);
          }
        }
      }
      continue;
    }
#pragma unroll 4
    for (int slot = 0; slot < slots; ++slot) {
      if (rows[slot] < 0) continue;  // a pair that goes to no expert
      const float* row = static_cast<const float*>(y) + static_cast<long long>(rows[slot]) * hidden + column;
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

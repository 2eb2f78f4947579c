// The GEMV-style expert family, for 1-8 rows per expert (decode): each warp streams one 16-row
// record column of one touched expert straight from global memory into registers, 16 bytes per lane
// per record, kUnroll records in flight, and multiplies it with the expert's <= 8 tokens, which the
// CTA stages once in shared memory. No weight byte is read twice and none goes through shared memory.
//
// Grid: x = row tiles / kWarps, y = active-expert slot (upper bound min(E, pairs)), z = k-split.
// Budget (per layer): every touched expert's records once (0.53 bytes per weight) plus the tokens'
// activations (2 K bytes per token per CTA, from L2); the MMAs do 8 tokens' work whatever the count,
// which is free while memory-bound. An expert with more than 8 rows is walked in groups of 8, which
// re-streams its weights: correct, and the tactic choice keeps such counts away from this family.
#pragma once

#include "kernels/expert_gemm.cuh"
#include "kernels/smem_bytes.hpp"

namespace mxmoe::kernels {

template <int kWarps, bool kFc1, int kUnroll>
__global__ void __launch_bounds__(kWarps * 32) expert_gemv_kernel(ExpertGemmArgs args, int k_split) {
  auto* staged = reinterpret_cast<unsigned short*>(dynamic_smem());
  const auto* input = static_cast<const unsigned short*>(args.input);
  const int slot = blockIdx.y;
  if (slot >= args.active_experts[args.num_experts]) return;
  const int expert = args.active_experts[slot];
  const int first_row = args.expert_offsets[expert];
  const int count = args.expert_offsets[expert + 1] - first_row;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row_tiles = args.rows / kRecordRows;
  const int row_tile = blockIdx.x * kWarps + warp;
  const int split = blockIdx.z;
  const int kt_begin = split * args.k_tiles / k_split, kt_end = (split + 1) * args.k_tiles / k_split;
  const int k_begin = kt_begin * kRecordK, k_len = (kt_end - kt_begin) * kRecordK;
  const int row_stride = k_len + 8;  // bf16; the extra 16 bytes put ldmatrix's 8 rows in distinct banks
  const unsigned char* records =
      args.records + ((static_cast<long long>(expert) * row_tiles + row_tile) * args.k_tiles + kt_begin) * kRecordBytes;
  const unsigned short* b_row = staged + (lane % 8) * row_stride + 8 * (lane / 8);

  for (int group = 0; group < count; group += kGemvTokens) {
    const int tokens = min(kGemvTokens, count - group);
    __syncthreads();  // the previous group's MMAs are done with `staged`
    const int chunks_per_row = k_len / 8;
    for (int c = threadIdx.x; c < kGemvTokens * chunks_per_row; c += blockDim.x) {
      const int r = c / chunks_per_row, k = k_begin + 8 * (c % chunks_per_row);
      uint4 v = make_uint4(0, 0, 0, 0);
      if (r < tokens && k < args.k) {
        v = *reinterpret_cast<const uint4*>(input + input_row<kFc1>(args, first_row + group + r) * args.k + k);
      }
      *reinterpret_cast<uint4*>(staged + r * row_stride + (k - k_begin)) = v;
    }
    __syncthreads();
    if (row_tile >= row_tiles) continue;

    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int kt = kt_begin; kt < kt_end; kt += kUnroll) {
      uint4 values[kUnroll];
      unsigned scales[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (kt + u < kt_end) {
          const unsigned char* record = records + (kt + u - kt_begin) * kRecordBytes;
          values[u] = load_stream_16(record + 16 * lane);
          scales[u] = load_stream_4(record + kRecordValueBytes + 4 * (lane / 4));
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (kt + u < kt_end) {
          unsigned a[4][4], b[8];
          dequantize_record(values[u], scales[u], a);
          load_token_fragments(b, b_row + (kt + u - kt_begin) * kRecordK);
          mma_record(acc, a, b);
        }
      }
    }
    store_accumulators<kFc1>(args, acc, expert, row_tile, first_row + group, tokens, split);
  }
}

}  // namespace mxmoe::kernels

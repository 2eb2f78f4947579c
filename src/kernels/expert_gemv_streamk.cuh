// The stream-K GEMV: the GEMV family's work (each warp streams 16-row record columns of the touched
// experts into registers and multiplies them with the expert's staged tokens), cut into equal shares
// for exactly one CTA per SM. The stage's units (token tile x column group x K tile) are numbered
// column group by column group, and CTA c takes units [c U / C, (c + 1) U / C): a few whole column
// groups, and at each end a piece of one. So every SM streams the same bytes, none waits in a last,
// partly filled wave of CTAs, and no CTA is launched after the first (the CTAs of a wave stay in
// step and their warps are latency-bound, so a multi-wave GEMV's last wave streams at the bandwidth
// of the CTAs it has: docs/performance.md, "The heuristic's decisions").
//
// A column group split between CTAs: its first piece is the last of the CTA that begins it, its
// later pieces the first of the next CTAs with a share (with fewer units than CTAs, some have
// none), which write their partial sums and raise a flag; the first piece's CTA adds them in CTA
// order (the result does not depend on timing) and stores. The routing zeroes the flags before
// every forward (so this family never routes a batch itself). A CTA waits only at its end, and
// only on later CTAs' first pieces, so the launch progresses whenever two of its CTAs fit at
// once; the host launches as many as are resident.
//
// Grid (expert_gemv_streamk_family.cpp): x = CTAs (the resident count, at most kMaxStreamCtas); one
// K range per piece, so no K split. Budget: the touched experts' records once, a token tile's
// activations (all of K, from L2) once per CTA that streams any of its columns, per split column
// group one CTA's partial sums (threads x kTokens / 2 floats) through L2, and per CTA the routing's
// tile and expert offsets (8 (E + 1) bytes, from L2, kept in shared memory).
#pragma once

#include "kernels/expert_gemv.cuh"

namespace mxmoe::kernels {

// Dynamic shared memory: the staging, then (16-byte aligned) a copy of the routing's tile offsets
// and expert offsets, [E + 1] each, which every piece searches.
constexpr int stream_offsets_at(int tokens, int rows, int k_tiles) {
  return align16(gemv_staging_bytes(tokens, rows, k_tiles, 1));
}
constexpr int stream_smem_bytes(int tokens, int rows, int k_tiles, int num_experts) {
  return stream_offsets_at(tokens, rows, k_tiles) + 2 * (num_experts + 1) * 4;
}

}  // namespace mxmoe::kernels

#if defined(__CUDACC__)
namespace mxmoe::kernels {

template <int kColumns, int kTokens, bool kFc1, int kUnroll>
__global__ void __launch_bounds__(kColumns * 32, 1) expert_gemv_streamk_kernel(ExpertGemmArgs routing_args,
                                                                                int /*k_split*/, GemvOptions options) {
  static_assert(kTokens == 8 || kTokens == 16, "8 or 16 tokens per tile");
  static_assert(kColumns * 32 * kTokens / 2 <= kStreamPartialFloats, "partial sums past the workspace's slot");
  constexpr int kAccumulators = kTokens / 8 * 4;
  if constexpr (kFc1) {
    wait_for_prerequisite_grids();  // the routing
    allow_dependent_grids();
  }
  // Every piece looks its tile's expert up in the tile offsets (a binary search) and then reads the
  // expert's offsets: from a copy in shared memory, made with one round trip of parallel loads,
  // where from global memory that chain is ~8 dependent L2 round trips before a CTA's first weight
  // load (docs/performance.md, "The heuristic's decisions").
  ExpertGemmArgs args = routing_args;
  {
    const int experts = args.num_experts;
    int* offsets = reinterpret_cast<int*>(dynamic_smem() + stream_offsets_at(kTokens, args.staged_rows, args.k_tiles));
    for (int e = threadIdx.x; e <= experts; e += blockDim.x) {
      offsets[e] = args.tile_offsets[e];
      offsets[experts + 1 + e] = args.expert_offsets[e];
    }
    __syncthreads();
    args.tile_offsets = offsets;
    args.expert_offsets = offsets + experts + 1;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int k_tiles = args.k_tiles, groups = (args.rows / kRecordRows + kColumns - 1) / kColumns;
  const long long units = static_cast<long long>(args.tile_offsets[args.num_experts]) * groups * k_tiles;
  const long long begin = units * blockIdx.x / gridDim.x, end = units * (blockIdx.x + 1) / gridDim.x;
  float* partials = args.stream_partials + threadIdx.x * kAccumulators;  // + CTA x kStreamPartialFloats
  bool inputs_ready = kFc1;
  int staged_tile = -1;  // the token tile whose rows (all of K) are in shared memory
  for (long long u = begin; u < end;) {
    const int item = static_cast<int>(u / k_tiles), k0 = static_cast<int>(u % k_tiles);
    const int k1 = static_cast<int>(end - u < k_tiles - k0 ? k0 + (end - u) : k_tiles);
    u += k1 - k0;
    const int tile = item / groups, expert = expert_of_tile(args, tile);
    const int first_row = args.expert_offsets[expert] + (tile - args.tile_offsets[expert]) * kTokens;
    // The tile's work over all of K: its rows are staged whole, once per tile, and the piece
    // streams records [k0, k1) of each column.
    const int count = min(kTokens, args.expert_offsets[expert + 1] - first_row);
    const GemvWork w = gemv_work_of(args, expert, first_row, count, 0, 1);
    const int row_tile = item % groups * kColumns + warp, records = k1 - k0;
    const bool streams = row_tile < w.row_tiles;
    const unsigned char* column = w.column(args, row_tile) + static_cast<long long>(k0) * kRecordBytes;
    RecordBatch<kUnroll> batch_a, batch_b;
    batch_a.load(column, 0, records, streams, lane);
    if (!inputs_ready) {
      wait_for_prerequisite_grids();  // FC1's activations
      allow_dependent_grids();
      inputs_ready = true;
    }
    const GemvStaging<kTokens> staging(args, w);
    if (tile != staged_tile) {
      __syncthreads();  // the previous tile's rows are no longer read
      stage_token_rows(args, w, 0, w.count, staging.source_rows, staging.rows, kFc1, options.round_fp8 != 0);
      __syncthreads();
      staged_tile = tile;
    }
    unsigned b_rows[kTokens / 8];  // at the piece's first K tile
    token_fragment_rows<kTokens>(b_rows, staging.rows + k0 * kRecordK, args.staged_rows, w.row_stride);
    float acc[kTokens / 8][4] = {};
    if (streams) stream_records<kTokens>(acc, batch_a, batch_b, column, 0, records, b_rows, options.scales_one_multiply != 0);

    if (k0 > 0) {  // a later piece of a group an earlier CTA began (this CTA's first)
      float* mine = partials + static_cast<long long>(blockIdx.x) * kStreamPartialFloats;
#pragma unroll
      for (int i = 0; i < kAccumulators; ++i) mine[i] = acc[i / 4][i % 4];
      __syncthreads();
      if (threadIdx.x == 0) {
        __threadfence();
        store_release(args.stream_flags + blockIdx.x, 1);
      }
      continue;
    }
    if (k1 < k_tiles) {  // the group's first piece (this CTA's last): add the next CTAs' pieces in order
      const long long group_end = static_cast<long long>(item + 1) * k_tiles;
      for (int next = blockIdx.x + 1; units * next / gridDim.x < group_end; ++next) {
        if (units * (next + 1) / gridDim.x == units * next / gridDim.x) continue;  // an empty share
        if (threadIdx.x == 0) {
          while (load_acquire(args.stream_flags + next) == 0) {
          }
        }
        __syncthreads();
        const float* theirs = partials + static_cast<long long>(next) * kStreamPartialFloats;
#pragma unroll
        for (int i = 0; i < kAccumulators; ++i) acc[i / 4][i % 4] += __ldcg(theirs + i);
      }
    }
    if (!streams) continue;
#pragma unroll
    for (int t = 0; t < kTokens / 8; ++t) {
      store_accumulators(args, acc[t], w.expert, row_tile, w.first_row + 8 * t, w.count - 8 * t, 0, kFc1);
    }
  }
}

}  // namespace mxmoe::kernels
#endif

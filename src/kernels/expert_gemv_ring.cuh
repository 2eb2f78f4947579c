// The ring GEMV: the GEMV family's work (one 16-row record column of one touched expert per warp,
// the expert's <= kTokens tokens staged once per CTA), with the weight stream moved out of
// registers. Each warp owns a kStages-deep ring of 4-record chunks in shared memory; its lane 0
// keeps kStages chunks in flight with cp.async.bulk copies that complete on one mbarrier per slot,
// and the warp consumes a chunk as soon as its barrier's phase flips, refilling the slot behind
// it. A warp so holds (kStages - 1) x 2176 bytes in flight while needing no registers for them,
// which lets an SM run the warps that hide the dequantisation chains.
//
// Grid and budget as for the register GEMV (expert_gemv.cuh); the first kStages chunks are issued
// before the activations are staged, and FC2 issues them before waiting on FC1.
#pragma once

#include "kernels/expert_gemm.cuh"

namespace mxmoe::kernels {

// Dynamic shared memory: the staging, then per warp `stages` chunks of 4 records and a barrier each.
constexpr int kRingChunkRecords = 4;
constexpr int ring_smem_bytes(int tokens, int rows, int k_tiles, int k_split, int columns, int stages) {
  return gemv_staging_bytes(tokens, rows, k_tiles, k_split) + columns * stages * (kRingChunkRecords * kRecordBytes + 8);
}

}  // namespace mxmoe::kernels

#if defined(__CUDACC__)
namespace mxmoe::kernels {

template <int kColumns, int kTokens, bool kFc1, int kStages>
__global__ void __launch_bounds__(kColumns * 32) expert_gemv_ring_kernel(ExpertGemmArgs args, int k_split) {
  static_assert(kTokens == 8 || kTokens == 16, "8 or 16 tokens per pass");
  constexpr int kChunkBytes = kRingChunkRecords * kRecordBytes;
  if constexpr (kFc1) {
    wait_for_prerequisite_grids();  // the routing
    allow_dependent_grids();
  }
  const GemvWork w = gemv_work(args, blockIdx.y, blockIdx.z, k_split);
  if (w.expert < 0) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row_tile = blockIdx.x * kColumns + warp;
  const bool streams = row_tile < w.row_tiles;
  const int records = w.records;
  const int chunks = (records + kRingChunkRecords - 1) / kRingChunkRecords;
  const unsigned char* column = w.column(args, row_tile);
  const GemvStaging<kTokens> staging(args, w);  // then the warps' rings, then their barriers
  unsigned char* ring = staging.end + warp * kStages * kChunkBytes;
  const unsigned ring_address = shared_address(ring);
  const unsigned barriers = shared_address(staging.end + kColumns * kStages * kChunkBytes) + warp * kStages * 8;
  unsigned b_rows[kTokens / 8];
  token_fragment_rows<kTokens>(b_rows, staging.rows, args.staged_rows, w.row_stride);

  if (lane == 0) {
    for (int s = 0; s < kStages; ++s) mbarrier_init(barriers + 8 * s, 1);
    fence_mbarrier_init();
  }
  __syncwarp();
  // Chunks are issued and consumed in one sequence per warp, across token groups: the i-th chunk
  // goes to slot i % kStages, in that slot's (i / kStages)-th phase.
  unsigned issued = 0, consumed = 0;
  auto issue = [&](int chunk) {
    const int first = chunk * kRingChunkRecords;
    const unsigned bytes = static_cast<unsigned>(min(kRingChunkRecords, records - first) * kRecordBytes);
    const unsigned s = issued++ % kStages;
    bulk_copy_to_shared(ring_address + s * kChunkBytes, column + static_cast<long long>(first) * kRecordBytes, bytes,
                        barriers + 8 * s);
  };
  auto fill = [&] {
    if (streams && lane == 0) {
      for (int c = 0; c < min(kStages, chunks); ++c) issue(c);
    }
  };
  fill();
  if constexpr (!kFc1) {
    wait_for_prerequisite_grids();  // FC1's activations
    allow_dependent_grids();
  }
  for (int group = 0; group < w.count; group += kTokens) {
    const int tokens = min(kTokens, w.count - group);
    if (group > 0) {
      __syncthreads();  // the previous group's MMAs are done with the staged rows
      fill();
    }
    stage_token_rows(args, w, group, tokens, staging.source_rows, staging.rows, kFc1, false);
    __syncthreads();
    if (!streams) continue;

    float acc[kTokens / 8][4] = {};
    for (int chunk = 0; chunk < chunks; ++chunk) {
      const unsigned s = consumed % kStages;
      mbarrier_wait(barriers + 8 * s, (consumed / kStages) & 1);
      ++consumed;
      const unsigned char* records_in_slot = ring + s * kChunkBytes;
#pragma unroll
      for (int u = 0; u < kRingChunkRecords; ++u) {
        const int record = chunk * kRingChunkRecords + u;
        if (record < records) {
          const unsigned char* r = records_in_slot + u * kRecordBytes;
          const unsigned scale_word = *reinterpret_cast<const unsigned*>(r + kRecordValueBytes + 4 * (lane / 4));
          multiply_record<kTokens>(acc, *reinterpret_cast<const uint4*>(r + 16 * lane), scale_word, b_rows, record,
                                   scale_codes_take_one_multiply(scale_word));
        }
      }
      __syncwarp();  // every lane is done reading the slot before it is refilled
      if (lane == 0 && chunk + kStages < chunks) issue(chunk + kStages);
    }
#pragma unroll
    for (int t = 0; t < kTokens / 8; ++t) {
      store_accumulators(args, acc[t], w.expert, row_tile, w.first_row + group + 8 * t, tokens - 8 * t, blockIdx.z,
                         kFc1);
    }
  }
}

}  // namespace mxmoe::kernels
#endif

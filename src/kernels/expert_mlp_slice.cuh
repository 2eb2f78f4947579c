// The mlp slice, for a 1-8 token step: CTA (s, e) runs FC1's 8 record columns s (64 outputs of
// active expert slot e, with the SwiGLU) and then the part of FC2 those outputs feed, its K tile s
// over all H rows. Nothing waits on another CTA: FC2's K tile needs only this CTA's FC1 outputs,
// and each CTA writes its own FC2 partial sums (split s), which the un-permute adds up. So FC2's
// weights need not wait for FC1 at all: the CTA bulk-copies its FC2 records (one per FC2 row tile,
// 98 KB for gpt-oss) into shared memory as soon as it has routed, and they arrive while its FC1
// columns stream through registers. The two stages' bytes are one stream, with no kernel
// boundary between them and no second ramp-up.
//
// The batch routes itself in every CTA (expert_gemm.cuh; at most kSmallBatchPairs pairs and
// kTokens tokens, so an expert's rows fit one pass); CTA (0, 0) writes the routing for the caller.
//
// Grid: x = FC2 K tiles (= FC1 column groups of 8), y = active-expert slot (bound min(E, pairs)).
// Budget (per layer): every touched expert's records once (0.53 bytes per weight), the tokens' x
// (2 H bytes per token per CTA, from L2), and FC2 partial sums of K / 64 x pairs x H fp32 (2 MB
// for gpt-oss at T = 1), written here and read back once by the un-permute from L2.
#pragma once

#include "kernels/expert_gemv.cuh"
#include "kernels/smem_bytes.hpp"

namespace mxmoe::kernels {

// FC2's K tile `slice` of the CTA's expert: its records, already in shared memory (`records`,
// one per FC2 row tile, completing on `barrier`), times the tokens' FC1 outputs over that K tile,
// which this CTA's FC1 just wrote. Each warp takes whole row tiles, one record each.
template <int kTokens>
__device__ __forceinline__ void fc2_slice_from_shared(const ExpertGemmArgs& fc2, const GemvWork& fc1_work, int slice,
                                                      const unsigned char* records, unsigned barrier) {
  const int warp = threadIdx.x / 32, warps = blockDim.x / 32, lane = threadIdx.x % 32;
  const GemvWork w = gemv_work_of(fc2, fc1_work.expert, fc1_work.first_row, fc1_work.count, slice, gridDim.x);
  const GemvStaging<kTokens> staging(fc2, w);
  stage_token_rows(fc2, w, 0, w.count, staging.source_rows, staging.rows, false);
  __syncthreads();
  unsigned b_rows[kTokens / 8];
  token_fragment_rows<kTokens>(b_rows, staging.rows, fc2.staged_rows, w.row_stride);
  mbarrier_wait(barrier, 0);
  for (int row_tile = warp; row_tile < w.row_tiles; row_tile += warps) {
    const unsigned char* record = records + row_tile * kRecordBytes;
    float acc[kTokens / 8][4] = {};
    multiply_record<kTokens>(acc, *reinterpret_cast<const uint4*>(record + 16 * lane),
                             *reinterpret_cast<const unsigned*>(record + kRecordValueBytes + 4 * (lane / 4)), b_rows, 0);
#pragma unroll
    for (int t = 0; t < kTokens / 8; ++t) {
      store_accumulators(fc2, acc[t], w.expert, row_tile, w.first_row + 8 * t, w.count - 8 * t, slice, false);
    }
  }
}

// Two CTAs per SM: the FC2 records take ~100 KB of shared memory each.
template <int kWarpsK, int kTokens, int kUnroll>
__global__ void __launch_bounds__(kMlpColumns * kWarpsK * 32, 2)
    expert_mlp_slice_kernel(ExpertGemmArgs fc1, ExpertGemmArgs fc2) {
  wait_for_prerequisite_grids();  // the logits
  allow_dependent_grids();
  const int slice = blockIdx.x, lane = threadIdx.x % 32;
  unsigned char* const smem = dynamic_smem();
  const int gemv_bytes = gemv_smem_bytes(kTokens, fc1.staged_rows, fc1.k_tiles, 1, kMlpColumns, kWarpsK);
  const GemvWork w = route_small_batch_in_cta(fc1, smem + small_route_offset(gemv_bytes), blockIdx.y,
                                              slice == 0 && blockIdx.y == 0, 0, 1);
  if (w.expert < 0) return;

  const int fc2_row_tiles = fc2.rows / kRecordRows;
  unsigned char* const records = smem + mlp_slice_records_offset(fc1.staged_rows, fc1.k_tiles, kWarpsK, fc1.num_experts);
  const unsigned barrier = shared_address(records + fc2_row_tiles * kRecordBytes);
  if (threadIdx.x < 32) {  // warp 0 issues the FC2 records' copies: record (row tile r, K tile `slice`)
    if (lane == 0) {
      mbarrier_init(barrier, 1);
      fence_mbarrier_init();
      mbarrier_arrive_expect_tx(barrier, static_cast<unsigned>(fc2_row_tiles * kRecordBytes));
    }
    __syncwarp();
    const unsigned char* first =
        fc2.records + (static_cast<long long>(w.expert) * fc2_row_tiles * fc2.k_tiles + slice) * kRecordBytes;
    for (int r = lane; r < fc2_row_tiles; r += 32) {
      bulk_copy_counted(shared_address(records + r * kRecordBytes),
                        first + static_cast<long long>(r) * fc2.k_tiles * kRecordBytes, kRecordBytes, barrier);
    }
  }
  gemv_columns<kMlpColumns, kWarpsK, kTokens, kUnroll>(fc1, w, slice, 0, true, [] {});
  __syncthreads();  // FC1's outputs are written (visible to the CTA) and its staging is free
  fc2_slice_from_shared<kTokens>(fc2, w, slice, records, barrier);
}

}  // namespace mxmoe::kernels

// The mlp slice, for a 1-8 token step: CTA (s, e) runs FC1's 8 record columns s (64 outputs of
// active expert slot e, with the SwiGLU) and then the part of FC2 those outputs feed, its K tile s
// over all H rows. Nothing waits on another CTA: FC2's K tile needs only this CTA's FC1 outputs,
// and each CTA writes its own FC2 partial sums (split s), which the un-permute adds up. So FC2's
// weights need not wait for FC1: the CTA prefetches its FC2 records (one per FC2 row tile, 98 KB
// for gpt-oss) into L2 as soon as it has routed, and their DRAM reads happen while its FC1 columns
// stream through registers; after FC1 the CTA reads them from L2. The layer has one weight stream
// and no kernel boundary inside it.
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

// FC2's K tile `slice` of the CTA's expert times the tokens' FC1 outputs over that K tile, which
// this CTA's FC1 just wrote. Each warp takes whole row tiles, one record each (`column_of(r)`:
// record (r, slice), which the CTA's prefetch has put in L2), kBatch records' loads in flight at
// once.
template <int kTokens, typename ColumnOf>
__device__ __forceinline__ void fc2_slice(const ExpertGemmArgs& fc2, const GemvWork& fc1_work, int slice,
                                          ColumnOf column_of) {
  constexpr int kBatch = 4;
  const int warp = threadIdx.x / 32, warps = blockDim.x / 32, lane = threadIdx.x % 32;
  const GemvWork w = gemv_work_of(fc2, fc1_work.expert, fc1_work.first_row, fc1_work.count, slice, gridDim.x);
  const GemvStaging<kTokens> staging(fc2, w);
  stage_token_rows(fc2, w, 0, w.count, staging.source_rows, staging.rows, false);
  __syncthreads();
  unsigned b_rows[kTokens / 8];
  token_fragment_rows<kTokens>(b_rows, staging.rows, fc2.staged_rows, w.row_stride);
  for (int first = warp; first < w.row_tiles; first += kBatch * warps) {
    uint4 values[kBatch];
    unsigned scales[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int row_tile = first + u * warps;
      if (row_tile < w.row_tiles) {
        values[u] = load_stream_16(column_of(row_tile) + 16 * lane);
        scales[u] = load_stream_4(column_of(row_tile) + kRecordValueBytes + 4 * (lane / 4));
      }
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int row_tile = first + u * warps;
      if (row_tile >= w.row_tiles) continue;
      float acc[kTokens / 8][4] = {};
      multiply_record<kTokens>(acc, values[u], scales[u], b_rows, 0);
#pragma unroll
      for (int t = 0; t < kTokens / 8; ++t) {
        store_accumulators(fc2, acc[t], w.expert, row_tile, w.first_row + 8 * t, w.count - 8 * t, slice, false);
      }
    }
  }
}

// Two CTAs per SM, so that 180 CTAs (gpt-oss at T = 1) are one wave.
template <int kWarpsK, int kTokens, int kUnroll>
__global__ void __launch_bounds__(kMlpColumns * kWarpsK * 32, 2)
    expert_mlp_slice_kernel(ExpertGemmArgs fc1, ExpertGemmArgs fc2) {
  wait_for_prerequisite_grids();  // the logits
  allow_dependent_grids();
  const int slice = blockIdx.x;
  const int gemv_bytes = gemv_smem_bytes(kTokens, fc1.staged_rows, fc1.k_tiles, 1, kMlpColumns, kWarpsK);
  const GemvWork w = route_small_batch_in_cta(fc1, dynamic_smem() + small_route_offset(gemv_bytes), blockIdx.y,
                                              slice == 0 && blockIdx.y == 0, 0, 1);
  if (w.expert < 0) return;
  // FC2's records of the slice, (row tile r, K tile `slice`) for every r, into L2 now, to stay
  // there while FC1's columns stream past them: 544 bytes each, every 128-byte line they touch.
  const unsigned char* fc2_first =
      fc2.records + (static_cast<long long>(w.expert) * (fc2.rows / kRecordRows) * fc2.k_tiles + slice) * kRecordBytes;
  auto column_of = [&](int row_tile) { return fc2_first + static_cast<long long>(row_tile) * fc2.k_tiles * kRecordBytes; };
  constexpr int kLinesPerRecord = 6;  // offsets 0, 128, ..., 512 and the last byte
  for (int i = threadIdx.x; i < fc2.rows / kRecordRows * kLinesPerRecord; i += blockDim.x) {
    const int line = i % kLinesPerRecord;
    prefetch_l2_evict_last(column_of(i / kLinesPerRecord) + (line < 5 ? 128 * line : kRecordBytes - 1));
  }
  gemv_columns<kMlpColumns, kWarpsK, kTokens, kUnroll>(fc1, w, slice, 0, true, [] {});
  __syncthreads();  // FC1's outputs are written (visible to the CTA) and its staging is free
  fc2_slice<kTokens>(fc2, w, slice, column_of);
}

}  // namespace mxmoe::kernels

// Dynamic shared memory of the expert kernels, for the kernels and for the host that launches them
// and checks tactics against an arch's limit. Plain header: NVRTC compiles it too.
#pragma once

#include "kernels/mxfp4_fragment.cuh"
#include "route/route_buffers.hpp"

namespace mxmoe::kernels {

constexpr int kSmemActivationRowBytes = (64 + 8) * 2;  // one token's 64 K of bf16, +16 bytes against bank conflicts

// `bytes` rounded up to 16, where a region after another starts (16-byte vector accesses).
constexpr int align16(int bytes) { return (bytes + 15) / 16 * 16; }

// The GEMV families' token staging for a `tokens`-token tactic (8 or 16) that stages `rows` of
// them (min(tokens, the batch's tokens)): the tactic's source-row slots (8 bytes each), then the
// rows of the split's K range (+16 bytes each).
constexpr int gemv_staging_bytes(int tokens, int rows, int k_tiles, int k_split) {
  return tokens * 8 + rows * ((k_tiles + k_split - 1) / k_split * 64 + 8) * 2;
}

// GEMV: the staging, then the partial sums of the warps past the first along K (columns x
// (warps_k - 1) warps x 32 lanes x tokens / 2).
constexpr int gemv_smem_bytes(int tokens, int rows, int k_tiles, int k_split, int columns, int warps_k) {
  return gemv_staging_bytes(tokens, rows, k_tiles, k_split) + columns * (warps_k - 1) * 32 * tokens / 2 * 4;
}

// Stream-K GEMV: the staging, then (16-byte aligned) a copy of the routing's tile offsets and
// expert offsets, [E + 1] each, which every piece searches (expert_gemv_streamk.cuh).
constexpr int stream_offsets_at(int tokens, int rows, int k_tiles) {
  return align16(gemv_staging_bytes(tokens, rows, k_tiles, 1));
}
constexpr int stream_smem_bytes(int tokens, int rows, int k_tiles, int num_experts) {
  return stream_offsets_at(tokens, rows, k_tiles) + 2 * (num_experts + 1) * 4;
}

// A batch that routes itself (expert_gemm.cuh) keeps its routing past the kernel's own shared
// memory, 16-byte aligned: each pair's expert, weight, sorted row and each sorted row's pair
// (kSmallBatchPairs each), the CTA's own words (its expert, first row, row count), and the
// workspace writer's counts [E] and offsets [E + 1].
constexpr int kSmallRouteOwnWords = 3;
constexpr int small_route_offset(int kernel_bytes) { return align16(kernel_bytes); }
constexpr int small_route_bytes(int num_experts) {
  return 4 * (4 * kSmallBatchPairs + kSmallRouteOwnWords + 2 * num_experts + 1);
}

// The fused layer: the larger of its two stages' GEMV needs (FC1's K is H, FC2's is I), then its
// control block (the item's ticket and stage arguments), then a copy of the routing's active list
// and expert offsets (2 (E + 1) ints). No kernel here has static shared memory, so the host may
// allow each the device's whole opt-in amount.
constexpr int kFusedControlBytes = 256;
constexpr int fused_control_offset(int tokens, int rows, int fc1_k_tiles, int fc2_k_tiles, int columns, int warps_k) {
  const int fc1 = gemv_smem_bytes(tokens, rows, fc1_k_tiles, 1, columns, warps_k);
  const int fc2 = gemv_smem_bytes(tokens, rows, fc2_k_tiles, 1, columns, warps_k);
  return align16(fc1 > fc2 ? fc1 : fc2);
}
constexpr int fused_smem_bytes(int tokens, int rows, int fc1_k_tiles, int fc2_k_tiles, int columns, int warps_k,
                               int num_experts) {
  return fused_control_offset(tokens, rows, fc1_k_tiles, fc2_k_tiles, columns, warps_k) + kFusedControlBytes +
         8 * (num_experts + 1);
}

// Ring GEMV: the staging, then per warp `stages` chunks of 4 records and a barrier each.
constexpr int kRingChunkRecords = 4;
constexpr int ring_smem_bytes(int tokens, int rows, int k_tiles, int k_split, int columns, int stages) {
  return gemv_staging_bytes(tokens, rows, k_tiles, k_split) + columns * stages * (kRingChunkRecords * kRecordBytes + 8);
}

// Tiled: `stages` copies of (records of tile_rows rows + tile_tokens activation rows), plus each
// token's 8-byte source row offset.
constexpr int mma_tile_stage_bytes(int tile_rows, int tile_tokens) {
  return tile_rows / 16 * kRecordBytes + tile_tokens * kSmemActivationRowBytes;
}
constexpr int mma_tile_smem_bytes(int tile_rows, int tile_tokens, int stages) {
  return stages * mma_tile_stage_bytes(tile_rows, tile_tokens) + tile_tokens * 8;
}

}  // namespace mxmoe::kernels

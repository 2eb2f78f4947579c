// Dynamic shared memory of the expert kernels, for the kernels and for the host that launches them
// and checks tactics against an arch's limit. Plain header: NVRTC compiles it too.
#pragma once

#include "kernels/expert_gemm_args.hpp"
#include "kernels/mxfp4_fragment.cuh"
#include "route/route_buffers.hpp"

namespace mxmoe::kernels {

constexpr int kSmemActivationRowBytes = (64 + 8) * 2;  // one token's 64 K of bf16, +16 bytes against bank conflicts

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

// A batch that routes itself (expert_gemm.cuh) keeps its routing past the kernel's own shared
// memory, 16-byte aligned: each pair's expert, weight, sorted row and each sorted row's pair
// (kSmallBatchPairs each), the CTA's own words (its expert, first row, row count), and the
// workspace writer's counts [E] and offsets [E + 1].
constexpr int kSmallRouteOwnWords = 3;
constexpr int small_route_offset(int kernel_bytes) { return (kernel_bytes + 15) / 16 * 16; }
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
  return ((fc1 > fc2 ? fc1 : fc2) + 15) / 16 * 16;
}
constexpr int fused_smem_bytes(int tokens, int rows, int fc1_k_tiles, int fc2_k_tiles, int columns, int warps_k,
                               int num_experts) {
  return fused_control_offset(tokens, rows, fc1_k_tiles, fc2_k_tiles, columns, warps_k) + kFusedControlBytes +
         8 * (num_experts + 1);
}

// The wave layer (expert_layer_wave.cuh) for `ctas` CTAs of `warps` warps at top-k `top_k`:
// - FC2's records of the CTA's row tiles (tiles c, c + ctas, ...) for every slot, one column each;
// - the mbarrier their bulk copies complete on, and the routing (small_route_bytes);
// - the scratch, which each stage uses in turn: its staged rows (FC1: the token's x; FC2: one
//   activation row per slot), then its partial sums, 16 floats per warp and unit it touches.
// A CTA's FC1 share is units [wave_fc1_unit_begin(c), wave_fc1_unit_begin(c + 1)) (unit u: slot
// u / FC1 row tiles, that row tile's column), chosen so that every CTA reads about as many records
// over both stages: CTA c's cumulative share ends near (c + 1) / ctas of all records, less the FC2
// columns it owns. That target is convex in c, so its positive part is nondecreasing and every
// unit lands in exactly one CTA.
constexpr int wave_fc1_unit_begin(int cta, int ctas, int top_k, int fc1_row_tiles, int fc1_k_tiles, int fc2_row_tiles,
                                  int fc2_k_tiles) {
  const long long fc1_units = static_cast<long long>(top_k) * fc1_row_tiles;
  const long long records = fc1_units * fc1_k_tiles + static_cast<long long>(top_k) * fc2_row_tiles * fc2_k_tiles;
  const long long owned_before = static_cast<long long>(fc2_row_tiles / ctas) * cta +
                                 (cta < fc2_row_tiles % ctas ? cta : fc2_row_tiles % ctas);
  const long long target = cta * records - static_cast<long long>(ctas) * top_k * fc2_k_tiles * owned_before;
  const long long unit = ((target > 0 ? target : 0) + static_cast<long long>(ctas) * fc1_k_tiles / 2) /
                         (static_cast<long long>(ctas) * fc1_k_tiles);
  return static_cast<int>(unit < fc1_units ? unit : fc1_units);
}
// Units that `records` records, split evenly over `warps`, put in one warp's share at most.
constexpr int wave_segments(int records, int warps, int k_tiles) {
  const int share = (records + warps - 1) / warps;
  return (share + k_tiles - 1) / k_tiles + 1;
}
constexpr WaveLayout wave_layout(int num_experts, int top_k, int fc1_row_tiles, int fc1_k_tiles, int fc2_row_tiles,
                                 int fc2_k_tiles, int ctas, int warps) {
  WaveLayout l{};
  l.fc2_tiles_per_cta = (fc2_row_tiles + ctas - 1) / ctas;
  int fc1_units = 0;
  for (int c = 0; c < ctas; ++c) {
    const int units = wave_fc1_unit_begin(c + 1, ctas, top_k, fc1_row_tiles, fc1_k_tiles, fc2_row_tiles, fc2_k_tiles) -
                      wave_fc1_unit_begin(c, ctas, top_k, fc1_row_tiles, fc1_k_tiles, fc2_row_tiles, fc2_k_tiles);
    fc1_units = units > fc1_units ? units : fc1_units;
  }
  l.fc1_segments = wave_segments(fc1_units * fc1_k_tiles, warps, fc1_k_tiles);
  l.fc2_segments = wave_segments(l.fc2_tiles_per_cta * top_k * fc2_k_tiles, warps, fc2_k_tiles);
  l.barrier = l.fc2_tiles_per_cta * top_k * fc2_k_tiles * kRecordBytes;
  l.route = l.barrier + 16;
  l.scratch = small_route_offset(l.route + small_route_bytes(num_experts));
  l.fc1_partials = small_route_offset(2 * (fc1_k_tiles * 64 + 8));
  l.fc2_partials = small_route_offset(2 * top_k * (fc2_k_tiles * 64 + 8));
  const int fc1_scratch = l.fc1_partials + warps * l.fc1_segments * 16 * 4;
  const int fc2_scratch = l.fc2_partials + warps * l.fc2_segments * 16 * 4;
  l.bytes = l.scratch + (fc1_scratch > fc2_scratch ? fc1_scratch : fc2_scratch);
  return l;
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

// The tiled expert family, for more than a handful of rows per expert (prefill): a CTA computes
// kTileRows weight rows x kTileTokens sorted rows of one expert, staging each 64-wide K slice of
// both operands in shared memory with a kStages-deep cp.async pipeline. Warps split the tile
// kWarpsRows x kWarpsTokens; a warp dequantizes its records once per K slice and reuses them for all
// its token columns. Small kTileTokens (16, 32) is the small-tile variant for tens of rows per
// expert; 64 and 128 the large tiles for prefill.
//
// Grid (expert_mma_tile_family.cpp): x = token-tile slot (upper bound pairs / kTileTokens + min(E,
// pairs); a CTA past the last tile exits), y = rows / kTileRows (rounded up), z = k-split (FC2
// only). Neighbouring CTAs share a weight row tile, so its records are served from L2 to every
// token tile of the expert. Budget: per CTA, kTileRows x K weights (0.53 bytes each) and
// kTileTokens x K activations (2 bytes), 2 kTileRows kTileTokens K FLOPs; with 128 x 128 tiles that
// is ~100 FLOPs per byte, so large tiles are bound by the tensor cores (and the dequantization
// feeding them), small ones by memory.
#pragma once

#include "kernels/expert_gemm.cuh"

namespace mxmoe::kernels {

constexpr int kSmemActivationRowBytes = (64 + 8) * 2;  // one token's 64 K of bf16, +16 bytes against bank conflicts

// Dynamic shared memory: `stages` copies of (records of tile_rows rows + tile_tokens activation
// rows), then each token's 8-byte source row offset.
constexpr int mma_tile_stage_bytes(int tile_rows, int tile_tokens) {
  return tile_rows / 16 * kRecordBytes + tile_tokens * kSmemActivationRowBytes;
}
constexpr int mma_tile_smem_bytes(int tile_rows, int tile_tokens, int stages) {
  return stages * mma_tile_stage_bytes(tile_rows, tile_tokens) + tile_tokens * 8;
}

}  // namespace mxmoe::kernels

#if defined(__CUDACC__)
namespace mxmoe::kernels {

template <int kTileRows, int kTileTokens, int kStages>
struct MmaTileSmem {
  static constexpr int kRecords = kTileRows / kRecordRows;
  static constexpr int kRowStride = kSmemActivationRowBytes / 2;  // bf16 elements
  static constexpr int kWeightBytes = kRecords * kRecordBytes;
  static constexpr int kStageBytes = mma_tile_stage_bytes(kTileRows, kTileTokens);
  static_assert(kStageBytes == kWeightBytes + kTileTokens * kSmemActivationRowBytes, "mma_tile_stage_bytes layout");
};

template <int kTileRows, int kTileTokens, int kWarpsRows, int kWarpsTokens, int kStages, bool kFc1>
__global__ void __launch_bounds__(kWarpsRows * kWarpsTokens * 32)
    expert_mma_tile_kernel(ExpertGemmArgs args, int k_split) {
  using Smem = MmaTileSmem<kTileRows, kTileTokens, kStages>;
  constexpr int kThreads = kWarpsRows * kWarpsTokens * 32;
  constexpr int kWarpRecords = kTileRows / kWarpsRows / kRecordRows;
  constexpr int kWarpTiles = kTileTokens / kWarpsTokens / 8;  // 8-token MMA tiles per warp
  static_assert(kWarpRecords >= 1 && kTileRows % (kWarpsRows * kRecordRows) == 0, "warp rows: whole records");
  static_assert(kWarpTiles >= 1 && kTileTokens % (kWarpsTokens * 8) == 0, "warp tokens: whole 8-token tiles");
  static_assert(kStages >= 2, "a pipeline needs two stages");
  unsigned char* smem = dynamic_smem();
  long long* source_rows = reinterpret_cast<long long*>(smem + kStages * Smem::kStageBytes);

  if constexpr (kFc1) {
    wait_for_prerequisite_grids();  // the routing
    allow_dependent_grids();
  }
  // Which expert and which of its token tiles this CTA owns.
  const auto [expert, first_row, tokens] = token_tile<kTileTokens>(args, blockIdx.x);
  if (expert < 0) return;
  const int row_tiles = args.rows / kRecordRows;
  const int first_row_tile = blockIdx.y * Smem::kRecords;
  const int split = blockIdx.z;
  const int kt_begin = split * args.k_tiles / k_split, kt_end = (split + 1) * args.k_tiles / k_split;
  const int k_slices = kt_end - kt_begin;

  for (int r = threadIdx.x; r < kTileTokens; r += kThreads) {
    source_rows[r] = r < tokens ? input_row(args, first_row + r, kFc1) * args.k : -1;
  }
  if constexpr (!kFc1) {
    wait_for_prerequisite_grids();  // FC1's activations (the routing was complete when FC2 started)
    allow_dependent_grids();
  }
  __syncthreads();

  const unsigned char* expert_records = args.records + static_cast<long long>(expert) * row_tiles * args.k_tiles * kRecordBytes;
  const auto* input = static_cast<const unsigned short*>(args.input);
  auto load_slice = [&](int slice) {
    unsigned char* stage = smem + (slice % kStages) * Smem::kStageBytes;
    const int kt = kt_begin + slice;
    copy_records_async<Smem::kRecords, kThreads>(stage, args, expert_records, first_row_tile, row_tiles, kt);
    auto* activations = reinterpret_cast<unsigned short*>(stage + Smem::kWeightBytes);
    for (int c = threadIdx.x; c < kTileTokens * 8; c += kThreads) {
      const int r = c / 8, k = kt * kRecordK + 8 * (c % 8);
      const bool valid = source_rows[r] >= 0 && k < args.k;
      cp_async_16(activations + r * Smem::kRowStride + 8 * (c % 8), valid ? input + source_rows[r] + k : input, valid);
    }
  };

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int warp_row = warp / kWarpsTokens, warp_token = warp % kWarpsTokens;
  float acc[kWarpRecords][kWarpTiles][4] = {};
  cp_async_pipeline<kStages>(k_slices, load_slice, [&](int slice) {
    const unsigned char* stage = smem + (slice % kStages) * Smem::kStageBytes;
    const auto* activations = reinterpret_cast<const unsigned short*>(stage + Smem::kWeightBytes);
    unsigned a[kWarpRecords][4][4];
#pragma unroll
    for (int r = 0; r < kWarpRecords; ++r) {
      const unsigned char* record = stage + (warp_row * kWarpRecords + r) * kRecordBytes;
      const unsigned scale_word = *reinterpret_cast<const unsigned*>(record + kRecordValueBytes + 4 * (lane / 4));
      dequantize_record(*reinterpret_cast<const uint4*>(record + 16 * lane), scale_word, a[r],
                        scale_codes_take_one_multiply(scale_word));
    }
#pragma unroll
    for (int t = 0; t < kWarpTiles; ++t) {
      const int token = (warp_token * kWarpTiles + t) * 8 + lane % 8;
      const unsigned b_row = shared_address(activations + token * Smem::kRowStride + 8 * (lane / 8));
      unsigned b[8];
      load_token_fragments(b, b_row);
#pragma unroll
      for (int r = 0; r < kWarpRecords; ++r) mma_record(acc[r][t], a[r], b);
    }
  });

  store_warp_tiles(args, acc, expert, first_row_tile + warp_row * kWarpRecords, row_tiles, first_row,
                   warp_token * kWarpTiles * 8, tokens, split, kFc1);
}

}  // namespace mxmoe::kernels
#endif

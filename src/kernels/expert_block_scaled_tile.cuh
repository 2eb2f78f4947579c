// The block-scaled tile family, the MXFP8-activation path (docs/block-scaled.md): a CTA computes
// kTileRows weight rows x kTileTokens sorted rows of one expert as expert_mma_tile.cuh does, but
// the tokens are MXFP8 (E4M3 codes, one E8M0 scale per 32 along K) and each record's weights enter
// the MMA as E4M3 with their own scales: per 64-K slice and scale block, one m16n8k32 block-scaled
// step (block_scaled_mma.cuh) per record and 8-token tile. `Step` is that step's form,
// BlockScaledStep: the tensor cores' mma.sync kind::mxf8f6f4.block_scale on sm_120a / sm_121a,
// its e4m3 twin with the scales applied in software elsewhere. Nothing else differs between them.
//
// Input: MXFP8 rows in sorted-row order (mxfp8_quantize.cuh), FC1's from the gather launch that
// quantises x after the routing, FC2's from FC1. Output: FC1 applies the SwiGLU to its fp32 sums,
// keeps them in shared memory and quantises them (the same quantiser, a quad per 32-column block)
// into FC2's MXFP8 rows, so a CTA's 128-row tiles hold whole 64-K slices of FC2's input; FC2
// writes its outputs as the other per-stage families do (store_accumulators: bf16 rows in one K
// split, fp32 partial sums with K splits).
//
// Grid (expert_block_scaled_tile_family.cpp): x = token-tile slot (pairs / kTileTokens + min(E,
// pairs), the CTAs past the last tile exit), y = rows / kTileRows rounded up, z = K splits (FC2).
// Budget per CTA: kTileRows x K weights (0.53 bytes each), kTileTokens x K activations (1.06 bytes:
// codes and a scale word per 64), 2 kTileRows kTileTokens K FLOPs; per record and slice each lane
// turns its 16 value bytes into 8 E4M3 registers (~25 integer operations each), which 2 MMAs per
// 8-token tile then use. On the twin, each MMA is two f16 HMMAs on the H100 plus the scale
// arithmetic, so it runs below the bf16 tiles; its purpose there is to check the path.
#pragma once

#include "kernels/expert_gemm.cuh"
#include "kernels/mxfp8_quantize.cuh"

namespace mxmoe::kernels {

// Per stage: the records of kTileRows rows, each token's 64 codes of the slice, each token's scale
// word of the slice. FC1's epilogue then reuses the stages for its SwiGLU outputs, fp32
// [tokens][rows / 2 + 4] (the 4: rows of the tile start in different banks).
MXMOE_HOST_DEVICE constexpr int block_scaled_stage_bytes(int tile_rows, int tile_tokens) {
  return tile_rows / 16 * kRecordBytes + tile_tokens * (kMxfp8SliceBytes + 4);
}
MXMOE_HOST_DEVICE constexpr int block_scaled_epilogue_stride(int tile_rows) { return tile_rows / 2 + 4; }
MXMOE_HOST_DEVICE constexpr int block_scaled_smem_bytes(int tile_rows, int tile_tokens, int stages) {
  const int pipeline = stages * block_scaled_stage_bytes(tile_rows, tile_tokens);
  const int epilogue = tile_tokens * block_scaled_epilogue_stride(tile_rows) * 4;
  return pipeline > epilogue ? pipeline : epilogue;
}

}  // namespace mxmoe::kernels

#if defined(__CUDACC__)
namespace mxmoe::kernels {

// FC1's outputs of one CTA, fp32 in shared memory [tokens][block_scaled_epilogue_stride], to MXFP8
// rows of FC2's input: a quad per (token, 32-column block), the warps taking 8 at a time (the
// quantiser's shuffles need whole warps). The CTA's blocks start at block `first_block`; those
// past the layer's I are the padding of its last slice, stored as zeros. As FP8 activations
// (args.epilogue.swiglu.fp8_output), each value goes to bf16 first, and 16 lanes hold a token's
// 128-column block: a tile of 256 rows (128 columns) is one such block per token, and its four
// 32-blocks start at a multiple of 4 items, so each half-warp takes one.
template <int kTileRows, int kTileTokens, int kThreads>
__device__ __forceinline__ void store_fc1_mxfp8(const ExpertGemmArgs& args, const float* gated, int first_row,
                                                int tokens) {
  constexpr int kBlocks = kTileRows / 64, kItems = kTileTokens * kBlocks;
  const int columns = args.rows / 2, out_k_tiles = (columns + 63) / 64;
  const Mxfp8Rows out(args.output, static_cast<long long>(args.num_tokens) * args.top_k, out_k_tiles);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, first_block = blockIdx.y * kBlocks;
  for (int base = 8 * warp; base < kItems; base += kThreads / 4) {
    const int item = base + lane / 4, token = item / kBlocks, block = first_block + item % kBlocks;
    float values[8] = {};
    if (item < kItems && 32 * block < columns) {
      const float* from = gated + token * block_scaled_epilogue_stride(kTileRows) + 32 * (item % kBlocks) + 8 * (lane % 4);
      const float4 low = *reinterpret_cast<const float4*>(from), high = *reinterpret_cast<const float4*>(from + 4);
      values[0] = low.x, values[1] = low.y, values[2] = low.z, values[3] = low.w;
      values[4] = high.x, values[5] = high.y, values[6] = high.z, values[7] = high.w;
    }
    // validate_plan gives FP8 activations no FC1 tile of fewer than 256 rows.
    const bool fp8 = kTileRows % 256 == 0 && args.epilogue.swiglu.fp8_output;
    if (fp8) {
#pragma unroll
      for (int j = 0; j < 8; ++j) values[j] = bf16_bits_to_float(float_to_bf16_bits(values[j]));
    }
    const Mxfp8Share share = fp8 ? quantize_fp8_share(values) : quantize_mxfp8_share(values);
    if (item < kItems && token < tokens && block < 2 * out_k_tiles) store_mxfp8_share(out, first_row + token, block, share);
  }
}

template <int kTileRows, int kTileTokens, int kWarpsRows, int kWarpsTokens, int kStages, bool kFc1, class Step>
__global__ void __launch_bounds__(kWarpsRows * kWarpsTokens * 32)
    expert_block_scaled_tile_kernel(ExpertGemmArgs args, int k_split) {
  constexpr int kThreads = kWarpsRows * kWarpsTokens * 32;
  constexpr int kRecords = kTileRows / kRecordRows;
  constexpr int kWarpRecords = kRecords / kWarpsRows;
  constexpr int kWarpTiles = kTileTokens / kWarpsTokens / 8;  // 8-token MMA tiles per warp
  constexpr int kStageBytes = block_scaled_stage_bytes(kTileRows, kTileTokens);
  constexpr int kCodes = kRecords * kRecordBytes, kScales = kCodes + kTileTokens * kMxfp8SliceBytes;
  static_assert(kWarpRecords >= 1 && kRecords % kWarpsRows == 0, "warp rows: whole records");
  static_assert(kWarpTiles >= 1 && kTileTokens % (kWarpsTokens * 8) == 0, "warp tokens: whole 8-token tiles");
  static_assert(kTileRows % 128 == 0, "FC1's tile: whole 64-K slices of FC2's input");
  static_assert(kStages >= 2, "a pipeline needs two stages");
  unsigned char* smem = dynamic_smem();

  if constexpr (kFc1) {
    wait_for_prerequisite_grids();  // the gather (the routing was complete when it started)
    allow_dependent_grids();
  }
  const auto [expert, first_row, tokens] = token_tile<kTileTokens>(args, blockIdx.x);
  if (expert < 0) return;
  const int row_tiles = args.rows / kRecordRows;
  const int first_row_tile = blockIdx.y * kRecords;
  const int split = blockIdx.z;
  const int kt_begin = split * args.k_tiles / k_split, kt_end = (split + 1) * args.k_tiles / k_split;
  if constexpr (!kFc1) {
    wait_for_prerequisite_grids();  // FC1's MXFP8 rows (the routing was complete when FC2 started)
    allow_dependent_grids();
  }

  const Mxfp8Rows input(const_cast<void*>(args.input), static_cast<long long>(args.num_tokens) * args.top_k,
                        args.k_tiles);
  const unsigned char* expert_records =
      args.records + static_cast<long long>(expert) * row_tiles * args.k_tiles * kRecordBytes;
  auto load_slice = [&](int slice) {
    unsigned char* stage = smem + (slice % kStages) * kStageBytes;
    const int kt = kt_begin + slice;
    copy_records_async<kRecords, kThreads>(stage, args, expert_records, first_row_tile, row_tiles, kt);
    for (int c = threadIdx.x; c < kTileTokens * 4; c += kThreads) {
      const int r = c / 4, chunk = 16 * (c % 4);
      const bool valid = r < tokens;
      cp_async_16(stage + kCodes + r * kMxfp8SliceBytes + chunk,
                  valid ? input.slice(first_row + r, kt) + chunk : input.codes, valid);
    }
    for (int r = threadIdx.x; r < kTileTokens; r += kThreads) {
      const bool valid = r < tokens;
      cp_async_4(stage + kScales + 4 * r, valid ? input.scale(first_row + r, kt) : input.scales, valid);
    }
  };

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int warp_row = warp / kWarpsTokens, warp_token = warp % kWarpsTokens;
  float acc[kWarpRecords][kWarpTiles][4] = {};
  cp_async_pipeline<kStages>(kt_end - kt_begin, load_slice, [&](int slice) {
    const unsigned char* stage = smem + (slice % kStages) * kStageBytes;
    unsigned a[kWarpRecords][2][4];
    typename Step::RowScales row_scales[kWarpRecords];
#pragma unroll
    for (int r = 0; r < kWarpRecords; ++r) {
      const unsigned char* record = stage + (warp_row * kWarpRecords + r) * kRecordBytes;
      const uint4 v = *reinterpret_cast<const uint4*>(record + 16 * lane);
      const unsigned words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int b = 0; b < 2; ++b) {
#pragma unroll
        for (int i = 0; i < 4; ++i) a[r][b][i] = e4m3_a_register(words, b, i);
      }
      const unsigned scale_word = *reinterpret_cast<const unsigned*>(record + kRecordValueBytes + 4 * (lane / 4));
      row_scales[r] = Step::row_scales(scale_a_register(scale_word, lane));
    }
#pragma unroll
    for (int t = 0; t < kWarpTiles; ++t) {
      const int token = (warp_token * kWarpTiles + t) * 8 + lane / 4;
      const uint4 b = *reinterpret_cast<const uint4*>(stage + kCodes + token * kMxfp8SliceBytes + 16 * (lane % 4));
      const unsigned b0[2] = {b.x, b.y}, b1[2] = {b.z, b.w};
      const auto token_scales = Step::token_scales(*reinterpret_cast<const unsigned*>(stage + kScales + 4 * token));
#pragma unroll
      for (int r = 0; r < kWarpRecords; ++r) {
        Step::template mma<0>(acc[r][t], a[r][0], b0, row_scales[r], token_scales);
        Step::template mma<1>(acc[r][t], a[r][1], b1, row_scales[r], token_scales);
      }
    }
  });

  if constexpr (kFc1) {
    __syncthreads();  // every warp is done with the stages the outputs overwrite
    auto* gated = reinterpret_cast<float*>(smem);
    const int g = lane / 4, q = lane % 4;
#pragma unroll
    for (int r = 0; r < kWarpRecords; ++r) {
      const int tile_record = warp_row * kWarpRecords + r, row_tile = first_row_tile + tile_record;
      if (row_tile >= row_tiles) continue;
      // Record rows g and g + 8 are glu and lin of the CTA's output column 8 tile_record + g.
      const float* bias_row = args.bias + static_cast<long long>(expert) * args.rows + 16 * row_tile + g;
      const float bias_glu = __ldg(bias_row), bias_lin = __ldg(bias_row + 8);
#pragma unroll
      for (int t = 0; t < kWarpTiles; ++t) {
        const int token = (warp_token * kWarpTiles + t) * 8 + 2 * q;
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          gated[(token + i) * block_scaled_epilogue_stride(kTileRows) + 8 * tile_record + g] =
              swiglu(args.epilogue.swiglu, acc[r][t][i] + bias_glu, acc[r][t][2 + i] + bias_lin);
        }
      }
    }
    __syncthreads();
    store_fc1_mxfp8<kTileRows, kTileTokens, kThreads>(args, gated, first_row, tokens);
  } else {
    store_warp_tiles(args, acc, expert, first_row_tile + warp_row * kWarpRecords, row_tiles, first_row,
                     warp_token * kWarpTiles * 8, tokens, split, false);
  }
}

}  // namespace mxmoe::kernels
#endif

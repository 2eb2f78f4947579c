// The Hopper prefill family (sm_90a): a CTA computes kTileRows weight rows x kTileTokens sorted rows
// of one expert on the warpgroup tensor cores. One producer thread fills a kStages-deep ring of
// 64-K slices by tensor copies: the tile's activation rows in 32-token boxes, as many as the tile
// has tokens (the input is in sorted rows: FC2's always, FC1's x gathered so by the gather launch
// after the routing), which the copy writes in the 128-byte swizzle wgmma reads, and the slice's
// records (kTileRows / 16 of them, 544 bytes each, as stored; zeros, not read, past the expert's
// last row, so a partial last row block reads only its rows) in one box, all completing on the
// slot's "full" barrier (one copy for all the records, so that the producer's issue time stays
// below the consumers' work on a slice: docs/performance.md, "The heuristic's decisions").
// kConsumerWarps / 4 consumer warpgroups each own 64 kWarpRecords weight rows: per slice a
// consumer warp dequantises its kWarpRecords records into bf16 A fragments in registers
// (mxfp4_fragment.cuh) and issues 4 kWarpRecords wgmma m64nNk16 with the activations as B from
// shared memory, N the tile's tokens rounded up to 8 (to 16 in tiles of more than 96 tokens); the
// slice's MMAs run while the warp dequantises the next slice into the other register set, and a
// slot is handed back on its "empty" barrier once the MMAs that read it are done. Accumulators go
// straight to the epilogue of the tiled families (store_accumulator_groups: FC1's bias and SwiGLU,
// FC2's bias and K split).
// The producer warpgroup runs on 24 registers so that the consumers get the rest (setmaxnreg: 240
// a thread for two consumer warpgroups, room for a 256 x 144 tile's 144 accumulators beside two
// fragment sets); its other threads have nothing to do.
//
// Grid (expert_wgmma_family.cpp): x = token-tile slot x row blocks, row block fastest, so that the
// CTAs in flight together share a token tile's activations in L2 (upper bound on slots pairs /
// kTileTokens + min(E, pairs); a CTA past the last tile exits); y = K split (FC2 only).
// Budget per CTA and slice: kTileRows / 16 x 544 weight bytes and up to kTileTokens x 128
// activation bytes from L2, 2 x 64 kTileRows kTileTokens FLOPs; a 256 x 128 tile moves 24.6 KB per 4.2 MFLOP
// (~24 bytes per SM clock at the H100's dense bf16 rate, within what the copy engine brings from
// L2); the consumers' dequantisation instructions beside the MMAs are what bounds it at ~64 tokens
// (docs/performance.md, "What limits each regime").
#pragma once

#include "kernels/expert_gemm.cuh"

namespace mxmoe::kernels {

constexpr int kWgmmaProducerThreads = 128;
constexpr int kWgmmaTokenRowBytes = 128;  // one token's 64 K of bf16
constexpr int kWgmmaAlign = 1024;         // the 128-byte swizzle's repeat: stage bases are aligned to it

constexpr int align_wgmma(int bytes) { return (bytes + kWgmmaAlign - 1) / kWgmmaAlign * kWgmmaAlign; }

// The activation rows of a tile arrive in boxes of this many tokens (the narrowest tile's), as
// many as its tokens need (rounded up to 32, which also covers the MMA width they round up to): an
// expert's partial last tile reads only the rows it multiplies, not the whole tile's.
constexpr int kWgmmaBoxTokens = 32;

// A slot's activation bytes: the tile's tokens in whole boxes (128 bytes a token, swizzled).
constexpr int wgmma_activation_bytes(int tile_tokens) {
  return (tile_tokens + kWgmmaBoxTokens - 1) / kWgmmaBoxTokens * kWgmmaBoxTokens * kWgmmaTokenRowBytes;
}
// One slot: the activations, then the records.
constexpr int wgmma_stage_bytes(int tile_rows, int tile_tokens) {
  return wgmma_activation_bytes(tile_tokens) + align_wgmma(tile_rows / kRecordRows * kRecordBytes);
}
// Dynamic shared memory: slack to align the base, the slots, then a full and an empty barrier each.
constexpr int wgmma_smem_bytes(int tile_rows, int tile_tokens, int stages) {
  return kWgmmaAlign + stages * wgmma_stage_bytes(tile_rows, tile_tokens) + stages * 16;
}

// Registers. A launch allocates the kernel's count for every thread, and ptxas gives a kernel with
// setmaxnreg the most its launch bounds allow, in steps of 8: 65536 / threads, rounded down to 8
// (168 for 8 consumer warps, 128 for 12, 96 for 16; checked on each compiled kernel,
// expert_wgmma_family.cpp). setmaxnreg then only moves registers within that allocation: the
// producer warpgroup gives its share down to kWgmmaProducerRegisters and each consumer thread takes
// an equal part of the rest, at most 240. A request past the allocation would wait forever.
constexpr int kWgmmaProducerRegisters = 24;
constexpr int wgmma_launch_registers(int consumer_warps) {
  return 65536 / (kWgmmaProducerThreads + consumer_warps * 32) / 8 * 8;
}
constexpr int wgmma_consumer_registers(int consumer_warps) {
  const int threads = kWgmmaProducerThreads + consumer_warps * 32;
  const int pool = wgmma_launch_registers(consumer_warps) * threads;
  const int per_thread = (pool - kWgmmaProducerThreads * kWgmmaProducerRegisters) / (consumer_warps * 32) / 8 * 8;
  return per_thread > 240 ? 240 : per_thread;
}
static_assert(wgmma_consumer_registers(8) == 240 && wgmma_consumer_registers(12) == 160 &&
              wgmma_consumer_registers(16) == 112);

}  // namespace mxmoe::kernels

#if defined(__CUDACC__)
#include "kernels/wgmma.cuh"

namespace mxmoe::kernels {

template <int kTileRows, int kTileTokens, int kConsumerWarps>
struct WgmmaLayout {
  static constexpr int kActivationBytes = wgmma_activation_bytes(kTileTokens);
  static constexpr int kStageBytes = wgmma_stage_bytes(kTileRows, kTileTokens);
  static constexpr int kConsumerRegisters = wgmma_consumer_registers(kConsumerWarps);
};
// The step of the MMA widths a tile's main loops are made for: 8 tokens (wgmma's finest N) for the
// tiles of at most 96 tokens, whose experts hold ~16-90 rows, where rounding up to 16 would add
// ~4 tokens of MMA work to every tile on average; 16 for the wider tiles, where that is a small
// share of the MMAs and each width costs a main loop and epilogue of code and compile time
// (docs/performance.md, "The heuristic's decisions").
template <int kTileTokens>
constexpr int kWgmmaWidthStep = kTileTokens <= 96 ? 8 : 16;

// A compile-time int passed as a value: which of the consumers' two fragment register sets a step
// fills (a constant, so the sets stay registers), and the MMA width a main loop is made for.
template <int kValue>
struct Constant {
  static constexpr int value = kValue;
};

// Calls f(Constant<c>) for the c of [kLow, kHigh] that is the narrowest to cover `tokens` with MMA
// width kStep c, found by halving the range (four uniform branches for a 256-token tile). A CTA's
// tokens are fixed, so this runs once, around its whole main loop: each width gets a loop of its own
// with no width branch in its slices, and an expert's partial token tile costs the MMAs of what it
// holds, rounded up to kStep tokens.
template <int kStep, int kLow, int kHigh, class F>
__device__ __forceinline__ void with_mma_width(int tokens, F&& f) {
  if constexpr (kLow < kHigh) {
    constexpr int kMiddle = (kLow + kHigh) / 2;
    if (tokens <= kStep * kMiddle) {
      with_mma_width<kStep, kLow, kMiddle>(tokens, f);
    } else {
      with_mma_width<kStep, kMiddle + 1, kHigh>(tokens, f);
    }
  } else {
    f(Constant<kLow>{});
  }
}

// A consumer warpgroup's MMAs of one slice at width kN, committed as one group; `first`: the tile's
// first slice, whose first k-step overwrites the accumulators (the widths write prefixes of them).
template <int kN, int kWarpRecords, int kAccumulators>
__device__ __forceinline__ void multiply_slice(float (&acc)[kWarpRecords][kAccumulators],
                                               const unsigned (&a)[kWarpRecords][4][4], unsigned long long descriptor, bool first) {
  wgmma_fence();
#pragma unroll
  for (int r = 0; r < kWarpRecords; ++r) {
#pragma unroll
    for (int j = 0; j < 4; ++j) WgmmaBf16<kN>::run(acc[r], a[r][j], descriptor + 2 * j, !first || j > 0);
  }
  wgmma_commit();
}

template <int kTileRows, int kTileTokens, int kConsumerWarps, int kStages, bool kFc1>
__global__ void __launch_bounds__(kWgmmaProducerThreads + kConsumerWarps * 32, 1)
    expert_wgmma_kernel(ExpertGemmArgs args, int k_split, int scales_one_multiply, const __grid_constant__ TensorMap activations,
                        const __grid_constant__ TensorMap weights) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int kRecords = kTileRows / kRecordRows;
  constexpr int kWarpRecords = kRecords / kConsumerWarps;  // 64-row MMA blocks per consumer warpgroup
  using Layout = WgmmaLayout<kTileRows, kTileTokens, kConsumerWarps>;
  constexpr int kStageBytes = Layout::kStageBytes;
  constexpr int kActivationBytes = Layout::kActivationBytes;
  static_assert(kConsumerWarps % 4 == 0 && kRecords % kConsumerWarps == 0, "whole records per consumer warp");
  static_assert(kTileTokens % 16 == 0 && kTileTokens <= 256, "whole steps of MMA width, a wgmma N of at most 256");
  static_assert(kStages >= 2, "a pipeline needs two stages");
  unsigned char* smem = dynamic_smem();
  smem += (kWgmmaAlign - shared_address(smem) % kWgmmaAlign) % kWgmmaAlign;
  const unsigned smem_base = shared_address(smem);
  const unsigned full = smem_base + kStages * kStageBytes, empty = full + 8 * kStages;

  // The routing is complete here: the gather (FC1's launch before) waits for it before it lets its
  // dependants launch, and FC2 launches after FC1. So the lookup and the weights' first copies, which
  // read only the routing and the weights, run before this grid's own wait, under the end of the
  // launch before (FC1: the gather; FC2: FC1's last wave); the activations wait for it. Dependants
  // may launch at once: FC2's CTAs then take the SMs FC1's last wave leaves, and the un-permute
  // waits for FC2, which completes after FC1.
  allow_dependent_grids();
  const int row_tiles = args.rows / kRecordRows;
  const int row_blocks = (row_tiles + kRecords - 1) / kRecords;
  const auto [expert, first_row, tokens] = token_tile_by_warp<kTileTokens>(args, blockIdx.x / row_blocks);
  if (expert < 0) return;
  const int first_row_tile = blockIdx.x % row_blocks * kRecords;
  const int split = blockIdx.y;
  const int kt_begin = split * args.k_tiles / k_split, k_slices = (split + 1) * args.k_tiles / k_split - kt_begin;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(full + 8 * s, 1);  // the producer's arrival, which expects the slice's bytes
      mbarrier_init(empty + 8 * s, kConsumerWarps * 32);
    }
    fence_mbarrier_init();
  }
  __syncthreads();

  if (threadIdx.x < kWgmmaProducerThreads) {
    registers_decrease<kWgmmaProducerRegisters>();
    if (threadIdx.x != 0) return;  // one thread issues every copy
    constexpr int kBoxBytes = kWgmmaBoxTokens * kWgmmaTokenRowBytes;  // a multiple of the swizzle's 1024-byte repeat
    const int boxes = (tokens + kWgmmaBoxTokens - 1) / kWgmmaBoxTokens;
    auto copy_weights = [&](int slice) {
      const int s = slice % kStages;
      mbarrier_arrive_expect_tx(full + 8 * s, boxes * kBoxBytes + kRecords * kRecordBytes);
      tensor_copy_4d(smem_base + s * kStageBytes + kActivationBytes, weights, 0, kt_begin + slice, first_row_tile,
                     expert, full + 8 * s);
    };
    auto copy_activations = [&](int slice) {
      const int s = slice % kStages;
      for (int box = 0; box < boxes; ++box) {
        tensor_copy_2d(smem_base + s * kStageBytes + box * kBoxBytes, activations, (kt_begin + slice) * kRecordK,
                       first_row + box * kWgmmaBoxTokens, full + 8 * s);
      }
    };
    // The first ring turn's weights, then the wait for the activations' writer.
    const int first_turn = k_slices < kStages ? k_slices : kStages;
    for (int slice = 0; slice < first_turn; ++slice) copy_weights(slice);
    wait_for_prerequisite_grids();  // FC1: the gather into sorted rows; FC2: FC1's activations
    for (int slice = 0; slice < first_turn; ++slice) copy_activations(slice);
    for (int slice = first_turn; slice < k_slices; ++slice) {
      mbarrier_wait(empty + 8 * (slice % kStages), (slice / kStages + 1) & 1);
      copy_weights(slice);
      copy_activations(slice);
    }
    return;
  }

  registers_increase<Layout::kConsumerRegisters>();
  // The consumers read only what the producer's copies bring after its wait, but they store where
  // the grid before may still read (FC2's bf16 rows take the places of FC1's gathered inputs).
  wait_for_prerequisite_grids();
  const int consumer_warp = threadIdx.x / 32 - kWgmmaProducerThreads / 32, lane = threadIdx.x % 32;
  const int group = consumer_warp / 4, group_warp = consumer_warp % 4;
  // Record of block r of this warp within the tile: 64-row block (group, r), its 16-row part group_warp.
  auto record_of = [&](int r) { return (group * kWarpRecords + r) * 4 + group_warp; };
  // A warpgroup whose 64-row blocks all lie past the matrix's rows (in an expert's last row block)
  // only passes the slots along. (The vote tells the compiler what holds anyway, that the branch is
  // uniform across the warp, else the main loop's ring counters leave the uniform registers.)
  if (__all_sync(~0u, first_row_tile + group * kWarpRecords * 4 >= row_tiles)) {
    for (int slice = 0; slice < k_slices; ++slice) {
      mbarrier_wait(full + 8 * (slice % kStages), (slice / kStages) & 1);
      mbarrier_arrive(empty + 8 * (slice % kStages));
    }
    return;
  }
  // The ring position of the next slice, counted along (no division by kStages per slice): its
  // slot's byte offset and barrier offset, the parity of that slot's fill, and the barrier offset of
  // the slot before, which a step hands back.
  unsigned stage_offset = 0, barrier_offset = 0, previous_barrier_offset = 0, phase = 0;
  auto advance = [&] {
    previous_barrier_offset = barrier_offset;
    stage_offset += kStageBytes;
    barrier_offset += 8;
    if (barrier_offset == 8 * kStages) {
      stage_offset = barrier_offset = 0;
      phase ^= 1;
    }
  };
  const unsigned long long descriptor0 = wgmma_descriptor_sw128(smem_base);  // + stage_offset / 16: no carry
  const unsigned char* lane_values = smem + kActivationBytes + 16 * lane;
  const unsigned char* lane_scales = smem + kActivationBytes + kRecordValueBytes + 4 * (lane / 4);
  // The matrix's scale range, known on the host: no range test and branch on each slice's scales.
  const bool one_multiply = scales_one_multiply != 0;
  // The epilogue's bias, loaded now so that its round trip runs under the main loop.
  RowBias bias[kWarpRecords];
#pragma unroll
  for (int r = 0; r < kWarpRecords; ++r) {
    if (first_row_tile + record_of(r) < row_tiles) bias[r] = row_bias(args, expert, first_row_tile + record_of(r));
  }
  float acc[kWarpRecords][kTileTokens / 2];  // the first slice's MMAs overwrite them
  unsigned a[2][kWarpRecords][4][4];
  constexpr int kMmaStep = kWgmmaWidthStep<kTileTokens>;
  with_mma_width<kMmaStep, 1, kTileTokens / kMmaStep>(tokens, [&](auto width) {
    constexpr int kN = kMmaStep * decltype(width)::value;
    // One slice through register set `set`: wait for its slot, dequantise, issue its MMAs, then
    // hand back the slot of the slice before (whose MMAs the wait for all but the newest group
    // ends).
    auto step = [&](int slice, auto set) {
      mbarrier_wait(full + barrier_offset, phase);
      // Every record is dequantised, with no test of its row tile: one past the matrix's rows holds
      // zeros (the copy's fill), whose MMA rows the epilogue skips.
      uint4 values[kWarpRecords];
      unsigned scale_words[kWarpRecords];
#pragma unroll
      for (int r = 0; r < kWarpRecords; ++r) {
        values[r] = *reinterpret_cast<const uint4*>(lane_values + stage_offset + record_of(r) * kRecordBytes);
        scale_words[r] = *reinterpret_cast<const unsigned*>(lane_scales + stage_offset + record_of(r) * kRecordBytes);
      }
      dequantize_records(values, scale_words, a[set.value], one_multiply);
      multiply_slice<kN>(acc, a[set.value], descriptor0 + stage_offset / 16, slice == 0);
      wgmma_wait<1>();
      // Every consumer thread arrives: an arrival releases the arriving thread's own reads only.
      if (slice > 0) mbarrier_arrive(empty + previous_barrier_offset);
      advance();
    };
    for (int slice = 0; slice < k_slices; slice += 2) {
      step(slice, Constant<0>{});
      if (slice + 1 < k_slices) step(slice + 1, Constant<1>{});
    }
    wgmma_wait<0>();
#pragma unroll
    for (int r = 0; r < kWarpRecords; ++r) {
#pragma unroll
      for (int i = 0; i < kN / 2; ++i) fence_operand(acc[r][i]);
    }
    // The epilogue of each width is its own, so that no accumulator of one width's loop is live in
    // another's (ptxas serialises the MMAs where the widths' loops merge before the stores).
#pragma unroll
    for (int r = 0; r < kWarpRecords; ++r) {
      const int row_tile = first_row_tile + record_of(r);
      if (row_tile >= row_tiles) continue;
      store_accumulator_groups<kN / 8>(args, reinterpret_cast<const float(&)[kN / 2]>(acc[r]), bias[r], row_tile,
                                       first_row, tokens, split, kFc1);
    }
  });
#else
  __trap();  // wgmma needs sm_90a; the family's tactics are valid there alone
#endif
}

}  // namespace mxmoe::kernels
#endif

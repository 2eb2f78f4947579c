// What the expert kernels share: the GEMV-style families' shared-memory layout, the work of a
// GEMV-style CTA and its token staging, and the epilogue that turns one warp's 16-row x 8-token
// accumulator tile into outputs. As in every kernel header here, the layout above the
// `#if defined(__CUDACC__)` compiles for the host too: the families' units size launches with it.
//
// Orientation: weight rows are the MMA's M side (one 16-row record), tokens its N side (8 per MMA),
// so a single token wastes nothing on the weight side. The accumulator tile of lane l holds
//   acc[0], acc[1]: record row g, tokens 2 q and 2 q + 1;  acc[2], acc[3]: row g + 8, same tokens
// with g = l / 4, q = l % 4. For FC1, record rows g and g + 8 are glu(j) and lin(j) of the same
// output j = 8 * row_tile + g (format/record_layout.hpp), so the SwiGLU is applied right here.
#pragma once

#include "kernels/expert_gemm_args.hpp"
#include "kernels/mxfp4_fragment.cuh"

namespace mxmoe::kernels {

// Shared-memory layout pieces of the GEMV-style families (plain constexpr: the host sizes launches
// with them too).

// `bytes` rounded up to 16, where a region after another starts (16-byte vector accesses).
constexpr int align16(int bytes) { return (bytes + 15) / 16 * 16; }

// The GEMV-style families' token staging for a `tokens`-token tactic (8 or 16) that stages `rows`
// of them (min(tokens, the batch's tokens)): the tactic's source-row slots (8 bytes each), then the
// rows of the split's K range (+16 bytes each).
constexpr int gemv_staging_bytes(int tokens, int rows, int k_tiles, int k_split) {
  return tokens * 8 + rows * ((k_tiles + k_split - 1) / k_split * 64 + 8) * 2;
}

// A batch that routes itself (route_small_batch_in_cta below) keeps its routing past the kernel's
// own shared memory, 16-byte aligned: the top-k's candidates (select_scratch_bytes for the CTA's
// warps), each pair's expert, weight, sorted row and each sorted row's pair (kSmallBatchPairs
// each), the CTA's own words (its expert, first row, row count), and the workspace writer's counts
// [E] and offsets [E + 1].
constexpr int kSmallRouteOwnWords = 3;
constexpr int small_route_offset(int kernel_bytes) { return align16(kernel_bytes); }
constexpr int small_route_bytes(int num_experts, int warps, int top_k) {
  return select_scratch_bytes(warps, top_k) + 4 * (4 * kSmallBatchPairs + kSmallRouteOwnWords + 2 * num_experts + 1);
}

}  // namespace mxmoe::kernels

#if defined(__CUDACC__)
#include "kernels/device_utils.cuh"
#include "kernels/fp8_rounding.cuh"
#include "route/small_batch_routing.cuh"

namespace mxmoe::kernels {

// The layer's SwiGLU (SwigluArgs; gpt-oss: alpha 1.702, limit 7, up + 1; DeepSeek-V4: 1, 10, + 0),
// NaN-propagating like the reference: glu * sigmoid(alpha glu) * (lin + up_offset) with
// glu = min(glu, limit), lin = clamp(lin, -limit, limit). Ten instructions, two of them MUFU: the
// sigmoid by 2^x and 1/x with subnormals flushed, which differs from the reference's only where
// alpha glu < -87 (sigmoid below 2^-126: the output is then 0 where the reference's is under 1e-36
// in magnitude). IEEE expf and division took ~40 instructions per output, a fifth of a prefill
// tile's time. The constants are kernel arguments: every spec runs the same binaries.
__device__ __forceinline__ float swiglu(const SwigluArgs& a, float glu, float lin) {
  glu = min_nan(glu, a.limit);
  lin = max_nan(min_nan(lin, a.limit), -a.limit);
  return glu * reciprocal_approx_ftz(1.0f + exp2_approx_ftz(a.minus_alpha_log2e * glu)) * (lin + a.up_offset);
}

// The bias of a lane's two accumulator rows (g and g + 8, g = lane / 4) of record row tile
// `row_tile` of `expert`: loaded apart from the stores, so that a kernel can load it before its
// main loop and keep its round trip out of the epilogue.
struct RowBias {
  float low = 0.0f, high = 0.0f;
};
__device__ __forceinline__ RowBias row_bias(const ExpertGemmArgs& args, int expert, int row_tile) {
  const float* bias_row = args.bias + static_cast<long long>(expert) * args.rows + 16 * row_tile + (threadIdx.x % 32) / 4;
  return {__ldg(bias_row), __ldg(bias_row + 8)};
}

// Stores a warp's accumulator tiles of one record and kGroups 8-token groups (group t's four at
// acc[4 t]) with their rows' `row_bias`: `row_tile` is the record's row tile, `first_row` the
// sorted row of group 0's token 0, `tokens` how many of the groups' tokens exist (the groups past
// them are skipped). FC2 adds the bias in split 0 only, and writes bf16 where it runs in one split
// (Fc2Output::output_bf16). `fc1`, here and below, is a constant in the per-stage kernels and
// a run-time value in the fused layer, which so keeps one copy of the weight loop. A lane's outputs
// are addressed from one pointer by offsets of whole token rows, so a store costs an offset and a
// predicate rather than a 64-bit product and a branch.
template <int kGroups>
__device__ __forceinline__ void store_accumulator_groups(const ExpertGemmArgs& args, const float (&acc)[4 * kGroups],
                                                         RowBias row_bias, int row_tile, int first_row, int tokens,
                                                         int split, bool fc1) {
  const int lane = threadIdx.x % 32;
  const int g = lane / 4, token = 2 * (lane % 4);
  const float bias[2] = {row_bias.low, row_bias.high};
  if (fc1) {
    const int columns = args.rows / 2;
    unsigned short* out =
        static_cast<unsigned short*>(args.output) + static_cast<long long>(first_row + token) * columns + 8 * row_tile + g;
#pragma unroll
    for (int t = 0; t < kGroups; ++t) {
      if (8 * t >= tokens) break;
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const unsigned short a =
            float_to_bf16_bits(swiglu(args.epilogue.swiglu, acc[4 * t + i] + bias[0], acc[4 * t + 2 + i] + bias[1]));
        if (8 * t + token + i < tokens) out[(8 * t + i) * columns] = a;
      }
    }
  } else {
    // FC2: fp32 partials of its K split (the bias in split 0 only), or bf16 rows where it runs
    // in one split (Fc2Output::output_bf16).
    const bool to_bf16 = args.epilogue.fc2.output_bf16;
    const float bias_low = split == 0 ? bias[0] : 0.0f, bias_high = split == 0 ? bias[1] : 0.0f;
    const long long first = (to_bf16 ? 0 : split * args.epilogue.fc2.split_stride) +
                            static_cast<long long>(first_row + token) * args.rows + 16 * row_tile + g;
    float* out = static_cast<float*>(args.output) + first;
    unsigned short* out_bf16 = static_cast<unsigned short*>(args.output) + first;
#pragma unroll
    for (int t = 0; t < kGroups; ++t) {
      if (8 * t >= tokens) break;
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        if (8 * t + token + i < tokens) {
          const int at = (8 * t + i) * args.rows;
          const float low = acc[4 * t + i] + bias_low, high = acc[4 * t + 2 + i] + bias_high;
          if (to_bf16) {
            out_bf16[at] = float_to_bf16_bits(low);
            out_bf16[at + 8] = float_to_bf16_bits(high);
          } else {
            out[at] = low;
            out[at + 8] = high;
          }
        }
      }
    }
  }
}

// One 8-token group's accumulator tile (store_accumulator_groups).
__device__ __forceinline__ void store_accumulators(const ExpertGemmArgs& args, const float (&acc)[4], int expert,
                                                   int row_tile, int first_row, int tokens, int split, bool fc1) {
  store_accumulator_groups<1>(args, acc, row_bias(args, expert, row_tile), row_tile, first_row, tokens, split, fc1);
}

// The source row of sorted row `row`: FC1 gathers the token's x row, FC2 reads its own row.
__device__ __forceinline__ long long input_row(const ExpertGemmArgs& args, int row, bool fc1) {
  return fc1 ? args.sorted_pairs[row] / args.top_k : row;
}

// What a CTA of the GEMV-style families works on: one active expert (`slot` in the routing's
// active list, whose length the grid only bounds, so a CTA may find none) and one K split of its
// record columns, with the token rows staged in shared memory at `row_stride` (bf16; 16 bytes past
// the K range, which puts ldmatrix's 8 rows in distinct banks). Only args.staged_rows rows are
// staged: an expert has at most as many rows as the batch has tokens, so a 1-token step stages one
// row, not eight.
struct GemvWork {
  int expert = -1;  // none for this CTA
  int first_row, count;
  int row_tiles, kt_begin, records;
  int k_begin, k_len, row_stride;

  __device__ __forceinline__ const unsigned char* column(const ExpertGemmArgs& args, int row_tile) const {
    return args.records +
           ((static_cast<long long>(expert) * row_tiles + row_tile) * args.k_tiles + kt_begin) * kRecordBytes;
  }
};

// The work of `expert` (none: -1), whose rows are sorted rows [first_row, first_row + count).
__device__ __forceinline__ GemvWork gemv_work_of(const ExpertGemmArgs& args, int expert, int first_row, int count,
                                                 int split, int k_split) {
  GemvWork w;
  if (expert < 0) return w;
  w.expert = expert;
  w.first_row = first_row;
  w.count = count;
  w.row_tiles = args.rows / kRecordRows;
  w.kt_begin = split * args.k_tiles / k_split;
  w.records = (split + 1) * args.k_tiles / k_split - w.kt_begin;
  w.k_begin = w.kt_begin * kRecordK;
  w.k_len = w.records * kRecordK;
  w.row_stride = w.k_len + 8;
  return w;
}

// The expert of token tile `tile` (< args.tile_offsets[E]): the e with tile_offsets[e] <= tile <
// tile_offsets[e + 1], by binary search.
__device__ __forceinline__ int expert_of_tile(const ExpertGemmArgs& args, int tile) {
  int lo = 0, hi = args.num_experts - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (args.tile_offsets[mid] <= tile) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// Token tile `tile` of a tiled kernel with kTileTokens-token tiles: its expert (-1 past the last
// tile), the sorted row of its token 0 and how many tokens it has. Reads the routing.
struct TokenTile {
  int expert = -1, first_row = 0, tokens = 0;
};
template <int kTileTokens>
__device__ __forceinline__ TokenTile token_tile(const ExpertGemmArgs& args, int tile) {
  TokenTile t;
  if (tile >= args.tile_offsets[args.num_experts]) return t;
  t.expert = expert_of_tile(args, tile);
  t.first_row = args.expert_offsets[t.expert] + (tile - args.tile_offsets[t.expert]) * kTileTokens;
  t.tokens = min(kTileTokens, args.expert_offsets[t.expert + 1] - t.first_row);
  return t;
}

// token_tile with the search for the tile's expert spread over the lanes of a warp, which must
// all call it (each gets the result). One round trip: each lane loads, for its ceil(E / 32)
// experts at once, the tile offset and the expert's first and end rows; the tile's expert is the
// last whose tile offset is at most `tile` (offsets do not decrease), and its lane hands the rows
// over by shuffles. (A binary search waits on log2(E) dependent loads, a search for the expert and
// then a load of its rows on two.) A CTA's first copies wait on this lookup.
template <int kTileTokens>
__device__ __forceinline__ TokenTile token_tile_by_warp(const ExpertGemmArgs& args, int tile) {
  const int lane = threadIdx.x % 32;
  const int tiles = args.tile_offsets[args.num_experts];
  int experts_at_or_below = 0;  // experts e with tile_offsets[e] <= tile: the tile's expert and those before
  int tile_offset = 0, first_row = 0, end_row = 0;  // the last such expert's, as the chunks go by
#pragma unroll 4
  for (int base = 0; base < args.num_experts; base += 32) {
    const int e = base + lane;
    const bool expert = e < args.num_experts;
    const int lane_tile_offset = expert ? args.tile_offsets[e] : 0;
    const int lane_first_row = expert ? args.expert_offsets[e] : 0;
    const int lane_end_row = expert ? args.expert_offsets[e + 1] : 0;
    const unsigned at_or_below = __ballot_sync(~0u, expert && lane_tile_offset <= tile);
    experts_at_or_below += __popc(at_or_below);
    if (at_or_below != 0) {
      const int last = 31 - __clz(at_or_below);
      tile_offset = __shfl_sync(~0u, lane_tile_offset, last);
      first_row = __shfl_sync(~0u, lane_first_row, last);
      end_row = __shfl_sync(~0u, lane_end_row, last);
    }
  }
  TokenTile t;
  if (tile >= tiles) return t;
  t.expert = experts_at_or_below - 1;  // tile_offsets[0] = 0 <= tile
  t.first_row = first_row + (tile - tile_offset) * kTileTokens;
  t.tokens = min(kTileTokens, end_row - t.first_row);
  return t;
}

// Reads the routing: call it after FC1's wait for the routing.
__device__ __forceinline__ GemvWork gemv_work(const ExpertGemmArgs& args, int slot, int split, int k_split) {
  // Both loads at once (slot < E, so the second is in bounds even past the active count).
  const int active = args.active_experts[args.num_experts], expert = args.active_experts[slot];
  if (slot >= active) return GemvWork{};
  const int first_row = args.expert_offsets[expert];
  return gemv_work_of(args, expert, first_row, args.expert_offsets[expert + 1] - first_row, split, k_split);
}

// A small batch routed by the CTA itself (args.routes_itself; expert_gemm_args.hpp), in shared
// memory at `smem` (small_route_bytes): the CTA takes every pair's local expert from `source`
// (select_batch_pairs: the tokens' top-k from the logits, a 1-token batch's experts split over all
// its warps, or the caller's top-k through the map to local experts), then warp 0 gives every
// pair its sorted row (pairs of lower experts, then of its own expert from lower lanes) and finds
// the CTA's expert, active slot `slot`. `args.sorted_pairs` is pointed at the shared copy. With
// `write_workspace` the CTA's last warp also writes the whole routing to args.route (and fences
// it), for FC2, the un-permute and the caller. This buys the layer no routing launch, and no global
// round trip between the routing's inputs and the first weight load.
// Budget: T R 4 bytes of logits from L2 per CTA (or 8-12 bytes a pair of the caller's top-k); per
// token k rounds of R / (32 x its warps) compares, and k rounds over its warps' candidates; 32
// shuffles.
__device__ __forceinline__ GemvWork route_small_batch_in_cta(ExpertGemmArgs& args, const RouteInput& source,
                                                             unsigned char* smem, int slot, bool write_workspace,
                                                             int split, int k_split) {
  const int pairs = args.num_tokens * args.top_k;
  const int warps = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  auto* candidates = reinterpret_cast<uint2*>(smem);
  int* pair_experts = reinterpret_cast<int*>(smem + select_scratch_bytes(warps, args.top_k));
  float* pair_weights = reinterpret_cast<float*>(pair_experts + kSmallBatchPairs);
  int* sorted_pairs = pair_experts + 2 * kSmallBatchPairs;
  int* pair_rows = pair_experts + 3 * kSmallBatchPairs;
  int* mine = pair_rows + kSmallBatchPairs;   // the CTA's expert, first row, row count
  int* counts = mine + kSmallRouteOwnWords;   // [E], [E + 1]: the workspace writer's scratch
  // Only the routing's writer needs the weights (the un-permute applies them): the other CTAs skip
  // their arithmetic, which would sit between the picks and the first weight load.
  select_batch_pairs(source, args.num_tokens, args.top_k, pair_experts, write_workspace ? pair_weights : nullptr,
                     candidates);
  if (threadIdx.x == 0) mine[0] = -1, mine[1] = mine[2] = 0;  // no expert, unless warp 0 finds one
  __syncthreads();
  if (warp == 0) rank_small_batch(pair_experts, pairs, slot, pair_rows, sorted_pairs, mine);
  if (write_workspace && warp == warps - 1) {
    permute_small_batch(pair_experts, pairs, args.num_experts, counts, counts + args.num_experts, args.route);
    for (int i = lane; i < pairs; i += 32) args.route.topk_weights[i] = pair_weights[i];
    __threadfence();  // visible to every later reader before the CTA lets a dependent grid launch
  }
  __syncthreads();
  args.sorted_pairs = sorted_pairs;
  return gemv_work_of(args, mine[0], mine[1], mine[2], split, k_split);
}

// The GEMV families' dynamic shared memory up to the staging's end (gemv_staging_bytes): kTokens
// source-row slots, then args.staged_rows rows at w.row_stride; what each kernel keeps past it
// (partial sums, rings) starts at `end`.
template <int kTokens>
struct GemvStaging {
  long long* source_rows;
  unsigned short* rows;
  unsigned char* end;

  __device__ __forceinline__ GemvStaging(const ExpertGemmArgs& args, const GemvWork& w)
      : source_rows(reinterpret_cast<long long*>(dynamic_smem())),
        rows(reinterpret_cast<unsigned short*>(dynamic_smem() + kTokens * 8)),
        end(dynamic_smem() + kTokens * 8 + args.staged_rows * w.row_stride * 2) {}
};

// Copies `rows` rows of the input, each at the element offset in `source_rows` (-1: zeros), over
// the work's K range into rows 0..rows-1 of `staged`, zeros past K; with `round_fp8` rounds the
// first `tokens` of them to FP8 activations' values (kernels/fp8_rounding.cuh; the work's K range
// must be the whole of K or cut at multiples of 128). Every 16-byte chunk is a cp.async with no
// register dependency, so the copy costs about one L2 round trip however long K is (a load-store
// loop costs one per chunk a thread handles). The whole CTA takes part, after `source_rows` is
// written and visible; the caller synchronises before reading.
__device__ __forceinline__ void copy_source_rows(const ExpertGemmArgs& args, const GemvWork& w, int rows, int tokens,
                                                 const long long* source_rows, unsigned short* staged,
                                                 bool round_fp8) {
  const auto* input = static_cast<const unsigned short*>(args.input);
  const int chunks_per_row = w.k_len / 8;
  for (int c = threadIdx.x; c < rows * chunks_per_row; c += blockDim.x) {
    const int row = c / chunks_per_row, k = w.k_begin + 8 * (c % chunks_per_row);
    const long long source = source_rows[row];
    const bool valid = source >= 0 && k < args.k;
    cp_async_16(staged + row * w.row_stride + (k - w.k_begin), input + (valid ? source + k : 0), valid);
  }
  cp_async_commit();
  cp_async_wait<0>();
  if (round_fp8) {
    __syncthreads();  // every thread's chunks are in
    round_staged_rows_to_fp8(staged, tokens, w.row_stride, w.k_len);
  }
}

// Stages sorted rows [first_row + pass, + tokens) of the input over the work's K range into rows
// 0..args.staged_rows-1 of `staged`, zeros past `tokens` (copy_source_rows). The rows' sources are
// looked up once into `source_rows` (one round trip), then copied, so the staging costs about two
// L2 round trips.
__device__ __forceinline__ void stage_token_rows(const ExpertGemmArgs& args, const GemvWork& w, int pass, int tokens,
                                                 long long* source_rows, unsigned short* staged, bool fc1,
                                                 bool round_fp8) {
  const int r = threadIdx.x;
  if (r < args.staged_rows) {  // the element offset of the row's input; -1: zeros
    source_rows[r] = r < tokens ? input_row(args, w.first_row + pass + r, fc1) * args.k : -1;
  }
  __syncthreads();
  copy_source_rows(args, w, args.staged_rows, tokens, source_rows, staged, round_fp8);
}

// This lane's ldmatrix row addresses (shared window, at K offset 0) in each 8-token tile of `staged`:
// token 8 t + lane % 8, or row 0 for tokens past the staged rows. Those tokens' MMA columns are
// never stored, and an MMA's output columns do not mix, so whatever row 0 holds serves. The opaque
// move keeps each address in a register: under the GEMV's 80-register cap ptxas otherwise
// recomputes it (~10 instructions) for every record.
template <int kTokens>
__device__ __forceinline__ void token_fragment_rows(unsigned (&rows)[kTokens / 8], const unsigned short* staged,
                                                    int staged_rows, int row_stride) {
  const int lane = threadIdx.x % 32;
  const unsigned base = shared_address(staged);
#pragma unroll
  for (int t = 0; t < kTokens / 8; ++t) {
    const int row = 8 * t + lane % 8;
    const unsigned address = base + 2 * ((row < staged_rows ? row : 0) * row_stride + 8 * (lane / 8));
    asm volatile("mov.b32 %0, %1;\n" : "=r"(rows[t]) : "r"(address));
  }
}

// Bytes between a lane's ldmatrix row addresses of consecutive records (64 bf16 of K).
constexpr unsigned kRecordKBytes = 2 * kRecordK;

// The B fragments of one 8-token tile over a record's 64 K: `b_row` is this lane's ldmatrix row
// address (token lane % 8, K offset 8 * (lane / 8)) at the record's first K; b[2 j], b[2 j + 1]
// feed k-step j.
__device__ __forceinline__ void load_token_fragments(unsigned (&b)[8], unsigned b_row) {
  unsigned lo[4], hi[4];
  ldmatrix_x4(lo, b_row);       // k-steps 0 and 1
  ldmatrix_x4(hi, b_row + 64);  // k-steps 2 and 3 (32 bf16 on)
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    b[i] = lo[i];
    b[4 + i] = hi[i];
  }
}

// Four MMAs: one record's 16 rows x 64 K times one 8-token tile.
__device__ __forceinline__ void mma_record(float (&acc)[4], const unsigned (&a)[4][4], const unsigned (&b)[8]) {
#pragma unroll
  for (int j = 0; j < 4; ++j) mma_bf16_m16n8k16(acc, a[j], b[2 * j], b[2 * j + 1]);
}

// One record of a GEMV-style warp: this lane's share (16 value bytes, its quad's scale word)
// dequantised (by one multiply where `one_multiply`: scale_codes_take_one_multiply holds for it),
// times every 8-token tile's B fragments at the record's K. `record` counts records from the first
// K of the staged rows.
template <int kTokens>
__device__ __forceinline__ void multiply_record(float (&acc)[kTokens / 8][4], uint4 values, unsigned scale_word,
                                                const unsigned (&b_rows)[kTokens / 8], int record, bool one_multiply) {
  unsigned a[4][4];
  dequantize_record(values, scale_word, a, one_multiply);
#pragma unroll
  for (int t = 0; t < kTokens / 8; ++t) {
    unsigned b[8];
    load_token_fragments(b, b_rows[t] + record * kRecordKBytes);
    mma_record(acc[t], a, b);
  }
}

// The tiled families' pipeline pieces (expert_mma_tile.cuh, expert_block_scaled_tile.cuh).

// Stores a warp's accumulator tiles: kWarpRecords records from row tile `first_row_tile` by
// kWarpTiles 8-token tiles from the tile's token `first_token` (of `tokens`, from sorted row
// `first_row`), skipping row tiles from `row_tiles` on.
template <int kWarpRecords, int kWarpTiles>
__device__ __forceinline__ void store_warp_tiles(const ExpertGemmArgs& args,
                                                 const float (&acc)[kWarpRecords][kWarpTiles][4], int expert,
                                                 int first_row_tile, int row_tiles, int first_row, int first_token,
                                                 int tokens, int split, bool fc1) {
#pragma unroll
  for (int r = 0; r < kWarpRecords; ++r) {
    const int row_tile = first_row_tile + r;
    if (row_tile >= row_tiles) continue;
#pragma unroll
    for (int t = 0; t < kWarpTiles; ++t) {
      const int token0 = first_token + 8 * t;
      store_accumulators(args, acc[r][t], expert, row_tile, first_row + token0, tokens - token0, split, fc1);
    }
  }
}

// Copies records [first_row_tile, + kRecords) of K tile `kt` of `expert_records` into `stage`
// (cp.async), zeros for row tiles from `row_tiles` on; the whole CTA takes part.
template <int kRecords, int kThreads>
__device__ __forceinline__ void copy_records_async(unsigned char* stage, const ExpertGemmArgs& args,
                                                   const unsigned char* expert_records, int first_row_tile,
                                                   int row_tiles, int kt) {
  constexpr int kRecordChunks = kRecordBytes / 16;
  for (int c = threadIdx.x; c < kRecords * kRecordChunks; c += kThreads) {
    const int record = c / kRecordChunks, chunk = c % kRecordChunks;
    const bool valid = first_row_tile + record < row_tiles;
    const unsigned char* src =
        expert_records + ((static_cast<long long>(first_row_tile + record) * args.k_tiles + kt) * kRecordBytes + 16 * chunk);
    cp_async_16(stage + record * kRecordBytes + 16 * chunk, valid ? src : args.records, valid);
  }
}

// A kStages-deep cp.async pipeline over `slices` K slices: load(s) issues slice s's copies into
// its stage (s % kStages), compute(s) reads them. Before each compute one barrier says that the
// slice is in and that every warp is done with the stage the next load overwrites. Returns with
// every copy complete (a caller reusing the stages synchronises first).
template <int kStages, typename Load, typename Compute>
__device__ __forceinline__ void cp_async_pipeline(int slices, Load&& load, Compute&& compute) {
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < slices) load(s);
    cp_async_commit();
  }
  for (int slice = 0; slice < slices; ++slice) {
    cp_async_wait<kStages - 2>();
    __syncthreads();
    if (slice + kStages - 1 < slices) load(slice + kStages - 1);
    cp_async_commit();
    compute(slice);
  }
  cp_async_wait<0>();
}

}  // namespace mxmoe::kernels
#endif

// The GEMV-style expert family, for 1-16 rows per expert (decode): each warp streams one 16-row
// record column of one touched expert straight from global memory into registers, 16 bytes per lane
// per record, and multiplies it with the expert's <= kTokens tokens, which the CTA stages once in
// shared memory. No weight byte goes through shared memory or is read twice (for counts up to
// kTokens).
//
// The weight stream is a two-batch register pipeline: while batch i (kUnroll records) is
// dequantised and multiplied, batch i + 1's loads are in flight, so a warp always has 16 kUnroll to
// 32 kUnroll bytes per lane outstanding. The first batch is issued before the activations are
// staged, and FC2 issues it before waiting on FC1 (programmatic dependent launch): it needs only the
// routing, which is complete by the time FC2 starts (or which a small batch's CTAs compute
// themselves from the logits, expert_gemm.cuh).
//
// A CTA has kColumns x kWarpsK warps: kWarpsK warps share each record column, each streaming a
// contiguous part of its K, their partial sums added in shared memory in a fixed order. That
// multiplies the warps a few experts' columns give an SM (a 1-token step) without a second pass
// over the output (which FC1's SwiGLU could not take).
//
// Grid (expert_gemv_family.cpp): x = row tiles / kColumns, y = active-expert slot (upper bound
// min(E, pairs)), z = k-split. Budget (per layer): every touched expert's records once (0.53 bytes
// per weight) plus the tokens' activations (2 K bytes per token per CTA, from L2); the MMAs do
// kTokens' work whatever the count, which is free while memory-bound. An expert with more than
// kTokens rows is walked in groups, re-streaming its weights: correct, and the tactic choice keeps
// such counts away from this family.
#pragma once

#include "kernels/expert_gemm.cuh"

namespace mxmoe::kernels {

// Dynamic shared memory: the staging, then the partial sums of the warps past the first along K
// (columns x (warps_k - 1) warps x 32 lanes x tokens / 2); a batch that routes itself keeps its
// routing past that (small_route_offset).
constexpr int gemv_smem_bytes(int tokens, int rows, int k_tiles, int k_split, int columns, int warps_k) {
  return gemv_staging_bytes(tokens, rows, k_tiles, k_split) + columns * (warps_k - 1) * 32 * tokens / 2 * 4;
}

// The token-sum GEMV's (expert_gemv_token_sum_kernel), for `pairs` pairs a CTA: their source rows
// and staged rows (all of K), the partial sums of the warps past the first along K, each pair's
// weighted rows and the CTA's sums (columns x 16 fp32 each), which its cluster reads.
constexpr int kTokenSumMaxPairs = 8;
constexpr int gemv_token_sum_smem_bytes(int k_tiles, int columns, int warps_k, int pairs) {
  return kTokenSumMaxPairs * 8 + pairs * (k_tiles * 64 + 8) * 2 + pairs * (warps_k - 1) * columns * 32 * 4 * 4 +
         (pairs + 1) * columns * 16 * 4;
}

}  // namespace mxmoe::kernels

#if defined(__CUDACC__)
namespace mxmoe::kernels {

// One lane's share of kUnroll consecutive records of its column.
template <int kUnroll>
struct RecordBatch {
  uint4 values[kUnroll];
  unsigned scales[kUnroll];

  // Records [first, first + kUnroll) that are below `end`; nothing when `active` is false.
  __device__ __forceinline__ void load(const unsigned char* column, int first, int end, bool active, int lane) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (active && first + u < end) {
        const unsigned char* record = column + static_cast<long long>(first + u) * kRecordBytes;
        values[u] = load_stream_16(record + 16 * lane);
        scales[u] = load_stream_4(record + kRecordValueBytes + 4 * (lane / 4));
      }
    }
  }
};

template <int kTokens, bool kOneMultiply, int kUnroll>
__device__ __forceinline__ void multiply_batch(float (&acc)[kTokens / 8][4], const RecordBatch<kUnroll>& batch, int first,
                                               int end, const unsigned (&b_rows)[kTokens / 8]) {
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    if (first + u < end) multiply_record<kTokens>(acc, batch.values[u], batch.scales[u], b_rows, first + u, kOneMultiply);
  }
}

template <int kTokens, bool kOneMultiply, int kUnroll>
__device__ __forceinline__ void stream_records_of(float (&acc)[kTokens / 8][4], RecordBatch<kUnroll>& batch_a,
                                                  RecordBatch<kUnroll>& batch_b, const unsigned char* column, int first,
                                                  int end, const unsigned (&b_rows)[kTokens / 8]) {
  const int lane = threadIdx.x % 32;
  for (int i = first; i < end; i += 2 * kUnroll) {
    batch_b.load(column, i + kUnroll, end, true, lane);
    multiply_batch<kTokens, kOneMultiply>(acc, batch_a, i, end, b_rows);
    batch_a.load(column, i + 2 * kUnroll, end, true, lane);
    multiply_batch<kTokens, kOneMultiply>(acc, batch_b, i + kUnroll, end, b_rows);
  }
}

// A warp's records [first, end) of `column` into `acc`, two batches in flight; `batch_a` holds the
// first batch's loads already. `one_multiply`: every scale code of the matrix takes one multiply
// (GemvOptions); a loop of its own for each case, so that no record's scales are tested.
template <int kTokens, int kUnroll>
__device__ __forceinline__ void stream_records(float (&acc)[kTokens / 8][4], RecordBatch<kUnroll>& batch_a,
                                               RecordBatch<kUnroll>& batch_b, const unsigned char* column, int first,
                                               int end, const unsigned (&b_rows)[kTokens / 8], bool one_multiply) {
  if (one_multiply) {
    stream_records_of<kTokens, true>(acc, batch_a, batch_b, column, first, end, b_rows);
  } else {
    stream_records_of<kTokens, false>(acc, batch_a, batch_b, column, first, end, b_rows);
  }
}

// A shallow pipeline (kUnroll <= 2) is held to 80 registers, so that an SM holds 24 of its warps
// (768 threads); deeper ones take what they need (~100-125 registers, 16 warps).
template <int kColumns, int kWarpsK, int kUnroll>
constexpr int kGemvMinBlocks = kUnroll <= 2 && 768 / (kColumns * kWarpsK * 32) > 1 ? 768 / (kColumns * kWarpsK * 32) : 1;

// One GEMV CTA's work: the kColumns record columns of column group `group` of the expert in `w`,
// over all its rows in passes of kTokens. `inputs_ready()` runs once every warp has issued its
// first weight batch and before the activations are staged, and must end with the whole CTA able
// to read the inputs (the standalone FC2 waits on FC1 there, the fused layer on its counters).
template <int kColumns, int kWarpsK, int kTokens, int kUnroll, typename InputsReady>
__device__ __forceinline__ void gemv_columns(const ExpertGemmArgs& args, const GemvWork& w, int group, int split,
                                             bool fc1, GemvOptions options, InputsReady inputs_ready) {
  static_assert(kTokens == 8 || kTokens == 16, "8 or 16 tokens per pass");
  constexpr int kAccumulators = kTokens / 8 * 4;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int column_in_cta = warp % kColumns, k_part = warp / kColumns;
  const int row_tile = group * kColumns + column_in_cta;
  const bool streams = row_tile < w.row_tiles;
  // This warp's records of the split: [first_record, end_record), relative to the split's first.
  const int first_record = k_part * w.records / kWarpsK;
  const int end_record = (k_part + 1) * w.records / kWarpsK;
  const unsigned char* column = w.column(args, row_tile);
  const GemvStaging<kTokens> staging(args, w);
  unsigned b_rows[kTokens / 8];
  token_fragment_rows<kTokens>(b_rows, staging.rows, args.staged_rows, w.row_stride);
  auto* partial = reinterpret_cast<float*>(staging.end);  // [kWarpsK - 1][kColumns][32][acc]

  RecordBatch<kUnroll> batch_a, batch_b;
  batch_a.load(column, first_record, end_record, streams, lane);
  inputs_ready();
  for (int pass = 0; pass < w.count; pass += kTokens) {
    const int tokens = min(kTokens, w.count - pass);
    if (pass > 0) {
      __syncthreads();  // the previous pass's MMAs and sums are done with the staged rows and `partial`
      batch_a.load(column, first_record, end_record, streams, lane);
    }
    stage_token_rows(args, w, pass, tokens, staging.source_rows, staging.rows, fc1, options.round_fp8 != 0);
    __syncthreads();

    float acc[kTokens / 8][4] = {};
    if (streams) {
      stream_records<kTokens>(acc, batch_a, batch_b, column, first_record, end_record, b_rows,
                              options.scales_one_multiply != 0);
    }
    if constexpr (kWarpsK > 1) {
      float* mine = partial + ((k_part - 1) * kColumns + column_in_cta) * 32 * kAccumulators + lane * kAccumulators;
      if (k_part > 0) {
#pragma unroll
        for (int t = 0; t < kTokens / 8; ++t) {
#pragma unroll
          for (int i = 0; i < 4; ++i) mine[4 * t + i] = acc[t][i];
        }
      }
      __syncthreads();
      if (k_part > 0) continue;
#pragma unroll
      for (int part = 1; part < kWarpsK; ++part) {  // in order: the result does not depend on timing
        const float* theirs = partial + ((part - 1) * kColumns + column_in_cta) * 32 * kAccumulators + lane * kAccumulators;
#pragma unroll
        for (int t = 0; t < kTokens / 8; ++t) {
#pragma unroll
          for (int i = 0; i < 4; ++i) acc[t][i] += theirs[4 * t + i];
        }
      }
    }
    if (!streams) continue;
#pragma unroll
    for (int t = 0; t < kTokens / 8; ++t) {
      store_accumulators(args, acc[t], w.expert, row_tile, w.first_row + pass + 8 * t, tokens - 8 * t, split, fc1);
    }
  }
}

template <int kColumns, int kWarpsK, int kTokens, bool kFc1, int kUnroll>
__global__ void __launch_bounds__(kColumns * kWarpsK * 32, (kGemvMinBlocks<kColumns, kWarpsK, kUnroll>))
    expert_gemv_kernel(ExpertGemmArgs args, int k_split, RouteInput source, GemvOptions options) {
  // A batch that routes itself does so in FC1, whose CTA (0, 0, 0) also writes the routing to
  // args.route and only then lets FC2 launch, so that FC2 and the un-permute read it as a routing
  // kernel's, with no routing of their own.
  const bool publishes = kFc1 && args.routes_itself && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0;
  if constexpr (kFc1) {
    wait_for_prerequisite_grids();  // the routing; for a batch that routes itself, its logits or top-k
    if (!publishes) allow_dependent_grids();
  }
  ExpertGemmArgs routed = args;
  GemvWork w;
  if (kFc1 && args.routes_itself) {  // FC2 reads the routing FC1 published
    const int own_bytes = gemv_smem_bytes(kTokens, args.staged_rows, args.k_tiles, k_split, kColumns, kWarpsK);
    w = route_small_batch_in_cta(routed, source, dynamic_smem() + small_route_offset(own_bytes), blockIdx.y, publishes,
                                 blockIdx.z, k_split);
    if (publishes) allow_dependent_grids();  // after the routing's writes and their fence
  } else {
    w = gemv_work(args, blockIdx.y, blockIdx.z, k_split);
  }
  if (w.expert < 0) return;
  gemv_columns<kColumns, kWarpsK, kTokens, kUnroll>(routed, w, blockIdx.x, blockIdx.z, kFc1, options, [] {
    if constexpr (!kFc1) {
      wait_for_prerequisite_grids();  // FC1's activations
      allow_dependent_grids();
    }
  });
}

// FC2 of a few tokens with the weighted un-permute in it. A CTA runs column group x (kColumns
// record columns) for kPairs consecutive pairs of one token, kColumns x kWarpsK warps a pair, each
// pair's warps streaming its expert's records for the pair's one row (8-token MMAs of which one
// column is used: free while the stream is memory-bound); the CTA adds its pairs' rows times their
// routing weights in slot order in shared memory. A token's top_k / kPairs CTAs are one cluster
// (cluster dims 1 x top_k / kPairs along y, CTA y holding pairs [kPairs y, kPairs (y + 1))),
// whose first CTA adds the CTAs' sums in rank order from distributed shared memory and writes the
// token's bf16 outputs. So FC2's rows never go to global memory and no un-permute launch follows
// (~1.7 us of a 1-token layer: that launch waits for all of FC2, then reads its rows back). A pair
// of no expert adds nothing. Budget: each pair's expert's records once (an expert two tokens pick
// is streamed twice: the heuristic takes this only for 1-2 tokens), the pairs' rows of FC1's output
// staged per CTA (2 I bytes each, from L2), top_k / kPairs x kColumns x 16 fp32 of distributed
// shared memory and kColumns x 16 bf16 outputs a cluster.
template <int kColumns, int kWarpsK, int kPairs, int kUnroll>
__global__ void __launch_bounds__(kColumns * kWarpsK * kPairs * 32,
                                  (kGemvMinBlocks<kColumns, kWarpsK * kPairs, kUnroll>))
    expert_gemv_token_sum_kernel(ExpertGemmArgs args, GemvOptions options, unsigned short* out) {
  constexpr int kPairWarps = kColumns * kWarpsK, kOutputs = kColumns * kRecordRows;
  if (static_cast<int>(blockIdx.y) * kPairs >= args.num_tokens * args.top_k) return;  // a grid for a larger batch
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int slot_in_cta = warp / kPairWarps, column_in_cta = warp % kColumns, k_part = warp % kPairWarps / kColumns;
  const int pair = blockIdx.y * kPairs + slot_in_cta;
  // The routing is complete before FC2 starts (FC1 waited for it, or wrote it, before letting FC2
  // launch): loaded together before the wait on FC1.
  const int row = args.route.pair_rows[pair], local_expert = args.route.topk_experts[pair];
  const float weight = args.route.topk_weights[pair];
  const GemvWork w = gemv_work_of(args, row < 0 ? -1 : local_expert, row, 1, 0, 1);
  const int row_tile = blockIdx.x * kColumns + column_in_cta;
  const bool streams = w.expert >= 0 && row_tile < args.rows / kRecordRows;
  const int first_record = k_part * args.k_tiles / kWarpsK, end_record = (k_part + 1) * args.k_tiles / kWarpsK;
  const unsigned char* column = streams ? w.column(args, row_tile) : nullptr;
  RecordBatch<kUnroll> batch_a, batch_b;
  batch_a.load(column, first_record, end_record, streams, lane);

  // Shared memory (gemv_token_sum_smem_bytes): the pairs' source rows, their staged rows, the
  // partial sums of the warps past the first along K, each pair's weighted rows, the CTA's sums.
  const GemvWork whole_k = gemv_work_of(args, 0, 0, 1, 0, 1);  // K range and row stride of every pair
  auto* source_rows = reinterpret_cast<long long*>(dynamic_smem());
  auto* staged = reinterpret_cast<unsigned short*>(source_rows + kTokenSumMaxPairs);  // 16-byte aligned
  // [pairs][kWarpsK - 1][kColumns][32][4]
  auto* partial = reinterpret_cast<float*>(staged + kPairs * whole_k.row_stride);
  float* pair_outputs = partial + kPairs * (kWarpsK - 1) * kColumns * 32 * 4;     // [pairs][kOutputs]
  float* sums = pair_outputs + kPairs * kOutputs;                                 // [kOutputs]
  if (warp % kPairWarps == 0 && lane == 0) {
    source_rows[slot_in_cta] = row < 0 ? -1 : static_cast<long long>(row) * args.k;
  }
  wait_for_prerequisite_grids();  // FC1's activations
  allow_dependent_grids();
  __syncthreads();
  copy_source_rows(args, whole_k, kPairs, kPairs, source_rows, staged, options.round_fp8 != 0);
  __syncthreads();

  unsigned b_rows[1];
  token_fragment_rows<8>(b_rows, staged + slot_in_cta * whole_k.row_stride, 1, whole_k.row_stride);
  float acc[1][4] = {};
  if (streams) {
    stream_records<8>(acc, batch_a, batch_b, column, first_record, end_record, b_rows,
                      options.scales_one_multiply != 0);
  }
  if (k_part > 0) {
    float* mine = partial + ((slot_in_cta * (kWarpsK - 1) + k_part - 1) * kColumns + column_in_cta) * 32 * 4 + lane * 4;
#pragma unroll
    for (int i = 0; i < 4; ++i) mine[i] = acc[0][i];
  }
  if constexpr (kWarpsK > 1) __syncthreads();
  if (k_part == 0) {
#pragma unroll
    for (int part = 1; part < kWarpsK; ++part) {  // in order: the result does not depend on timing
      const float* theirs = partial + ((slot_in_cta * (kWarpsK - 1) + part - 1) * kColumns + column_in_cta) * 32 * 4 + lane * 4;
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[0][i] += theirs[i];
    }
    if (lane % 4 == 0) {  // token 0 of the group, the pair's row: rows g and g + 8 of the record
      float low = 0.0f, high = 0.0f;
      if (streams) {
        const RowBias bias = row_bias(args, w.expert, row_tile);
        low = weight * (acc[0][0] + bias.low);
        high = weight * (acc[0][2] + bias.high);
      }
      float* out_rows = pair_outputs + slot_in_cta * kOutputs + column_in_cta * kRecordRows + lane / 4;
      out_rows[0] = low;
      out_rows[8] = high;
    }
  }
  __syncthreads();
  if (threadIdx.x < kOutputs) {
    float sum = 0.0f;
#pragma unroll
    for (int p = 0; p < kPairs; ++p) sum += pair_outputs[p * kOutputs + threadIdx.x];
    sums[threadIdx.x] = sum;
  }
  const int ranks = args.top_k / kPairs;
  if (ranks > 1) cluster_barrier();  // every CTA's sums are in its shared memory
  if (cluster_rank() == 0 && threadIdx.x < kOutputs) {
    const int output = blockIdx.x * kOutputs + threadIdx.x;
    float rank_sums[8];  // at most 8 ranks: all loads in flight before the first add
#pragma unroll
    for (int rank = 0; rank < 8; ++rank) {
      if (rank < ranks) rank_sums[rank] = ranks > 1 ? load_cluster_shared(sums + threadIdx.x, rank) : sums[threadIdx.x];
    }
    float total = 0.0f;
#pragma unroll
    for (int rank = 0; rank < 8; ++rank) {
      if (rank < ranks) total += rank_sums[rank];
    }
    const int token = blockIdx.y * kPairs / args.top_k;
    if (output < args.rows) out[static_cast<long long>(token) * args.rows + output] = float_to_bf16_bits(total);
  }
  if (ranks > 1) cluster_barrier();  // no CTA leaves while the first still reads its shared memory
}

}  // namespace mxmoe::kernels
#endif

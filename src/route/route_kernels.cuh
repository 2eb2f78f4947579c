// Routing on the device: router logits, top-k with softmax, and the expert-sorted permutation.
// No kernel here needs the host to know how many tokens each expert got.
#pragma once

#include <cuda_bf16.h>

#include "route/small_batch_routing.cuh"

namespace mxmoe::kernels {

constexpr int kLogitWarps = 8;   // experts per CTA, one per warp
constexpr int kLogitTokens = 8;  // tokens per CTA

// acc[t] += x[token0 + t] . w over the 8 elements of H at chunk `chunk`, w being W[expert]'s (bf16
// bits), for the first `tokens` of 8 tokens. Every token's load is issued before the first FMA, so
// that a chunk costs one L2 round trip, not one a token.
__device__ __forceinline__ void accumulate_chunk(float (&acc)[kLogitTokens], const __nv_bfloat16* x, uint4 w,
                                                 int token0, int tokens, int hidden, int chunk) {
  const unsigned w_words[4] = {w.x, w.y, w.z, w.w};
  uint4 v[kLogitTokens];
#pragma unroll
  for (int t = 0; t < kLogitTokens; ++t) {
    if (t < tokens) v[t] = *reinterpret_cast<const uint4*>(x + static_cast<long long>(token0 + t) * hidden + 8 * chunk);
  }
#pragma unroll
  for (int t = 0; t < kLogitTokens; ++t) {
    if (t >= tokens) break;
    const unsigned x_words[4] = {v[t].x, v[t].y, v[t].z, v[t].w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      acc[t] += bf16_bits_to_float(x_words[i] & 0xFFFF) * bf16_bits_to_float(w_words[i] & 0xFFFF);
      acc[t] += bf16_bits_to_float(x_words[i] >> 16) * bf16_bits_to_float(w_words[i] >> 16);
    }
  }
}

__device__ __forceinline__ uint4 load_weight_chunk(const __nv_bfloat16* weight, int expert, int hidden, int chunk) {
  return *reinterpret_cast<const uint4*>(weight + static_cast<long long>(expert) * hidden + 8 * chunk);
}

// acc[t] += x[token0 + t] . W[expert] over the 8-element chunks first, first + step, ... of H, for
// the first `tokens` of 8 tokens.
__device__ __forceinline__ void accumulate_logits(float (&acc)[kLogitTokens], const __nv_bfloat16* x,
                                                  const __nv_bfloat16* weight, int expert, int token0, int tokens,
                                                  int hidden, int first, int step) {
  for (int chunk = first; chunk < hidden / 8; chunk += step) {
    accumulate_chunk(acc, x, load_weight_chunk(weight, expert, hidden, chunk), token0, tokens, hidden, chunk);
  }
}

// logits [T, E] = x [T, H] . W [E, H]^T + b, fp32 accumulation. Grid: x = token groups of 8,
// y = expert groups of 8.
// Budget: reads W (E H 2 bytes) once per 8 tokens (from L2 after the first CTA) and x once per 8
// experts; 2 T E H FLOPs on the CUDA cores: small beside the experts at every T.
__global__ void __launch_bounds__(kLogitWarps * 32)
    router_logits_kernel(const __nv_bfloat16* x, const __nv_bfloat16* weight, const float* bias, float* logits,
                         int num_tokens, int num_experts, int hidden) {
  wait_for_prerequisite_grids();  // x
  allow_dependent_grids();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int expert = blockIdx.y * kLogitWarps + warp;
  const int token0 = blockIdx.x * kLogitTokens;
  if (expert >= num_experts) return;
  const int tokens = min(kLogitTokens, num_tokens - token0);
  float acc[kLogitTokens] = {};
  accumulate_logits(acc, x, weight, expert, token0, tokens, hidden, lane, 32);
#pragma unroll
  for (int t = 0; t < kLogitTokens; ++t) {
    for (int offset = 16; offset > 0; offset /= 2) acc[t] += __shfl_xor_sync(0xffffffffu, acc[t], offset);
    if (lane == 0 && t < tokens) logits[static_cast<long long>(token0 + t) * num_experts + expert] = acc[t] + bias[expert];
  }
}

// The same logits for small batches (at most kSmallBatchTokens): one CTA per (expert, 8 tokens), its
// 8 warps splitting H, so that E CTAs share the work a 1-token step has; partial sums meet in
// shared memory. W does not depend on the grid before (only x does), so a thread loads its first
// kPrefetchedChunks chunks of W (all of them up to H = 8192) before it waits on that grid: their
// DRAM latency passes while the grid before finishes, and after the wait only x's L2 reads remain.
// Budget: E x (H 2 bytes of W + 8 H 2 bytes of x from L2) per 8 tokens.
constexpr int kSmallBatchTokens = 64;
constexpr int kPrefetchedChunks = 4;
static_assert(8192 / 8 <= kPrefetchedChunks * kLogitWarps * 32, "H up to 8192 has all its W chunks prefetched");

__global__ void __launch_bounds__(kLogitWarps * 32)
    router_logits_small_batch_kernel(const __nv_bfloat16* x, const __nv_bfloat16* weight, const float* bias,
                                     float* logits, int num_tokens, int num_experts, int hidden) {
  __shared__ float partial[kLogitWarps][kLogitTokens];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int expert = blockIdx.x, token0 = blockIdx.y * kLogitTokens;
  const int first = warp * 32 + lane, step = kLogitWarps * 32, chunks = hidden / 8;
  uint4 w[kPrefetchedChunks];
#pragma unroll
  for (int i = 0; i < kPrefetchedChunks; ++i) {
    if (first + i * step < chunks) w[i] = load_weight_chunk(weight, expert, hidden, first + i * step);
  }
  wait_for_prerequisite_grids();  // x
  allow_dependent_grids();
  const int tokens = min(kLogitTokens, num_tokens - token0);
  float acc[kLogitTokens] = {};
#pragma unroll
  for (int i = 0; i < kPrefetchedChunks; ++i) {
    if (first + i * step < chunks) accumulate_chunk(acc, x, w[i], token0, tokens, hidden, first + i * step);
  }
  accumulate_logits(acc, x, weight, expert, token0, tokens, hidden, first + kPrefetchedChunks * step, step);
#pragma unroll
  for (int t = 0; t < kLogitTokens; ++t) {
    for (int offset = 16; offset > 0; offset /= 2) acc[t] += __shfl_xor_sync(0xffffffffu, acc[t], offset);
    if (lane == 0) partial[warp][t] = acc[t];
  }
  __syncthreads();
  if (threadIdx.x < tokens) {
    float sum = 0.0f;
    for (int part = 0; part < kLogitWarps; ++part) sum += partial[part][threadIdx.x];
    logits[static_cast<long long>(token0 + threadIdx.x) * num_experts + expert] = sum + bias[expert];
  }
}

// One token's top-k as local experts into experts[token k + s] and weights[token k + s], slot s by
// lane s: from the logits (top-k and weights as RouterMath says) or the caller's ids and weights,
// then through the map to local experts (RouteInput). Call with one whole warp.
__device__ __forceinline__ void route_token(const RouteInput& in, int token, int top_k, int* experts, float* weights) {
  if (in.logits) {
    select_token_experts(in.logits, token, in.routed_experts, top_k, experts, weights, in.router, in.local_experts);
    return;
  }
  const int lane = threadIdx.x % 32;
  if (lane < top_k) take_given_pair(in, token * top_k + lane, experts, weights);
}

constexpr int kSelectWarps = 8;  // tokens per CTA, one per warp

__global__ void __launch_bounds__(kSelectWarps * 32)
    select_experts_kernel(RouteInput in, int num_tokens, int top_k, RouteBuffers route) {
  wait_for_prerequisite_grids();  // the logits or the caller's top-k
  allow_dependent_grids();
  const int token = blockIdx.x * kSelectWarps + threadIdx.x / 32;
  if (token < num_tokens) route_token(in, token, top_k, route.topk_experts, route.topk_weights);
}

constexpr int kPermuteThreads = 1024;
// The one CTA routes each token with at least one warp, so past 32 tokens a warp's tokens queue and
// the one launch grows with T, where the top-k launch and the permutation cost about the same at
// any T: so batches of up to 64 tokens take the one launch, larger ones the two
// (docs/performance.md, "The heuristic's decisions").
constexpr int kFusedRouteTokens = 64;
constexpr int kFusedRoutePairs = 1024;  // and at most this many pairs (the launcher checks both)
constexpr int kPermuteSmemBytes = 48 * 1024;

// The scratch of the CTA-wide top-k and scan over experts (select_batch_experts's candidates for 32
// warps of top-8, scan_experts's warp totals), at the start of the permutation's shared memory.
constexpr int kPermuteScratchBytes = select_scratch_bytes(kPermuteThreads / 32, 8);
static_assert(kPermuteScratchBytes >= kExpertScanScratchBytes, "the scan's scratch shares the top-k's");

// Shared memory of the permutation besides its histograms: the scratch, offsets [E + 1] and counts
// [E], and on the fused path each pair's expert and rank [pairs] x 2.
__host__ __device__ inline int permute_fixed_smem(int num_experts, int smem_pairs) {
  return kPermuteScratchBytes + 4 * (2 * num_experts + 1) + 8 * smem_pairs;
}

// A fused batch of at most kOneWarpPermutePairs pairs and 32 tokens is counted by one warp; the
// launcher gives it small_permute_warps, among which the scan over experts is split, and for a
// scored router each token's top-k (select_group: at DeepSeek-V4's shapes, batches of up to 8
// tokens take 4-8 warps a token). Softmax tokens take a warp each, and the CTA at least
// kSmallPermuteWarps for the scan.
constexpr int kSmallPermuteWarps = 8;
__host__ __device__ inline bool permutes_in_one_warp(int num_tokens, int top_k) {
  return num_tokens <= 32 && num_tokens * top_k <= kOneWarpPermutePairs;
}
__host__ __device__ inline int small_permute_warps(int num_tokens, bool scored) {
  return scored ? kPermuteThreads / 32 : (num_tokens > kSmallPermuteWarps ? num_tokens : kSmallPermuteWarps);
}

// Segments (warps) of the pair list: no more than 32-pair chunks (a segment's histogram is one
// match.any step per chunk, and every expert's scan over segments walks them all), and no more
// than fit the shared-memory budget.
__host__ __device__ inline int permute_segments(int num_experts, int num_pairs, int smem_pairs) {
  const int fit = (kPermuteSmemBytes - permute_fixed_smem(num_experts, smem_pairs)) / (4 * num_experts);
  const int chunks = (num_pairs + 31) / 32;
  const int most = chunks < kPermuteThreads / 32 ? chunks : kPermuteThreads / 32;
  return fit < 1 ? 1 : (fit > most ? most : fit);
}

// The expert-sorted permutation, in one CTA; with logits or a given top-k in `in` it first routes
// every token itself (one launch fewer for small batches: at most kFusedRouteTokens, 2 tokens per
// warp, or a token's experts split over several warps where there are fewer tokens than warps) and
// keeps each pair's expert and rank in shared memory, so that no step waits on a global-memory
// round trip of its own CTA's writes. Warp w owns a contiguous segment of pairs and counts
// them per expert in hist[w][*] (pairs that go to no expert are not counted), ranking pairs of the same expert within each 32-pair chunk by lane
// (match.any); a scan over segments then over experts gives every pair its sorted row:
//   row(p) = offset[e] + (pairs of e in earlier segments) + (pairs of e earlier in p's segment).
// It also zeroes the fused layer's schedule counters, which the expert kernels after it may use.
// Budget: a few reads and writes per pair plus O(S E) shared-memory work; one CTA, so this is a
// latency term (microseconds), not a bandwidth one.
__global__ void __launch_bounds__(kPermuteThreads)
    permute_kernel(RouteInput in, int num_tokens, int num_experts, int top_k, RouteBuffers route) {
  auto* candidates = reinterpret_cast<uint2*>(dynamic_smem());  // the scratch: the top-k's, then the scan's
  int* scan_scratch = reinterpret_cast<int*>(dynamic_smem());
  int* smem = reinterpret_cast<int*>(dynamic_smem() + kPermuteScratchBytes);
  wait_for_prerequisite_grids();  // the logits or given top-k, or the top-k of select_experts_kernel
  allow_dependent_grids();
  const int num_pairs = num_tokens * top_k;
  const bool fused = in.logits || in.topk_ids;
  const int segments = permute_segments(num_experts, num_pairs, fused ? num_pairs : 0);
  int* hist = smem;                                 // [segments][E]
  int* offsets = smem + segments * num_experts;     // [E + 1]
  int* counts = offsets + num_experts + 1;          // [E]
  // Each pair's expert, then its rank within its segment and later its sorted row: shared memory
  // on the fused path, the workspace's top-k and pair_rows otherwise.
  int* pair_experts = fused ? counts + num_experts : route.topk_experts;
  int* pair_ranks = fused ? pair_experts + num_pairs : route.pair_rows;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const unsigned lanes_below = (1u << lane) - 1u;
  for (int i = threadIdx.x; i < route.schedule_words; i += blockDim.x) route.schedule[i] = 0;
  if (in.logits) {
    select_batch_experts(in.logits, num_tokens, in.routed_experts, top_k, pair_experts, route.topk_weights, in.router,
                         in.local_experts, candidates);
  } else if (in.topk_ids) {
    for (int token = warp; token < num_tokens; token += blockDim.x / 32) {
      route_token(in, token, top_k, pair_experts, route.topk_weights);
    }
  }
  if (fused && permutes_in_one_warp(num_tokens, top_k)) {
    // A small batch: warp 0 counts its pairs, the CTA scans the experts, warp 0 writes the rows.
    for (int e = threadIdx.x; e < num_experts; e += blockDim.x) counts[e] = 0;
    __syncthreads();  // the selected experts and the zeroed counts
    SmallBatchPairs pairs;
    if (warp == 0) pairs = count_small_batch(pair_experts, num_pairs, counts);
    __syncthreads();  // the counts
    scan_experts<true, true>(counts, offsets, num_experts, route, scan_scratch);
    __syncthreads();  // the offsets
    if (warp == 0) write_small_batch_rows(pairs, num_pairs, offsets, route);
    return;
  }
  for (int i = threadIdx.x; i < segments * num_experts; i += blockDim.x) hist[i] = 0;
  __syncthreads();  // the selected experts and the zeroed histograms

  const int seg_begin = static_cast<int>(static_cast<long long>(warp) * num_pairs / segments);
  const int seg_end = static_cast<int>(static_cast<long long>(warp + 1) * num_pairs / segments);
  if (warp < segments) {
    int* my_hist = hist + warp * num_experts;
    for (int base = seg_begin; base < seg_end; base += 32) {
      const int pair = base + lane;
      const int expert = pair < seg_end ? pair_experts[pair] : -1;
      const bool valid = expert >= 0;
      const unsigned peers = __match_any_sync(0xffffffffu, expert);
      const int before = valid ? my_hist[expert] : 0;
      __syncwarp();
      if (valid) {
        pair_ranks[pair] = before + __popc(peers & lanes_below);  // rank within the segment, for now
        if ((peers & lanes_below) == 0) my_hist[expert] = before + __popc(peers);
      }
      __syncwarp();
    }
  }
  __syncthreads();

  // Per expert: exclusive scan over segments, and the expert's total.
  for (int e = threadIdx.x; e < num_experts; e += blockDim.x) {
    int running = 0;
    for (int s = 0; s < segments; ++s) {
      const int c = hist[s * num_experts + e];
      hist[s * num_experts + e] = running;
      running += c;
    }
    counts[e] = running;
  }
  __syncthreads();

  scan_experts<true>(counts, offsets, num_experts, route, scan_scratch);
  __syncthreads();

  if (warp < segments) {
    const int* my_hist = hist + warp * num_experts;
    for (int pair = seg_begin + lane; pair < seg_end; pair += 32) {
      const int expert = pair_experts[pair];
      const int row = expert < 0 ? -1 : offsets[expert] + my_hist[expert] + pair_ranks[pair];
      if (row >= 0) route.sorted_pairs[row] = pair;
      route.pair_rows[pair] = row;
      if (fused) route.topk_experts[pair] = expert;
    }
  }
}

}  // namespace mxmoe::kernels

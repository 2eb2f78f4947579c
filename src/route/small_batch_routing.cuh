// Routing that one warp can do: a token's top-k with the softmax over it, the scans over experts,
// and the whole expert-sorted permutation of a batch of at most kOneWarpPermutePairs pairs. The routing
// kernels use it, and so do the GEMV kernels and the un-permute, which route a small batch
// themselves when no routing kernel ran (expert_gemm.cuh): NVRTC compiles it too, so no toolkit
// headers.
#pragma once

#include "kernels/device_utils.cuh"
#include "route/route_buffers.hpp"

namespace mxmoe::kernels {

__device__ __forceinline__ float infinity() { return __int_as_float(0x7f800000); }

// A logit's rank as an unsigned word: a larger logit gives a larger word, NaN ranks as -inf (below
// every number, tied with -inf), and -0 as +0, so that equal words are equal logits. Ties go to
// the lower expert.
__device__ __forceinline__ unsigned logit_rank(float v) {
  if (v != v) v = -infinity();
  const unsigned u = v == 0.0f ? 0u : __float_as_uint(v);
  return u & 0x80000000u ? ~u : u | 0x80000000u;
}

// torch.nn.functional.softplus (beta 1, threshold 20), then the square root: ref/router.cpp's.
__device__ __forceinline__ float sqrt_softplus(float logit) {
  return sqrtf(logit > 20.0f ? logit : log1pf(expf(logit)));
}

// What expert e's logit ranks by under `router`.
__device__ __forceinline__ float rank_key(const RouterMath& router, float logit, int e) {
  return router.sqrt_softplus ? sqrt_softplus(logit) + router.selection_bias[e] : logit;
}

// Top-k over one token's logits and the weights of the k selected (RouterMath), by one warp. Round
// s takes the best entry ranked after round s-1's pick, so nothing needs marking: each lane its own best,
// then the warp's by two reductions (the highest rank, then the lowest expert holding it). Lane s
// keeps slot s. Writes experts[token k + s] and weights[token k + s] (workspace or shared).
// Budget: reads E 4 bytes once (all loads in flight together); k rounds of E / 32 compares and
// three warp-wide steps. kHeld: logits a lane keeps in registers (it rereads any past 32 kHeld);
// select_token_experts below picks the fewest that hold E, so that no compare is issued for an
// expert that does not exist (the routing kernel runs every token's top-k on one SM).
template <int kHeld>
__device__ __forceinline__ void select_token_experts_held(const float* logits, int token, int num_experts, int top_k,
                                                          int* experts, float* weights, const RouterMath& router) {
  const int lane = threadIdx.x % 32;
  const float* row = logits + static_cast<long long>(token) * num_experts;
  float held[kHeld];  // rank keys
#pragma unroll
  for (int i = 0; i < kHeld; ++i) {
    const int e = lane + 32 * i;
    held[i] = e < num_experts ? rank_key(router, row[e], e) : 0.0f;
  }
  unsigned previous_rank = 0xFFFFFFFFu;
  int previous_expert = -1;
  int my_expert = -1;
  for (int slot = 0; slot < top_k; ++slot) {
    unsigned best_rank = 0;  // below every key's rank: this lane has no candidate
    int best_expert = num_experts;
    auto consider = [&](float key, int e) {
      const unsigned rank = logit_rank(key);
      const bool after_previous = rank < previous_rank || (rank == previous_rank && e > previous_expert);
      if (after_previous && (rank > best_rank || (rank == best_rank && e < best_expert))) {
        best_rank = rank;
        best_expert = e;
      }
    };
#pragma unroll
    for (int i = 0; i < kHeld; ++i) {
      if (lane + 32 * i < num_experts) consider(held[i], lane + 32 * i);
    }
    for (int e = lane + 32 * kHeld; e < num_experts; e += 32) consider(rank_key(router, row[e], e), e);
    const unsigned top_rank = __reduce_max_sync(0xffffffffu, best_rank);
    const int top_expert = static_cast<int>(
        __reduce_min_sync(0xffffffffu, best_rank == top_rank ? static_cast<unsigned>(best_expert) : 0xFFFFFFFFu));
    previous_rank = top_rank;
    previous_expert = top_expert;
    if (lane == slot) my_expert = top_expert;
  }
  // The raw logit of this lane's pick (L1: the row was just read): a NaN logit makes NaN weights,
  // as in the reference.
  const float my_logit = lane < top_k ? row[my_expert] : 0.0f;
  float e;
  if (router.sqrt_softplus) {
    e = lane < top_k ? sqrt_softplus(my_logit) : 0.0f;
  } else {
    const float max_logit = __shfl_sync(0xffffffffu, my_logit, 0);
    e = lane < top_k ? expf(my_logit - max_logit) : 0.0f;
  }
  float sum = e;
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (lane < top_k) {
    experts[token * top_k + lane] = my_expert;
    weights[token * top_k + lane] = router.sqrt_softplus ? e / sum * router.routed_scaling : e / sum;
  }
}

// select_token_experts_held with the fewest held logits per lane that cover E (8 past 256). Not
// inlined: four inlined copies raised the 16-token GEMV past 128 registers (one CTA per SM).
__device__ __noinline__ void select_token_experts(const float* logits, int token, int num_experts, int top_k,
                                                     int* experts, float* weights, RouterMath router = {}) {
  if (num_experts <= 32) {
    select_token_experts_held<1>(logits, token, num_experts, top_k, experts, weights, router);
  } else if (num_experts <= 64) {
    select_token_experts_held<2>(logits, token, num_experts, top_k, experts, weights, router);
  } else if (num_experts <= 128) {
    select_token_experts_held<4>(logits, token, num_experts, top_k, experts, weights, router);
  } else {
    select_token_experts_held<8>(logits, token, num_experts, top_k, experts, weights, router);
  }
}

// Warp-wide exclusive scans over experts of `counts` (shared memory): each expert's first sorted
// row (into `offsets` [E + 1], shared, and the workspace), its count, the active list and each
// tile size's tile offsets (workspace). Call with one whole warp.
__device__ __forceinline__ void scan_experts(const int* counts, int* offsets, int num_experts, const RouteBuffers& route) {
  const int lane = threadIdx.x % 32;
  const int per_lane = (num_experts + 31) / 32;
  const int first = lane * per_lane, last = min(num_experts, first + per_lane);
  int sums[2 + kTileSizeCount] = {};
  for (int e = first; e < last; ++e) {
    const int c = counts[e];
    sums[0] += c;
    sums[1] += c > 0;
#pragma unroll
    for (int i = 0; i < kTileSizeCount; ++i) sums[2 + i] += (c + tile_size(i) - 1) / tile_size(i);
  }
#pragma unroll
  for (int q = 0; q < 2 + kTileSizeCount; ++q) {
    int inclusive = sums[q];
    for (int offset = 1; offset < 32; offset *= 2) {
      const int up = __shfl_up_sync(0xffffffffu, inclusive, offset);
      if (lane >= offset) inclusive += up;
    }
    sums[q] = inclusive - sums[q];  // exclusive prefix of this lane's chunk
  }
  for (int e = first; e < last; ++e) {
    const int c = counts[e];
    route.expert_counts[e] = c;
    offsets[e] = sums[0];
    route.expert_offsets[e] = sums[0];
    sums[0] += c;
    if (c > 0) route.active_experts[sums[1]++] = e;
#pragma unroll
    for (int i = 0; i < kTileSizeCount; ++i) {
      route.tile_offsets[i * (num_experts + 1) + e] = sums[2 + i];
      sums[2 + i] += (c + tile_size(i) - 1) / tile_size(i);
    }
  }
  if (lane == 31) {
    offsets[num_experts] = sums[0];
    route.expert_offsets[num_experts] = sums[0];
    route.active_experts[num_experts] = sums[1];
    for (int i = 0; i < kTileSizeCount; ++i) route.tile_offsets[i * (num_experts + 1) + num_experts] = sums[2 + i];
  }
}

// Pair `first + lane` of a warp's 32 (expert -1 past `num_pairs`): its expert, the lanes whose
// pair has the same expert, and how many of those are below this lane. Call with one whole warp.
struct LanePair {
  int expert;
  unsigned peers;
  int rank;
};
__device__ __forceinline__ LanePair lane_pair(const int* pair_experts, int first, int num_pairs) {
  const int lane = threadIdx.x % 32, pair = first + lane;
  LanePair p;
  p.expert = pair < num_pairs ? pair_experts[pair] : -1;
  p.peers = __match_any_sync(0xffffffffu, p.expert);
  p.rank = __popc(p.peers & ((1u << lane) - 1u));
  return p;
}

// The permutation of a batch of at most kOneWarpPermutePairs (64) pairs by one warp, after every
// pair's expert (-1: none) is in `pair_experts` (its top-k, visible to the warp): lane l holds pairs l and
// 32 + l, so a pair's rank among its expert's pairs is a match.any away, plus the expert's count
// in the step before. Writes the counts, offsets, active list and tile offsets, then the sorted
// rows, into `route`; `counts` [E] and `offsets` [E + 1] are the warp's shared scratch. Call with
// one whole warp.
__device__ __forceinline__ void permute_small_batch(const int* pair_experts, int num_pairs, int num_experts,
                                                    int* counts, int* offsets, const RouteBuffers& route) {
  constexpr int kSteps = kOneWarpPermutePairs / 32;
  const int lane = threadIdx.x % 32;
  for (int e = lane; e < num_experts; e += 32) counts[e] = 0;
  __syncwarp();
  int experts[kSteps], ranks[kSteps];
#pragma unroll
  for (int s = 0; s < kSteps; ++s) {
    const LanePair p = lane_pair(pair_experts, 32 * s, num_pairs);
    experts[s] = p.expert;
    const int before = p.expert >= 0 ? counts[p.expert] : 0;
    __syncwarp();
    ranks[s] = before + p.rank;
    if (p.expert >= 0 && p.rank == 0) counts[p.expert] = before + __popc(p.peers);
    __syncwarp();
  }
  scan_experts(counts, offsets, num_experts, route);
  __syncwarp();
#pragma unroll
  for (int s = 0; s < kSteps; ++s) {
    const int pair = 32 * s + lane;
    if (pair >= num_pairs) continue;
    const int row = experts[s] < 0 ? -1 : offsets[experts[s]] + ranks[s];  // -1: the pair goes to no expert
    if (row >= 0) route.sorted_pairs[row] = pair;
    route.pair_rows[pair] = row;
    route.topk_experts[pair] = experts[s];
  }
}

// Warp 0's part of a small batch's routing inside one CTA, after every pair's expert is in
// `pair_experts` (shared): each pair's sorted row (pairs of lower experts, then of its own expert
// from lower lanes) into pair_rows and, when given, sorted_pairs; when `mine` is given, the expert
// of active slot `slot`, its first sorted row and its row count into mine[0..2] (left alone when
// there is no such slot). 32 shuffles, no scan over experts. Call with one whole warp.
__device__ __forceinline__ void rank_small_batch(const int* pair_experts, int num_pairs, int slot, int* pair_rows,
                                                 int* sorted_pairs, int* mine) {
  const int lane = threadIdx.x % 32;
  const LanePair p = lane_pair(pair_experts, 0, num_pairs);
  const int expert = p.expert;
  const bool leads = expert >= 0 && p.rank == 0;
  const unsigned leaders = __ballot_sync(0xffffffffu, leads);
  int rows_before = 0, experts_before = 0;  // pairs, and distinct experts, below this pair's expert
  for (int q = 0; q < num_pairs; ++q) {
    const int other = __shfl_sync(0xffffffffu, expert, q);
    if (other < expert) {
      ++rows_before;
      experts_before += (leaders >> q) & 1;
    }
  }
  if (expert >= 0) {
    const int row = rows_before + p.rank;
    pair_rows[lane] = row;
    if (sorted_pairs) sorted_pairs[row] = lane;
  }
  if (mine && leads && experts_before == slot) {
    mine[0] = expert;
    mine[1] = rows_before;
    mine[2] = __popc(p.peers);
  }
}

}  // namespace mxmoe::kernels

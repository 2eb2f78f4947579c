// Routing of a small batch by one warp or one CTA: a token's top-k and its weights (its experts
// split over warps where the CTA has more warps than tokens), the scans over experts, and the whole
// expert-sorted permutation of a batch of at most kOneWarpPermutePairs pairs. The routing kernels
// use it, and so do the GEMV kernels and the un-permute, which route a small batch themselves when
// no routing kernel ran (expert_gemm.cuh): NVRTC compiles it too, so no toolkit headers.
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

// What expert e's logit ranks by under `router`; kScored: router.sqrt_softplus, as a template
// parameter below so that a softmax layer's top-k carries none of the scoring's code.
template <bool kScored>
__device__ __forceinline__ float rank_key(const RouterMath& router, float logit, int e) {
  if constexpr (kScored) return sqrt_softplus(logit) + router.selection_bias[e];
  return logit;
}

// A lane's pick of a top-k: the expert (kNoPick where fewer than k experts remain) and its rank.
constexpr int kNoPick = 0x7FFFFFFF;
struct Pick {
  int expert;
  unsigned rank;
};

// The k best of the (rank, expert) pairs a warp holds, by one warp: round s takes the best pair
// ranked after round s-1's pick (higher rank first, then the lower expert), so nothing needs
// marking; each lane its own best, then the warp's by two reductions. Lane l holds rank[i] of
// expert_of(i); a pair of rank 0 (below every key's) is none, and at least k pairs must have a
// rank above 0. `rescore(consider)` calls consider(rank, expert) for pairs the lanes do not hold
// (every round). Lane s < k gets pick s.
// Budget: k rounds of kHeld compares and two warp-wide reductions.
template <int kHeld, typename ExpertOf, typename Rescore>
__device__ __forceinline__ Pick warp_top_k(const unsigned (&rank)[kHeld], ExpertOf expert_of, int top_k,
                                           Rescore rescore) {
  const int lane = threadIdx.x % 32;
  unsigned previous_rank = 0xFFFFFFFFu;
  int previous_expert = -1;
  Pick mine{kNoPick, 0};
  for (int slot = 0; slot < top_k; ++slot) {
    unsigned best_rank = 0;  // below every key's rank: this lane has no candidate
    int best_expert = kNoPick;
    auto consider = [&](unsigned r, int e) {
      const bool after_previous = r < previous_rank || (r == previous_rank && e > previous_expert);
      if (after_previous && (r > best_rank || (r == best_rank && e < best_expert))) {
        best_rank = r;
        best_expert = e;
      }
    };
#pragma unroll
    for (int i = 0; i < kHeld; ++i) consider(rank[i], expert_of(i));
    rescore(consider);
    const unsigned top_rank = __reduce_max_sync(0xffffffffu, best_rank);
    const int top_expert = static_cast<int>(
        __reduce_min_sync(0xffffffffu, best_rank == top_rank ? static_cast<unsigned>(best_expert) : 0xFFFFFFFFu));
    previous_rank = top_rank;
    previous_expert = top_expert;
    if (lane == slot) mine = Pick{top_expert, top_rank};
  }
  return mine;
}

// The k best experts of one token's logits `row` among experts first + lane + stride i (a slice
// when several warps share the token, stride 32 x warps), as RouterMath ranks them, by one warp.
// kHeld: ranks a lane keeps in registers; it rescores any past them every round. The slice must
// hold at least k experts.
// Budget: reads the slice's E / (stride / 32) logits once (all loads in flight together) and scores
// each once; then warp_top_k.
template <bool kScored, int kHeld>
__device__ __forceinline__ Pick slice_top_k_held(const float* row, int num_experts, int first, int stride, int top_k,
                                                 const RouterMath& router) {
  const int lane = threadIdx.x % 32;
  const auto expert_of = [&](int i) { return first + lane + stride * i; };
  float logit[kHeld];  // every load issued before the first score (a score's branches and call would
                       // otherwise put each load behind the score before it)
#pragma unroll
  for (int i = 0; i < kHeld; ++i) logit[i] = expert_of(i) < num_experts ? row[expert_of(i)] : 0.0f;
  unsigned rank[kHeld];
#pragma unroll
  for (int i = 0; i < kHeld; ++i) {
    rank[i] = expert_of(i) < num_experts ? logit_rank(rank_key<kScored>(router, logit[i], expert_of(i))) : 0u;
  }
  return warp_top_k(rank, expert_of, top_k, [&](auto& consider) {
    for (int e = first + lane + stride * kHeld; e < num_experts; e += stride) {
      consider(logit_rank(rank_key<kScored>(router, row[e], e)), e);
    }
  });
}

// slice_top_k_held with the fewest held ranks per lane that cover the slice (at most 8, as many as
// the GEMVs' register budgets hold without spilling: past 256 experts a slice rescores the rest
// every round).
template <bool kScored>
__device__ __forceinline__ Pick slice_top_k(const float* row, int num_experts, int first, int stride, int top_k,
                                            const RouterMath& router) {
  const int per_lane = (num_experts - first + stride - 1) / stride;
  if (per_lane <= 1) return slice_top_k_held<kScored, 1>(row, num_experts, first, stride, top_k, router);
  if (per_lane <= 2) return slice_top_k_held<kScored, 2>(row, num_experts, first, stride, top_k, router);
  if (per_lane <= 4) return slice_top_k_held<kScored, 4>(row, num_experts, first, stride, top_k, router);
  return slice_top_k_held<kScored, 8>(row, num_experts, first, stride, top_k, router);
}

// Lane s < k of the warp holding a token's picks writes pick s (through `local_experts` where
// given) and its weight: the softmax over the k picked logits, or the picked scores over their sum
// times routed_scaling (RouterMath), into experts[token k + s] and weights[token k + s] (only the
// experts where `weights` is null: a caller that needs no weights skips their arithmetic). The raw
// logit is reread (L1: the row was just read): a NaN logit makes NaN weights, as in the reference.
template <bool kScored>
__device__ __forceinline__ void write_token_picks(const float* row, int token, int top_k, int my_expert, int* experts,
                                                  float* weights, const RouterMath& router, const int* local_experts) {
  const int lane = threadIdx.x % 32;
  if (weights == nullptr) {
    if (lane < top_k) experts[token * top_k + lane] = local_experts ? local_experts[my_expert] : my_expert;
    return;
  }
  const float my_logit = lane < top_k ? row[my_expert] : 0.0f;
  float e;
  if constexpr (kScored) {
    e = lane < top_k ? sqrt_softplus(my_logit) : 0.0f;
  } else {
    const float max_logit = __shfl_sync(0xffffffffu, my_logit, 0);
    e = lane < top_k ? expf(my_logit - max_logit) : 0.0f;
  }
  float sum = e;
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (lane < top_k) {
    experts[token * top_k + lane] = local_experts ? local_experts[my_expert] : my_expert;
    weights[token * top_k + lane] = kScored ? e / sum * router.routed_scaling : e / sum;
  }
}

// One token's top-k and weights (write_token_picks) by one warp, for a router of kind kScored.
// Not inlined: inlined copies of the held variants raised the 16-token GEMV past 128 registers
// (one CTA per SM). The router's kind is a template parameter: with the scoring's code behind a
// run-time branch in the softmax path, gpt-oss's decode layer (T = 1) took 1.0-1.3 us longer on an
// H200.
template <bool kScored>
__device__ __noinline__ void select_token_experts_of(const float* logits, int token, int num_experts, int top_k,
                                                     int* experts, float* weights, RouterMath router,
                                                     const int* local_experts) {
  const float* row = logits + static_cast<long long>(token) * num_experts;
  const Pick pick = slice_top_k<kScored>(row, num_experts, 0, 32, top_k, router);
  write_token_picks<kScored>(row, token, top_k, pick.expert, experts, weights, router, local_experts);
}

// One token's top-k and weights by one warp, as `router` ranks and weighs them.
__device__ __forceinline__ void select_token_experts(const float* logits, int token, int num_experts, int top_k,
                                                     int* experts, float* weights, const RouterMath& router,
                                                     const int* local_experts) {
  if (router.sqrt_softplus) {
    select_token_experts_of<true>(logits, token, num_experts, top_k, experts, weights, router, local_experts);
  } else {
    select_token_experts_of<false>(logits, token, num_experts, top_k, experts, weights, router, local_experts);
  }
}

// Warps per token when a CTA of `warps` warps selects `num_tokens` tokens' top-k
// (select_batch_experts): the most, a power of two, that the CTA has for every token, with at
// least 32 experts per warp and at most 64 candidates to merge; 1 where the keys are the logits
// themselves (`scored` false: softmax), which cost a lane a few instructions per expert, less than
// the split's barrier and second set of rounds.
__host__ __device__ inline int select_group(int warps, int num_tokens, int num_experts, int top_k, bool scored) {
  if (!scored) return 1;
  int group = 1;
  while (2 * group * num_tokens <= warps && 2 * group * 32 <= num_experts && 2 * group * top_k <= 64) group *= 2;
  return group;
}

// Whether key (rank_a, expert_a) comes before (rank_b, expert_b) in a top-k's order: the higher
// rank, then the lower expert (warp_top_k's order).
__device__ __forceinline__ bool key_before(unsigned rank_a, int expert_a, unsigned rank_b, int expert_b) {
  return rank_a > rank_b || (rank_a == rank_b && expert_a < expert_b);
}

// A lane's key in a slice of at most one expert a lane (expert first + lane; rank 0, none, past
// the experts) and how many of the warp's keys come before it. The 31 comparisons are independent
// shuffles, where warp_top_k's k rounds each wait on two warp-wide reductions and on the round
// before (docs/performance.md, "The heuristic's decisions").
struct CountedKey {
  unsigned rank;
  int expert;
  int ahead;
};
template <bool kScored>
__device__ __forceinline__ CountedKey count_slice_key(const float* row, int num_experts, int first,
                                                      const RouterMath& router) {
  const int lane = threadIdx.x % 32, expert = first + lane;
  const unsigned rank = expert < num_experts ? logit_rank(rank_key<kScored>(router, row[expert], expert)) : 0u;
  int ahead = 0;
#pragma unroll
  for (int d = 1; d < 32; ++d) {
    const unsigned other = __shfl_xor_sync(0xffffffffu, rank, d);
    ahead += key_before(other, lane ^ d, rank, lane) ? 1 : 0;  // lanes in the order of their experts
  }
  return {rank, expert, ahead};
}

// select_batch_experts with its tokens' experts split over `group` warps each (> 1, so the router
// scores): each warp puts its slice's k best into `candidates` in order (by counting the keys
// before each where its slice has one expert a lane, else by warp_top_k), and after a barrier the
// token's own warp counts, for each of the group's candidates, the candidates before it: candidate
// s goes to the token's slot s in `experts`, where lane s takes it. Every thread of the CTA calls
// it. Not inlined: the GEMVs' one-warp path keeps its code apart from this one's.
__device__ __noinline__ void select_split_experts(const float* logits, int num_tokens, int num_experts, int top_k,
                                                  int* experts, float* weights, RouterMath router,
                                                  const int* local_experts, uint2* candidates, int group) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int token = warp / group, part = warp % group;
  if (token < num_tokens) {
    const float* row = logits + static_cast<long long>(token) * num_experts;
    if (num_experts <= 32 * group) {
      const CountedKey key = count_slice_key<true>(row, num_experts, 32 * part, router);
      if (lane < top_k) candidates[warp * top_k + lane] = uint2{0u, static_cast<unsigned>(kNoPick)};
      __syncwarp();
      if (key.rank > 0 && key.ahead < top_k) {
        candidates[warp * top_k + key.ahead] = uint2{key.rank, static_cast<unsigned>(key.expert)};
      }
    } else {
      const Pick pick = slice_top_k<true>(row, num_experts, 32 * part, 32 * group, top_k, router);
      if (lane < top_k) candidates[warp * top_k + lane] = uint2{pick.rank, static_cast<unsigned>(pick.expert)};
    }
  }
  __syncthreads();  // the candidates
  if (warp < num_tokens) {
    const uint2* mine = candidates + warp * group * top_k;
    const int count = group * top_k;  // at most 64
    uint2 held[2];
    int ahead[2] = {0, 0};
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      held[i] = lane + 32 * i < count ? mine[lane + 32 * i] : uint2{0u, static_cast<unsigned>(kNoPick)};
    }
    for (int q = 0; q < count; ++q) {
      const uint2 other = mine[q];  // the same word for every lane: a broadcast
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        ahead[i] += key_before(other.x, static_cast<int>(other.y), held[i].x, static_cast<int>(held[i].y)) ? 1 : 0;
      }
    }
    int* slots = experts + warp * top_k;  // the token's picks in order, then write_token_picks's
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      if (held[i].x > 0 && ahead[i] < top_k) slots[ahead[i]] = static_cast<int>(held[i].y);
    }
    __syncwarp();
    const int my_expert = lane < top_k ? slots[lane] : 0;
    __syncwarp();  // every pick is read before write_token_picks writes the slots
    write_token_picks<true>(logits + static_cast<long long>(warp) * num_experts, warp, top_k, my_expert, experts,
                            weights, router, local_experts);
  }
}

// Every token's top-k and weights (write_token_picks) by the whole CTA. With more warps than
// tokens and scored keys, a token's experts are split over a group of warps (select_group,
// select_split_experts; `candidates`: shared, select_scratch_bytes). This cuts the latency of a
// 1-token batch, which one warp would score and rank alone (a sqrt-softplus score costs ~70
// instructions). Every thread of the CTA calls it, with the same arguments; the caller
// synchronises before reading the picks.
// Budget: per token E logits read and scored once, k rounds over E / (32 group) + 2 group k / 64
// ranks per lane.
__device__ __forceinline__ void select_batch_experts(const float* logits, int num_tokens, int num_experts, int top_k,
                                                     int* experts, float* weights, const RouterMath& router,
                                                     const int* local_experts, uint2* candidates) {
  const int warps = blockDim.x / 32;
  const int group = select_group(warps, num_tokens, num_experts, top_k, router.sqrt_softplus != 0);
  if (group > 1) {
    select_split_experts(logits, num_tokens, num_experts, top_k, experts, weights, router, local_experts, candidates,
                         group);
    return;
  }
  for (int token = threadIdx.x / 32; token < num_tokens; token += warps) {
    select_token_experts(logits, token, num_experts, top_k, experts, weights, router, local_experts);
  }
}

// Pair `pair` of the caller's top-k (RouteInput::topk_ids and topk_weights) as a local expert (-1
// for an id outside [0, routed_experts) or one the map gives -1) and its weight, into experts[pair]
// and weights[pair] (where `weights` is not null).
__device__ __forceinline__ void take_given_pair(const RouteInput& in, int pair, int* experts, float* weights) {
  const long long id =
      in.ids_int64 ? static_cast<const long long*>(in.topk_ids)[pair] : static_cast<const int*>(in.topk_ids)[pair];
  const int expert = id >= 0 && id < in.routed_experts ? static_cast<int>(id) : -1;
  if (weights) weights[pair] = in.topk_weights[pair];
  experts[pair] = expert >= 0 && in.local_experts ? in.local_experts[expert] : expert;
}

// Every pair's local expert and weight (no weights where `weights` is null) by the whole CTA, from
// the logits (select_batch_experts) or the caller's top-k (take_given_pair). Every thread calls it;
// the caller synchronises after.
__device__ __forceinline__ void select_batch_pairs(const RouteInput& in, int num_tokens, int top_k, int* experts,
                                                   float* weights, uint2* candidates) {
  if (in.logits) {
    select_batch_experts(in.logits, num_tokens, in.routed_experts, top_k, experts, weights, in.router,
                         in.local_experts, candidates);
    return;
  }
  for (int pair = threadIdx.x; pair < num_tokens * top_k; pair += blockDim.x) {
    take_given_pair(in, pair, experts, weights);
  }
}

// Exclusive scans over experts of `counts` (shared memory): each expert's first sorted row (into
// `offsets` [E + 1], shared, and the workspace), its count, the active list and each tile size's
// tile offsets (workspace). Each thread takes a contiguous chunk of experts. kWholeCta: by every
// thread of the CTA (it synchronises), the warps' totals meeting in `scratch` (shared,
// kExpertScanScratchBytes), so that a CTA of 8 warps scans 256 experts one per thread; else by one
// whole warp (each lane E / 32 experts, one after the other). kSmallCounts: no count exceeds
// kOneWarpPermutePairs (a small batch), so every tile size from 64 up gives an expert with rows one
// tile, and its tile offsets are the active list's: only the tile sizes under 64 are summed.
// Budget: E / threads experts per thread, each ~11 stores; 2 + the summed tile sizes warp scans (5
// shuffles each, all in flight together), and with kWholeCta two barriers and one more warp scan.
constexpr int kSmallCountTileSizes = 3;  // the tile sizes under 64: 8, 16, 32
static_assert(tile_size(kSmallCountTileSizes - 1) < kOneWarpPermutePairs &&
                  tile_size(kSmallCountTileSizes) >= kOneWarpPermutePairs,
              "from tile size index kSmallCountTileSizes a small batch's expert fills at most one tile");
constexpr int kExpertSums = 2 + kTileSizeCount;
constexpr int kExpertScanScratchBytes = 4 * 32 * kExpertSums;
template <bool kWholeCta, bool kSmallCounts = false>
__device__ __forceinline__ void scan_experts(const int* counts, int* offsets, int num_experts, const RouteBuffers& route,
                                             int* scratch = nullptr) {
  constexpr int kSummedTileSizes = kSmallCounts ? kSmallCountTileSizes : kTileSizeCount;
  constexpr int kSums = 2 + kSummedTileSizes;
  const int lane = threadIdx.x % 32;
  const int threads = kWholeCta ? static_cast<int>(blockDim.x) : 32;
  const int index = kWholeCta ? static_cast<int>(threadIdx.x) : lane;
  const int per_thread = (num_experts + threads - 1) / threads;
  const int first = min(num_experts, index * per_thread), last = min(num_experts, first + per_thread);
  int sums[kSums] = {};
  for (int e = first; e < last; ++e) {
    const int c = counts[e];
    sums[0] += c;
    sums[1] += c > 0;
#pragma unroll
    for (int i = 0; i < kSummedTileSizes; ++i) sums[2 + i] += (c + tile_size(i) - 1) / tile_size(i);
  }
  auto warp_exclusive_scan = [&](int (&v)[kSums]) {
#pragma unroll
    for (int q = 0; q < kSums; ++q) {
      int inclusive = v[q];
      for (int offset = 1; offset < 32; offset *= 2) {
        const int up = __shfl_up_sync(0xffffffffu, inclusive, offset);
        if (lane >= offset) inclusive += up;
      }
      v[q] = inclusive - v[q];
    }
  };
  int before[kSums];  // exclusive prefix of this thread's chunk
#pragma unroll
  for (int q = 0; q < kSums; ++q) before[q] = sums[q];
  warp_exclusive_scan(before);
  if constexpr (kWholeCta) {
    const int warp = threadIdx.x / 32, warps = blockDim.x / 32;
    if (lane == 31) {
#pragma unroll
      for (int q = 0; q < kSums; ++q) scratch[warp * kSums + q] = before[q] + sums[q];
    }
    __syncthreads();  // every warp's totals
    if (warp == 0) {
      int totals[kSums];
#pragma unroll
      for (int q = 0; q < kSums; ++q) totals[q] = lane < warps ? scratch[lane * kSums + q] : 0;
      warp_exclusive_scan(totals);
#pragma unroll
      for (int q = 0; q < kSums; ++q) {
        if (lane < warps) scratch[lane * kSums + q] = totals[q];
      }
    }
    __syncthreads();  // every warp's prefix
#pragma unroll
    for (int q = 0; q < kSums; ++q) before[q] += scratch[warp * kSums + q];
  }
  for (int e = first; e < last; ++e) {
    const int c = counts[e];
    route.expert_counts[e] = c;
    offsets[e] = before[0];
    route.expert_offsets[e] = before[0];
    before[0] += c;
    const int active_before = before[1];  // the offset of every tile size not summed
    if (c > 0) route.active_experts[before[1]++] = e;
#pragma unroll
    for (int i = 0; i < kTileSizeCount; ++i) {
      if (i < kSummedTileSizes) {
        route.tile_offsets[i * (num_experts + 1) + e] = before[2 + i];
        before[2 + i] += (c + tile_size(i) - 1) / tile_size(i);
      } else {
        route.tile_offsets[i * (num_experts + 1) + e] = active_before;
      }
    }
  }
  if (index == threads - 1) {  // its prefix and chunk are every expert's
    offsets[num_experts] = before[0];
    route.expert_offsets[num_experts] = before[0];
    route.active_experts[num_experts] = before[1];
#pragma unroll
    for (int i = 0; i < kTileSizeCount; ++i) {
      route.tile_offsets[i * (num_experts + 1) + num_experts] = i < kSummedTileSizes ? before[2 + i] : before[1];
    }
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

// A batch of at most kOneWarpPermutePairs (64) pairs, after every pair's expert (-1: none) is in
// `pair_experts` (its top-k, visible to the warp), held by one warp: lane l holds pairs l and
// 32 + l, so a pair's rank among its expert's pairs is a match.any away, plus the expert's count
// in the step before. count_small_batch adds every pair to `counts` [E] (shared, zeroed before)
// and returns the lane's pairs' experts and ranks; after the scan over experts has put each
// expert's first row in `offsets`, write_small_batch_rows writes each pair's sorted row. Call each
// with one whole warp.
constexpr int kSmallBatchSteps = kOneWarpPermutePairs / 32;
struct SmallBatchPairs {
  int experts[kSmallBatchSteps];
  int ranks[kSmallBatchSteps];
};

__device__ __forceinline__ SmallBatchPairs count_small_batch(const int* pair_experts, int num_pairs, int* counts) {
  SmallBatchPairs pairs;
#pragma unroll
  for (int s = 0; s < kSmallBatchSteps; ++s) {
    const LanePair p = lane_pair(pair_experts, 32 * s, num_pairs);
    pairs.experts[s] = p.expert;
    const int before = p.expert >= 0 ? counts[p.expert] : 0;
    __syncwarp();
    pairs.ranks[s] = before + p.rank;
    if (p.expert >= 0 && p.rank == 0) counts[p.expert] = before + __popc(p.peers);
    __syncwarp();
  }
  return pairs;
}

__device__ __forceinline__ void write_small_batch_rows(const SmallBatchPairs& pairs, int num_pairs, const int* offsets,
                                                       const RouteBuffers& route) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int s = 0; s < kSmallBatchSteps; ++s) {
    const int pair = 32 * s + lane;
    if (pair >= num_pairs) continue;
    const int expert = pairs.experts[s];
    const int row = expert < 0 ? -1 : offsets[expert] + pairs.ranks[s];  // -1: the pair goes to no expert
    if (row >= 0) route.sorted_pairs[row] = pair;
    route.pair_rows[pair] = row;
    route.topk_experts[pair] = expert;
  }
}

// The whole permutation of such a batch by one warp: the counts, offsets, active list and tile
// offsets, then the sorted rows, into `route`; `counts` [E] and `offsets` [E + 1] are the warp's
// shared scratch.
__device__ __forceinline__ void permute_small_batch(const int* pair_experts, int num_pairs, int num_experts,
                                                    int* counts, int* offsets, const RouteBuffers& route) {
  for (int e = threadIdx.x % 32; e < num_experts; e += 32) counts[e] = 0;
  __syncwarp();
  const SmallBatchPairs pairs = count_small_batch(pair_experts, num_pairs, counts);
  scan_experts<false, true>(counts, offsets, num_experts, route);
  __syncwarp();
  write_small_batch_rows(pairs, num_pairs, offsets, route);
}

// Warp 0's part of a small batch's routing inside one CTA, after every pair's expert (-1: none) is
// in `pair_experts` (shared): each pair's sorted row (pairs of lower experts, then of its own expert
// from lower lanes; -1 for a pair of no expert) into pair_rows, each sorted row's pair into
// sorted_pairs, and the expert of active slot `slot`, its first sorted row and its row count into
// mine[0..2] (left alone when there is no such slot). 32 shuffles, no scan over experts. Call with
// one whole warp.
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
    if (other >= 0 && other < expert) {
      ++rows_before;
      experts_before += (leaders >> q) & 1;
    }
  }
  if (lane < num_pairs) pair_rows[lane] = expert >= 0 ? rows_before + p.rank : -1;
  if (expert >= 0) sorted_pairs[rows_before + p.rank] = lane;
  if (leads && experts_before == slot) {
    mine[0] = expert;
    mine[1] = rows_before;
    mine[2] = __popc(p.peers);
  }
}

}  // namespace mxmoe::kernels

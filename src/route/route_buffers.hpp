// What routing writes into the workspace for the expert kernels and the un-permute to read. Pairs
// are (token, slot) in token-major order, p = t * top_k + slot; sorted rows order the pairs by
// expert, and by pair index within an expert, so the permutation is deterministic.
#pragma once

namespace mxmoe::kernels {

// Token tiles whose per-expert prefix sums the permutation precomputes for the tiled kernels:
// tile_offsets[i][e] = sum over experts before e of ceil(count / tile_size(i)). The sizes ascend:
// the powers of two from 8 to 256, and two that hold the experts of a uniform routing's common
// counts in one tile where the next power of two would be mostly padding or leave about half the
// experts a second, nearly empty one: 96 for 64 expected rows (mean plus ~4 standard deviations)
// and 144 for 128 (plus ~1.4).
constexpr int kTileSizeCount = 8;
#if defined(__CUDACC__)
__host__ __device__
#endif
constexpr int tile_size(int index) {
  constexpr int kTileSizes[kTileSizeCount] = {8, 16, 32, 64, 96, 128, 144, 256};
  return kTileSizes[index];
}
// The smallest precomputed tile size of at least `tokens` (the last for more than 256).
constexpr int tile_size_index(int tokens) {
  int index = 0;
  while (index + 1 < kTileSizeCount && tile_size(index) < tokens) ++index;
  return index;
}

// Batches of at most this many pairs route themselves inside the expert kernels, one pair per lane
// (small_batch_routing.cuh).
constexpr int kSmallBatchPairs = 32;

// The routing kernel permutes a batch of up to this many pairs in one warp, 32 pairs per step
// (route_kernels.cuh, permutes_in_one_warp).
constexpr int kOneWarpPermutePairs = 64;

// Shared memory of a CTA's top-k over a small batch (small_batch_routing.cuh,
// select_batch_experts): a candidate (rank, expert) per slot of each warp.
#if defined(__CUDACC__)
__host__ __device__
#endif
constexpr int select_scratch_bytes(int warps, int top_k) {
  return 8 * warps * top_k;
}

// How a router ranks the experts and weighs the k it picks (layer_spec.hpp's RouterKind, for the
// logits it routes from). Softmax (gpt-oss): ranks by the logit, weights the softmax over the k
// picked. Sqrt-softplus (DeepSeek-V4): scores s = sqrt(softplus(l)), ranks by s + selection_bias[e],
// weights the k picked scores over their sum, times routed_scaling.
struct RouterMath {
  const float* selection_bias = nullptr;  // [routed experts], sqrt-softplus only
  float routed_scaling = 1.0f;
  int sqrt_softplus = 0;
};

// Where the routing's top-k comes from: the router logits (top-k + softmax, as the layer routes), or
// the caller's own top-k (the engine form). Experts are the routed ones (an expert-parallel shard's
// router scores all of the layer's); `local_experts` maps each to the expert the weights hold, -1
// where they hold none. A pair whose expert is -1 after the map, or whose given id is outside
// [0, routed_experts), goes to no expert: its sorted row is -1 and it adds nothing.
struct RouteInput {
  const float* logits;        // [T, routed_experts], or null
  RouterMath router;          // how the logits route
  const void* topk_ids;       // [T, k] int32 or int64 (ids_int64), when logits is null
  const float* topk_weights;  // [T, k]
  const int* local_experts;   // [routed_experts], or null: the identity
  int routed_experts;
  int ids_int64;
};

struct RouteBuffers {
  int* topk_experts;    // [pairs]: local experts, -1 for none
  float* topk_weights;  // [pairs]
  int* expert_counts;   // [E]
  int* expert_offsets;  // [E + 1]: first sorted row of each expert; [E] = pairs
  int* active_experts;  // [E + 1]: experts with rows, ascending; [E] = their number
  int* tile_offsets;    // [kTileSizeCount][E + 1]
  int* sorted_pairs;    // [pairs]: sorted row -> pair (the first expert_offsets[E] rows)
  int* pair_rows;       // [pairs]: pair -> sorted row, -1 for a pair that goes to no expert
  int* schedule;        // [schedule_words]: the fused layer's counters, zeroed by the permutation
  int schedule_words;
};

}  // namespace mxmoe::kernels

// What routing writes into the workspace for the expert kernels and the un-permute to read. Pairs
// are (token, slot) in token-major order, p = t * top_k + slot; sorted rows order the pairs by
// expert, and by pair index within an expert, so the permutation is deterministic.
#pragma once

namespace mxmoe::kernels {

// Token tiles whose per-expert prefix sums the permutation precomputes for the tiled kernels:
// tile_offsets[i][e] = sum over experts before e of ceil(count / (8 << i)).
constexpr int kTileSizeCount = 5;  // 8, 16, 32, 64, 128

// Batches of at most this many pairs route themselves inside the expert kernels, one pair per lane
// (small_batch_routing.cuh).
constexpr int kSmallBatchPairs = 32;

// The routing kernel permutes a batch of up to this many pairs in one warp, 32 pairs per step
// (route_kernels.cuh, permutes_in_one_warp).
constexpr int kOneWarpPermutePairs = 64;

struct RouteBuffers {
  int* topk_experts;    // [pairs]
  float* topk_weights;  // [pairs]
  int* expert_counts;   // [E]
  int* expert_offsets;  // [E + 1]: first sorted row of each expert; [E] = pairs
  int* active_experts;  // [E + 1]: experts with rows, ascending; [E] = their number
  int* tile_offsets;    // [kTileSizeCount][E + 1]
  int* sorted_pairs;    // [pairs]: sorted row -> pair
  int* pair_rows;       // [pairs]: pair -> sorted row
  int* schedule;        // [schedule_words]: the fused layer's counters, zeroed by the permutation
  int schedule_words;
};

}  // namespace mxmoe::kernels

// Where forward() keeps its intermediates inside the caller's workspace. Every array starts on a
// 256-byte boundary; sizes follow from the shape and the token count alone, so the host never needs
// the routing to lay them out.
#pragma once

#include <cstddef>

#include "mxmoe/moe_shape.hpp"
#include "route/route_buffers.hpp"

namespace mxmoe {

struct WorkspaceLayout {
  size_t logits = 0;        // fp32 [T, R] (forward from router weights; R: the routed experts)
  size_t topk_experts = 0;  // int [pairs]
  size_t topk_weights = 0;  // fp32 [pairs]
  size_t expert_counts = 0, expert_offsets = 0, active_experts = 0, tile_offsets = 0;
  size_t sorted_pairs = 0, pair_rows = 0;  // int [pairs]
  size_t schedule = 0;      // int: the fused layer's counters [fused_schedule_words(E, H)], then the
  int schedule_words = 0;   // stream-K flags of FC1 and FC2 [2][kMaxStreamCtas]; zeroed by the routing
  size_t stream_flags = 0;     // int [2][kMaxStreamCtas], inside the schedule: FC1's, then FC2's
  size_t stream_partials = 0;  // fp32 [2][kMaxStreamCtas][kStreamPartialFloats]: FC1's, then FC2's
  // FC1's output in sorted-row order: bf16 [pairs, I], or with MXFP8 activations MXFP8 rows of
  // K = I (kernels/mxfp8_quantize.cuh); room for the larger.
  size_t activation = 0;
  size_t expert_out = 0;    // fp32 [kMaxKSplit][pairs, H]: FC2's partial outputs (bf16 [pairs, H] in one split)
  // x gathered into sorted-row order for an FC1 that reads it so: bf16 [pairs, H], or MXFP8 rows
  // of K = H. It shares expert_out's bytes: FC2 writes there only after its wait for FC1, which has
  // read it all.
  size_t sorted_input = 0;
  size_t total = 0;

  static WorkspaceLayout of(const MoeShape& shape, int routed_experts, int num_tokens);
  kernels::RouteBuffers route(void* base) const;
  // Stage s's (0: FC1, 1: FC2) stream-K partial sums and flags.
  float* stream_partials_of(void* base, int stage) const;
  int* stream_flags_of(void* base, int stage) const;
};

}  // namespace mxmoe

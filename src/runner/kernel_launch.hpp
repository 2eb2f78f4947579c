// Host-side launchers of the device kernels (routing in route_launch.cu, experts in
// expert_launch.cpp); the runner sequences them.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <span>

#include "kernels/expert_gemm_args.hpp"
#include "mxmoe/tactic.hpp"
#include "route/route_buffers.hpp"

namespace mxmoe {

void launch_router_logits(const __nv_bfloat16* x, const __nv_bfloat16* weight, const float* bias, float* logits,
                          int num_tokens, int num_experts, int hidden, cudaStream_t stream);
// Top-k + softmax and the expert-sorted permutation: one single-CTA launch for small batches, a
// parallel top-k then the permutation for large ones.
void launch_routing(const float* logits, int num_tokens, int num_experts, int top_k, const kernels::RouteBuffers& route,
                    cudaStream_t stream);
// `args.tile_offsets` must be the prefix array of the tactic's tile_tokens. Loads the tactic's
// kernels on first use (see MoeRunner::prepare to do that ahead of a graph capture).
void launch_expert_gemm(Stage stage, const Tactic& tactic, const kernels::ExpertGemmArgs& args, int num_pairs,
                        cudaStream_t stream);
// What an expert-GEMM launch's grid and shared memory depend on besides the tactic and the pairs:
// the stage's weight rows and K tiles, and the layer's experts and top-k.
struct ExpertStageShape {
  int rows = 0, k_tiles = 0, num_experts = 0, top_k = 0;
};
// Whether every CTA of the expert-GEMM launch, routing its small batch itself, is resident at once
// on the current device (one wave). A small batch routes itself in the expert kernels only then
// (MoeRunner; docs/perf-notes.md, decode round 16): a CTA of a later wave would pay the routing
// before its first load, while the streaming CTAs wait on its issue slots.
bool expert_gemm_routing_itself_fits_one_wave(Stage stage, const Tactic& tactic, const ExpertStageShape& shape,
                                              int num_pairs);
// The fused layer (a kFused tactic): FC1, FC2 and the un-permute in one launch after the routing;
// `args.schedule` must have been zeroed by that routing.
void launch_fused_layer(const Tactic& tactic, const kernels::FusedLayerArgs& args, int num_pairs, cudaStream_t stream);
// `route_logits`: the batch routed itself in FC1 and FC2 (MoeRunner::routes_in_expert_kernels), so
// the un-permute routes it again from these logits; null: it reads `route`.
void launch_unpermute(const float* expert_out, long long split_stride, int k_split, int hidden, int top_k,
                      int num_tokens, const kernels::RouteBuffers& route, __nv_bfloat16* out, const float* route_logits,
                      int num_experts, cudaStream_t stream);

}  // namespace mxmoe

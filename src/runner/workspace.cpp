#include "runner/workspace.hpp"

#include <algorithm>

#include "kernels/expert_gemm_args.hpp"
#include "kernels/mxfp8_quantize.cuh"
#include "mxmoe/tactic.hpp"

namespace mxmoe {

WorkspaceLayout WorkspaceLayout::of(const MoeShape& shape, int routed_experts, int num_tokens) {
  const size_t tokens = static_cast<size_t>(num_tokens), pairs = tokens * shape.top_k;
  const size_t experts = shape.num_experts;
  WorkspaceLayout w;
  size_t at = 0;
  auto take = [&](size_t bytes) {
    const size_t offset = at;
    at += (bytes + 255) / 256 * 256;
    return offset;
  };
  w.logits = take(tokens * static_cast<size_t>(routed_experts) * 4);
  w.topk_experts = take(pairs * 4);
  w.topk_weights = take(pairs * 4);
  w.expert_counts = take(experts * 4);
  w.expert_offsets = take((experts + 1) * 4);
  w.active_experts = take((experts + 1) * 4);
  w.tile_offsets = take(kernels::kTileSizeCount * (experts + 1) * 4);
  w.sorted_pairs = take(pairs * 4);
  w.pair_rows = take(pairs * 4);
  const int fused_words = kernels::fused_schedule_words(shape.num_experts, shape.hidden);
  w.schedule_words = fused_words + 2 * kernels::kMaxStreamCtas;
  w.schedule = take(static_cast<size_t>(w.schedule_words) * 4);
  w.stream_flags = w.schedule + static_cast<size_t>(fused_words) * 4;
  w.stream_partials = take(2ull * kernels::kMaxStreamCtas * kernels::kStreamPartialFloats * 4);
  w.activation = take(std::max<size_t>(pairs * shape.intermediate * 2,
                                       static_cast<size_t>(kernels::mxfp8_rows_bytes(pairs, shape.intermediate))));
  w.expert_out = take(static_cast<size_t>(kMaxKSplit) * pairs * shape.hidden * 4);
  w.sorted_input = w.expert_out;
  w.total = at;
  return w;
}

kernels::RouteBuffers WorkspaceLayout::route(void* base) const {
  auto* b = static_cast<unsigned char*>(base);
  return {reinterpret_cast<int*>(b + topk_experts),   reinterpret_cast<float*>(b + topk_weights),
          reinterpret_cast<int*>(b + expert_counts),  reinterpret_cast<int*>(b + expert_offsets),
          reinterpret_cast<int*>(b + active_experts), reinterpret_cast<int*>(b + tile_offsets),
          reinterpret_cast<int*>(b + sorted_pairs),   reinterpret_cast<int*>(b + pair_rows),
          reinterpret_cast<int*>(b + schedule),       schedule_words};
}

float* WorkspaceLayout::stream_partials_of(void* base, int stage) const {
  return reinterpret_cast<float*>(static_cast<unsigned char*>(base) + stream_partials) +
         static_cast<size_t>(stage) * kernels::kMaxStreamCtas * kernels::kStreamPartialFloats;
}

int* WorkspaceLayout::stream_flags_of(void* base, int stage) const {
  return reinterpret_cast<int*>(static_cast<unsigned char*>(base) + stream_flags) + stage * kernels::kMaxStreamCtas;
}

}  // namespace mxmoe

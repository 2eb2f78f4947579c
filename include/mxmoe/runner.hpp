// The GPU MoE layer for a serving engine: build a runner from one layer's weights (repacked and
// copied to the current device once, at load), size a workspace for the largest batch, then call
// forward() on any stream. forward() allocates nothing, never synchronises and never reads device
// memory on the host, so a whole call can be captured in a CUDA graph and replayed.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <memory>

#include "mxmoe/layer_weights.hpp"
#include "mxmoe/tactic.hpp"

namespace mxmoe {

// Device pointers into a workspace after forward(): the routing and permutation it computed, for
// tests and tools. Pairs are (token, slot), p = t * top_k + slot.
struct RoutingView {
  const int* topk_experts;    // [T * k]
  const float* topk_weights;  // [T * k]
  const int* expert_counts;   // [E]
  const int* expert_offsets;  // [E + 1]
  const int* sorted_pairs;    // [T * k]: sorted row -> pair
  const int* pair_rows;       // [T * k]: pair -> sorted row
  const float* router_logits; // [T, E], written by the forward that computes them
};

// How far forward() goes: the whole layer, or (for measuring the stages inside a graph) the stages
// up to and including one; a forward that stops early leaves `out` unwritten. A whole-layer plan runs
// FC1, FC2 and the un-permute as one launch, so stopping after FC1 or FC2 runs the whole layer.
// A small batch for which MoeRunner::routes_in_expert_kernels holds is routed inside FC1 and FC2, so
// stopping after the routing launches nothing and leaves the routing buffers unwritten; they are
// written by the time FC2 ends.
enum class ForwardPart { kRouting, kFc1, kFc2, kAll };

class MoeRunner {
 public:
  // Throws Error when the weights are inconsistent or the device is out of memory.
  explicit MoeRunner(const MoeLayerWeights& weights);
  ~MoeRunner();
  MoeRunner(MoeRunner&&) noexcept;
  MoeRunner& operator=(MoeRunner&&) noexcept;

  const MoeShape& shape() const;
  size_t device_bytes() const;  // packed weights resident on the device

  // Bytes of workspace a forward of up to `max_tokens` tokens needs.
  size_t workspace_size(int max_tokens) const;

  // The tactics forward() uses for `num_tokens` tokens when not given a plan: the tuned table's
  // (mxmoe tune) if this device has one for the shape, else the heuristic's. Host-only, no sync.
  LayerPlan plan(int num_tokens) const;
  LayerPlan heuristic_plan(int num_tokens) const;
  bool tuned() const;  // a tuned table was found for this device and shape

  // Decides, for every token count up to `max_tokens`, what forward() launches (the plan's kernels,
  // loaded now and compiled first if the ahead-of-time set lacks them, their grids and shared
  // memory, whether the batch routes itself), so that a forward of up to `max_tokens` tokens only
  // looks its launches up and launches, and no graph capture waits on a compiler or a module load.
  // A forward of more tokens than prepared, or with a plan other than the prepared one, makes its
  // launches first, on the host, before any launch.
  void prepare(int max_tokens) const;

  // x [T, H] bf16 and out [T, H] bf16 (16-byte aligned), router_logits [T, E] fp32: device
  // pointers. The workspace must hold workspace_size(num_tokens) bytes (256-byte aligned).
  // Throws Error on bad arguments (checked on the host) or a failed launch.
  void forward(const __nv_bfloat16* x, const float* router_logits, __nv_bfloat16* out, int num_tokens,
               void* workspace, size_t workspace_bytes, cudaStream_t stream, const LayerPlan* plan = nullptr,
               ForwardPart last = ForwardPart::kAll) const;
  // As above, computing the router logits from the layer's router weights first.
  void forward(const __nv_bfloat16* x, __nv_bfloat16* out, int num_tokens, void* workspace, size_t workspace_bytes,
               cudaStream_t stream, const LayerPlan* plan = nullptr) const;

  RoutingView routing(void* workspace, int num_tokens) const;

  // Whether forward() of `num_tokens` tokens under `plan` runs with no routing launch, FC1 and FC2
  // routing the batch themselves: a batch that can (can_route_in_expert_kernels) and whose FC1 grid
  // is resident at once on this device. Host-only; loads the plan's kernels to ask.
  bool routes_in_expert_kernels(const LayerPlan& plan, int num_tokens) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mxmoe

// The GPU MoE layer for a serving engine: build a runner from one layer's weights (copied to the
// current device once, at load, and repacked there), size a workspace for the largest batch, then
// call forward() on any stream. forward() allocates nothing, never synchronises and never reads device
// memory on the host, so a whole call can be captured in a CUDA graph and replayed.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "mxmoe/device_layer.hpp"
#include "mxmoe/layer_weights.hpp"
#include "mxmoe/mx_format.hpp"
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
// A small batch for which MoeRunner::routes_in_expert_kernels holds is routed inside FC1, so
// stopping after the routing launches nothing and leaves the routing buffers unwritten; FC1 writes
// them before FC2 starts.
enum class ForwardPart { kRouting, kFc1, kFc2, kAll };

// The caller's routing, for the engine form (MoeRunner::forward_experts): device pointers to
// ids [T, k] (int32, or int64 with ids_int64), each slot's expert among the layer's routed experts
// (an expert-parallel shard's are the whole layer's), and weights [T, k] fp32. A slot whose id is
// outside [0, routed_experts()) (an engine's -1 for padding) goes to no expert and adds nothing, as
// does one whose expert a shard does not hold.
struct GivenTopK {
  const void* ids;
  bool ids_int64;
  const float* weights;
};

// When a runner checks the block-scaled tile family (MXFP8 activations, and FP8 ones on a 12.x
// device) on its device before its first use there: the family's SM12x form is an instruction no
// GPU lent to mxmoe's tests has run, so on a 12.x device a runner that prepares a block-scaled plan
// first runs one FC2 tile of each block-scaled tactic it will launch against the bf16 mma tile on
// the same values; if they disagree it warns once (naming the device and the tactic) and its plans
// fall back to the bf16 families on that device (bf16 activations, or FP8 ones on rounded rows).
// kAlways runs the check on any device (on the others the family's twin), as a test of the check
// itself (docs/block-scaled.md).
enum class BlockScaledCheck { kOnSm12x, kAlways };

struct RunnerOptions {
  // The activations of the runner's own plans (plan(), prepare(), forward() without a plan): bf16,
  // or MXFP8 (the block-scaled tiles), which costs accuracy (~5e-2 by norm at the gpt-oss shapes,
  // docs/block-scaled.md) and is never chosen otherwise, or FP8 (E4M3 with one power-of-two scale
  // per 128 along K, DeepSeek-V4's own; ~4.5e-2): the bf16 families on rows rounded to FP8 values,
  // on a 12.x device the block-scaled tiles.
  ActivationFormat activations = ActivationFormat::kBf16;
  BlockScaledCheck block_scaled_check = BlockScaledCheck::kOnSm12x;
  // Where the runner's weights (device_bytes()) and its load-time scratch come from; cudaMalloc
  // where it has no callbacks. The runner releases the weights when it is destroyed, so no forward
  // may be in flight then.
  DeviceAllocator allocator{};
};

// One block-scaled tactic's first-use check on a device.
struct BlockScaledCheckResult {
  std::string device;     // "NVIDIA GeForce RTX 5090 (sm_120a)"
  std::string tactic;     // the block-scaled tactic
  std::string reference;  // the bf16 tactic it was compared with
  double rel_difference;  // of their FC2 outputs on one tile, by norm
  bool passed;            // rel_difference within the bound and every output finite
};

class MoeRunner {
 public:
  // Host weights (a checkpoint's mapping, NumPy arrays, a shard): uploaded in the checkpoint layout
  // through pinned staging and repacked on the device. Throws Error when the weights are
  // inconsistent or an allocation fails (naming it and its bytes).
  explicit MoeRunner(const MoeLayerWeights& weights, const RunnerOptions& options = {});
  // Tensors already on the current device (device_layer.hpp), read on tensors.stream: MXFP4
  // experts repacked, dense ones quantised and repacked, with no host copy; the same device bytes
  // as the host constructor gives for the same weights (dense experts: quantize_bf16_experts').
  // Returns once the load is done. Throws Error naming a missing or mis-shaped tensor, one that is
  // not on the current device, or a failed allocation.
  explicit MoeRunner(const DeviceLayerTensors& tensors, const RunnerOptions& options = {});
  ~MoeRunner();
  MoeRunner(MoeRunner&&) noexcept;
  MoeRunner& operator=(MoeRunner&&) noexcept;

  const MoeShape& shape() const;
  int routed_experts() const;  // the experts the routing picks among: the layer's (a shard's too)
  size_t device_bytes() const;  // packed weights resident on the device

  // Bytes of workspace a forward of up to `max_tokens` tokens needs.
  size_t workspace_size(int max_tokens) const;

  // The tactics forward() uses for `num_tokens` tokens when not given a plan: the tuned table's
  // (mxmoe tune) if this device has one for the shape and the options' activations, else the
  // heuristic's; bf16 activations where MXFP8 ones were asked for and the block-scaled family
  // failed its check on this device (FP8 ones then on the bf16 families). Host-only, no sync.
  LayerPlan plan(int num_tokens) const;
  LayerPlan heuristic_plan(int num_tokens) const;
  bool tuned() const;  // a tuned table was found for this device, shape and activations
  ActivationFormat activations() const;  // the options' (plan(T).activations says what runs)
  // The block-scaled checks this process ran on the runner's device (each tactic once per device
  // and build of the family's kernels).
  std::vector<BlockScaledCheckResult> block_scaled_checks() const;

  // Decides, for every token count up to `max_tokens`, what forward() launches (the plan's kernels,
  // loaded now and compiled first if the ahead-of-time set lacks them, their grids and shared
  // memory, whether the batch routes itself; the first-use check of block-scaled tactics, where it
  // applies, runs here and synchronises the device), so that a forward of up to `max_tokens` tokens only
  // looks its launches up and launches, and no graph capture waits on a compiler or a module load.
  // A forward of more tokens than prepared, or with a plan other than the prepared one, makes its
  // launches first, on the host, before any launch.
  void prepare(int max_tokens) const;

  // x [T, H] bf16 and out [T, H] bf16 (16-byte aligned), router_logits [T, R] fp32 (R =
  // routed_experts()): device
  // pointers. The workspace must hold workspace_size(num_tokens) bytes (256-byte aligned).
  // Throws Error on bad arguments (checked on the host) or a failed launch.
  void forward(const __nv_bfloat16* x, const float* router_logits, __nv_bfloat16* out, int num_tokens,
               void* workspace, size_t workspace_bytes, cudaStream_t stream, const LayerPlan* plan = nullptr,
               ForwardPart last = ForwardPart::kAll) const;
  // As above, computing the router logits from the layer's router weights first.
  void forward(const __nv_bfloat16* x, __nv_bfloat16* out, int num_tokens, void* workspace, size_t workspace_bytes,
               cudaStream_t stream, const LayerPlan* plan = nullptr) const;

  // The engine form: the experts and the weighted sum for the caller's routing (routing done by the
  // caller, as vLLM's and SGLang's fused-MoE expert calls take it), with the same workspace. The
  // routing launch always runs (a permutation of the given top-k).
  void forward_experts(const __nv_bfloat16* x, const GivenTopK& topk, __nv_bfloat16* out, int num_tokens,
                       void* workspace, size_t workspace_bytes, cudaStream_t stream,
                       const LayerPlan* plan = nullptr) const;

  RoutingView routing(void* workspace, int num_tokens) const;

  // Whether forward() and forward_experts() of `num_tokens` tokens under `plan` run with no routing
  // launch, FC1 routing the batch itself (from the logits or the caller's top-k, a shard's through
  // its map) and writing the routing for FC2 and the un-permute: a batch that can
  // (can_route_in_expert_kernels) and whose FC1 grid is resident at once on this device. Host-only;
  // loads the plan's kernels to ask.
  bool routes_in_expert_kernels(const LayerPlan& plan, int num_tokens) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mxmoe

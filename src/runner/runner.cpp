// The runner: loads a layer once (load/layer_loader.cpp), prepares the launches of every token count
// it meets, then on each forward fills the kernels' arguments and launches them on the caller's
// stream.
#include "mxmoe/runner.hpp"

#include <bit>
#include <climits>
#include <cstdint>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <string>
#include <vector>

#include "device/cuda_check.hpp"
#include "device/current_device.hpp"
#include "format/mxfp4_records.hpp"
#include "jit/kernel_cache.hpp"
#include "kernels/family_registry.hpp"
#include "load/layer_loader.hpp"
#include "mxmoe/error.hpp"
#include "runner/block_scaled_check.hpp"
#include "runner/launch_plan.hpp"
#include "runner/route_launch.hpp"
#include "runner/workspace.hpp"
#include "tactics/heuristic.hpp"
#include "tactics/tuned_plans.hpp"

namespace mxmoe {
namespace {

void check_aligned(const void* p, size_t alignment, const char* what) {
  if (p == nullptr) throw Error(std::string("forward: ") + what + " is null");
  if (reinterpret_cast<uintptr_t>(p) % alignment != 0) {
    throw Error(std::string("forward: ") + what + " must be " + std::to_string(alignment) + "-byte aligned");
  }
}

}  // namespace

struct MoeRunner::Impl {
  MoeShape shape;
  RunnerOptions options;
  DeviceArch device;
  TunedPlans tuned;
  RecordGeometry fc1_geometry, fc2_geometry;
  int routed_experts = 0;
  PackedLayer weights;  // its local_experts: an expert-parallel shard's map; null for a whole layer
  mutable std::shared_mutex launches_mutex;  // forward() reads the table, prepare() rebuilds it
  // The launches of both forms (routing from logits or the caller's top-k: a small batch routes
  // itself from either).
  mutable LaunchTable launches;

  // The options' activations, but bf16 where they ask for MXFP8 and the block-scaled family failed
  // its check on this device (FP8 activations then run on the bf16 families: heuristic_plan).
  ActivationFormat activations() const {
    if (options.activations == ActivationFormat::kMxfp8 && block_scaled_family_dropped()) return ActivationFormat::kBf16;
    return options.activations;
  }
  LayerPlan heuristic_plan(int num_tokens) const {
    const Arch& arch = *device.arch;
    return mxmoe::heuristic_plan(shape, num_tokens, arch, activations(),
                                 multiplies_block_scaled(arch) && !block_scaled_family_dropped(), routed_experts);
  }
  LayerPlan plan(int num_tokens) const {
    return tuned.find(num_tokens, activations()).value_or(heuristic_plan(num_tokens));
  }
  // The first-use check of each block-scaled tactic of `plan` where the options ask for it on this
  // device; false when one fails (the family is then dropped here).
  bool block_scaled_checks_pass(const LayerPlan& plan) const {
    if (!block_scaled_check_applies(options.block_scaled_check, *device.arch)) return true;
    for (const Tactic& t : {plan.fc1, plan.fc2}) {
      if (activations_of(t) == ActivationFormat::kMxfp8 && !check_block_scaled_tactic(t).passed) return false;
    }
    return true;
  }
  // Everything but the weights: the shape, options, device and its tuned plans.
  void init(const MoeShape& s, int routed, const RunnerOptions& runner_options);
  void prepare(int max_tokens) const;
  // Calls `run` with the prepared launches of `num_tokens` tokens, or with `plan`'s where a plan is
  // given that is not the prepared one; prepares up to num_tokens first where needed.
  template <typename Run>
  void with_launch(int num_tokens, const LayerPlan* plan, Run run) const;
  LayerLaunch make_launch(const LayerPlan& plan, int num_tokens) const {
    if (!block_scaled_checks_pass(plan)) {
      throw Error("plan " + plan.fc1.name() + " + " + plan.fc2.name() +
                  ": the block-scaled family failed its first-use check on this device (see the warning)");
    }
    return make_layer_launch(shape, *device.arch, plan, num_tokens);
  }
  kernels::RouteInput route_input(const float* logits) const {
    if (shape.spec.router == RouterKind::kCallerTopK) {
      throw Error("forward: the layer (" + shape.describe() +
                  ") is routed by its caller: call forward_experts with its top-k");
    }
    const kernels::RouterMath router{
        .selection_bias = weights.selection_bias,
        .routed_scaling = shape.spec.routed_scaling,
        .sqrt_softplus = shape.spec.router == RouterKind::kSqrtSoftplus ? 1 : 0};
    return {.logits = logits, .router = router, .topk_ids = nullptr, .topk_weights = nullptr,
            .local_experts = weights.local_experts, .routed_experts = routed_experts, .ids_int64 = 0};
  }
  void run(const __nv_bfloat16* x, const kernels::RouteInput& in, __nv_bfloat16* out, int num_tokens,
           void* workspace, cudaStream_t stream, const LayerLaunch& launch, ForwardPart last = ForwardPart::kAll) const;
};

MoeRunner::MoeRunner(const MoeLayerWeights& weights, const RunnerOptions& options) : impl_(std::make_unique<Impl>()) {
  weights.validate();
  impl_->init(weights.shape, weights.num_routed_experts(), options);
  impl_->weights = load_layer(weights, options.allocator);
}

MoeRunner::MoeRunner(const DeviceLayerTensors& tensors, const RunnerOptions& options)
    : impl_(std::make_unique<Impl>()) {
  tensors.validate();
  impl_->init(tensors.shape, tensors.shape.num_experts, options);
  impl_->weights = load_layer(tensors, options.allocator);
}

void MoeRunner::Impl::init(const MoeShape& s, int routed, const RunnerOptions& runner_options) {
  shape = s;
  options = runner_options;
  routed_experts = routed;
  device = current_device_arch();
  cudaDeviceProp prop{};
  int device_index = 0;
  cuda_check(cudaGetDevice(&device_index), "cudaGetDevice");
  cuda_check(cudaGetDeviceProperties(&prop, device_index), "cudaGetDeviceProperties");
  tuned = TunedPlans::load(default_kernel_cache().dir(), prop.name, *device.arch, s);
  fc1_geometry = {s.num_experts, s.fc1_rows(), s.hidden};
  fc2_geometry = {s.num_experts, s.hidden, s.intermediate};
}

MoeRunner::~MoeRunner() = default;
MoeRunner::MoeRunner(MoeRunner&&) noexcept = default;
MoeRunner& MoeRunner::operator=(MoeRunner&&) noexcept = default;

const MoeShape& MoeRunner::shape() const { return impl_->shape; }
int MoeRunner::routed_experts() const { return impl_->routed_experts; }
size_t MoeRunner::device_bytes() const { return impl_->weights.buffer.bytes(); }

size_t MoeRunner::workspace_size(int max_tokens) const {
  if (max_tokens < 0) throw Error("workspace_size: max_tokens is negative");
  return WorkspaceLayout::of(impl_->shape, impl_->routed_experts, max_tokens).total;
}

LayerPlan MoeRunner::heuristic_plan(int num_tokens) const { return impl_->heuristic_plan(num_tokens); }

LayerPlan MoeRunner::plan(int num_tokens) const { return impl_->plan(num_tokens); }

bool MoeRunner::tuned() const { return !impl_->tuned.entries(impl_->activations()).empty(); }

ActivationFormat MoeRunner::activations() const { return impl_->options.activations; }

std::vector<BlockScaledCheckResult> MoeRunner::block_scaled_checks() const { return block_scaled_checks_on_device(); }

void MoeRunner::prepare(int max_tokens) const {
  if (max_tokens < 1) throw Error("prepare: max_tokens must be at least 1");
  impl_->prepare(max_tokens);
}

void MoeRunner::Impl::prepare(int max_tokens) const {
  std::unique_lock lock(launches_mutex);
  if (max_tokens <= launches.max_tokens()) return;
  // Block-scaled tactics are checked before any launch of them is made: a failure turns every
  // later plan() to the bf16 families (bf16 activations, or FP8 ones on rounded rows), so the loop
  // ends at the first.
  if (options.activations != ActivationFormat::kBf16) {
    std::set<std::string> checked;
    for (int t = 1; t <= max_tokens; ++t) {
      const LayerPlan p = plan(t);
      if (activations_of(p.fc1) != ActivationFormat::kMxfp8) break;
      if (checked.insert(p.fc1.binary().name() + " " + p.fc2.binary().name()).second && !block_scaled_checks_pass(p)) break;
    }
  }
  launches.build(
      max_tokens, [&](int t) { return plan(t); }, [&](const LayerPlan& p, int t) { return make_launch(p, t); });
}

template <typename Run>
void MoeRunner::Impl::with_launch(int num_tokens, const LayerPlan* plan, Run run) const {
  std::shared_lock lock(launches_mutex);
  if (num_tokens > launches.max_tokens()) {
    lock.unlock();
    // Not prepared this far: prepare to the next power of two, so a growing batch rebuilds rarely.
    prepare(static_cast<int>(std::min<long long>(std::bit_ceil(static_cast<unsigned>(num_tokens)), INT_MAX)));
    lock.lock();
  }
  const LayerLaunch& prepared = launches.find(num_tokens);
  if (!plan || *plan == prepared.plan) return run(prepared);
  run(make_launch(*plan, num_tokens));
}

bool MoeRunner::routes_in_expert_kernels(const LayerPlan& plan, int num_tokens) const {
  return !impl_->make_launch(plan, num_tokens).routing_launch;
}

namespace {

kernels::SwigluArgs swiglu_args(const SwigluActivation& a, bool fp8_output) {
  return {.minus_alpha_log2e = -a.alpha * 1.4426950408889634f,
          .limit = a.limit,
          .up_offset = a.up_offset,
          .fp8_output = fp8_output ? 1 : 0};
}

}  // namespace

void MoeRunner::Impl::run(const __nv_bfloat16* x, const kernels::RouteInput& in, __nv_bfloat16* out,
                          int num_tokens, void* workspace, cudaStream_t stream, const LayerLaunch& launch,
                          ForwardPart last) const {
  const WorkspaceLayout layout = WorkspaceLayout::of(shape, routed_experts, num_tokens);
  const kernels::RouteBuffers route = layout.route(workspace);
  auto* ws = static_cast<unsigned char*>(workspace);
  const int pairs = num_tokens * shape.top_k;
  const long long split_stride = static_cast<long long>(pairs) * shape.hidden;

  if (launch.routing_launch) launch_routing(in, num_tokens, shape.num_experts, shape.top_k, route, stream);
  if (last == ForwardPart::kRouting) return;

  // FP8 activations: the bf16 families compute with rows rounded to FP8 values, FC1's input and
  // FC2's: the GEMV-style kernels as they stage them (KernelFamily::rounds_fp8_when_staging), the
  // others' by a rounding launch, FC1's here (the gathered rows in place, or x into expert_out's
  // bytes, which FC2 writes only after its wait for FC1), FC2's after FC1. Rows past the routing's
  // count are left alone. The block-scaled family takes them as MXFP8 rows of one scale per 128,
  // from its quantising gather and FC1's epilogue.
  const LayerPlan& plan = launch.plan;
  const bool fp8 = plan.activations == ActivationFormat::kFp8;
  const bool mxfp8_rows = activations_of(plan.fc1) == ActivationFormat::kMxfp8;
  const bool rounded_rows = fp8 && !mxfp8_rows;
  const bool staging_rounds[2] = {rounded_rows && plan.fc1.family->rounds_fp8_when_staging(plan.fc1, num_tokens),
                                  rounded_rows && plan.fc2.family->rounds_fp8_when_staging(plan.fc2, num_tokens)};
  const int* sorted_rows = route.expert_offsets + shape.num_experts;
  const void* fc1_input = x;
  if (launch.gather_launch) {
    void* sorted_input = ws + layout.sorted_input;
    if (mxfp8_rows) {
      launch_gather_quantize_rows(x, shape.hidden, shape.top_k, shape.num_experts, num_tokens, route, sorted_input,
                                  fp8, stream);
    } else {
      auto* rows = static_cast<__nv_bfloat16*>(sorted_input);
      launch_gather_rows(x, shape.hidden, shape.top_k, shape.num_experts, num_tokens, route, rows, stream);
      if (rounded_rows && !staging_rounds[0]) launch_fp8_round_rows(rows, rows, shape.hidden, pairs, sorted_rows, stream);
    }
    fc1_input = sorted_input;
  } else if (rounded_rows && !staging_rounds[0]) {
    auto* rounded = reinterpret_cast<__nv_bfloat16*>(ws + layout.expert_out);
    launch_fp8_round_rows(x, rounded, shape.hidden, num_tokens, nullptr, stream);
    fc1_input = rounded;
  }
  void* activation = ws + layout.activation;  // bf16 or MXFP8 rows, as the plan's activations
  void* expert_out = ws + layout.expert_out;
  // FC2 in one K split as a launch of its own writes its final rows in bf16 (the fused layer sums
  // its own fp32 rows).
  const bool fc2_bf16 = plan.fc2.k_split == 1 && !plan.whole_layer();
  // A batch with no routing launch routes itself in FC1, which writes the routing for FC2, the
  // un-permute and the caller (expert_gemv.cuh).
  const int routes_itself = launch.routing_launch ? 0 : 1;
  auto tile_offsets = [&](int stage) {
    return route.tile_offsets + launch.tile_offsets_index[stage] * (shape.num_experts + 1);
  };
  const kernels::LayerArgs args{
      .fc1 = {.records = weights.fc1_records,
              .bias = weights.fc1_bias,
              .input = fc1_input,
              .sorted_pairs = route.sorted_pairs,
              .top_k = shape.top_k,
              .rows = shape.fc1_rows(),
              .k = shape.hidden,
              .k_tiles = fc1_geometry.k_tiles(),
              .staged_rows = 0,  // each launch's own (ExpertLaunch::geometry)
              .num_experts = shape.num_experts,
              .expert_offsets = route.expert_offsets,
              .active_experts = route.active_experts,
              .tile_offsets = tile_offsets(0),
              .output = activation,
              .epilogue = {.swiglu = swiglu_args(shape.spec.activation, fp8 && mxfp8_rows)},
              .routes_itself = routes_itself,
              .num_tokens = num_tokens,
              .route = route,
              .stream_partials = layout.stream_partials_of(workspace, 0),
              .stream_flags = layout.stream_flags_of(workspace, 0)},
      .fc2 = {.records = weights.fc2_records,
              .bias = weights.fc2_bias,
              .input = activation,
              .sorted_pairs = route.sorted_pairs,
              .top_k = shape.top_k,
              .rows = shape.hidden,
              .k = shape.intermediate,
              .k_tiles = fc2_geometry.k_tiles(),
              .staged_rows = 0,  // each launch's own (ExpertLaunch::geometry)
              .num_experts = shape.num_experts,
              .expert_offsets = route.expert_offsets,
              .active_experts = route.active_experts,
              .tile_offsets = tile_offsets(1),
              .output = expert_out,
              .epilogue = {.fc2 = {.split_stride = split_stride, .output_bf16 = fc2_bf16}},
              .routes_itself = 0,
              .num_tokens = num_tokens,
              .route = route,
              .stream_partials = layout.stream_partials_of(workspace, 1),
              .stream_flags = layout.stream_flags_of(workspace, 1)},
      .topk_weights = route.topk_weights,
      .pair_rows = route.pair_rows,
      .num_tokens = num_tokens,
      .out = out,
      .schedule = route.schedule,
      .scales_one_multiply = {weights.fc1_scales_one_multiply, weights.fc2_scales_one_multiply},
      .rounds_staged_fp8 = {staging_rounds[0] ? 1 : 0, staging_rounds[1] ? 1 : 0},
      .source = in};
  for (const ExpertLaunch& expert : launch.expert_launches) {
    expert.tactic.family->launch(expert, args, stream);
    // A whole-layer launch is FC1's and runs to the end: nothing follows it.
    if (last == (expert.stage == Stage::kFc1 ? ForwardPart::kFc1 : ForwardPart::kFc2)) return;
    if (rounded_rows && !staging_rounds[1] && expert.stage == Stage::kFc1) {
      auto* rows = static_cast<__nv_bfloat16*>(activation);
      launch_fp8_round_rows(rows, rows, shape.intermediate, pairs, sorted_rows, stream);
    }
  }
  if (!launch.unpermute_launch) return;
  launch_unpermute(expert_out, fc2_bf16, split_stride, plan.fc2.k_split, shape.hidden, shape.top_k, num_tokens,
                   route, out, stream);
}

namespace {

void check_forward_args(const MoeRunner& runner, const void* x, const void* out, int num_tokens, void* workspace,
                        size_t workspace_bytes) {
  if (num_tokens < 0) throw Error("forward: num_tokens is negative");
  check_aligned(x, 16, "x");
  check_aligned(out, 16, "out");
  check_aligned(workspace, 256, "workspace");
  const size_t needed = runner.workspace_size(num_tokens);
  if (workspace_bytes < needed) {
    throw Error("forward: the workspace holds " + std::to_string(workspace_bytes) + " bytes; " +
                std::to_string(num_tokens) + " tokens need workspace_size = " + std::to_string(needed));
  }
}

}  // namespace

void MoeRunner::forward(const __nv_bfloat16* x, const float* router_logits, __nv_bfloat16* out, int num_tokens,
                        void* workspace, size_t workspace_bytes, cudaStream_t stream, const LayerPlan* plan,
                        ForwardPart last) const {
  check_forward_args(*this, x, out, num_tokens, workspace, workspace_bytes);
  check_aligned(router_logits, 4, "router_logits");
  if (num_tokens == 0) return;
  impl_->with_launch(num_tokens, plan, [&](const LayerLaunch& launch) {
    impl_->run(x, impl_->route_input(router_logits), out, num_tokens, workspace, stream, launch, last);
  });
}

void MoeRunner::forward(const __nv_bfloat16* x, __nv_bfloat16* out, int num_tokens, void* workspace,
                        size_t workspace_bytes, cudaStream_t stream, const LayerPlan* plan) const {
  check_forward_args(*this, x, out, num_tokens, workspace, workspace_bytes);
  if (num_tokens == 0) return;
  impl_->with_launch(num_tokens, plan, [&](const LayerLaunch& launch) {
    auto* logits = reinterpret_cast<float*>(static_cast<unsigned char*>(workspace) +
                                            WorkspaceLayout::of(impl_->shape, impl_->routed_experts, num_tokens).logits);
    const kernels::RouteInput in = impl_->route_input(logits);
    launch_router_logits(x, impl_->weights.router_weight, impl_->weights.router_bias, logits, num_tokens,
                         impl_->routed_experts, impl_->shape.hidden, stream);
    impl_->run(x, in, out, num_tokens, workspace, stream, launch);
  });
}

void MoeRunner::forward_experts(const __nv_bfloat16* x, const GivenTopK& topk, __nv_bfloat16* out, int num_tokens,
                                void* workspace, size_t workspace_bytes, cudaStream_t stream,
                                const LayerPlan* plan) const {
  check_forward_args(*this, x, out, num_tokens, workspace, workspace_bytes);
  check_aligned(topk.ids, topk.ids_int64 ? 8 : 4, "topk ids");
  check_aligned(topk.weights, 4, "topk weights");
  if (num_tokens == 0) return;
  const kernels::RouteInput in{.logits = nullptr,
                               .router = {},
                               .topk_ids = topk.ids,
                               .topk_weights = topk.weights,
                               .local_experts = impl_->weights.local_experts,
                               .routed_experts = impl_->routed_experts,
                               .ids_int64 = topk.ids_int64 ? 1 : 0};
  impl_->with_launch(num_tokens, plan, [&](const LayerLaunch& launch) {
    impl_->run(x, in, out, num_tokens, workspace, stream, launch);
  });
}

RoutingView MoeRunner::routing(void* workspace, int num_tokens) const {
  const WorkspaceLayout layout = WorkspaceLayout::of(impl_->shape, impl_->routed_experts, num_tokens);
  const kernels::RouteBuffers r = layout.route(workspace);
  return {r.topk_experts, r.topk_weights, r.expert_counts, r.expert_offsets, r.sorted_pairs, r.pair_rows,
          reinterpret_cast<const float*>(static_cast<unsigned char*>(workspace) + layout.logits)};
}

}  // namespace mxmoe

// The runner: packs a layer once, then sequences routing, FC1, FC2 and the un-permute on a stream.
#include "mxmoe/runner.hpp"

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "format/mxfp4_records.hpp"
#include "kernels/mxfp4_fragment.cuh"
#include "mxmoe/error.hpp"
#include "jit/kernel_cache.hpp"
#include "runner/cuda_check.hpp"
#include "runner/expert_modules.hpp"
#include "runner/kernel_launch.hpp"
#include "runner/workspace.hpp"
#include "tactics/tactic_choice.hpp"
#include "tactics/tuned_plans.hpp"

namespace mxmoe {
namespace {

size_t align256(size_t n) { return (n + 255) / 256 * 256; }

std::span<const uint16_t> bits_of(const std::vector<Bf16>& v) {
  return {reinterpret_cast<const uint16_t*>(v.data()), v.size()};
}

std::vector<float> floats_of(const std::vector<Bf16>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = bf16_to_float(v[i]);
  return out;
}

void check_aligned(const void* p, size_t alignment, const char* what) {
  if (p == nullptr) throw Error(std::string("forward: ") + what + " is null");
  if (reinterpret_cast<uintptr_t>(p) % alignment != 0) {
    throw Error(std::string("forward: ") + what + " must be " + std::to_string(alignment) + "-byte aligned");
  }
}

}  // namespace

struct MoeRunner::Impl {
  MoeShape shape;
  DeviceArch device;
  TunedPlans tuned;
  RecordGeometry fc1_geometry, fc2_geometry;
  DeviceBuffer weights;  // fc1 records | fc1 bias | fc2 records | fc2 bias | router weight | router bias
  const unsigned char* fc1_records = nullptr;
  const float* fc1_bias = nullptr;
  const unsigned char* fc2_records = nullptr;
  const float* fc2_bias = nullptr;
  const __nv_bfloat16* router_weight = nullptr;
  const float* router_bias = nullptr;

  void run(const __nv_bfloat16* x, const float* logits, __nv_bfloat16* out, int num_tokens, void* workspace,
           cudaStream_t stream, const LayerPlan& plan, ForwardPart last = ForwardPart::kAll) const;
  bool routes_in_expert_kernels(const LayerPlan& plan, int num_tokens) const;
};

MoeRunner::MoeRunner(const MoeLayerWeights& weights) : impl_(std::make_unique<Impl>()) {
  weights.validate();
  Impl& m = *impl_;
  const MoeShape& s = weights.shape;
  m.shape = s;
  m.device = current_device_arch();
  cudaDeviceProp prop{};
  int device = 0;
  cuda_check(cudaGetDevice(&device), "cudaGetDevice");
  cuda_check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  m.tuned = TunedPlans::load(default_kernel_cache().dir(), prop.name, *m.device.arch, s);
  m.fc1_geometry = {s.num_experts, s.fc1_rows(), s.hidden};
  m.fc2_geometry = {s.num_experts, s.hidden, s.intermediate};

  const auto fc1 = pack_records(m.fc1_geometry, RowOrder::kGluLinSplit, weights.fc1_blocks, weights.fc1_scales);
  const auto fc1_bias = pack_row_vector(m.fc1_geometry, RowOrder::kGluLinSplit, bits_of(weights.fc1_bias));
  const auto fc2 = pack_records(m.fc2_geometry, RowOrder::kIdentity, weights.fc2_blocks, weights.fc2_scales);
  const auto fc2_bias = pack_row_vector(m.fc2_geometry, RowOrder::kIdentity, bits_of(weights.fc2_bias));
  const auto router_bias = floats_of(weights.router_bias);

  struct Piece {
    const void* data;
    size_t bytes;
  };
  const Piece pieces[] = {{fc1.data(), fc1.size()},
                          {fc1_bias.data(), fc1_bias.size() * 4},
                          {fc2.data(), fc2.size()},
                          {fc2_bias.data(), fc2_bias.size() * 4},
                          {weights.router_weight.data(), weights.router_weight.size() * 2},
                          {router_bias.data(), router_bias.size() * 4}};
  size_t total = 0;
  for (const auto& p : pieces) total += align256(p.bytes);

  m.weights = DeviceBuffer(total, "MoE layer weights (" + s.describe() + ")");
  auto* base = static_cast<unsigned char*>(m.weights.get());
  std::vector<unsigned char*> at;
  size_t offset = 0;
  for (const auto& p : pieces) {
    at.push_back(base + offset);
    cuda_check(cudaMemcpy(base + offset, p.data, p.bytes, cudaMemcpyHostToDevice), "copying weights to the device");
    offset += align256(p.bytes);
  }
  m.fc1_records = at[0];
  m.fc1_bias = reinterpret_cast<const float*>(at[1]);
  m.fc2_records = at[2];
  m.fc2_bias = reinterpret_cast<const float*>(at[3]);
  m.router_weight = reinterpret_cast<const __nv_bfloat16*>(at[4]);
  m.router_bias = reinterpret_cast<const float*>(at[5]);
}

MoeRunner::~MoeRunner() = default;
MoeRunner::MoeRunner(MoeRunner&&) noexcept = default;
MoeRunner& MoeRunner::operator=(MoeRunner&&) noexcept = default;

const MoeShape& MoeRunner::shape() const { return impl_->shape; }
size_t MoeRunner::device_bytes() const { return impl_->weights.bytes(); }

size_t MoeRunner::workspace_size(int max_tokens) const {
  if (max_tokens < 0) throw Error("workspace_size: max_tokens is negative");
  return WorkspaceLayout::of(impl_->shape, max_tokens).total;
}

LayerPlan MoeRunner::heuristic_plan(int num_tokens) const {
  return mxmoe::heuristic_plan(impl_->shape, num_tokens, *impl_->device.arch);
}

LayerPlan MoeRunner::plan(int num_tokens) const {
  return impl_->tuned.find(num_tokens).value_or(heuristic_plan(num_tokens));
}

bool MoeRunner::tuned() const { return !impl_->tuned.entries().empty(); }

void MoeRunner::prepare(int max_tokens) const {
  std::vector<int> counts;
  for (int t = 1; t < max_tokens; t *= 2) counts.push_back(t);
  counts.push_back(max_tokens);
  for (const auto& [bucket, entry] : impl_->tuned.entries()) counts.push_back(std::min(bucket, max_tokens));
  for (int t : counts) {
    for (const LayerPlan& p : {plan(t), heuristic_plan(t)}) {
      expert_kernels(p.fc1);
      expert_kernels(p.fc2);
    }
  }
}

bool MoeRunner::Impl::routes_in_expert_kernels(const LayerPlan& plan, int num_tokens) const {
  if (!can_route_in_expert_kernels(plan, num_tokens, shape.top_k)) return false;
  const ExpertStageShape fc1{shape.fc1_rows(), fc1_geometry.k_tiles(), shape.num_experts, shape.top_k};
  return expert_gemm_routing_itself_fits_one_wave(Stage::kFc1, plan.fc1, fc1, num_tokens * shape.top_k);
}

bool MoeRunner::routes_in_expert_kernels(const LayerPlan& plan, int num_tokens) const {
  return impl_->routes_in_expert_kernels(plan, num_tokens);
}

void MoeRunner::Impl::run(const __nv_bfloat16* x, const float* logits, __nv_bfloat16* out, int num_tokens,
                          void* workspace, cudaStream_t stream, const LayerPlan& plan, ForwardPart last) const {
  const WorkspaceLayout layout = WorkspaceLayout::of(shape, num_tokens);
  const kernels::RouteBuffers route = layout.route(workspace);
  auto* ws = static_cast<unsigned char*>(workspace);
  const int pairs = num_tokens * shape.top_k;
  const long long split_stride = static_cast<long long>(pairs) * shape.hidden;

  // A small batch under a GEMV plan whose FC1 fits one wave is routed inside FC1 and FC2
  // (expert_gemm.cuh): no routing launch, so stopping after the routing launches nothing.
  const bool self_routed = routes_in_expert_kernels(plan, num_tokens);
  if (!self_routed) launch_routing(logits, num_tokens, shape.num_experts, shape.top_k, route, stream);
  if (last == ForwardPart::kRouting) return;

  auto tile_offsets = [&](const Tactic& t) {
    int index = 0;
    while ((8 << index) < t.tile_tokens) ++index;
    return route.tile_offsets + index * (shape.num_experts + 1);
  };
  auto* activation = reinterpret_cast<__nv_bfloat16*>(ws + layout.activation);
  auto* expert_out = reinterpret_cast<float*>(ws + layout.expert_out);
  const float* route_logits = self_routed ? logits : nullptr;
  kernels::ExpertGemmArgs fc1{fc1_records, fc1_bias, x, route.sorted_pairs, shape.top_k,
                              shape.fc1_rows(), shape.hidden, fc1_geometry.k_tiles(), shape.num_experts,
                              route.expert_offsets, route.active_experts, tile_offsets(plan.fc1), activation, 0, 0,
                              route_logits, num_tokens, route, layout.stream_partials_of(workspace, 0),
                              layout.stream_flags_of(workspace, 0)};
  kernels::ExpertGemmArgs fc2{fc2_records, fc2_bias, activation, route.sorted_pairs, shape.top_k,
                              shape.hidden, shape.intermediate, fc2_geometry.k_tiles(), shape.num_experts,
                              route.expert_offsets, route.active_experts, tile_offsets(plan.fc2), expert_out,
                              split_stride, 0, route_logits, num_tokens, route, layout.stream_partials_of(workspace, 1),
                              layout.stream_flags_of(workspace, 1)};
  if (plan.fused()) {  // one launch from here on: stopping after FC1 or FC2 runs it whole
    const kernels::FusedLayerArgs fused{fc1, fc2, route.topk_weights, route.pair_rows, num_tokens, out, route.schedule};
    launch_fused_layer(plan.fc1, fused, pairs, stream);
    return;
  }
  launch_expert_gemm(Stage::kFc1, plan.fc1, fc1, pairs, stream);
  if (last == ForwardPart::kFc1) return;
  launch_expert_gemm(Stage::kFc2, plan.fc2, fc2, pairs, stream);
  if (last == ForwardPart::kFc2) return;
  launch_unpermute(expert_out, split_stride, plan.fc2.k_split, shape.hidden, shape.top_k, num_tokens, route, out,
                   route_logits, shape.num_experts, stream);
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
  const LayerPlan chosen = plan ? *plan : this->plan(num_tokens);
  validate_plan(impl_->shape, chosen, *impl_->device.arch);
  impl_->run(x, router_logits, out, num_tokens, workspace, stream, chosen, last);
}

void MoeRunner::forward(const __nv_bfloat16* x, __nv_bfloat16* out, int num_tokens, void* workspace,
                        size_t workspace_bytes, cudaStream_t stream, const LayerPlan* plan) const {
  check_forward_args(*this, x, out, num_tokens, workspace, workspace_bytes);
  if (num_tokens == 0) return;
  const LayerPlan chosen = plan ? *plan : this->plan(num_tokens);
  validate_plan(impl_->shape, chosen, *impl_->device.arch);
  auto* logits = reinterpret_cast<float*>(static_cast<unsigned char*>(workspace) +
                                          WorkspaceLayout::of(impl_->shape, num_tokens).logits);
  launch_router_logits(x, impl_->router_weight, impl_->router_bias, logits, num_tokens, impl_->shape.num_experts,
                       impl_->shape.hidden, stream);
  impl_->run(x, logits, out, num_tokens, workspace, stream, chosen);
}

RoutingView MoeRunner::routing(void* workspace, int num_tokens) const {
  const WorkspaceLayout layout = WorkspaceLayout::of(impl_->shape, num_tokens);
  const kernels::RouteBuffers r = layout.route(workspace);
  return {r.topk_experts, r.topk_weights, r.expert_counts, r.expert_offsets, r.sorted_pairs, r.pair_rows,
          reinterpret_cast<const float*>(static_cast<unsigned char*>(workspace) + layout.logits)};
}

}  // namespace mxmoe

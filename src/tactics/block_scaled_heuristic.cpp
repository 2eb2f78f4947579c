// The plans for MXFP8 and FP8 activations (heuristic.hpp): the block-scaled tiles, by expected
// rows per expert. Apart from heuristic.cpp, whose bf16 choices never lead here.
#include <string>

#include "kernels/family_registry.hpp"
#include "mxmoe/error.hpp"
#include "tactics/heuristic.hpp"

namespace mxmoe {

LayerPlan heuristic_plan(const MoeShape& shape, int num_tokens, const Arch& arch, ActivationFormat activations,
                         bool block_scaled_mma, int routed_experts) {
  if (activations == ActivationFormat::kBf16) return heuristic_plan(shape, num_tokens, arch, routed_experts);
  if (activations == ActivationFormat::kFp8 && !block_scaled_mma) {
    LayerPlan plan = heuristic_plan(shape, num_tokens, arch, routed_experts);  // bf16 families on rounded rows
    plan.activations = ActivationFormat::kFp8;
    return plan;
  }
  const long long pairs = static_cast<long long>(num_tokens) * shape.top_k;
  const long long rows_expected = (pairs + shape.num_experts - 1) / shape.num_experts;
  const KernelFamily& family = block_scaled_tile_family();
  const LayerPlan plan{row_tile_for(family, rows_expected, activations == ActivationFormat::kFp8 ? 256 : 128),
                       row_tile_for(family, rows_expected), activations};
  for (const auto& [t, stage] : {std::pair{plan.fc1, Stage::kFc1}, std::pair{plan.fc2, Stage::kFc2}}) {
    const StageShape stage_shape{shape, stage};
    if (const std::string why = t.family->why_invalid(t, arch, &stage_shape); !why.empty()) {
      throw Error(std::string("no ") + (activations == ActivationFormat::kFp8 ? "FP8" : "MXFP8") + "-activation plan for " +
                  shape.describe() + " on " + std::string(arch.name) + ": " + t.name() + ": " + why);
    }
  }
  return plan;
}

LayerPlan heuristic_plan(const MoeShape& shape, int num_tokens, const Arch& arch, ActivationFormat activations) {
  return heuristic_plan(shape, num_tokens, arch, activations, multiplies_block_scaled(arch));
}

}  // namespace mxmoe

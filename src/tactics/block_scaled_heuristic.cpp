// The plan for MXFP8 activations (heuristic.hpp): the block-scaled tiles, by expected rows per
// expert. Apart from heuristic.cpp, whose bf16 choices never lead here.
#include <string>

#include "kernels/family_registry.hpp"
#include "mxmoe/error.hpp"
#include "tactics/heuristic.hpp"

namespace mxmoe {

LayerPlan heuristic_plan(const MoeShape& shape, int num_tokens, const Arch& arch, ActivationFormat activations) {
  if (activations == ActivationFormat::kBf16) return heuristic_plan(shape, num_tokens, arch);
  if (activations == ActivationFormat::kFp8) {
    LayerPlan plan = heuristic_plan(shape, num_tokens, arch);  // bf16 families on rounded rows
    plan.activations = ActivationFormat::kFp8;
    return plan;
  }
  const long long pairs = static_cast<long long>(num_tokens) * shape.top_k;
  const long long rows_expected = (pairs + shape.num_experts - 1) / shape.num_experts;
  const Tactic t = row_tile_for(block_scaled_tile_family(), rows_expected);
  for (const Stage stage : {Stage::kFc1, Stage::kFc2}) {
    const StageShape stage_shape{shape, stage};
    if (const std::string why = t.family->why_invalid(t, arch, &stage_shape); !why.empty()) {
      throw Error("no MXFP8-activation plan for " + shape.describe() + " on " + std::string(arch.name) + ": " +
                  t.name() + ": " + why);
    }
  }
  return {t, t, ActivationFormat::kMxfp8};
}

}  // namespace mxmoe

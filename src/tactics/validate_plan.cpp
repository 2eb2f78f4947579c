#include "tactics/validate_plan.hpp"

#include <algorithm>

#include "kernels/family_registry.hpp"
#include "mxmoe/error.hpp"

namespace mxmoe {

void validate_plan(const MoeShape& shape, const LayerPlan& plan, const Arch& arch) {
  require_family(plan.fc1, "FC1 tactic");
  require_family(plan.fc2, "FC2 tactic");
  const KernelFamily &fc1 = *plan.fc1.family, &fc2 = *plan.fc2.family;
  if ((fc1.whole_layer() || fc2.whole_layer()) && !(plan.fc1 == plan.fc2 && plan.fc1.k_split == 1)) {
    throw Error("plan " + plan.fc1.name() + " + " + plan.fc2.name() +
                ": a whole-layer tactic runs the whole layer (FC1, FC2 and the un-permute), so it must be "
                "both stages' tactic, with k_split 1");
  }
  if (plan.activations == ActivationFormat::kFp8 && fc1.activations() != fc2.activations()) {
    throw Error("plan " + plan.fc1.name() + " + " + plan.fc2.name() +
                ": FP8 activations pass from FC1 to FC2 as rows both tactics take, but FC1's family takes " +
                activation_format_name(fc1.activations()) + " rows and FC2's " +
                activation_format_name(fc2.activations()));
  }
  const auto& valid = valid_tactics(arch.name);
  for (const auto& [tactic, stage] : {std::pair{plan.fc1, Stage::kFc1}, std::pair{plan.fc2, Stage::kFc2}}) {
    const std::string which = stage == Stage::kFc1 ? "FC1" : "FC2";
    if (std::find(valid.begin(), valid.end(), tactic.binary()) == valid.end()) {
      throw Error(which + " tactic " + tactic.name() + " is not in the " + std::string(arch.name) + " tactic table");
    }
    // FP8 activations run on the bf16 families, their rows rounded between the stages, and on the
    // block-scaled one as MXFP8 rows of one scale per 128 (KernelFamily::why_no_fp8).
    const ActivationFormat takes = tactic.family->activations();
    if (plan.activations == ActivationFormat::kFp8) {
      if (const std::string why = tactic.family->why_no_fp8(tactic, stage); !why.empty()) {
        throw Error(which + " tactic " + tactic.name() + ": " + why + "; the plan's activations are fp8");
      }
    } else if (takes != plan.activations) {
      throw Error(which + " tactic " + tactic.name() + " takes " + activation_format_name(takes) +
                  " activations; the plan's are " + activation_format_name(plan.activations));
    }
    const StageShape stage_shape{shape, stage};
    if (const std::string why = tactic.family->why_invalid(tactic, arch, &stage_shape); !why.empty()) {
      throw Error(which + " tactic " + tactic.name() + ": " + why);
    }
  }
}

}  // namespace mxmoe

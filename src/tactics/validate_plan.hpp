// Whether a layer plan can run on a shape and an arch.
#pragma once

#include "device/arch.hpp"
#include "mxmoe/moe_shape.hpp"
#include "mxmoe/tactic.hpp"

namespace mxmoe {

// Throws Error naming the stage and tactic when `plan` cannot run on `shape` and `arch`: a tactic
// not in the arch's table, a K split the stage or family does not take, shared memory past the
// arch's at the shape's K, a whole-layer tactic that is not both stages', or a tactic whose family
// takes other activations than the plan's.
void validate_plan(const MoeShape& shape, const LayerPlan& plan, const Arch& arch);

}  // namespace mxmoe

// Choosing tactics on the host from the shape and the token count alone (never from device data).
#pragma once

#include "mxmoe/moe_shape.hpp"
#include "mxmoe/tactic.hpp"

namespace mxmoe {

// Throws Error naming the stage and tactic when a plan cannot run on this shape.
void validate_plan(const MoeShape& shape, const LayerPlan& plan);
LayerPlan heuristic_plan(const MoeShape& shape, int num_tokens);

}  // namespace mxmoe

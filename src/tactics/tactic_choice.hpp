// Choosing tactics on the host from the shape, the token count and the device alone (never from
// device data), and checking a plan against them.
#pragma once

#include "jit/arch.hpp"
#include "mxmoe/moe_shape.hpp"
#include "mxmoe/tactic.hpp"

namespace mxmoe {

// Throws Error naming the stage and tactic when a plan cannot run on this shape and arch.
void validate_plan(const MoeShape& shape, const LayerPlan& plan, const Arch& arch);

// The documented default (docs/tactics.md):
//   rows per expert: expected ceil(T k / E), worst case T (a token adds at most one row per expert)
//   GEMV while the worst case is at most 8 rows, or the expected count at most 2 (then an expert
//   past 8 rows is rare, and the GEMV walks it in extra passes): FC1 with 4 record columns per CTA
//   below 4 tokens and 8 from 4 on, FC2 with 4 columns x 2 warps along K;
//   otherwise 128-row tiles with the smallest token tile of 16, 32, 64, 128 covering the expected
//   count (128 at most);
//   FC2 on the GEMV splits K until its CTAs reach 2 per SM, counting the expected number of
//   touched experts E (1 - (1 - k/E)^T), at most 4 ways.
// Every tactic it returns is in default_tactics(), the set compiled ahead of time.
LayerPlan heuristic_plan(const MoeShape& shape, int num_tokens, const Arch& arch, int multiprocessors);
std::vector<Tactic> default_tactics();

}  // namespace mxmoe

// The default plan: tactics chosen on the host from the shape, the token count and the arch alone
// (never from device data).
#pragma once

#include <vector>

#include "device/arch.hpp"
#include "mxmoe/moe_shape.hpp"
#include "mxmoe/tactic.hpp"

namespace mxmoe {

// The documented default (docs/tactics.md), the plans `mxmoe tune` chose on an H100
// (docs/perf-notes.md, "the heuristic catches up with the tuner" and "equal shares for one CTA per SM"):
//   rows per expert: expected ceil(T k / E), worst case T (a token adds at most one row per expert)
//   8-token GEMV while the worst case is at most 8 rows, or the expected count at most 4 (then an
//   expert past 8 rows is rare, and the GEMV walks it in extra passes), by the expected number of
//   touched experts E (1 - (1 - k/E)^T): up to 4 (T = 1 at top-4), FC1 with 4 columns x 2 warps
//   along K and FC2 with 2 columns x 4; up to 12, FC1 with 8 columns and FC2 with 4 columns x 2;
//   past that, the stream-K GEMV (one 24-warp CTA per SM) for both;
//   the 16-token stream-K GEMV for 5-8 expected rows;
//   on sm_90a from 32 expected rows, the wgmma family's 256 x 128 tile, and from 192 its 128 x 256
//   tile;
//   otherwise 128-row tiles with the smallest token tile of 16, 32, 64, 128 covering the expected
//   count (128 at most);
//   a GEMV-style tactic only where it is valid for both stages of the shape (its staged
//   activations fit the arch's shared memory).
// Every tactic it returns is in default_tactics(), the set compiled ahead of time for each arch
// where it is valid.
LayerPlan heuristic_plan(const MoeShape& shape, int num_tokens, const Arch& arch);
std::vector<Tactic> default_tactics();

// The plan for `activations`: the above for bf16; for MXFP8 activations, which only a caller
// chooses (RunnerOptions::activations; their accuracy cost, docs/block-scaled.md, is the caller's
// to accept), the block-scaled tiles for both stages with the smallest token tile of 16, 32, 64,
// 128 that covers the expected rows per expert, as the mma tiles' (block_scaled_heuristic.cpp).
// Those tactics compile on first use (they are not in default_tactics()). Throws Error where no
// block-scaled tactic runs on the shape and arch.
LayerPlan heuristic_plan(const MoeShape& shape, int num_tokens, const Arch& arch, ActivationFormat activations);

}  // namespace mxmoe

// The default plan: tactics chosen on the host from the shape, the token count and the arch alone
// (never from device data).
#pragma once

#include <vector>

#include "device/arch.hpp"
#include "mxmoe/moe_shape.hpp"
#include "mxmoe/tactic.hpp"

namespace mxmoe {

// The documented default (docs/tactics.md gives the thresholds; docs/performance.md, "The
// heuristic's decisions", the measurement behind each): by rows per expert, expected ceil(T k / E) and at worst T, the 8-token GEMV shapes while
// few rows are expected (by the number of touched experts), then the stream-K GEMV with 8 and 16
// tokens a tile, then on sm_90a the wgmma family with the token tile the expected rows fill, and
// elsewhere the 128-row mma tiles of row_tile_for; a GEMV-style tactic only where it is valid for
// both stages of the shape. Every tactic it returns is in default_tactics(), the set compiled
// ahead of time for each arch where it is valid. An expert-parallel shard is planned as a layer of
// its own experts taking all of the batch's pairs: its plan suits the rank that gets the most of
// them, whose time the layer waits for.
LayerPlan heuristic_plan(const MoeShape& shape, int num_tokens, const Arch& arch);
std::vector<Tactic> default_tactics();

// The 128-row tile of the mma-shaped families ("mma", "bsmma") whose token tile is the smallest of
// 16, 32, 64, 128 that covers `rows_expected`: 4 warps along the rows up to 32 tokens, then 2 x
// tokens / 32.
Tactic row_tile_for(const KernelFamily& family, long long rows_expected);

// The plan for `activations`: the above for bf16, and for FP8 activations (the runner rounds the
// bf16 families' input rows to FP8 values: route/fp8_round_rows_kernel.cuh); for MXFP8
// activations, which only a caller chooses (RunnerOptions::activations; their accuracy cost,
// docs/block-scaled.md, is the caller's to accept), the block-scaled tiles for both stages with
// the smallest token tile of 16, 32, 64, 128 that covers the expected rows per expert, as the mma
// tiles' (block_scaled_heuristic.cpp). Those tactics compile on first use (they are not in
// default_tactics()). Throws Error where no block-scaled tactic runs on the shape and arch.
LayerPlan heuristic_plan(const MoeShape& shape, int num_tokens, const Arch& arch, ActivationFormat activations);

}  // namespace mxmoe

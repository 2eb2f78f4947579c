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
// ahead of time for each arch where it is valid. An expert-parallel shard (`shape` its own experts,
// picked among `routed_experts`; 0 for a whole layer) is planned as a layer of its own experts
// taking all of the batch's pairs, which suits the rank that gets the most of them, whose time the
// layer waits for; only the decode GEMVs' rows per CTA are chosen for the experts it touches on
// average (its share, shape.num_experts / routed_experts, of the pairs).
LayerPlan heuristic_plan(const MoeShape& shape, int num_tokens, const Arch& arch, int routed_experts = 0);
std::vector<Tactic> default_tactics();

// The tile of the mma-shaped families ("mma", "bsmma") of `tile_rows` rows (128, or 256: the
// block-scaled FC1 of FP8 activations) whose token tile is the smallest of 16, 32, 64, 128 that
// covers `rows_expected`: on 128 rows 4 warps along the rows up to 32 tokens, then 2 x tokens / 32;
// on 256 rows at most 64 tokens (128 would spill the twin's registers), 4 x max(1, tokens / 32).
Tactic row_tile_for(const KernelFamily& family, long long rows_expected, int tile_rows = 128);

// Whether `arch`'s tensor cores apply E8M0 block scales in mma.sync (kind::mxf8f6f4.block_scale:
// sm_120a, sm_121a), where the block-scaled family runs at the MMA's own rate; elsewhere it runs
// its twin, a correctness vehicle (docs/block-scaled.md).
inline bool multiplies_block_scaled(const Arch& arch) { return arch.major == 12; }

// The plan for `activations`: the above for bf16. For MXFP8 activations, which only a caller
// chooses (RunnerOptions::activations; their accuracy cost, docs/block-scaled.md, is the caller's
// to accept), the block-scaled tiles for both stages with the smallest token tile of 16, 32, 64,
// 128 that covers the expected rows per expert, as the mma tiles' (block_scaled_heuristic.cpp).
// For FP8 activations, with `block_scaled_mma` the same block-scaled tiles but FC1's of 256 rows
// (its epilogue quantises whole 128-column blocks); without, the bf16 plan above, the runner
// rounding its families' input rows to FP8 values (route/fp8_round_rows_kernel.cuh). The
// block-scaled tactics compile on first use (they are not in default_tactics()). Throws Error
// where no block-scaled tactic runs on the shape and arch. Without `block_scaled_mma`,
// multiplies_block_scaled(arch).
LayerPlan heuristic_plan(const MoeShape& shape, int num_tokens, const Arch& arch, ActivationFormat activations,
                         bool block_scaled_mma, int routed_experts = 0);
LayerPlan heuristic_plan(const MoeShape& shape, int num_tokens, const Arch& arch, ActivationFormat activations);

}  // namespace mxmoe

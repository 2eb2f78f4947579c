// Choosing tactics on the host from the shape, the token count and the device alone (never from
// device data), and checking a plan against them.
#pragma once

#include "jit/arch.hpp"
#include "mxmoe/moe_shape.hpp"
#include "mxmoe/tactic.hpp"

namespace mxmoe {

// Throws Error naming the stage and tactic when a plan cannot run on this shape and arch.
void validate_plan(const MoeShape& shape, const LayerPlan& plan, const Arch& arch);

// The dynamic shared memory of a per-stage (not fused) expert kernel of tactic `t` that stages
// `staged_rows` token rows over `k_tiles` K tiles: the launch's (the batch's rows, at most
// t.tile_tokens) and validate_plan's worst case (t.tile_tokens) alike, for a layer of `num_experts`
// experts. A GEMV that routes a small batch itself (`routes_itself`) keeps that routing past its own
// memory; the stream-K GEMV keeps a copy of the routing's offsets.
int expert_stage_smem_bytes(const Tactic& t, int staged_rows, int k_tiles, int num_experts, bool routes_itself);

// The documented default (docs/tactics.md), from what `mxmoe tune` chose on an H100:
//   rows per expert: expected ceil(T k / E), worst case T (a token adds at most one row per expert)
//   8-token GEMV while the worst case is at most 8 rows, or the expected count at most 4 (then an
//   expert past 8 rows is rare, and the GEMV walks it in extra passes), by the expected number of
//   touched experts E (1 - (1 - k/E)^T): up to 4 (T = 1 at top-4), FC1 with 4 columns x 2 warps
//   along K and FC2 with 2 columns x 4; up to 12, FC1 with 8 columns and FC2 with 4 columns x 2;
//   past that, the stream-K GEMV (one 24-warp CTA per SM) for both;
//   the 16-token stream-K GEMV for 5-8 expected rows;
//   otherwise 128-row tiles with the smallest token tile of 16, 32, 64, 128 covering the expected
//   count (128 at most);
//   every GEMV family only where its staged activations fit the arch's shared memory.
// Every tactic it returns is in default_tactics(), the set compiled ahead of time.
LayerPlan heuristic_plan(const MoeShape& shape, int num_tokens, const Arch& arch);
std::vector<Tactic> default_tactics();

}  // namespace mxmoe

// The kernel families, in the order the tactic table lists their candidates and the tuner tries
// them.
#pragma once

#include <span>
#include <string_view>

#include "kernels/kernel_family.hpp"

namespace mxmoe {

std::span<const KernelFamily* const> kernel_families();
// nullptr when no family has the prefix.
const KernelFamily* family_by_prefix(std::string_view prefix);

// Each family's one object, defined by its unit (src/kernels/<kernel>_family.cpp): what a tactic
// made in code names as its family (Tactic::family).
const KernelFamily &gemv_ring_family(), &gemv_family(), &gemv_token_sum_family(), &fused_layer_family(),
    &gemv_streamk_family(), &mma_tile_family(), &wgmma_family(), &block_scaled_tile_family();

// Throws Error naming `what` where `t` has no family (a Tactic made by hand; parse_tactic's, the
// tactic table's and the heuristic's always have one). For the places a tactic comes in from a
// caller: its name, a plan's checks, its compilation.
void require_family(const Tactic& t, std::string_view what);

}  // namespace mxmoe

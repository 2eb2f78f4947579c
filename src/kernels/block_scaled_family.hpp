// What the host knows of the block-scaled tile family beyond its KernelFamily unit
// (expert_block_scaled_tile_family.cpp): the inner step its kernels are instantiated with.
#pragma once

#include <string>
#include <string_view>

namespace mxmoe {

// MXMOE_BLOCK_SCALED_FAULT=twin-row-scales builds the family's kernels with a deliberately wrong
// step, the twin reading both rows' scales of an MMA from one lane (block_scaled_mma.cuh,
// TwinScaleLanes::kRowsOfOneLane), on every arch: what a GPU whose scale placement differs from the
// ISA's would compute, for testing the first-use self-check (runner/block_scaled_check.hpp). Unset
// or empty, the arch's step.
inline constexpr std::string_view kBlockScaledFaultVariable = "MXMOE_BLOCK_SCALED_FAULT";
inline constexpr std::string_view kBlockScaledFaultRowScaleLanes = "twin-row-scales";

// The step's C++ type as the family's kernel name expressions spell it; throws Error naming the
// variable for a fault it does not know.
std::string block_scaled_step();

}  // namespace mxmoe

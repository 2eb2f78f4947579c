// The first-use check of the block-scaled tile family (expert_block_scaled_tile.cuh) on a device:
// its SM12x form issues mma.sync kind::mxf8f6f4.block_scale with the scale placement the PTX ISA
// describes, which no GPU lent to mxmoe's tests has run, so before a runner launches a block-scaled
// tactic on such a device it runs that tactic's FC2 kernel on one tile and the bf16 mma tile's FC2
// kernel on the same values (MXFP8 tokens, and their exact bf16 values), and compares. Both sum
// exact products in fp32, so they agree to fp32 rounding; a wrong scale or fragment placement
// gives differences of the order of the values. A tactic that fails drops the family on that
// device (MoeRunner plans bf16 activations there) with one warning naming the device and the tactic.
//
// The problem: one expert, tile_rows rows, K = 288 (four and a half 64-K slices: the pipeline
// wraps and the last slice is half padding), tile_tokens - 3 tokens (a partial tile); weight
// scales spread over 2^-9 .. 2^7 and token blocks over 2^-6 .. 2^6, so that any mix-up of scales
// shows. It synchronises the device, so it runs in prepare(), never inside a forward.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "device/arch.hpp"
#include "mxmoe/runner.hpp"
#include "mxmoe/tactic.hpp"

namespace mxmoe {

// Whether a runner with `mode` checks block-scaled tactics on `arch`.
bool block_scaled_check_applies(BlockScaledCheck mode, const Arch& arch);

// How far the two FC2 outputs may differ, by norm: fp32 sums of the same exact products in other
// orders differ by ~1e-6 (the tensor cores' accumulation is not IEEE's), a misplaced scale by
// factors of 2 and more.
inline constexpr double kBlockScaledCheckTolerance = 1e-3;

// The verdict on one check's outputs: `got` the block-scaled tile's, `expected` the bf16 tile's.
struct BlockScaledVerdict {
  double rel_difference = 0.0;  // by norm; infinity when `got` holds a NaN or an infinity
  bool passed = false;
};
BlockScaledVerdict judge_block_scaled_check(std::span<const float> got, std::span<const float> expected);

// The bf16 tactic a block-scaled tactic is checked against (valid on every arch).
Tactic block_scaled_check_reference();

// The check of `t` (a block-scaled tactic) on the current device, run once per process, device and
// kernel variant (block_scaled_family.hpp); a failure warns once and drops the family there.
BlockScaledCheckResult check_block_scaled_tactic(const Tactic& t);
// Whether a check of the current kernel variant has failed on the current device.
bool block_scaled_family_dropped();
// The checks of the current kernel variant run on the current device, in the order they ran.
std::vector<BlockScaledCheckResult> block_scaled_checks_on_device();

}  // namespace mxmoe

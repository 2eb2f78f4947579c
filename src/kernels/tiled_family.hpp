// What the tiled families' units (expert_mma_tile_family.cpp, expert_block_scaled_tile_family.cpp)
// share: a CTA computes a weight-row x token tile of one expert, warps_rows x warps_tokens warps of
// 16-row records x 8-token MMA tiles. Their name grammar, their grid and their register rules.
#pragma once

#include <algorithm>
#include <string>

#include "kernels/kernel_family.hpp"

namespace mxmoe {

// "<family>.r<rows>x<tokens>.w<warps along rows>x<warps along tokens>.s<stages>.k<split>".
inline constexpr NameField kTiledNameFields[] = {{".r", &Tactic::tile_rows},   {"x", &Tactic::tile_tokens},
                                                 {".w", &Tactic::warps_rows},  {"x", &Tactic::warps_tokens},
                                                 {".s", &Tactic::smem_stages}, {".k", &Tactic::k_split}};

inline Tactic tiled_tactic(const KernelFamily& family, int tile_rows, int tile_tokens, int warps_rows,
                           int warps_tokens, int stages) {
  return {.family = &family,
          .tile_rows = tile_rows,
          .tile_tokens = tile_tokens,
          .warps_rows = warps_rows,
          .warps_tokens = warps_tokens,
          .smem_stages = stages};
}

// x = token-tile slots (an upper bound: pairs / tile_tokens + min(E, pairs); a CTA past the last
// tile exits), y = row tiles of tile_rows, z = K splits.
inline LaunchGeometry tiled_geometry(const Tactic& t, const StageShape& shape, int num_tokens, int smem_bytes) {
  const int pairs = num_tokens * shape.layer.top_k;
  const dim3 grid(static_cast<unsigned>(pairs / t.tile_tokens + std::min(shape.layer.num_experts, pairs)),
                  static_cast<unsigned>((shape.rows() + t.tile_rows - 1) / t.tile_rows),
                  static_cast<unsigned>(t.k_split));
  return {grid, 32 * t.warps(), smem_bytes, std::min(t.tile_tokens, num_tokens)};
}

// A family's own limits within the tiled rules: its tile rows a multiple of `rows_multiple` (and
// why), and per record of a warp `weight_registers` registers of weights (what they are called).
struct TileRules {
  int rows_multiple;
  const char* rows_reason;
  int weight_registers;
  const char* weight_registers_name;
};

// Per thread at most 64 fp32 accumulators and 64 registers of weight fragments, so that a CTA of 8
// warps keeps two CTAs' worth of registers per SM free of spills; at least 2 pipeline stages; then
// the shared memory of all stages (`smem_bytes`) within the arch's.
inline std::string why_invalid_tile(const Tactic& t, const Arch& arch, const TileRules& rules, int smem_bytes) {
  constexpr int kMaxAccumulators = 64, kMaxWeightRegisters = 64;
  if (std::string why = why_invalid_warps(t); !why.empty()) return why;
  if (t.tile_rows % (16 * t.warps_rows) != 0) return "tile rows must split into whole 16-row records per warp";
  if (t.tile_rows % rules.rows_multiple != 0) return rules.rows_reason;
  if (t.tile_tokens % (8 * t.warps_tokens) != 0) return "tile tokens must split into whole 8-token MMA tiles per warp";
  const int records = t.tile_rows / t.warps_rows / 16, token_tiles = t.tile_tokens / t.warps_tokens / 8;
  if (records * token_tiles * 4 > kMaxAccumulators) {
    return std::to_string(records * token_tiles * 4) + " accumulators per thread (budget " +
           std::to_string(kMaxAccumulators) + ")";
  }
  if (records * rules.weight_registers > kMaxWeightRegisters) {
    return std::string("too many ") + rules.weight_registers_name + " registers per thread";
  }
  if (t.smem_stages < 2) return "a cp.async pipeline needs 2 stages";
  return why_over_shared_memory(smem_bytes, arch);
}

}  // namespace mxmoe

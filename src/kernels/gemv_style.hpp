// Host-side rules shared by the GEMV-style families (gemv, gemvsum, sk, ring, fused), whose CTAs are record
// columns, one 16-row record column per warp along the rows, over a tile of 8 or 16 tokens, as
// expert_gemm.cuh's device helpers are shared by their kernels.
#pragma once

#include <algorithm>
#include <string>

#include "kernels/kernel_family.hpp"

namespace mxmoe {

// Whether `t`'s CTA is warps_rows record columns over 8 or 16 tokens.
inline bool is_record_column_cta(const Tactic& t) {
  return (t.tile_tokens == 8 || t.tile_tokens == 16) && t.warps_rows >= 1 && t.tile_rows == 16 * t.warps_rows;
}

// Empty when `t` keeps 1 to 16 records per lane in flight in each of its two register batches.
inline std::string why_invalid_batch(const Tactic& t) {
  return t.batch_records < 1 || t.batch_records > 16 ? "1 to 16 records in flight per lane" : "";
}

// The register GEMV's CTA (expert_gemv.cuh, gemv_columns), which the fused layer runs too: record
// columns with 1, 2 or 4 warps each along K; and its names, ".r<rows>x<tokens>.w<columns>x<warps
// along K>.u<batch records>.k<split>".
inline std::string why_invalid_gemv_cta(const Tactic& t) {
  if (std::string why = why_invalid_warps(t); !why.empty()) return why;
  if (!is_record_column_cta(t)) {
    return "a GEMV CTA is 16-row record columns (one per warp along rows) over 8 or 16 tokens";
  }
  if (t.warps_k != 1 && t.warps_k != 2 && t.warps_k != 4) return "1, 2 or 4 warps along K";
  return why_invalid_batch(t);
}
inline constexpr NameField kGemvCtaNameFields[] = {{".r", &Tactic::tile_rows},     {"x", &Tactic::tile_tokens},
                                                   {".w", &Tactic::warps_rows},    {"x", &Tactic::warps_k},
                                                   {".u", &Tactic::batch_records}, {".k", &Tactic::k_split}};

// A GEMV-style launch's GemvOptions: its stage's entries of the layer's arguments.
inline kernels::GemvOptions gemv_options(const ExpertLaunch& l, const kernels::LayerArgs& args) {
  const int stage = l.stage == Stage::kFc1 ? 0 : 1;
  return {.scales_one_multiply = args.scales_one_multiply[stage], .round_fp8 = args.rounds_staged_fp8[stage]};
}

// Token rows a CTA stages per pass: an expert gets a token at most once, so a batch of T tokens
// gives it at most T rows.
inline int staged_token_rows(const Tactic& t, int num_tokens) { return std::min(t.tile_tokens, num_tokens); }

// A launch's block: the token rows its CTAs stage, its dynamic shared memory and its threads; the
// grid is the family's.
inline LaunchGeometry gemv_style_block(const KernelFamily& family, const Tactic& t, const StageShape& shape,
                                       int num_tokens, bool routes_itself) {
  LaunchGeometry g;
  g.staged_rows = staged_token_rows(t, num_tokens);
  g.smem_bytes = family.smem_bytes(t, shape, g.staged_rows, routes_itself);
  g.threads = 32 * t.warps();
  return g;
}

// The per-expert grid: x = column groups of warps_rows record columns, y = active-expert slots (an
// upper bound, min(E, pairs); a CTA past the active count exits), z = K splits.
inline dim3 column_group_grid(const Tactic& t, const StageShape& shape, int num_tokens) {
  const int pairs = num_tokens * shape.layer.top_k;
  return dim3(static_cast<unsigned>((shape.row_tiles() + t.warps_rows - 1) / t.warps_rows),
              static_cast<unsigned>(std::min(shape.layer.num_experts, pairs)), static_cast<unsigned>(t.k_split));
}

}  // namespace mxmoe

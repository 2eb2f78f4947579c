// The block-scaled tile family (expert_block_scaled_tile.cuh): "bsmma.r<rows>x<tokens>.w<warps along
// rows>x<warps along tokens>.s<stages>.k<split>". The mma family's tiles with MXFP8 activations: a
// plan of it has ActivationFormat::kMxfp8 (both stages), which a caller chooses
// (RunnerOptions::activations); the bf16 heuristic never does (docs/block-scaled.md).
#include <cstdlib>
#include <string>

#include "kernels/block_scaled_family.hpp"
#include "kernels/expert_block_scaled_tile.cuh"
#include "kernels/kernel_family.hpp"
#include "mxmoe/error.hpp"

namespace mxmoe {
namespace {

// Per thread at most 64 fp32 accumulators and 64 registers of E4M3 weights (8 per record), as the
// mma family's budget.
constexpr int kMaxAccumulators = 64;
constexpr int kMaxWeightRegisters = 64;

Tactic bsmma(int tile_rows, int tile_tokens, int warps_rows, int warps_tokens, int stages) {
  return {.family = "bsmma",
          .tile_rows = tile_rows,
          .tile_tokens = tile_tokens,
          .warps_rows = warps_rows,
          .warps_tokens = warps_tokens,
          .smem_stages = stages};
}

class BlockScaledTileFamily final : public KernelFamily {
 public:
  std::string_view prefix() const override { return "bsmma"; }

  std::span<const NameField> name_fields() const override {
    static constexpr NameField kFields[] = {{".r", &Tactic::tile_rows},   {"x", &Tactic::tile_tokens},
                                            {".w", &Tactic::warps_rows},  {"x", &Tactic::warps_tokens},
                                            {".s", &Tactic::smem_stages}, {".k", &Tactic::k_split}};
    return kFields;
  }

  std::span<const TacticCandidate> candidates() const override {
    static const TacticCandidate kCandidates[] = {
        {bsmma(128, 16, 4, 1, 4), "MXFP8 activations, small tile: up to 16 rows per expert"},
        {bsmma(128, 32, 4, 1, 4), "MXFP8 activations, small tile: 17-32 rows per expert"},
        {bsmma(128, 64, 2, 2, 3), "MXFP8 activations, large tile: 33-64 rows per expert"},
        {bsmma(128, 128, 2, 4, 3), "MXFP8 activations, prefill: 65+ rows per expert"},
    };
    return kCandidates;
  }

  ActivationFormat activations() const override { return ActivationFormat::kMxfp8; }
  // FC1 reads the gather launch's MXFP8 rows (x quantised in sorted-row order).
  bool reads_sorted_input() const override { return true; }

  int smem_bytes(const Tactic& t, const StageShape&, int, bool) const override {
    return kernels::block_scaled_smem_bytes(t.tile_rows, t.tile_tokens, t.smem_stages);
  }
  // Its shared memory depends on the tactic alone.
  int smem_limit(const Tactic& t, const Arch&) const override {
    return kernels::block_scaled_smem_bytes(t.tile_rows, t.tile_tokens, t.smem_stages);
  }

  // The step is the arch's (BlockScaledStep, chosen where the kernel compiles), unless
  // MXMOE_BLOCK_SCALED_FAULT asks for a wrong one (block_scaled_family.hpp).
  KernelInstantiation instantiation(const Tactic& t) const override {
    auto kernel = [&](bool fc1) {
      return kernel_expression("expert_block_scaled_tile_kernel",
                               {kernel_argument(t.tile_rows), kernel_argument(t.tile_tokens),
                                kernel_argument(t.warps_rows), kernel_argument(t.warps_tokens),
                                kernel_argument(t.smem_stages), kernel_argument(fc1), block_scaled_step()});
    };
    return {"kernels/expert_block_scaled_tile.cuh", kernel(true), kernel(false)};
  }

  // x = token-tile slots (an upper bound: pairs / tile_tokens + min(E, pairs); a CTA past the last
  // tile exits), y = row tiles of tile_rows, z = K splits.
  LaunchGeometry geometry(const Tactic& t, const StageShape& shape, int num_tokens, bool, const void*) const override {
    const int pairs = num_tokens * shape.layer.top_k;
    const dim3 grid(static_cast<unsigned>(pairs / t.tile_tokens + std::min(shape.layer.num_experts, pairs)),
                    static_cast<unsigned>((shape.rows() + t.tile_rows - 1) / t.tile_rows),
                    static_cast<unsigned>(t.k_split));
    return {grid, 32 * t.warps(), smem_bytes(t, shape, t.tile_tokens, false), std::min(t.tile_tokens, num_tokens)};
  }

 protected:
  std::string why_invalid_on(const Tactic& t, const Arch& arch) const override {
    if (10 * arch.major + arch.minor < 89) return "E4M3 mma.sync needs sm_89 or later";
    if (std::string why = why_invalid_warps(t); !why.empty()) return why;
    if (t.tile_rows % (16 * t.warps_rows) != 0) return "tile rows must split into whole 16-row records per warp";
    if (t.tile_rows % 128 != 0) {
      return "tile rows must be a multiple of 128: FC1's tile quantises whole 64-K slices of FC2's MXFP8 input";
    }
    if (t.tile_tokens % (8 * t.warps_tokens) != 0)
      return "tile tokens must split into whole 8-token MMA tiles per warp";
    const int records = t.tile_rows / t.warps_rows / 16, token_tiles = t.tile_tokens / t.warps_tokens / 8;
    if (records * token_tiles * 4 > kMaxAccumulators) {
      return std::to_string(records * token_tiles * 4) + " accumulators per thread (budget " +
             std::to_string(kMaxAccumulators) + ")";
    }
    if (records * 8 > kMaxWeightRegisters) return "too many E4M3 weight registers per thread";
    if (t.smem_stages < 2) return "a cp.async pipeline needs 2 stages";
    return why_over_shared_memory(smem_limit(t, arch), arch);
  }
};

}  // namespace

std::string block_scaled_step() {
  const char* fault = std::getenv(std::string(kBlockScaledFaultVariable).c_str());
  if (!fault || !*fault) return "mxmoe::kernels::BlockScaledStep";
  if (fault == kBlockScaledFaultRowScaleLanes) {
    return "mxmoe::kernels::BlockScaledMmaTwin<mxmoe::kernels::TwinScaleLanes::kRowsOfOneLane>";
  }
  throw Error(std::string(kBlockScaledFaultVariable) + "='" + fault + "': expected '" +
              std::string(kBlockScaledFaultRowScaleLanes) + "' or nothing");
}

const KernelFamily& block_scaled_tile_family() {
  static const BlockScaledTileFamily family;
  return family;
}

}  // namespace mxmoe

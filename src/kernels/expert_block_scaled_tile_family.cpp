// The block-scaled tile family (expert_block_scaled_tile.cuh): "bsmma.r<rows>x<tokens>.w<warps along
// rows>x<warps along tokens>.s<stages>.k<split>". The mma family's tiles with MXFP8 activations: a
// plan of it has ActivationFormat::kMxfp8 or kFp8 (both stages), which a caller chooses
// (RunnerOptions::activations); the bf16 heuristic never does (docs/block-scaled.md).
#include <cstdlib>
#include <string>

#include "kernels/block_scaled_family.hpp"
#include "kernels/expert_block_scaled_tile.cuh"
#include "kernels/family_registry.hpp"
#include "kernels/kernel_family.hpp"
#include "kernels/tiled_family.hpp"
#include "mxmoe/error.hpp"

namespace mxmoe {
namespace {

Tactic bsmma(int tile_rows, int tile_tokens, int warps_rows, int warps_tokens, int stages) {
  return tiled_tactic(block_scaled_tile_family(), tile_rows, tile_tokens, warps_rows, warps_tokens, stages);
}

class BlockScaledTileFamily final : public KernelFamily {
 public:
  std::string_view prefix() const override { return "bsmma"; }

  std::span<const NameField> name_fields() const override { return kTiledNameFields; }

  std::span<const TacticCandidate> candidates() const override {
    static const TacticCandidate kCandidates[] = {
        {bsmma(128, 16, 4, 1, 4), "MXFP8 activations, small tile: up to 16 rows per expert"},
        {bsmma(128, 32, 4, 1, 4), "MXFP8 activations, small tile: 17-32 rows per expert"},
        {bsmma(128, 64, 2, 2, 3), "MXFP8 activations, large tile: 33-64 rows per expert"},
        {bsmma(128, 128, 2, 4, 3), "MXFP8 activations, prefill: 65+ rows per expert"},
        {bsmma(256, 16, 4, 1, 4), "FP8 activations' FC1 (whole 128-column blocks): up to 16 rows per expert"},
        {bsmma(256, 32, 4, 1, 4), "FP8 activations' FC1: 17-32 rows per expert"},
        {bsmma(256, 64, 4, 2, 3), "FP8 activations' FC1: 33+ rows per expert (128 tokens spill on the twin)"},
    };
    return kCandidates;
  }

  ActivationFormat activations() const override { return ActivationFormat::kMxfp8; }
  // FP8 activations go between the stages as MXFP8 rows whose 128-K blocks repeat one scale over
  // their four 32-K blocks (mxfp8_quantize.cuh): FC1's epilogue quantises a 128-column block per
  // token, so its tile has a multiple of 256 rows (gate and up rows: 128 columns).
  std::string why_no_fp8(const Tactic& t, Stage stage) const override {
    if (stage == Stage::kFc1 && t.tile_rows % 256 != 0) {
      return "FP8 activations need FC1 tiles of a multiple of 256 rows (whole 128-column blocks of FC2's input)";
    }
    return "";
  }
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

  LaunchGeometry geometry(const Tactic& t, const StageShape& shape, int num_tokens, bool, const void*) const override {
    return tiled_geometry(t, shape, num_tokens, smem_bytes(t, shape, t.tile_tokens, false));
  }

 protected:
  // E4M3 mma.sync (the twin's and the block-scaled one's operands) from sm_89 on; then the tiled
  // rules, with whole 128-row tiles and 8 registers of E4M3 weights per record.
  std::string why_invalid_on(const Tactic& t, const Arch& arch) const override {
    if (10 * arch.major + arch.minor < 89) return "E4M3 mma.sync needs sm_89 or later";
    return why_invalid_tile(
        t, arch,
        {128, "tile rows must be a multiple of 128: FC1's tile quantises whole 64-K slices of FC2's MXFP8 input", 8,
         "E4M3 weight"},
        smem_limit(t, arch));
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

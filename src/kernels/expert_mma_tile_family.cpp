// The tiled family (expert_mma_tile.cuh): "mma.r<rows>x<tokens>.w<warps along rows>x<warps along
// tokens>.s<stages>.k<split>". A CTA computes a weight-row x token tile of one expert, both operands
// staged through a cp.async pipeline; for tens of rows per expert and up (prefill).
#include "kernels/expert_mma_tile.cuh"
#include "kernels/family_registry.hpp"
#include "kernels/kernel_family.hpp"
#include "kernels/tiled_family.hpp"

namespace mxmoe {
namespace {

Tactic mma(int tile_rows, int tile_tokens, int warps_rows, int warps_tokens, int stages) {
  return tiled_tactic(mma_tile_family(), tile_rows, tile_tokens, warps_rows, warps_tokens, stages);
}

class MmaTileFamily final : public KernelFamily {
 public:
  std::string_view prefix() const override { return "mma"; }

  std::span<const NameField> name_fields() const override { return kTiledNameFields; }

  std::span<const TacticCandidate> candidates() const override {
    static const TacticCandidate kCandidates[] = {
        {mma(64, 16, 4, 1, 4), "small tile, half height: twice the CTAs of r128 for 9-16 rows per expert"},
        {mma(128, 16, 4, 1, 4), "small tile: 9-16 rows per expert"},
        {mma(128, 32, 4, 1, 4), "small tile: 17-32 rows per expert"},
        {mma(128, 64, 2, 2, 3), "large tile: 33-64 rows per expert"},
        {mma(128, 64, 4, 2, 3), "large tile, 8 warps: more warps to hide the dequantisation"},
        {mma(128, 128, 2, 4, 3), "prefill: 65+ rows per expert"},
        {mma(128, 128, 4, 2, 3), "prefill, taller warp tiles: each dequantised record feeds 8 MMA tiles"},
        {mma(256, 64, 4, 2, 3), "prefill, tall tile: each staged activation slice feeds 256 weight rows"},
        {mma(128, 128, 2, 4, 4), "prefill, 4-deep pipeline"},
        {mma(128, 128, 2, 4, 5), "prefill, 5-deep pipeline for long DRAM latency"},
        {mma(256, 128, 4, 2, 3), "prefill, 256 x 128 tile: fewest re-reads of weights and activations"},
    };
    return kCandidates;
  }

  int smem_bytes(const Tactic& t, const StageShape&, int, bool) const override {
    return kernels::mma_tile_smem_bytes(t.tile_rows, t.tile_tokens, t.smem_stages);
  }
  // Its shared memory depends on the tactic alone.
  int smem_limit(const Tactic& t, const Arch&) const override {
    return kernels::mma_tile_smem_bytes(t.tile_rows, t.tile_tokens, t.smem_stages);
  }

  KernelInstantiation instantiation(const Tactic& t) const override {
    auto kernel = [&](bool fc1) {
      return kernel_expression(
          "expert_mma_tile_kernel",
          {kernel_argument(t.tile_rows), kernel_argument(t.tile_tokens), kernel_argument(t.warps_rows),
           kernel_argument(t.warps_tokens), kernel_argument(t.smem_stages), kernel_argument(fc1)});
    };
    return {"kernels/expert_mma_tile.cuh", kernel(true), kernel(false)};
  }

  LaunchGeometry geometry(const Tactic& t, const StageShape& shape, int num_tokens, bool, const void*) const override {
    return tiled_geometry(t, shape, num_tokens, smem_bytes(t, shape, t.tile_tokens, false));
  }

 protected:
  // The tiled rules, with 16 bf16x2 registers of dequantised fragments per record.
  std::string why_invalid_on(const Tactic& t, const Arch& arch) const override {
    return why_invalid_tile(t, arch, {16, "", 16, "dequantised fragment"}, smem_limit(t, arch));
  }
};

}  // namespace

const KernelFamily& mma_tile_family() {
  static const MmaTileFamily family;
  return family;
}

}  // namespace mxmoe

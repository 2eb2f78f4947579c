// The tiled family (expert_mma_tile.cuh): "mma.r<rows>x<tokens>.w<warps along rows>x<warps along
// tokens>.s<stages>.k<split>". A CTA computes a weight-row x token tile of one expert, both operands
// staged through a cp.async pipeline; for tens of rows per expert and up (prefill).
#include "kernels/expert_mma_tile.cuh"
#include "kernels/kernel_family.hpp"

namespace mxmoe {
namespace {

// Per thread: fp32 accumulators and dequantised weight fragments (bf16x2), each at most 64
// registers, so that a CTA of 8 warps keeps two CTAs' worth of registers per SM free of spills.
constexpr int kMaxAccumulators = 64;
constexpr int kMaxFragmentRegisters = 64;

Tactic mma(int tile_rows, int tile_tokens, int warps_rows, int warps_tokens, int stages) {
  return {.family = "mma",
          .tile_rows = tile_rows,
          .tile_tokens = tile_tokens,
          .warps_rows = warps_rows,
          .warps_tokens = warps_tokens,
          .smem_stages = stages};
}

class MmaTileFamily final : public KernelFamily {
 public:
  std::string_view prefix() const override { return "mma"; }

  std::span<const NameField> name_fields() const override {
    static constexpr NameField kFields[] = {{".r", &Tactic::tile_rows},   {"x", &Tactic::tile_tokens},
                                            {".w", &Tactic::warps_rows},  {"x", &Tactic::warps_tokens},
                                            {".s", &Tactic::smem_stages}, {".k", &Tactic::k_split}};
    return kFields;
  }

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
    if (std::string why = why_invalid_warps(t); !why.empty()) return why;
    if (t.tile_rows % (16 * t.warps_rows) != 0) return "tile rows must split into whole 16-row records per warp";
    if (t.tile_tokens % (8 * t.warps_tokens) != 0)
      return "tile tokens must split into whole 8-token MMA tiles per warp";
    const int records = t.tile_rows / t.warps_rows / 16, token_tiles = t.tile_tokens / t.warps_tokens / 8;
    if (records * token_tiles * 4 > kMaxAccumulators) {
      return std::to_string(records * token_tiles * 4) + " accumulators per thread (budget " +
             std::to_string(kMaxAccumulators) + ")";
    }
    if (records * 16 > kMaxFragmentRegisters) return "too many dequantised fragment registers per thread";
    if (t.smem_stages < 2) return "a cp.async pipeline needs 2 stages";
    return why_over_shared_memory(smem_limit(t, arch), arch);
  }
};

}  // namespace

const KernelFamily& mma_tile_family() {
  static const MmaTileFamily family;
  return family;
}

}  // namespace mxmoe

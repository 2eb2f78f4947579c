// The stream-K GEMV family (expert_gemv_streamk.cuh): "sk.r<rows>x<tokens>.w<columns>.u<batch
// records>.k1". The GEMV's work cut into equal shares for one CTA per SM; the CTAs wait on each
// other's partial sums, so the grid is the count the device holds at once, and the routing launch
// zeroes their flags (so the family never routes a batch itself).
#include "device/current_device.hpp"
#include "kernels/expert_gemv_streamk.cuh"
#include "kernels/family_registry.hpp"
#include "kernels/gemv_style.hpp"
#include "mxmoe/error.hpp"

namespace mxmoe {
namespace {

Tactic stream_k(int columns, int tokens) {
  return {.family = &gemv_streamk_family(),
          .tile_rows = 16 * columns,
          .tile_tokens = tokens,
          .warps_rows = columns,
          .batch_records = 2};
}

class StreamKFamily final : public KernelFamily {
 public:
  std::string_view prefix() const override { return "sk"; }

  std::span<const NameField> name_fields() const override {
    static constexpr NameField kFields[] = {{".r", &Tactic::tile_rows},
                                            {"x", &Tactic::tile_tokens},
                                            {".w", &Tactic::warps_rows},
                                            {".u", &Tactic::batch_records},
                                            {".k", &Tactic::k_split}};
    return kFields;
  }

  std::span<const TacticCandidate> candidates() const override {
    static const TacticCandidate kCandidates[] = {
        {stream_k(24, 8), "decode over several waves: one 24-warp CTA per SM, equal shares, no last partial wave"},
        {stream_k(20, 8), "stream-K with 20-column groups: FC2's 180 row tiles in 9 whole groups"},
        {stream_k(24, 16), "stream-K for 9-16 rows per expert: each weight feeds two 8-token MMA tiles"},
        {stream_k(20, 16), "stream-K for 9-16 rows per expert, 20 warps: 88 registers, no spills"},
    };
    return kCandidates;
  }

  // A CTA stages a token tile's rows over the whole of K, again for each tile it crosses, and rounds
  // them there up to 16 tokens, where that costs less than the two rounding launches; past that the
  // rounding of every tile a CTA stages, on that CTA's path, outweighs them (docs/performance.md,
  // "The heuristic's decisions", the FP8 staging row, and "Tried and not kept").
  static constexpr int kMaxStagingRoundedTokens = 16;
  bool rounds_fp8_when_staging(const Tactic&, int num_tokens) const override {
    return num_tokens <= kMaxStagingRoundedTokens;
  }
  int smem_bytes(const Tactic& t, const StageShape& shape, int staged_rows, bool) const override {
    return kernels::stream_smem_bytes(t.tile_tokens, staged_rows, shape.k_tiles(), shape.layer.num_experts);
  }

  KernelInstantiation instantiation(const Tactic& t) const override {
    auto kernel = [&](bool fc1) {
      return kernel_expression("expert_gemv_streamk_kernel",
                               {kernel_argument(t.warps_rows), kernel_argument(t.tile_tokens), kernel_argument(fc1),
                                kernel_argument(t.batch_records)});
    };
    return {"kernels/expert_gemv_streamk.cuh", kernel(true), kernel(false)};
  }

  // Every CTA resident at once (they wait on each other), at most kMaxStreamCtas.
  LaunchGeometry geometry(const Tactic& t, const StageShape& shape, int num_tokens, bool,
                          const void* kernel) const override {
    LaunchGeometry g = gemv_style_block(*this, t, shape, num_tokens, false);
    const long long resident = resident_ctas(kernel, g.threads, g.smem_bytes);
    if (resident < 1) {
      throw Error(t.name() + ": no CTA fits an SM (" + std::to_string(g.smem_bytes) + " bytes of shared memory)");
    }
    g.grid = dim3(static_cast<unsigned>(std::min<long long>(resident, kernels::kMaxStreamCtas)));
    return g;
  }
  void launch(const ExpertLaunch& l, const kernels::LayerArgs& args, cudaStream_t stream) const override {
    kernels::ExpertGemmArgs stage_args = stage_arguments(l, args);
    int k_split = l.tactic.k_split;
    kernels::GemvOptions options = gemv_options(l, args);
    void* params[] = {&stage_args, &k_split, &options};
    launch_kernel(l, params, stream);
  }

 protected:
  std::string why_invalid_on(const Tactic& t, const Arch&) const override {
    if (!is_record_column_cta(t)) {
      return "a stream-K GEMV CTA is one 16-row record column per warp over 8 or 16 tokens";
    }
    if (32 * t.warps() > kernels::kMaxStreamThreads) {
      return "at most " + std::to_string(kernels::kMaxStreamThreads / 32) + " warps per stream-K CTA";
    }
    return why_invalid_batch(t);
  }
  std::string_view why_no_k_split() const override { return "a stream-K GEMV splits K itself"; }
};

}  // namespace

const KernelFamily& gemv_streamk_family() {
  static const StreamKFamily family;
  return family;
}

}  // namespace mxmoe

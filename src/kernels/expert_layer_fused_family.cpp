// The fused layer family (expert_layer_fused.cuh): "fused.r<rows>x<tokens>.w<columns>x<warps along
// K>.u<batch records>.k1", a whole-layer tactic. After the routing, one persistent launch runs FC1
// (SwiGLU), FC2 and the weighted un-permute; its CTAs take GEMV-sized items by ticket.
#include "device/current_device.hpp"
#include "kernels/expert_layer_fused.cuh"
#include "kernels/family_registry.hpp"
#include "kernels/gemv_style.hpp"

namespace mxmoe {
namespace {

Tactic fused(int columns, int warps_k, int tokens, int batch_records) {
  return {.family = &fused_layer_family(),
          .tile_rows = 16 * columns,
          .tile_tokens = tokens,
          .warps_rows = columns,
          .warps_k = warps_k,
          .batch_records = batch_records};
}

int column_groups(const Tactic& t, int rows) { return (rows / 16 + t.warps_rows - 1) / t.warps_rows; }

class FusedLayerFamily final : public KernelFamily {
 public:
  std::string_view prefix() const override { return "fused"; }

  std::span<const NameField> name_fields() const override { return kGemvCtaNameFields; }

  std::span<const TacticCandidate> candidates() const override {
    static const TacticCandidate kCandidates[] = {
        {fused(4, 2, 8, 2),
         "decode, whole layer in one launch: FC2's stream starts in FC1's tail, no kernel boundaries"},
        {fused(2, 4, 8, 2), "whole layer in one launch, small items: a short tail for a 1-2 token step"},
        {fused(8, 1, 8, 2), "whole layer in one launch, 8-column items: the staged activations shared by 8 warps"},
        {fused(4, 1, 8, 4), "whole layer in one launch, deeper per-warp pipeline"},
        {fused(8, 1, 16, 4), "whole layer in one launch for 9-16 rows per expert: FC2 items fill FC1's last wave"},
    };
    return kCandidates;
  }

  bool whole_layer() const override { return true; }

  // Both stages' staging (FC1's K is H, FC2's is I) share the CTA's memory.
  int smem_bytes(const Tactic& t, const StageShape& shape, int staged_rows, bool) const override {
    const StageShape fc1{shape.layer, Stage::kFc1}, fc2{shape.layer, Stage::kFc2};
    return kernels::fused_smem_bytes(t.tile_tokens, staged_rows, fc1.k_tiles(), fc2.k_tiles(), t.warps_rows, t.warps_k,
                                     shape.layer.num_experts);
  }

  KernelInstantiation instantiation(const Tactic& t) const override {
    const std::string kernel = kernel_expression("expert_layer_fused_kernel",
                                                 {kernel_argument(t.warps_rows), kernel_argument(t.warps_k),
                                                  kernel_argument(t.tile_tokens), kernel_argument(t.batch_records)});
    return {"kernels/expert_layer_fused.cuh", kernel, kernel};
  }

  // As many CTAs as are resident at once, and no more than there can be items.
  LaunchGeometry geometry(const Tactic& t, const StageShape& shape, int num_tokens, bool,
                          const void* kernel) const override {
    LaunchGeometry g = gemv_style_block(*this, t, shape, num_tokens, false);
    const long long resident = resident_ctas(kernel, g.threads, g.smem_bytes);
    const long long max_active = std::min(shape.layer.num_experts, num_tokens * shape.layer.top_k);
    const long long groups = column_groups(t, shape.layer.fc1_rows()) + column_groups(t, shape.layer.hidden);
    g.grid = dim3(static_cast<unsigned>(std::max(1LL, std::min(resident, max_active * groups))));
    return g;
  }

  void launch(const ExpertLaunch& l, const kernels::LayerArgs& args, cudaStream_t stream) const override {
    kernels::LayerArgs a = args;
    a.fc1.staged_rows = a.fc2.staged_rows = l.geometry.staged_rows;
    void* params[] = {&a};
    launch_kernel(l, params, stream);
  }

 protected:
  std::string why_invalid_on(const Tactic& t, const Arch&) const override { return why_invalid_gemv_cta(t); }
  std::string_view why_no_k_split() const override { return "a whole-layer launch has no K split"; }
};

}  // namespace

const KernelFamily& fused_layer_family() {
  static const FusedLayerFamily family;
  return family;
}

}  // namespace mxmoe

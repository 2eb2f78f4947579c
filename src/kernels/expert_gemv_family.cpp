// The GEMV family (expert_gemv.cuh): "gemv.r<rows>x<tokens>.w<columns>x<warps along K>.u<batch
// records>.k<split>". Each warp streams one record column of one touched expert into registers; a
// CTA stages its expert's <= 8 or 16 tokens once. For decode.
#include "kernels/expert_gemv.cuh"
#include "kernels/family_registry.hpp"
#include "kernels/gemv_style.hpp"

namespace mxmoe {
namespace {

Tactic gemv(int columns, int warps_k, int tokens, int batch_records) {
  return {.family = &gemv_family(),
          .tile_rows = 16 * columns,
          .tile_tokens = tokens,
          .warps_rows = columns,
          .warps_k = warps_k,
          .batch_records = batch_records};
}

class GemvFamily final : public KernelFamily {
 public:
  std::string_view prefix() const override { return "gemv"; }

  std::span<const NameField> name_fields() const override { return kGemvCtaNameFields; }

  std::span<const TacticCandidate> candidates() const override {
    static const TacticCandidate kCandidates[] = {
        {gemv(4, 1, 8, 4), "decode default: 64 rows per CTA, 4-8 records (2-4 KB per warp) in flight"},
        {gemv(4, 1, 8, 8), "decode, deeper: 8-16 records in flight per lane, for more bytes in flight per SM"},
        {gemv(2, 1, 8, 8), "decode, small CTAs: twice the CTAs, for the few experts a 1-token step touches"},
        {gemv(8, 1, 8, 4), "decode, large CTAs: the staged activations shared by 8 warps"},
        {gemv(8, 1, 8, 2), "decode, large CTAs with a shallow pipeline: fewer registers, more CTAs per SM"},
        {gemv(4, 2, 8, 4), "decode, 2 warps per column along K: twice the warps a 1-token step gives an SM"},
        {gemv(2, 4, 8, 4), "decode, 4 warps per column along K: short, many weight streams"},
        {gemv(8, 2, 8, 2), "decode, 16-warp CTAs: 8 columns x 2 along K, shallow pipeline"},
        {gemv(4, 2, 8, 2), "decode, 2 warps per column along K, shallow: 80 registers, 24 warps per SM"},
        {gemv(2, 4, 8, 2), "decode, 4 warps per column along K, shallow: the most warps a 1-token step gives"},
        {gemv(4, 1, 16, 4), "9-16 rows per expert in one pass: each weight feeds two 8-token MMA tiles"},
        {gemv(8, 1, 16, 4), "9-16 rows per expert, large CTAs"},
    };
    return kCandidates;
  }

  bool routes_small_batches() const override { return true; }
  // With one K split a CTA stages the whole of K.
  bool rounds_fp8_when_staging(const Tactic& t, int) const override { return t.k_split == 1; }

  int smem_bytes(const Tactic& t, const StageShape& shape, int staged_rows, bool routes_itself) const override {
    const int own =
        kernels::gemv_smem_bytes(t.tile_tokens, staged_rows, shape.k_tiles(), t.k_split, t.warps_rows, t.warps_k);
    if (!routes_itself) return own;
    return kernels::small_route_offset(own) +
           kernels::small_route_bytes(shape.layer.num_experts, t.warps_rows * t.warps_k, shape.layer.top_k);
  }

  KernelInstantiation instantiation(const Tactic& t) const override {
    auto kernel = [&](bool fc1) {
      return kernel_expression("expert_gemv_kernel", {kernel_argument(t.warps_rows), kernel_argument(t.warps_k),
                                                      kernel_argument(t.tile_tokens), kernel_argument(fc1),
                                                      kernel_argument(t.batch_records)});
    };
    return {"kernels/expert_gemv.cuh", kernel(true), kernel(false)};
  }

  LaunchGeometry geometry(const Tactic& t, const StageShape& shape, int num_tokens, bool routes_itself,
                          const void*) const override {
    LaunchGeometry g = gemv_style_block(*this, t, shape, num_tokens, routes_itself);
    g.grid = column_group_grid(t, shape, num_tokens);
    return g;
  }

  // The kernel takes the routing's source (a batch routes itself) and its GemvOptions beside its
  // stage's arguments.
  void launch(const ExpertLaunch& l, const kernels::LayerArgs& args, cudaStream_t stream) const override {
    kernels::ExpertGemmArgs stage_args = stage_arguments(l, args);
    int k_split = l.tactic.k_split;
    kernels::RouteInput source = args.source;
    kernels::GemvOptions options = gemv_options(l, args);
    void* params[] = {&stage_args, &k_split, &source, &options};
    launch_kernel(l, params, stream);
  }

 protected:
  std::string why_invalid_on(const Tactic& t, const Arch&) const override { return why_invalid_gemv_cta(t); }
};

}  // namespace

const KernelFamily& gemv_family() {
  static const GemvFamily family;
  return family;
}

}  // namespace mxmoe

// The token-sum GEMV family (expert_gemv.cuh, expert_gemv_token_sum_kernel):
// "gemvsum.r<rows>x8.w<columns>x<warps along K>.u<batch records>.k1". FC2 of a few tokens with the
// weighted un-permute in it: a GEMV CTA a (column group, pair), the top_k CTAs of a token one
// cluster that sums its experts' rows in shared memory, so no un-permute launch follows. For decode.
#include "kernels/expert_gemv.cuh"
#include "kernels/family_registry.hpp"
#include "kernels/gemv_style.hpp"

namespace mxmoe {
namespace {

Tactic gemv_token_sum(int columns, int warps_k, int batch_records) {
  return {.family = &gemv_token_sum_family(),
          .tile_rows = 16 * columns,
          .tile_tokens = 8,
          .warps_rows = columns,
          .warps_k = warps_k,
          .batch_records = batch_records};
}

// A cluster holds at most this many CTAs on every supported arch without opting in to more.
constexpr int kPortableClusterCtas = 8;

class GemvTokenSumFamily final : public KernelFamily {
 public:
  std::string_view prefix() const override { return "gemvsum"; }

  std::span<const NameField> name_fields() const override { return kGemvCtaNameFields; }

  // The decode GEMV's FC2 CTAs (tactics/heuristic.cpp), and a deeper one.
  std::span<const TacticCandidate> candidates() const override {
    static const TacticCandidate kCandidates[] = {
        {gemv_token_sum(4, 2, 2), "1-token FC2: 64 rows per CTA, 2 warps per column along K, 24 warps per SM"},
        {gemv_token_sum(2, 4, 2), "1-token FC2 of few rows: 32 rows per CTA, 4 warps per column along K"},
        {gemv_token_sum(8, 1, 2), "1-token FC2 of many rows: 128 rows per CTA"},
        {gemv_token_sum(4, 2, 4), "1-token FC2, deeper: 4-8 records in flight per lane"},
    };
    return kCandidates;
  }

  // It reads the routing a self-routed batch's FC1 writes, so FC1 may route the batch itself.
  bool routes_small_batches() const override { return true; }
  bool writes_layer_output() const override { return true; }
  bool rounds_fp8_when_staging(const Tactic&, int) const override { return true; }

  int smem_bytes(const Tactic& t, const StageShape& shape, int, bool) const override {
    return kernels::gemv_token_sum_smem_bytes(shape.k_tiles(), t.warps_rows, t.warps_k);
  }

  KernelInstantiation instantiation(const Tactic& t) const override {
    const std::string kernel =
        kernel_expression("expert_gemv_token_sum_kernel", {kernel_argument(t.warps_rows), kernel_argument(t.warps_k),
                                                           kernel_argument(t.batch_records)});
    return {"kernels/expert_gemv.cuh", kernel, kernel};  // FC2's only: named for both stages
  }

  // x = column groups, y = pairs (token-major), one cluster a token's top_k pairs.
  LaunchGeometry geometry(const Tactic& t, const StageShape& shape, int num_tokens, bool, const void*) const override {
    LaunchGeometry g;
    g.staged_rows = 1;
    g.smem_bytes = smem_bytes(t, shape, 1, false);
    g.threads = 32 * t.warps();
    g.grid = dim3(static_cast<unsigned>((shape.row_tiles() + t.warps_rows - 1) / t.warps_rows),
                  static_cast<unsigned>(num_tokens * shape.layer.top_k));
    g.cluster = dim3(1, static_cast<unsigned>(shape.layer.top_k));
    return g;
  }

  void launch(const ExpertLaunch& l, const kernels::LayerArgs& args, cudaStream_t stream) const override {
    kernels::ExpertGemmArgs stage_args = stage_arguments(l, args);
    kernels::GemvOptions options = gemv_options(l, args);
    void* out = args.out;
    void* params[] = {&stage_args, &options, &out};
    launch_kernel(l, params, stream);
  }

 protected:
  std::string why_invalid_on(const Tactic& t, const Arch&) const override {
    if (std::string why = why_invalid_gemv_cta(t); !why.empty()) return why;
    return t.tile_tokens == 8 ? "" : "one staged row a CTA: 8 tokens (one MMA tile)";
  }
  std::string why_invalid_at(const Tactic&, const StageShape& shape) const override {
    if (shape.stage == Stage::kFc1) return "FC2 only: it sums FC2's rows into the layer's output";
    if (shape.layer.top_k > kPortableClusterCtas) {
      return "top-k " + std::to_string(shape.layer.top_k) + ": a token's pairs are one cluster of at most " +
             std::to_string(kPortableClusterCtas) + " CTAs";
    }
    return "";
  }
  std::string_view why_no_k_split() const override { return "a token's experts are summed in one cluster"; }
};

}  // namespace

const KernelFamily& gemv_token_sum_family() {
  static const GemvTokenSumFamily family;
  return family;
}

}  // namespace mxmoe

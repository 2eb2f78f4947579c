// The token-sum GEMV family (expert_gemv.cuh, expert_gemv_token_sum_kernel):
// "gemvsum.r<rows>x8.w<columns>x<warps along K>x<pairs>.u<batch records>.k1". FC2 of a few tokens
// with the weighted un-permute in it: a CTA a column group and <pairs> pairs of a token (a GEMV
// CTA's warps for each), the CTAs of a token one cluster that sums its experts' rows in shared
// memory, so no un-permute launch follows. For decode.
#include "kernels/expert_gemv.cuh"
#include "kernels/family_registry.hpp"
#include "kernels/gemv_style.hpp"

namespace mxmoe {
namespace {

Tactic gemv_token_sum(int columns, int warps_k, int pairs, int batch_records) {
  return {.family = &gemv_token_sum_family(),
          .tile_rows = 16 * columns,
          .tile_tokens = 8,
          .warps_rows = columns,
          .warps_tokens = pairs,
          .warps_k = warps_k,
          .batch_records = batch_records};
}

// Its names: the GEMV's, with the pairs a CTA after the warps along K.
constexpr NameField kNameFields[] = {{".r", &Tactic::tile_rows},     {"x", &Tactic::tile_tokens},
                                     {".w", &Tactic::warps_rows},    {"x", &Tactic::warps_k},
                                     {"x", &Tactic::warps_tokens},   {".u", &Tactic::batch_records},
                                     {".k", &Tactic::k_split}};

// A cluster holds at most this many CTAs on every supported arch without opting in to more.
constexpr int kPortableClusterCtas = 8;

class GemvTokenSumFamily final : public KernelFamily {
 public:
  std::string_view prefix() const override { return "gemvsum"; }

  std::span<const NameField> name_fields() const override { return kNameFields; }

  // The decode GEMV's FC2 CTAs a pair (tactics/heuristic.cpp), a deeper one, and CTAs of several
  // pairs (fewer CTAs a cluster, or a token's whole top-k in one CTA).
  std::span<const TacticCandidate> candidates() const override {
    static const TacticCandidate kCandidates[] = {
        {gemv_token_sum(4, 2, 1, 2), "1-token FC2: 64 rows a pair, 2 warps per column along K, 24 warps per SM"},
        {gemv_token_sum(2, 4, 1, 2), "1-token FC2 of few rows: 32 rows a pair, 4 warps per column along K"},
        {gemv_token_sum(8, 1, 1, 2), "1-token FC2 of many rows: 128 rows a pair"},
        {gemv_token_sum(4, 2, 1, 4), "1-token FC2, deeper: 4-8 records in flight per lane"},
        {gemv_token_sum(1, 4, 2, 2), "two pairs a CTA (top-4: clusters of 2), 16 rows, 4 warps along K"},
        {gemv_token_sum(1, 2, 3, 2), "three pairs a CTA (top-6: clusters of 2), 16 rows, 2 warps along K"},
        {gemv_token_sum(2, 2, 3, 2), "three pairs a CTA (top-6: clusters of 2), 32 rows, 12 warps"},
        {gemv_token_sum(1, 2, 6, 2), "a top-6 token's pairs in one CTA (no cluster), 16 rows, 12 warps"},
        {gemv_token_sum(1, 2, 4, 2), "a top-4 token's pairs in one CTA (no cluster), 16 rows, 8 warps"},
    };
    return kCandidates;
  }

  // It reads the routing a self-routed batch's FC1 writes, so FC1 may route the batch itself.
  bool routes_small_batches() const override { return true; }
  bool writes_layer_output() const override { return true; }
  bool rounds_fp8_when_staging(const Tactic&, int) const override { return true; }

  int smem_bytes(const Tactic& t, const StageShape& shape, int, bool) const override {
    return kernels::gemv_token_sum_smem_bytes(shape.k_tiles(), t.warps_rows, t.warps_k, t.warps_tokens);
  }

  KernelInstantiation instantiation(const Tactic& t) const override {
    const std::string kernel =
        kernel_expression("expert_gemv_token_sum_kernel", {kernel_argument(t.warps_rows), kernel_argument(t.warps_k),
                                                           kernel_argument(t.warps_tokens),
                                                           kernel_argument(t.batch_records)});
    return {"kernels/expert_gemv.cuh", kernel, kernel};  // FC2's only: named for both stages
  }

  // x = column groups, y = groups of pairs (token-major), one cluster a token's.
  LaunchGeometry geometry(const Tactic& t, const StageShape& shape, int num_tokens, bool, const void*) const override {
    LaunchGeometry g;
    g.staged_rows = 1;
    g.smem_bytes = smem_bytes(t, shape, 1, false);
    g.threads = 32 * t.warps();
    g.grid = dim3(static_cast<unsigned>((shape.row_tiles() + t.warps_rows - 1) / t.warps_rows),
                  static_cast<unsigned>(num_tokens * shape.layer.top_k / t.warps_tokens));
    g.cluster = dim3(1, static_cast<unsigned>(shape.layer.top_k / t.warps_tokens));
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
    if (t.tile_tokens != 8) return "one staged row a pair: 8 tokens (one MMA tile)";
    return t.warps_tokens <= kernels::kTokenSumMaxPairs ? "" : "1 to 8 pairs a CTA";
  }
  std::string why_invalid_at(const Tactic& t, const StageShape& shape) const override {
    if (shape.stage == Stage::kFc1) return "FC2 only: it sums FC2's rows into the layer's output";
    const int top_k = shape.layer.top_k;
    if (top_k % t.warps_tokens != 0) {
      return std::to_string(t.warps_tokens) + " pairs a CTA do not divide top-k " + std::to_string(top_k);
    }
    if (top_k / t.warps_tokens > kPortableClusterCtas) {
      return "top-k " + std::to_string(top_k) + ": a token's CTAs are one cluster of at most " +
             std::to_string(kPortableClusterCtas);
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

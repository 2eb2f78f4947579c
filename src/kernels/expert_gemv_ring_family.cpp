// The ring GEMV family (expert_gemv_ring.cuh): "ring.r<rows>x<tokens>.w<columns>.s<slots>.k<split>".
// The GEMV's work with each warp's weights streamed by bulk copies into a shared-memory ring of
// 4-record slots instead of registers.
#include "kernels/expert_gemv_ring.cuh"
#include "kernels/family_registry.hpp"
#include "kernels/gemv_style.hpp"

namespace mxmoe {
namespace {

Tactic ring(int columns, int tokens, int slots) {
  return {.family = &gemv_ring_family(),
          .tile_rows = 16 * columns,
          .tile_tokens = tokens,
          .warps_rows = columns,
          .smem_stages = slots};
}

class RingFamily final : public KernelFamily {
 public:
  std::string_view prefix() const override { return "ring"; }

  std::span<const NameField> name_fields() const override {
    static constexpr NameField kFields[] = {{".r", &Tactic::tile_rows},
                                            {"x", &Tactic::tile_tokens},
                                            {".w", &Tactic::warps_rows},
                                            {".s", &Tactic::smem_stages},
                                            {".k", &Tactic::k_split}};
    return kFields;
  }

  std::span<const TacticCandidate> candidates() const override {
    static const TacticCandidate kCandidates[] = {
        {ring(4, 8, 6), "decode, weights by bulk copy into a 6-slot ring per warp: ~11 KB in flight, no registers"},
        {ring(2, 8, 8), "decode, ring with small CTAs: more CTAs per SM for a 1-token step"},
        {ring(8, 8, 4), "decode, ring with 8-warp CTAs sharing one activation staging"},
        {ring(4, 16, 4), "9-16 rows per expert through the ring"},
    };
    return kCandidates;
  }

  int smem_bytes(const Tactic& t, const StageShape& shape, int staged_rows, bool) const override {
    return kernels::ring_smem_bytes(t.tile_tokens, staged_rows, shape.k_tiles(), t.k_split, t.warps_rows,
                                    t.smem_stages);
  }

  KernelInstantiation instantiation(const Tactic& t) const override {
    auto kernel = [&](bool fc1) {
      return kernel_expression("expert_gemv_ring_kernel",
                               {kernel_argument(t.warps_rows), kernel_argument(t.tile_tokens), kernel_argument(fc1),
                                kernel_argument(t.smem_stages)});
    };
    return {"kernels/expert_gemv_ring.cuh", kernel(true), kernel(false)};
  }

  LaunchGeometry geometry(const Tactic& t, const StageShape& shape, int num_tokens, bool, const void*) const override {
    LaunchGeometry g = gemv_style_block(*this, t, shape, num_tokens, false);
    g.grid = column_group_grid(t, shape, num_tokens);
    return g;
  }

 protected:
  std::string why_invalid_on(const Tactic& t, const Arch&) const override {
    if (std::string why = why_invalid_warps(t); !why.empty()) return why;
    if (!is_record_column_cta(t)) return "a ring GEMV CTA is one 16-row record column per warp over 8 or 16 tokens";
    if (t.smem_stages < 2 || t.smem_stages > 16) return "2 to 16 ring slots per warp";
    return "";
  }
};

}  // namespace

const KernelFamily& gemv_ring_family() {
  static const RingFamily family;
  return family;
}

}  // namespace mxmoe

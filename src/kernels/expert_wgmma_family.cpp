// The Hopper prefill family (expert_wgmma.cuh): "wgmma.r<rows>x<tokens>.w<consumer warps>.s<stages>.k<split>".
// A producer warpgroup feeds a shared-memory ring; consumer warpgroups dequantise the weights into
// registers and multiply them with wgmma. sm_90a only (sm_100a has no wgmma).
#include "device/tensor_map.hpp"
#include "kernels/expert_wgmma.cuh"
#include "kernels/family_registry.hpp"
#include "kernels/kernel_family.hpp"

namespace mxmoe {
namespace {

// A consumer thread's registers (kernels::wgmma_consumer_registers: 240 with two consumer
// warpgroups, 160 with three, 112 with four) hold its fp32 accumulators, two sets of dequantised
// fragments (16 per record of its warp each) and ~32 of addresses and temporaries. Past that ptxas
// serialises the MMAs (C7512; a 256 x 160 tile, 160 accumulators with 2 records a warp, does).
constexpr int kOtherConsumerRegisters = 32;
int consumer_registers_needed(const Tactic& t) {
  const int warp_records = t.tile_rows / t.warps_rows / 16;
  return warp_records * t.tile_tokens / 2 + 2 * 16 * warp_records + kOtherConsumerRegisters;
}

Tactic wgmma(int tile_rows, int tile_tokens, int consumer_warps, int stages) {
  return {.family = &wgmma_family(),
          .tile_rows = tile_rows,
          .tile_tokens = tile_tokens,
          .warps_rows = consumer_warps,
          .smem_stages = stages};
}

class WgmmaFamily final : public KernelFamily {
 public:
  std::string_view prefix() const override { return "wgmma"; }

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
        {wgmma(256, 32, 8, 7), "17-32 rows per expert: streams the weights, 256 rows per staged activation slice, 7-deep ring"},
        {wgmma(256, 32, 16, 6), "17-32 rows per expert, four consumer warpgroups: one record a warp, more warps"},
        {wgmma(128, 64, 8, 6), "33-64 rows per expert: two consumer warpgroups of one 64-row block each"},
        {wgmma(256, 64, 8, 5), "33-64 rows per expert, tall: each staged activation slice feeds 256 rows"},
        {wgmma(256, 64, 16, 6), "33-64 rows per expert, tall, four consumer warpgroups of one 64-row block, 6-deep ring"},
        {wgmma(256, 96, 16, 5), "~64 rows per expert in one tile, four consumer warpgroups (48 accumulators: 112 registers)"},
        {wgmma(256, 96, 16, 6), "~64 rows per expert in one tile, four consumer warpgroups, 6-deep ring"},
        {wgmma(128, 128, 8, 5), "65+ rows per expert: 64 x 128 accumulators per consumer warpgroup"},
        {wgmma(192, 128, 12, 4), "65+ rows per expert: three consumer warpgroups; 192 divides 2880 and 5760"},
        {wgmma(256, 128, 8, 4), "65+ rows per expert: fewest bytes per FLOP (two 64-row blocks per warp)"},
        {wgmma(256, 128, 8, 6), "65+ rows per expert, 6-deep ring for long L2 latency"},
        {wgmma(256, 144, 8, 5), "~128 rows per expert in one tile (a 128-token tile leaves half of them a second)"},
        {wgmma(256, 144, 8, 6), "~128 rows per expert in one tile, 6-deep ring"},
        {wgmma(128, 256, 8, 4), "129+ rows per expert: each dequantised record feeds 256 tokens (half the dequantisation per FLOP)"},
        {wgmma(128, 256, 8, 5), "129+ rows per expert, 5-deep ring"},
    };
    return kCandidates;
  }

  bool reads_sorted_input() const override { return true; }

  int smem_bytes(const Tactic& t, const StageShape&, int, bool) const override {
    return kernels::wgmma_smem_bytes(t.tile_rows, t.tile_tokens, t.smem_stages);
  }
  int smem_limit(const Tactic& t, const Arch&) const override {
    return kernels::wgmma_smem_bytes(t.tile_rows, t.tile_tokens, t.smem_stages);
  }

  // The consumers' setmaxnreg requests are served from what the launch allocates, the kernel's
  // register count for every thread (expert_wgmma.cuh): a kernel given fewer registers than
  // wgmma_launch_registers assumes would leave them waiting forever.
  std::string why_unfit_binary(const Tactic& t, std::span<const int> registers) const override {
    const int assumed = kernels::wgmma_launch_registers(t.warps_rows);
    for (const int r : registers) {
      if (r != assumed) {
        return "ptxas gave a kernel " + std::to_string(r) + " registers a thread where its warpgroups' setmaxnreg " +
               "requests assume a launch of " + std::to_string(assumed);
      }
    }
    return {};
  }

  KernelInstantiation instantiation(const Tactic& t) const override {
    auto kernel = [&](bool fc1) {
      return kernel_expression("expert_wgmma_kernel",
                               {kernel_argument(t.tile_rows), kernel_argument(t.tile_tokens),
                                kernel_argument(t.warps_rows), kernel_argument(t.smem_stages), kernel_argument(fc1)});
    };
    return {"kernels/expert_wgmma.cuh", kernel(true), kernel(false)};
  }

  // x = token-tile slots (an upper bound: pairs / tile_tokens + min(E, pairs); a CTA past the last
  // tile exits) times row blocks of tile_rows, row block fastest; y = K splits.
  LaunchGeometry geometry(const Tactic& t, const StageShape& shape, int num_tokens, bool, const void*) const override {
    const long long pairs = static_cast<long long>(num_tokens) * shape.layer.top_k;
    const long long slots = pairs / t.tile_tokens + std::min<long long>(shape.layer.num_experts, pairs);
    const long long row_blocks = (shape.row_tiles() + t.tile_rows / 16 - 1) / (t.tile_rows / 16);
    const dim3 grid(static_cast<unsigned>(slots * row_blocks), static_cast<unsigned>(t.k_split));
    return {grid, kernels::kWgmmaProducerThreads + 32 * t.warps_rows, smem_bytes(t, shape, t.tile_tokens, false),
            std::min(t.tile_tokens, num_tokens)};
  }

  // The kernel takes (its stage's arguments, the K split, whether its records' scales all take one
  // multiply (LayerArgs::scales_one_multiply), the tensor map of its input's sorted rows,
  // [pairs, K] with boxes of 64 K x kWgmmaBoxTokens rows, and that of its records, E matrices of
  // row tiles of them, boxes of tile_rows / 16 row tiles of one K tile of one expert).
  void launch(const ExpertLaunch& l, const kernels::LayerArgs& args, cudaStream_t stream) const override {
    kernels::ExpertGemmArgs stage_args = stage_arguments(l, args);
    const long long pairs = static_cast<long long>(stage_args.num_tokens) * stage_args.top_k;
    kernels::TensorMap input = bf16_rows_map(stage_args.input, stage_args.k, pairs, kernels::kWgmmaBoxTokens, l.what);
    kernels::TensorMap weights = records_map(stage_args.records, stage_args.num_experts, stage_args.rows / kernels::kRecordRows,
                                             stage_args.k_tiles, l.tactic.tile_rows / kernels::kRecordRows, l.what);
    int k_split = l.tactic.k_split;
    int scales_one_multiply = args.scales_one_multiply[l.stage == Stage::kFc1 ? 0 : 1];
    void* params[] = {&stage_args, &k_split, &scales_one_multiply, &input, &weights};
    launch_kernel(l, params, stream);
  }

 protected:
  std::string why_invalid_on(const Tactic& t, const Arch& arch) const override {
    if (arch.name != "sm_90a") return "wgmma runs on sm_90a only (" + std::string(arch.name) + " has none)";
    if (t.warps_rows != 8 && t.warps_rows != 12 && t.warps_rows != 16) {
      return "8, 12 or 16 consumer warps (2, 3 or 4 warpgroups beside the producer's)";
    }
    if (t.tile_rows % (16 * t.warps_rows) != 0) return "tile rows must split into whole 16-row records per warp";
    if (t.tile_tokens < 32 || kernels::tile_size(kernels::tile_size_index(t.tile_tokens)) != t.tile_tokens)
      return "tile tokens must be 32, 64, 96, 128, 144 or 256 (a wgmma N the routing has tile offsets for)";
    if (const int needed = consumer_registers_needed(t); needed > kernels::wgmma_consumer_registers(t.warps_rows)) {
      return std::to_string(needed) + " registers per consumer thread (accumulators, two fragment sets, " +
             std::to_string(kOtherConsumerRegisters) + " others), " +
             std::to_string(kernels::wgmma_consumer_registers(t.warps_rows)) + " there";
    }
    if (t.smem_stages < 2) return "a ring needs 2 stages";
    return why_over_shared_memory(smem_limit(t, arch), arch);
  }
};

}  // namespace

const KernelFamily& wgmma_family() {
  static const WgmmaFamily family;
  return family;
}

}  // namespace mxmoe

// The candidate expert-kernel binaries and the rules that decide which are valid on an arch.
#include <array>

#include "jit/arch.hpp"
#include "kernels/expert_gemm_args.hpp"
#include "kernels/smem_bytes.hpp"
#include "mxmoe/tactic.hpp"

namespace mxmoe {
namespace {

struct Candidate {
  Tactic tactic;
  const char* reason;
};

constexpr KernelFamily kGemv = KernelFamily::kGemv;
constexpr KernelFamily kMma = KernelFamily::kMmaTile;
constexpr KernelFamily kRing = KernelFamily::kGemvRing;
constexpr KernelFamily kFused = KernelFamily::kFused;
constexpr KernelFamily kStreamK = KernelFamily::kGemvStreamK;

// Budgets per thread: accumulators (fp32) and dequantised weight fragments (bf16x2), each at most
// 64 registers, so that a CTA of 8 warps keeps two CTAs' worth of registers per SM free of spills.
constexpr int kMaxAccumulators = 64;
constexpr int kMaxFragmentRegisters = 64;

const std::array<Candidate, 36> kCandidates{{
    {{kRing, 64, 8, 4, 1, 6, 1}, "decode, weights by bulk copy into a 6-slot ring per warp: ~11 KB in flight, no registers"},
    {{kRing, 32, 8, 2, 1, 8, 1}, "decode, ring with small CTAs: more CTAs per SM for a 1-token step"},
    {{kRing, 128, 8, 8, 1, 4, 1}, "decode, ring with 8-warp CTAs sharing one activation staging"},
    {{kRing, 64, 16, 4, 1, 4, 1}, "9-16 rows per expert through the ring"},
    {{kGemv, 64, 8, 4, 1, 4, 1}, "decode default: 64 rows per CTA, 4-8 records (2-4 KB per warp) in flight"},
    {{kGemv, 64, 8, 4, 1, 8, 1}, "decode, deeper: 8-16 records in flight per lane, for more bytes in flight per SM"},
    {{kGemv, 32, 8, 2, 1, 8, 1}, "decode, small CTAs: twice the CTAs, for the few experts a 1-token step touches"},
    {{kGemv, 128, 8, 8, 1, 4, 1}, "decode, large CTAs: the staged activations shared by 8 warps"},
    {{kGemv, 128, 8, 8, 1, 2, 1}, "decode, large CTAs with a shallow pipeline: fewer registers, more CTAs per SM"},
    {{kGemv, 64, 8, 4, 2, 4, 1}, "decode, 2 warps per column along K: twice the warps a 1-token step gives an SM"},
    {{kGemv, 32, 8, 2, 4, 4, 1}, "decode, 4 warps per column along K: short, many weight streams"},
    {{kGemv, 128, 8, 8, 2, 2, 1}, "decode, 16-warp CTAs: 8 columns x 2 along K, shallow pipeline"},
    {{kGemv, 64, 8, 4, 2, 2, 1}, "decode, 2 warps per column along K, shallow: 80 registers, 24 warps per SM"},
    {{kGemv, 32, 8, 2, 4, 2, 1}, "decode, 4 warps per column along K, shallow: the most warps a 1-token step gives"},
    {{kGemv, 64, 16, 4, 1, 4, 1}, "9-16 rows per expert in one pass: each weight feeds two 8-token MMA tiles"},
    {{kGemv, 128, 16, 8, 1, 4, 1}, "9-16 rows per expert, large CTAs"},
    {{kFused, 64, 8, 4, 2, 2, 1}, "decode, whole layer in one launch: FC2's stream starts in FC1's tail, no kernel boundaries"},
    {{kFused, 32, 8, 2, 4, 2, 1}, "whole layer in one launch, small items: a short tail for a 1-2 token step"},
    {{kFused, 128, 8, 8, 1, 2, 1}, "whole layer in one launch, 8-column items: the staged activations shared by 8 warps"},
    {{kFused, 64, 8, 4, 1, 4, 1}, "whole layer in one launch, deeper per-warp pipeline"},
    {{kFused, 128, 16, 8, 1, 4, 1}, "whole layer in one launch for 9-16 rows per expert: FC2 items fill FC1's last wave"},
    {{kStreamK, 384, 8, 24, 1, 2, 1}, "decode over several waves: one 24-warp CTA per SM, equal shares, no last partial wave"},
    {{kStreamK, 320, 8, 20, 1, 2, 1}, "stream-K with 20-column groups: FC2's 180 row tiles in 9 whole groups"},
    {{kStreamK, 384, 16, 24, 1, 2, 1}, "stream-K for 9-16 rows per expert: each weight feeds two 8-token MMA tiles"},
    {{kStreamK, 320, 16, 20, 1, 2, 1}, "stream-K for 9-16 rows per expert, 20 warps: 88 registers, no spills"},
    {{kMma, 64, 16, 4, 1, 4, 1}, "small tile, half height: twice the CTAs of r128 for 9-16 rows per expert"},
    {{kMma, 128, 16, 4, 1, 4, 1}, "small tile: 9-16 rows per expert"},
    {{kMma, 128, 32, 4, 1, 4, 1}, "small tile: 17-32 rows per expert"},
    {{kMma, 128, 64, 2, 2, 3, 1}, "large tile: 33-64 rows per expert"},
    {{kMma, 128, 64, 4, 2, 3, 1}, "large tile, 8 warps: more warps to hide the dequantisation"},
    {{kMma, 128, 128, 2, 4, 3, 1}, "prefill: 65+ rows per expert"},
    {{kMma, 128, 128, 4, 2, 3, 1}, "prefill, taller warp tiles: each dequantised record feeds 8 MMA tiles"},
    {{kMma, 256, 64, 4, 2, 3, 1}, "prefill, tall tile: each staged activation slice feeds 256 weight rows"},
    {{kMma, 128, 128, 2, 4, 4, 1}, "prefill, 4-deep pipeline"},
    {{kMma, 128, 128, 2, 4, 5, 1}, "prefill, 5-deep pipeline for long DRAM latency"},
    {{kMma, 256, 128, 4, 2, 3, 1}, "prefill, 256 x 128 tile: fewest re-reads of weights and activations"},
}};

// Empty when `t` can run on `arch`; otherwise the first rule it breaks.
std::string why_invalid(const Tactic& t, const Arch& arch) {
  if (t.family == KernelFamily::kGemvStreamK) {
    if ((t.tile_tokens != 8 && t.tile_tokens != 16) || t.warps_tokens != 1 || t.warps_rows < 1 ||
        t.tile_rows != 16 * t.warps_rows) {
      return "a stream-K GEMV CTA is one 16-row record column per warp over 8 or 16 tokens";
    }
    if (32 * t.warps_rows > kernels::kMaxStreamThreads) {
      return "at most " + std::to_string(kernels::kMaxStreamThreads / 32) + " warps per stream-K CTA";
    }
    if (t.stages < 1 || t.stages > 16) return "1 to 16 records in flight per lane";
    return "";
  }
  if (t.warps_rows < 1 || t.warps_tokens < 1 || t.warps() > 16) return "1 to 16 warps per CTA";
  if (t.family == KernelFamily::kGemvRing) {
    if ((t.tile_tokens != 8 && t.tile_tokens != 16) || t.warps_tokens != 1 || t.tile_rows != 16 * t.warps_rows) {
      return "a ring GEMV CTA is one 16-row record column per warp over 8 or 16 tokens";
    }
    if (t.stages < 2 || t.stages > 16) return "2 to 16 ring slots per warp";
    return "";
  }
  if (t.family == KernelFamily::kGemv || t.family == KernelFamily::kFused) {
    if ((t.tile_tokens != 8 && t.tile_tokens != 16) || t.tile_rows != 16 * t.warps_rows) {
      return "a GEMV CTA is 16-row record columns (one per warp along rows) over 8 or 16 tokens";
    }
    if (t.warps_tokens != 1 && t.warps_tokens != 2 && t.warps_tokens != 4) return "1, 2 or 4 warps along K";
    if (t.stages < 1 || t.stages > 16) return "1 to 16 records in flight per lane";
    return "";
  }
  if (t.tile_rows % (16 * t.warps_rows) != 0) return "tile rows must split into whole 16-row records per warp";
  if (t.tile_tokens % (8 * t.warps_tokens) != 0) return "tile tokens must split into whole 8-token MMA tiles per warp";
  const int records = t.tile_rows / t.warps_rows / 16, token_tiles = t.tile_tokens / t.warps_tokens / 8;
  if (records * token_tiles * 4 > kMaxAccumulators) {
    return std::to_string(records * token_tiles * 4) + " accumulators per thread (budget " +
           std::to_string(kMaxAccumulators) + ")";
  }
  if (records * 16 > kMaxFragmentRegisters) return "too many dequantised fragment registers per thread";
  if (t.stages < 2) return "a cp.async pipeline needs 2 stages";
  const int smem = kernels::mma_tile_smem_bytes(t.tile_rows, t.tile_tokens, t.stages);
  if (smem > arch.smem_per_block) {
    return std::to_string(smem) + " bytes of shared memory (" + std::string(arch.name) + " allows " +
           std::to_string(arch.smem_per_block) + ")";
  }
  return "";
}

}  // namespace

std::vector<TacticEntry> tactic_table(std::string_view arch_name) {
  const Arch& arch = arch_by_name(arch_name);
  std::vector<TacticEntry> table;
  for (const auto& c : kCandidates) table.push_back({c.tactic, c.reason, why_invalid(c.tactic, arch)});
  return table;
}

const std::vector<Tactic>& valid_tactics(std::string_view arch) {
  static const std::vector<std::vector<Tactic>> per_arch = [] {
    std::vector<std::vector<Tactic>> all;
    for (const Arch& a : supported_archs()) {
      std::vector<Tactic> valid;
      for (const auto& c : kCandidates) {
        if (why_invalid(c.tactic, a).empty()) valid.push_back(c.tactic);
      }
      all.push_back(std::move(valid));
    }
    return all;
  }();
  return per_arch[&arch_by_name(arch) - supported_archs().data()];
}

}  // namespace mxmoe

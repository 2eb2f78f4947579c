// A tactic is everything that changes an expert-GEMM kernel's binary or launch: the family, the
// CTA tile, the warp layout, the pipeline depth, and the K split. A layer plan is the pair of
// tactics for FC1 (with the SwiGLU epilogue) and FC2.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace mxmoe {

enum class KernelFamily {
  kGemv,     // weights streamed global -> registers, <= 8 rows per expert per pass (decode)
  kMmaTile,  // weights and activations staged through a cp.async pipeline, tiles of 16-128 rows
  kGemvRing, // as kGemv, the weights streamed into a shared-memory ring by bulk copies
  kFused,    // the GEMV's CTAs running FC1, FC2 and the un-permute as one launch (a plan's both stages)
  kGemvStreamK,  // as kGemv, one CTA per SM, each taking an equal share of the layer's records (stream-K)
};

enum class Stage { kFc1, kFc2 };

struct Tactic {
  KernelFamily family = KernelFamily::kGemv;
  int tile_rows = 64;     // weight rows per CTA (multiple of 16)
  int tile_tokens = 8;    // sorted rows (token copies) per CTA tile
  int warps_rows = 4;     // warp grid over the CTA tile
  int warps_tokens = 1;
  int stages = 4;         // GEMV: records per register batch; tiled: cp.async stages; ring: ring slots
  int k_split = 1;        // K split into this many partial sums (FC2 only); a launch parameter

  int warps() const { return warps_rows * warps_tokens; }
  // "gemv.r64x8.w4x1.u4.k1", "mma.r128x32.w4x1.s4.k1", "ring.r64x8.w4.s6.k1", "fused.r64x8.w4x2.u2.k1",
  // "sk.r384x8.w24.u2.k1"
  std::string name() const;
  // The tactic with k_split = 1: what the compiled binary depends on.
  Tactic binary() const;
  bool operator==(const Tactic&) const = default;
};

// Parses name(); throws Error naming the malformed part.
Tactic parse_tactic(std::string_view name);

// A fused tactic is a whole-layer plan: it must be both stages' (k_split 1).
struct LayerPlan {
  Tactic fc1;
  Tactic fc2;
  bool fused() const { return fc1.family == KernelFamily::kFused; }
};

// Whether a layer of `num_tokens` tokens at top-k `top_k` may run with no routing launch, its
// expert kernels routing the batch themselves: a plan of two GEMV tactics and a batch small enough
// for one warp to permute (32 pairs: T <= 8 at top-4). MoeRunner::routes_in_expert_kernels decides.
bool can_route_in_expert_kernels(const LayerPlan& plan, int num_tokens, int top_k);

inline constexpr int kMaxKSplit = 4;

// The tactic table of an arch ("sm_90a", "sm_100a", "sm_120a", "sm_121a"): every candidate binary
// with the reason it exists, and whether it is valid there; an invalid one says why (its tile does
// not split into warps, its accumulators or shared memory exceed the budget).
struct TacticEntry {
  Tactic tactic;        // k_split = 1
  std::string reason;   // why the candidate exists
  std::string invalid;  // empty when valid on the arch
};
std::vector<TacticEntry> tactic_table(std::string_view arch);
// The valid ones, built once per arch (forward() checks plans against them on every call).
const std::vector<Tactic>& valid_tactics(std::string_view arch);

}  // namespace mxmoe

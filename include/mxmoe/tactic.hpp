// A tactic is everything that changes an expert-GEMM kernel's binary or launch: its kernel family
// and the family's parameters. A layer plan is the pair of tactics for FC1 (with the SwiGLU
// epilogue) and FC2. The families are listed in docs/tactics.md.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "mxmoe/mx_format.hpp"

namespace mxmoe {

enum class Stage { kFc1, kFc2 };

// One kind of expert-GEMM kernel and all the host knows of it (the library's src/kernels/
// kernel_family.hpp); each family is one object, so a tactic's family is compared by address.
class KernelFamily;

// Each field means one thing in every family that has it; a family's names spell only its own
// fields, and the others keep the defaults below.
struct Tactic {
  // The kernel family, set once where the tactic is made: by parse_tactic, the tactic table and
  // the heuristic. Its prefix begins the name: "gemv", "gemvsum", "sk", "ring", "fused", "mma", "wgmma",
  // "bsmma". A tactic without one (made by hand) has no name, plan or launch: those throw Error.
  const KernelFamily* family = nullptr;
  int tile_rows = 0;       // weight rows per CTA tile: whole 16-row records
  int tile_tokens = 0;     // sorted token rows per tile (per pass of the GEMV-style families)
  int warps_rows = 1;      // warps along the weight rows
  int warps_tokens = 1;    // warps along the tokens ("mma": its warp grid is warps_rows x warps_tokens;
                           // "gemvsum": the pairs a CTA, a group of warps_rows x warps_k warps each)
  int warps_k = 1;         // warps sharing a record column, each over a contiguous part of K
  int batch_records = 0;   // records per lane in one register batch, two batches in flight
  int smem_stages = 0;     // stages of a shared-memory pipeline ("mma": cp.async stages; "ring": slots)
  int k_split = 1;         // FC2's K cut into this many partial sums, added by the un-permute

  int warps() const { return warps_rows * warps_tokens * warps_k; }
  // "gemv.r64x8.w4x2.u2.k1", "sk.r384x8.w24.u2.k1", "ring.r64x8.w4.s6.k1", "fused.r64x8.w4x2.u2.k1",
  // "mma.r128x32.w4x1.s4.k1"; throws Error for a tactic without a family.
  std::string name() const;
  // The tactic with k_split = 1: what the compiled binary depends on (the split is a launch
  // parameter).
  Tactic binary() const;
  bool operator==(const Tactic&) const = default;
};

// Parses name(); throws Error naming the malformed part.
Tactic parse_tactic(std::string_view name);

// The activations `t`'s family takes (bf16 for every family but the block-scaled "bsmma").
ActivationFormat activations_of(const Tactic& t);

struct LayerPlan {
  Tactic fc1;
  Tactic fc2;
  // FC1's and FC2's input: bf16, or MXFP8 (E4M3 with an E8M0 scale per 32 along K), which costs
  // accuracy (~5e-2 by norm at the gpt-oss shapes, docs/block-scaled.md) and so is the caller's
  // choice (RunnerOptions::activations). Both tactics' families must take it (validate_plan).
  ActivationFormat activations = ActivationFormat::kBf16;
  // A whole-layer tactic's one launch runs FC1, FC2 and the un-permute: it is both stages'
  // tactic, with k_split 1 (validate_plan).
  bool whole_layer() const;
  bool operator==(const LayerPlan&) const = default;
};

// Whether a layer of `num_tokens` tokens at top-k `top_k` may run with no routing launch, FC1
// routing the batch itself for the whole layer: both tactics' families can, and the batch is small
// enough for one warp to permute (32 pairs: T <= 8 at top-4). MoeRunner::routes_in_expert_kernels
// decides, from this and the device.
bool can_route_in_expert_kernels(const LayerPlan& plan, int num_tokens, int top_k);

inline constexpr int kMaxKSplit = 4;

// The tactic table of an arch ("sm_90a", "sm_100a", "sm_120a", "sm_121a"): every family's
// candidate binaries with the reason each exists, and whether it is valid there; an invalid one
// says why (its tile does not split into warps, its accumulators or shared memory exceed the
// budget).
struct TacticEntry {
  Tactic tactic;        // k_split = 1
  std::string reason;   // why the candidate exists
  std::string invalid;  // empty when valid on the arch
};
std::vector<TacticEntry> tactic_table(std::string_view arch);
// The valid ones, built once per arch.
const std::vector<Tactic>& valid_tactics(std::string_view arch);

}  // namespace mxmoe

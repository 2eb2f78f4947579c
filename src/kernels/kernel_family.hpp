// A kernel family: one kind of expert-GEMM kernel (its device source, src/kernels/<name>.cuh) and
// everything the host knows about it, in one unit beside that source
// (src/kernels/<name>_family.cpp): how its tactics' names are spelled, the candidates it gives the
// tactic table, the rules that make a tactic invalid on an arch or a shape, its shared memory and
// grid for a launch, its NVRTC instantiation, and its launch. The registry (family_registry.hpp)
// lists the families; the tactic table, the heuristic, the tuner, the JIT and the runner ask them
// and never switch on one.
#pragma once

#include <cuda_runtime.h>

#include <initializer_list>
#include <span>
#include <string>
#include <string_view>

#include "device/arch.hpp"
#include "kernels/expert_gemm_args.hpp"
#include "mxmoe/moe_shape.hpp"
#include "mxmoe/mx_format.hpp"
#include "mxmoe/tactic.hpp"

namespace mxmoe {

// One stage of a layer, as its expert kernels see it.
struct StageShape {
  MoeShape layer;
  Stage stage;

  int rows() const { return stage == Stage::kFc1 ? layer.fc1_rows() : layer.hidden; }  // weight rows
  int k() const { return stage == Stage::kFc1 ? layer.hidden : layer.intermediate; }   // the reduction
  int k_tiles() const { return (k() + 63) / 64; }                                      // records along K
  int row_tiles() const { return rows() / 16; }                                        // records along rows
};

// A field of a tactic's name after the family's prefix: its separator and the Tactic member it
// spells ("gemv" ".r" tile_rows "x" tile_tokens ".w" warps_rows "x" warps_k ".u" batch_records
// ".k" k_split).
struct NameField {
  std::string_view separator;
  int Tactic::*field;
};

struct TacticCandidate {
  Tactic tactic;            // k_split 1
  std::string_view reason;  // why it is in the table
};

// What NVRTC compiles for a tactic: the kernel header, and FC1's and FC2's kernel name expressions
// ("&mxmoe::kernels::expert_gemv_kernel<4, 2, 8, true, 2>"). A whole-layer family names its one
// kernel twice.
struct KernelInstantiation {
  std::string header;
  std::string fc1, fc2;
};
// "&mxmoe::kernels::<kernel><a, b, ...>".
std::string kernel_expression(std::string_view kernel, std::initializer_list<std::string> template_arguments);
std::string kernel_argument(bool value);
std::string kernel_argument(int value);

// One launch of a tactic: its grid, block and dynamic shared memory, and the token rows each CTA
// stages (ExpertGemmArgs::staged_rows).
struct LaunchGeometry {
  dim3 grid;
  int threads = 0;
  int smem_bytes = 0;
  int staged_rows = 0;
  dim3 cluster = dim3(1, 1, 1);  // CTAs a cluster
};

// Empty when `t`'s CTA has 1 to 16 warps (the limit of every family but the stream-K GEMV).
inline std::string why_invalid_warps(const Tactic& t) {
  return t.warps_rows < 1 || t.warps_tokens < 1 || t.warps_k < 1 || t.warps() > 16 ? "1 to 16 warps per CTA" : "";
}

// Empty when `bytes` of dynamic shared memory fit `arch`'s opt-in limit (the tiled families'
// rule on a tactic's whole ring).
inline std::string why_over_shared_memory(int bytes, const Arch& arch) {
  if (bytes <= arch.smem_per_block) return "";
  return std::to_string(bytes) + " bytes of shared memory (" + std::string(arch.name) + " allows " +
         std::to_string(arch.smem_per_block) + ")";
}

// One expert-kernel launch of a prepared plan (runner/launch_plan.hpp makes them).
struct ExpertLaunch {
  Stage stage = Stage::kFc1;  // the stage whose arguments it takes (a whole-layer launch: FC1, and all)
  Tactic tactic;              // tactic.family launches it
  const void* kernel = nullptr;  // the loaded cudaKernel_t of that stage
  LaunchGeometry geometry;
  std::string what;  // "FC1 gemv.r64x8.w4x2.u2.k1 launch": names it in errors
};

class KernelFamily {
 public:
  virtual ~KernelFamily() = default;

  // Names are the prefix, then each field: Tactic::name and parse_tactic spell every family so.
  virtual std::string_view prefix() const = 0;
  virtual std::span<const NameField> name_fields() const = 0;

  // The family's entries in the tactic table, in the order the tuner tries them.
  virtual std::span<const TacticCandidate> candidates() const = 0;

  // Empty when `t` can run on `arch` and, given a stage shape, as that stage's tactic on it (its K
  // split, and its shared memory at the shape's K with a full token tile); else the first rule it
  // breaks. The stage-independent plan rules (FC1 takes no K split, a whole-layer tactic is both
  // stages') are validate_plan's.
  std::string why_invalid(const Tactic& t, const Arch& arch, const StageShape* shape = nullptr) const;

  // Whether a plan of it runs FC1, FC2 and the un-permute in one launch.
  virtual bool whole_layer() const { return false; }
  // Whether its FC2 launch writes the layer's output (the weighted un-permute in its kernel), so
  // that no un-permute launch follows it.
  virtual bool writes_layer_output() const { return whole_layer(); }
  // Whether its kernels may route a batch of at most kSmallBatchPairs pairs themselves, from the
  // router logits (expert_gemm.cuh, route_small_batch_in_cta), with no routing launch before them.
  virtual bool routes_small_batches() const { return false; }

  // The activations its kernels take (FC1's input and FC2's): a plan's activations must be both
  // stages' families' (validate_plan).
  virtual ActivationFormat activations() const { return ActivationFormat::kBf16; }

  // Empty when its kernels can run `stage` of a plan with FP8 activations (ActivationFormat::kFp8);
  // else why not. By default a bf16 family's per-stage launches can (the runner rounds their input
  // rows to FP8 values between the launches), a whole-layer launch cannot, and neither can a
  // family of another format.
  virtual std::string why_no_fp8(const Tactic& t, Stage stage) const;
  // Whether its kernels, given LayerArgs::rounds_staged_fp8, round the token rows they stage to FP8
  // values themselves for a batch of `num_tokens`, so that a plan of FP8 activations needs no
  // rounding launch before the stage (the GEMV-style kernels, whose CTAs stage whole 128-blocks of K).
  virtual bool rounds_fp8_when_staging(const Tactic&, int /*num_tokens*/) const { return false; }

  // Whether its FC1 reads x gathered into sorted-row order (a gather launch after the routing
  // writes it), so that a token tile's rows are one block of the input.
  virtual bool reads_sorted_input() const { return false; }

  // Dynamic shared memory of a launch on `shape` that stages `staged_rows` token rows.
  virtual int smem_bytes(const Tactic& t, const StageShape& shape, int staged_rows, bool routes_itself) const = 0;
  // The most any launch of its kernels asks, which they are allowed when loaded. No expert kernel
  // has static shared memory, so by default the arch's whole opt-in amount.
  virtual int smem_limit(const Tactic& t, const Arch& arch) const;

  virtual KernelInstantiation instantiation(const Tactic& t) const = 0;

  // Empty when its assembled kernels, given the registers per thread ptxas gave each (FC1, FC2),
  // can run as its launches assume; else why not. By default any count can (the launch allocates
  // what the kernel uses).
  virtual std::string why_unfit_binary(const Tactic&, std::span<const int> /*registers*/) const { return {}; }

  // The launch of `t` on `shape` for `num_tokens` tokens; `kernel` is the loaded kernel of that
  // stage, for families whose grid is the count the device holds at once. A grid made for a count
  // serves any smaller batch too: CTAs past a batch's work find none and exit.
  virtual LaunchGeometry geometry(const Tactic& t, const StageShape& shape, int num_tokens, bool routes_itself,
                                  const void* kernel) const = 0;

  // Launches it on `stream`. By default a per-stage kernel taking (its stage's ExpertGemmArgs, the
  // K split); a whole-layer family passes the layer's arguments.
  virtual void launch(const ExpertLaunch& launch, const kernels::LayerArgs& args, cudaStream_t stream) const;

 protected:
  // A per-stage launch's arguments: its stage's, with the launch's staged rows.
  static kernels::ExpertGemmArgs stage_arguments(const ExpertLaunch& launch, const kernels::LayerArgs& args);
  // The launch's kernel on its grid, block and shared memory, with `params` (launch_programmatic).
  static void launch_kernel(const ExpertLaunch& launch, void** params, cudaStream_t stream);

  // The family's own rules on `t` and `arch`: empty when it may run there.
  virtual std::string why_invalid_on(const Tactic& t, const Arch& arch) const = 0;
  // Its rules on `t` as the tactic of `shape`'s stage beyond the shared ones (the K split, the
  // shared memory): empty when it may run it.
  virtual std::string why_invalid_at(const Tactic&, const StageShape&) const { return {}; }
  // Why the family takes no K split; empty when it does (FC2's partial sums added by the un-permute).
  virtual std::string_view why_no_k_split() const { return {}; }
};

}  // namespace mxmoe

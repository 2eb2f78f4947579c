#include "kernels/kernel_family.hpp"

#include <algorithm>

#include "device/cuda_check.hpp"

namespace mxmoe {

std::string kernel_expression(std::string_view kernel, std::initializer_list<std::string> template_arguments) {
  std::string e = "&mxmoe::kernels::" + std::string(kernel) + "<";
  for (const std::string& a : template_arguments) e += (e.back() == '<' ? "" : ", ") + a;
  return e + ">";
}

std::string kernel_argument(bool value) { return value ? "true" : "false"; }
std::string kernel_argument(int value) { return std::to_string(value); }

namespace {

struct FieldName {
  int Tactic::*field;
  std::string_view name;
};
constexpr FieldName kFieldNames[] = {{&Tactic::tile_rows, "tile_rows"},     {&Tactic::tile_tokens, "tile_tokens"},
                                     {&Tactic::warps_rows, "warps_rows"},   {&Tactic::warps_tokens, "warps_tokens"},
                                     {&Tactic::warps_k, "warps_k"},         {&Tactic::batch_records, "batch_records"},
                                     {&Tactic::smem_stages, "smem_stages"}, {&Tactic::k_split, "k_split"}};

}  // namespace

std::string KernelFamily::why_invalid(const Tactic& t, const Arch& arch, const StageShape* shape) const {
  if (t.family != this) return "not a '" + std::string(prefix()) + "' tactic";
  // Fields its names do not spell keep their defaults, so that a name stands for one tactic.
  const Tactic defaults;
  const auto fields = name_fields();
  for (const auto& [field, name] : kFieldNames) {
    const bool spelled =
        std::any_of(fields.begin(), fields.end(), [&](const NameField& f) { return f.field == field; });
    if (!spelled && t.*field != defaults.*field) {
      return std::string(name) + " must keep its default (" + std::to_string(defaults.*field) + "): '" +
             std::string(prefix()) + "' names do not spell it";
    }
  }
  if (std::string why = why_invalid_on(t, arch); !why.empty()) return why;
  if (!shape) return t.k_split == 1 ? "" : "a table entry has k_split 1 (the split is a launch parameter)";
  if (std::string why = why_invalid_at(t, *shape); !why.empty()) return why;
  const bool splits = shape->stage == Stage::kFc2 && why_no_k_split().empty();
  const int max_split = splits ? std::min(kMaxKSplit, shape->k_tiles()) : 1;
  if (t.k_split < 1 || t.k_split > max_split) {
    return "k_split must be in [1, " + std::to_string(max_split) + "]" +
           (!why_no_k_split().empty()     ? " (" + std::string(why_no_k_split()) + ")"
            : shape->stage == Stage::kFc1 ? std::string(" (FC1's SwiGLU needs whole sums)")
                                          : std::string());
  }
  if (smem_bytes(t, *shape, t.tile_tokens, routes_small_batches()) > arch.smem_per_block) {
    return "K = " + std::to_string(shape->k_tiles() * 64) + " needs more shared memory than " + std::string(arch.name) +
           " has; use a K split or a tiled tactic";
  }
  return "";
}

int KernelFamily::smem_limit(const Tactic&, const Arch& arch) const { return arch.smem_per_block; }

std::string KernelFamily::why_no_fp8(const Tactic&, Stage) const {
  if (activations() != ActivationFormat::kBf16) {
    return "takes " + std::string(activation_format_name(activations())) + " activations";
  }
  return whole_layer() ? "a whole-layer launch cannot round FC1's output between its stages" : "";
}

kernels::ExpertGemmArgs KernelFamily::stage_arguments(const ExpertLaunch& l, const kernels::LayerArgs& args) {
  kernels::ExpertGemmArgs stage_args = l.stage == Stage::kFc1 ? args.fc1 : args.fc2;
  stage_args.staged_rows = l.geometry.staged_rows;
  return stage_args;
}

void KernelFamily::launch_kernel(const ExpertLaunch& l, void** params, cudaStream_t stream) {
  launch_programmatic(l.kernel, l.geometry.grid, dim3(l.geometry.threads), params,
                      static_cast<size_t>(l.geometry.smem_bytes), stream, l.what, l.geometry.cluster);
}

void KernelFamily::launch(const ExpertLaunch& l, const kernels::LayerArgs& args, cudaStream_t stream) const {
  kernels::ExpertGemmArgs stage_args = stage_arguments(l, args);
  int k_split = l.tactic.k_split;
  void* params[] = {&stage_args, &k_split};
  launch_kernel(l, params, stream);
}

}  // namespace mxmoe

#include "mxmoe/moe_shape.hpp"

#include <array>

#include "mxmoe/error.hpp"
#include "mxmoe/mx_format.hpp"

namespace mxmoe {
namespace {

// gpt-oss config.json: hidden_size 2880, intermediate_size 2880, experts_per_token 4;
// gpt-oss-120b: num_experts 128, num_hidden_layers 36; gpt-oss-20b: 32 experts, 24 layers.
// DeepSeek-V4 config.json (transformers' DeepseekV4Config defaults are Flash's): hidden_size,
// moe_intermediate_size, n_routed_experts, num_experts_per_tok, num_hidden_layers, routed_scaling_factor,
// swiglu_limit 10. The spec is the score layers'; the first three (hash-routed) layers are the same
// experts routed by the caller (RouterKind::kCallerTopK).
constexpr std::array<ModelPreset, 4> kPresets{{
    {"gpt-oss-20b", MoeShape{32, 4, 2880, 2880, 24}},
    {"gpt-oss-120b", MoeShape{128, 4, 2880, 2880, 36}},
    {"deepseek-v4-flash", MoeShape{256, 6, 4096, 2048, 43, deepseek_v4_spec(1.5f)}},
    {"deepseek-v4-pro", MoeShape{384, 6, 7168, 3072, 61, deepseek_v4_spec(2.5f)}},
}};

size_t mxfp4_matrix_bytes(size_t rows, size_t cols) { return rows * cols / 2 + rows * cols / kMxBlock; }

}  // namespace

size_t MoeShape::fc1_bytes_per_expert() const {
  return mxfp4_matrix_bytes(fc1_rows(), hidden) + (spec.expert_biases ? static_cast<size_t>(fc1_rows()) * 2 : 0);
}

size_t MoeShape::fc2_bytes_per_expert() const {
  return mxfp4_matrix_bytes(hidden, intermediate) + (spec.expert_biases ? static_cast<size_t>(hidden) * 2 : 0);
}

void MoeShape::validate() const {
  auto fail = [&](const std::string& what) { throw Error("MoE shape " + describe() + ": " + what); };
  if (num_experts < 1) fail("num_experts must be at least 1");
  if (top_k < 1 || top_k > num_experts || top_k > kMaxTopK) {
    fail("top_k must be in [1, min(num_experts, " + std::to_string(kMaxTopK) + ")]");
  }
  if (hidden < kMxBlock || hidden % kMxBlock != 0) fail("hidden must be a positive multiple of 32");
  if (intermediate < kMxBlock || intermediate % kMxBlock != 0) fail("intermediate must be a positive multiple of 32");
  // Keeps every element count of a layer inside int64 and every per-expert count inside int32.
  if (hidden > (1 << 16) || intermediate > (1 << 16) || num_experts > (1 << 12)) {
    fail("hidden and intermediate must be at most 65536 and num_experts at most 4096");
  }
  if (num_layers < 1) fail("num_layers must be at least 1");
  spec.validate();
}

std::string MoeShape::describe() const {
  std::string text = "E=" + std::to_string(num_experts) + " k=" + std::to_string(top_k) +
                     " H=" + std::to_string(hidden) + " I=" + std::to_string(intermediate);
  if (spec != LayerSpec{}) text.append(" ").append(spec.describe());
  return text;
}

std::span<const ModelPreset> model_presets() { return kPresets; }

MoeShape model_shape(std::string_view name) {
  std::string known;
  for (const auto& preset : kPresets) {
    if (preset.name == name) return preset.shape;
    known += (known.empty() ? "" : ", ") + std::string(preset.name);
  }
  throw Error("unknown model '" + std::string(name) + "' (known: " + known + ")");
}

}  // namespace mxmoe

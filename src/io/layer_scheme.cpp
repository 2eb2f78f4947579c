// Which naming scheme a checkpoint holds a layer under, and loading the layer by that scheme's reader.
#include <array>

#include "common/printable.hpp"
#include "io/deepseek_v4_names.hpp"
#include "io/gpt_oss_names.hpp"
#include "mxmoe/checkpoint.hpp"
#include "mxmoe/error.hpp"

namespace mxmoe {
namespace {

constexpr std::array<std::pair<CheckpointScheme, std::string_view>, 4> kSchemeNames{{
    {CheckpointScheme::kOpenAi, "openai"},
    {CheckpointScheme::kHuggingFace, "hf"},
    {CheckpointScheme::kDeepSeek, "deepseek"},
    {CheckpointScheme::kDeepSeekHuggingFace, "deepseek-hf"},
}};

bool is_deepseek(CheckpointScheme scheme) {
  return scheme == CheckpointScheme::kDeepSeek || scheme == CheckpointScheme::kDeepSeekHuggingFace;
}

// The tensor whose presence says that the checkpoint holds layer `layer` under `scheme`'s names.
std::string layer_marker(CheckpointScheme scheme, int layer) {
  return is_deepseek(scheme) ? deepseek_v4_layer_names(scheme, layer).marker : layer_tensor_names(scheme, layer).fc1_blocks;
}

// "none", or the layers 0-N the checkpoint holds under `scheme`'s names.
std::string layers_present(const Checkpoint& checkpoint, CheckpointScheme scheme) {
  int count = 0;
  while (checkpoint.find(layer_marker(scheme, count))) ++count;
  return count == 0 ? "none" : "0-" + std::to_string(count - 1);
}

}  // namespace

std::string_view scheme_name(CheckpointScheme scheme) {
  for (const auto& [s, name] : kSchemeNames) {
    if (s == scheme) return name;
  }
  return "?";
}

CheckpointScheme parse_scheme(std::string_view name) {
  for (const auto& [scheme, n] : kSchemeNames) {
    if (n == name) return scheme;
  }
  throw Error("unknown checkpoint scheme '" + std::string(name) + "' (known: openai, hf, deepseek, deepseek-hf)");
}

LoadedLayer load_moe_layer(const Checkpoint& checkpoint, int layer, const LoadOptions& options) {
  if (layer < 0) throw Error("layer " + std::to_string(layer) + " is negative");
  if (options.scheme && is_deepseek(*options.scheme)) return load_deepseek_v4_layer(checkpoint, layer, *options.scheme);
  if (!options.scheme) {
    for (CheckpointScheme scheme : {CheckpointScheme::kDeepSeek, CheckpointScheme::kDeepSeekHuggingFace}) {
      if (checkpoint.find(layer_marker(scheme, layer))) return load_deepseek_v4_layer(checkpoint, layer, scheme);
    }
    bool held = checkpoint.find(dense_expert_names(layer).gate_up).has_value();
    for (CheckpointScheme scheme : {CheckpointScheme::kOpenAi, CheckpointScheme::kHuggingFace}) {
      held = held || checkpoint.find(layer_marker(scheme, layer));
    }
    if (!held) {
      std::string present;
      for (const auto& [scheme, name] : kSchemeNames) {
        present += (present.empty() ? "" : ", ") + std::string(name) + " " + layers_present(checkpoint, scheme);
      }
      throw Error(printable(checkpoint.path()) + ": no MoE tensors for layer " + std::to_string(layer) +
                  " under any naming (layers present: " + present + ")");
    }
  }
  return load_gpt_oss_layer(checkpoint, layer, options);
}

}  // namespace mxmoe

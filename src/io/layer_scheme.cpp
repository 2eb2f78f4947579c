// Which naming scheme a checkpoint holds a layer under, and loading the layer by that scheme's reader.
#include <array>

#include "io/deepseek_v4_names.hpp"
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
      if (checkpoint.find(deepseek_v4_layer_names(scheme, layer).marker)) {
        return load_deepseek_v4_layer(checkpoint, layer, scheme);
      }
    }
  }
  return load_gpt_oss_layer(checkpoint, layer, options);
}

}  // namespace mxmoe

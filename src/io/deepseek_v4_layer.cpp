// Loading one DeepSeek-V4 layer's MoE tensors in DeepSeek's naming (an expert's w1, w3 and w2 apart)
// or transformers' (the experts stacked, [w1; w3] as gate_up): the shape from the first expert
// tensor, the spec from config.json, and every other tensor held to exactly the dtype and shape that
// shape implies.
#include <cmath>
#include <cstring>

#include "common/printable.hpp"
#include "io/deepseek_v4_names.hpp"
#include "io/layer_reader.hpp"
#include "mxmoe/checkpoint.hpp"
#include "mxmoe/error.hpp"
#include "mxmoe/mx_format.hpp"

namespace mxmoe {
namespace {

// The layer's spec: DeepSeek-V4's activation at the config's swiglu_limit; a score layer routes by
// sqrt-softplus scaled by routed_scaling_factor, a hash-routed layer takes the caller's top-k.
LayerSpec layer_spec(const Checkpoint& checkpoint, bool hash_routed) {
  const CheckpointConfig& config = checkpoint.config();
  const std::string where = printable(checkpoint.path()) + ": config.json";
  if (!config.top_k) throw Error(where + " gives no num_experts_per_tok (a DeepSeek-V4 layer's top-k)");
  if (config.scoring_func && *config.scoring_func != "sqrtsoftplus") {
    throw Error(where + ": scoring_func '" + printable(*config.scoring_func) +
                "' is not supported (DeepSeek-V4 layers score with sqrtsoftplus)");
  }
  LayerSpec spec = deepseek_v4_spec(1.0f);
  spec.activation.limit = config.swiglu_limit.value_or(spec.activation.limit);
  if (hash_routed) {
    spec.router = RouterKind::kCallerTopK;
  } else {
    if (!config.routed_scaling) throw Error(where + " gives no routed_scaling_factor");
    spec.routed_scaling = *config.routed_scaling;
  }
  return spec;
}

struct HostExperts {
  std::vector<uint8_t> fc1_blocks, fc1_scales, fc2_blocks, fc2_scales;
  std::shared_ptr<const void> files;
};

// DeepSeek's per-expert tensors assembled into the layer's [E, 2I, ..] ([w1; w3]) and [E, H, ..]
// tensors. A host copy (a V4-Flash layer's 3.4 GB pass through memory once): the stacked layout is
// what MoeLayerWeights views; reading each expert's tensors straight into the device's staging
// buffers would avoid it.
std::shared_ptr<HostExperts> assemble_experts(LayerReader& reader, const MoeShape& shape, int layer) {
  const int64_t e_count = shape.num_experts, h = shape.hidden, i = shape.intermediate;
  const int64_t k1 = h / kMxBlock, k2 = i / kMxBlock;
  auto host = std::make_shared<HostExperts>();
  host->fc1_blocks.resize(e_count * 2 * i * k1 * kMxfp4BlockBytes);
  host->fc1_scales.resize(e_count * 2 * i * k1);
  host->fc2_blocks.resize(e_count * h * k2 * kMxfp4BlockBytes);
  host->fc2_scales.resize(e_count * h * k2);
  auto put = [](std::vector<uint8_t>& to, int64_t at, std::span<const uint8_t> from) {
    std::memcpy(to.data() + at, from.data(), from.size());
  };
  for (int64_t e = 0; e < e_count; ++e) {
    const DeepseekV4ExpertNames n = deepseek_v4_expert_names(layer, static_cast<int>(e));
    const int64_t half1 = i * k1 * kMxfp4BlockBytes, half1_scales = i * k1;
    put(host->fc1_blocks, (2 * e) * half1, reader.bytes({n.w1, Dtype::kI8, {i, h / 2}}, {Dtype::kU8}));
    put(host->fc1_blocks, (2 * e + 1) * half1, reader.bytes({n.w3, Dtype::kI8, {i, h / 2}}, {Dtype::kU8}));
    put(host->fc1_scales, (2 * e) * half1_scales, reader.bytes({n.w1_scale, Dtype::kF8E8M0, {i, k1}}));
    put(host->fc1_scales, (2 * e + 1) * half1_scales, reader.bytes({n.w3_scale, Dtype::kF8E8M0, {i, k1}}));
    put(host->fc2_blocks, e * h * k2 * kMxfp4BlockBytes, reader.bytes({n.w2, Dtype::kI8, {h, i / 2}}, {Dtype::kU8}));
    put(host->fc2_scales, e * h * k2, reader.bytes({n.w2_scale, Dtype::kF8E8M0, {h, k2}}));
  }
  host->files = reader.keepalive();
  return host;
}

}  // namespace

LoadedLayer load_deepseek_v4_layer(const Checkpoint& checkpoint, int layer, CheckpointScheme scheme) {
  const DeepseekV4LayerNames names = deepseek_v4_layer_names(scheme, layer);
  LayerReader reader(checkpoint, layer, scheme);
  const bool hash_routed = checkpoint.config().hash_routed(layer).value_or(checkpoint.find(names.tid2eid).has_value());
  const LayerSpec spec = layer_spec(checkpoint, hash_routed);
  const int top_k = *checkpoint.config().top_k;

  // The sizes from the first expert tensor: w1 [I, H/2] of expert 0 (E counted from the experts
  // present), or gate_up [E, 2I, H/2].
  const bool per_expert = scheme == CheckpointScheme::kDeepSeek;
  const std::string& first_name = per_expert ? names.marker : names.gate_up;
  const auto first = reader.require(first_name);
  const auto& dims = first.tensor->shape;
  const bool packed = first.tensor->dtype == Dtype::kI8 || first.tensor->dtype == Dtype::kU8;
  if (!packed || dims.size() != (per_expert ? 2u : 3u) || dims.back() < 1 || dims[dims.size() - 2] < 1 ||
      (!per_expert && (dims[0] < 1 || dims[1] % 2 != 0))) {
    throw Error(printable(first.file->path()) + ": tensor '" + first_name + "': expected " +
                (per_expert ? "[I, H/2]" : "[E, 2I, H/2]") + " I8, got " + first.tensor->describe());
  }
  int64_t experts = 0, hidden = 2 * dims.back(), intermediate = 0;
  if (per_expert) {
    while (checkpoint.find(deepseek_v4_expert_names(layer, static_cast<int>(experts)).w1)) ++experts;
    intermediate = dims[0];
  } else {
    experts = dims[0];
    intermediate = dims[1] / 2;
  }
  // config.json's sizes, where it gives them, decide (a missing expert or a mis-shaped first tensor is
  // then named as such); the first tensor must agree with them.
  const CheckpointConfig& config = checkpoint.config();
  if (per_expert && config.routed_experts) experts = *config.routed_experts;
  const bool agrees = (!config.hidden || *config.hidden == hidden) &&
                      (!config.moe_intermediate || *config.moe_intermediate == intermediate) &&
                      (per_expert || !config.routed_experts || *config.routed_experts == experts);
  if (!agrees) {
    throw Error(printable(first.file->path()) + ": tensor '" + first_name + "' " + first.tensor->describe() +
                " disagrees with config.json (n_routed_experts " + std::to_string(config.routed_experts.value_or(-1)) +
                ", hidden_size " + std::to_string(config.hidden.value_or(-1)) + ", moe_intermediate_size " +
                std::to_string(config.moe_intermediate.value_or(-1)) + ")");
  }
  const MoeShape shape = checked_layer_shape(first, first_name, experts, hidden, intermediate, top_k, spec);
  const int64_t e = shape.num_experts, h = shape.hidden, i = shape.intermediate;

  LoadedLayer loaded{MoeLayerWeights{}, scheme, false};
  MoeLayerWeights& w = loaded.weights;
  w.shape = shape;
  if (!hash_routed) {
    w.router_weight = reader.copy<Bf16>({names.router_weight, Dtype::kBF16, {e, h}});
    w.router_selection_bias = reader.copy<float>({names.selection_bias, Dtype::kF32, {e}});
  }
  if (per_expert) {
    const auto host = assemble_experts(reader, shape, layer);
    w.fc1_blocks = host->fc1_blocks;
    w.fc1_scales = host->fc1_scales;
    w.fc2_blocks = host->fc2_blocks;
    w.fc2_scales = host->fc2_scales;
    w.storage = host;
  } else {
    w.fc1_blocks = reader.bytes({names.gate_up, Dtype::kI8, {e, 2 * i, h / 2}}, {Dtype::kU8});
    w.fc1_scales = reader.bytes({names.gate_up_scale, Dtype::kF8E8M0, {e, 2 * i, h / kMxBlock}});
    w.fc2_blocks = reader.bytes({names.down, Dtype::kI8, {e, h, i / 2}}, {Dtype::kU8});
    w.fc2_scales = reader.bytes({names.down_scale, Dtype::kF8E8M0, {e, h, i / kMxBlock}});
    w.storage = reader.keepalive();
    w.mapped_files = reader.mapped_files();
  }
  w.validate();
  return loaded;
}

}  // namespace mxmoe

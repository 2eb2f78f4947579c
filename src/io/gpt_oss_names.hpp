// The names of one layer's MoE tensors in each gpt-oss checkpoint scheme (table in checkpoint.hpp).
#pragma once

#include <string>

#include "mxmoe/checkpoint.hpp"

namespace mxmoe {

struct LayerTensorNames {
  std::string router_weight, router_bias, fc1_blocks, fc1_scales, fc1_bias, fc2_blocks, fc2_scales, fc2_bias;
};

// The dense bf16 experts transformers saves after Mxfp4Config(dequantize=True) (Hugging Face names;
// the router and biases are named as in layer_tensor_names).
struct DenseExpertNames {
  std::string gate_up, down;
};
inline DenseExpertNames dense_expert_names(int layer) {
  const std::string p = "model.layers." + std::to_string(layer) + ".mlp.experts.";
  return {p + "gate_up_proj", p + "down_proj"};
}

inline LayerTensorNames layer_tensor_names(CheckpointScheme scheme, int layer) {
  const std::string n = std::to_string(layer);
  if (scheme == CheckpointScheme::kOpenAi) {
    const std::string p = "block." + n + ".mlp.";
    return {p + "gate.weight",          p + "gate.bias",           p + "mlp1_weight.blocks", p + "mlp1_weight.scales",
            p + "mlp1_bias",            p + "mlp2_weight.blocks",  p + "mlp2_weight.scales", p + "mlp2_bias"};
  }
  const std::string p = "model.layers." + n + ".mlp.";
  return {p + "router.weight",           p + "router.bias",           p + "experts.gate_up_proj_blocks",
          p + "experts.gate_up_proj_scales", p + "experts.gate_up_proj_bias", p + "experts.down_proj_blocks",
          p + "experts.down_proj_scales",    p + "experts.down_proj_bias"};
}

}  // namespace mxmoe

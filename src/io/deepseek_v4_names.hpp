// The names of one DeepSeek-V4 layer's MoE tensors in each naming (table in checkpoint.hpp).
#pragma once

#include <string>

#include "mxmoe/checkpoint.hpp"

namespace mxmoe {

// DeepSeek's own checkpoints hold each expert's projections apart: w1 (gate) and w3 (up) [I, H/2],
// w2 (down) [H, I/2], two E2M1 values a byte (I8), each with a `.scale` of one E8M0 per 32 along K.
struct DeepseekV4ExpertNames {
  std::string w1, w1_scale, w2, w2_scale, w3, w3_scale;
};
inline DeepseekV4ExpertNames deepseek_v4_expert_names(int layer, int expert) {
  const std::string p = "layers." + std::to_string(layer) + ".ffn.experts." + std::to_string(expert) + ".";
  return {p + "w1.weight", p + "w1.scale", p + "w2.weight", p + "w2.scale", p + "w3.weight", p + "w3.scale"};
}

// The router's tensors in either naming, and transformers' stacked experts (gate_up [E, 2I, H/2]
// holding [w1; w3] of each expert, down [E, H, I/2], scales `_scale_inv` [.., K/32] E8M0).
// `marker` is the tensor whose presence says that the checkpoint holds the layer under this naming.
struct DeepseekV4LayerNames {
  std::string router_weight, selection_bias, tid2eid;
  std::string gate_up, gate_up_scale, down, down_scale;
  std::string marker;
};
inline DeepseekV4LayerNames deepseek_v4_layer_names(CheckpointScheme scheme, int layer) {
  const std::string n = std::to_string(layer);
  if (scheme == CheckpointScheme::kDeepSeek) {
    const std::string p = "layers." + n + ".ffn.gate.";
    return {p + "weight", p + "bias", p + "tid2eid", {}, {}, {}, {}, deepseek_v4_expert_names(layer, 0).w1};
  }
  const std::string p = "model.layers." + n + ".mlp.";
  // gate_up_proj alone would not tell these MXFP4 experts from gpt-oss's dense bf16 ones (same name).
  return {p + "gate.weight",
          p + "gate.e_score_correction_bias",
          p + "gate.tid2eid",
          p + "experts.gate_up_proj",
          p + "experts.gate_up_proj_scale_inv",
          p + "experts.down_proj",
          p + "experts.down_proj_scale_inv",
          p + "experts.gate_up_proj_scale_inv"};
}

}  // namespace mxmoe

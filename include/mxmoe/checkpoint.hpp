// MXFP4 MoE checkpoints (gpt-oss's and DeepSeek-V4's): reading one layer's MoE tensors in any of their
// naming schemes, and writing small synthetic checkpoints in any scheme for tests and for users
// without the real weights.
//
// gpt-oss:
//   tensor         original (openai/gpt-oss)              Hugging Face (transformers)
//   router W       block.N.mlp.gate.weight [E, H]          model.layers.N.mlp.router.weight
//   router b       block.N.mlp.gate.bias [E]               model.layers.N.mlp.router.bias
//   FC1 values     block.N.mlp.mlp1_weight.blocks          model.layers.N.mlp.experts.gate_up_proj_blocks
//                  [E, 2I, H/32, 16] U8
//   FC1 scales     block.N.mlp.mlp1_weight.scales          ...experts.gate_up_proj_scales [E, 2I, H/32] U8
//   FC1 bias       block.N.mlp.mlp1_bias [E, 2I]           ...experts.gate_up_proj_bias
//   FC2 values     block.N.mlp.mlp2_weight.blocks          ...experts.down_proj_blocks [E, H, I/32, 16] U8
//   FC2 scales     block.N.mlp.mlp2_weight.scales          ...experts.down_proj_scales [E, H, I/32] U8
//   FC2 bias       block.N.mlp.mlp2_bias [E, H]            ...experts.down_proj_bias
// Router weights and biases are BF16. The Hugging Face converter
// (transformers convert_gpt_oss_weights_to_hf.py) only renames the MXFP4 tensors
// (".blocks" -> "_blocks"), so both schemes store the same bytes in the same layout; transformers
// transposes to [E, H, 2I] only when it dequantizes (integrations/mxfp4.py).
//
// DeepSeek-V4 (deepseek_v4_spec; DeepSeek's inference/model.py, transformers' deepseek_v4 and its
// checkpoint conversion mapping):
//   tensor         DeepSeek (scheme deepseek)              transformers (scheme deepseek-hf)
//   router W       layers.N.ffn.gate.weight [E, H] BF16    model.layers.N.mlp.gate.weight
//   selection b    layers.N.ffn.gate.bias [E] F32          ...mlp.gate.e_score_correction_bias
//   FC1 values     layers.N.ffn.experts.e.w1.weight and    ...mlp.experts.gate_up_proj [E, 2I, H/2] I8
//                  .w3.weight [I, H/2] I8 (gate, up)       ([w1; w3] of each expert)
//   FC1 scales     ...w1.scale, ...w3.scale [I, H/32]      ...experts.gate_up_proj_scale_inv [E, 2I, H/32]
//                  F8_E8M0                                 F8_E8M0
//   FC2 values     ...w2.weight [H, I/2] I8                ...experts.down_proj [E, H, I/2] I8
//   FC2 scales     ...w2.scale [H, I/32] F8_E8M0           ...experts.down_proj_scale_inv [E, H, I/32]
// Two E2M1 values a byte, the low nibble first: the bytes of gpt-oss's blocks. The first layers
// (config.json's mlp_layer_types "hash_moe", or num_hash_layers) choose experts from token ids
// (gate.tid2eid) and have no selection bias: mxmoe loads them with the caller's top-k
// (RouterKind::kCallerTopK) and no router. The spec comes from config.json: num_experts_per_tok,
// routed_scaling_factor, swiglu_limit (default 10), scoring_func (sqrtsoftplus only).
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "mxmoe/layer_weights.hpp"
#include "mxmoe/safetensors.hpp"

namespace mxmoe {

enum class CheckpointScheme { kOpenAi, kHuggingFace, kDeepSeek, kDeepSeekHuggingFace };
std::string_view scheme_name(CheckpointScheme scheme);  // "openai", "hf", "deepseek", "deepseek-hf"
CheckpointScheme parse_scheme(std::string_view name);  // throws Error

// What a config.json beside the files says about the MoE layers (the original gpt-oss's field names
// or transformers'); empty where it says nothing.
struct CheckpointConfig {
  std::optional<int> top_k;               // experts_per_token, num_experts_per_tok
  // DeepSeek-V4's sizes (n_routed_experts, hidden_size, moe_intermediate_size): where given, its
  // layers' tensors are held to them.
  std::optional<int> routed_experts, hidden, moe_intermediate;
  std::optional<float> swiglu_limit;      // the activation's limit (LayerSpec)
  std::optional<float> routed_scaling;    // routed_scaling_factor
  std::optional<std::string> scoring_func;
  std::optional<std::vector<bool>> hash_layers;  // mlp_layer_types: true for "hash_moe"
  std::optional<int> num_hash_layers;            // the first N layers are hash_moe
  // Whether layer `layer` chooses its experts from token ids; empty where the config does not say.
  std::optional<bool> hash_routed(int layer) const;
};

// A checkpoint: one .safetensors file, or a directory holding model.safetensors.index.json (whose
// weight_map names each tensor's file), or a directory of .safetensors files, with the config.json
// beside the files, if any.
class Checkpoint {
 public:
  static Checkpoint open(const std::string& path);  // throws Error naming the path

  const std::string& path() const { return path_; }
  // The tensor and the file it lives in; nullptr when the checkpoint has no such tensor.
  struct Located {
    const TensorInfo* tensor;
    std::shared_ptr<const SafetensorsFile> file;
  };
  std::optional<Located> find(const std::string& name) const;
  const CheckpointConfig& config() const { return config_; }

 private:
  std::string path_;
  std::vector<std::shared_ptr<const SafetensorsFile>> files_;
  std::map<std::string, size_t> file_of_tensor_;  // name -> index into files_
  CheckpointConfig config_;
};

// Loads layer `layer`'s MoE tensors, detecting the scheme; the shape comes from the tensors
// (E, H, I) and the config (top-k, default 4). The MXFP4 tensors stay in the mapped files.
// Throws Error naming the file, the tensor and what was expected for anything missing or mis-shaped,
// and for a checkpoint it will not guess about: one holding the layer under both schemes' names
// (unless `scheme` says which to read), or one whose experts are bf16 (transformers' save after
// Mxfp4Config(dequantize=True): experts.gate_up_proj [E, H, 2I], experts.down_proj [E, I, H]),
// unless `quantize_bf16_experts` asks to quantise them to MXFP4 (quantize_bf16_experts in
// layer_weights.hpp; lossless for weights that were MXFP4).
struct LoadOptions {
  std::optional<CheckpointScheme> scheme;
  bool quantize_bf16_experts = false;
};
struct LoadedLayer {
  MoeLayerWeights weights;
  CheckpointScheme scheme;
  bool quantized_from_bf16 = false;
};
LoadedLayer load_gpt_oss_layer(const Checkpoint& checkpoint, int layer, const LoadOptions& options = {});

// Loads layer `layer` of a DeepSeek-V4 checkpoint under `scheme`'s names (kDeepSeek or
// kDeepSeekHuggingFace): the shape from the expert tensors, the spec from config.json (which must
// give num_experts_per_tok, and routed_scaling_factor for a layer that is not hash-routed). DeepSeek's
// per-expert tensors are copied into the stacked layout in host memory; transformers' stay in the
// mapped files. Throws Error naming the file and the tensor that is missing, mis-shaped or mis-typed.
LoadedLayer load_deepseek_v4_layer(const Checkpoint& checkpoint, int layer, CheckpointScheme scheme);

// Loads layer `layer` under whichever scheme the checkpoint holds it (options.scheme, where set):
// DeepSeek-V4's names by load_deepseek_v4_layer, anything else by load_gpt_oss_layer.
LoadedLayer load_moe_layer(const Checkpoint& checkpoint, int layer, const LoadOptions& options = {});

// Writes shape.num_layers layers of make_synthetic_layer(shape, layer_seed(seed, layer)) into `dir`
// (created if missing): `shards` safetensors files (with model.safetensors.index.json when more than
// one) and a config.json, named as `scheme` names them. Throws Error for a spec the scheme does not
// hold (gpt-oss's names hold gpt-oss's spec at any swiglu limit; DeepSeek-V4's its spec, all layers
// hash-routed where the router is kCallerTopK).
void write_synthetic_checkpoint(const std::string& dir, const MoeShape& shape, CheckpointScheme scheme, int shards,
                                uint64_t seed);

}  // namespace mxmoe

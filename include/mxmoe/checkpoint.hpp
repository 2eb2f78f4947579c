// gpt-oss MXFP4 checkpoints: reading one layer's MoE tensors in either naming scheme, and writing
// small synthetic checkpoints in either scheme for tests and for users without the real weights.
//
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
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "mxmoe/layer_weights.hpp"
#include "mxmoe/safetensors.hpp"

namespace mxmoe {

enum class CheckpointScheme { kOpenAi, kHuggingFace };
std::string_view scheme_name(CheckpointScheme scheme);  // "openai", "hf"
CheckpointScheme parse_scheme(std::string_view name);  // throws Error

// A checkpoint: one .safetensors file, or a directory holding model.safetensors.index.json (whose
// weight_map names each tensor's file), or a directory of .safetensors files. A config.json beside
// the files, if any, supplies top-k (experts_per_token / num_experts_per_tok).
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
  std::optional<int> config_top_k() const { return config_top_k_; }

 private:
  std::string path_;
  std::vector<std::shared_ptr<const SafetensorsFile>> files_;
  std::map<std::string, size_t> file_of_tensor_;  // name -> index into files_
  std::optional<int> config_top_k_;
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

// Writes shape.num_layers layers of make_synthetic_layer(shape, layer_seed(seed, layer)) into `dir`
// (created if missing): `shards` safetensors files (with model.safetensors.index.json when more than
// one) and a config.json, named as `scheme` names them.
void write_synthetic_checkpoint(const std::string& dir, const MoeShape& shape, CheckpointScheme scheme, int shards,
                                uint64_t seed);

}  // namespace mxmoe

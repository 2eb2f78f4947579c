// Loading one gpt-oss layer's MoE tensors: detect the scheme, infer the shape from FC1's blocks,
// then hold every other tensor to exactly the dtype and shape that shape implies.
#include <algorithm>

#include "common/printable.hpp"
#include "io/gpt_oss_names.hpp"
#include "io/layer_reader.hpp"
#include "mxmoe/checkpoint.hpp"
#include "mxmoe/error.hpp"
#include "mxmoe/mx_format.hpp"

namespace mxmoe {
namespace {

constexpr int kDefaultTopK = 4;  // gpt-oss experts_per_token, when no config.json says otherwise

int gpt_oss_top_k(const Checkpoint& checkpoint) { return checkpoint.config().top_k.value_or(kDefaultTopK); }

// gpt-oss's spec with the config's swiglu_limit, where it gives one.
LayerSpec gpt_oss_spec(const Checkpoint& checkpoint) {
  LayerSpec spec = kGptOssSpec;
  spec.activation.limit = checkpoint.config().swiglu_limit.value_or(kGptOssSpec.activation.limit);
  return spec;
}

std::string layers_present(const Checkpoint& checkpoint, CheckpointScheme scheme) {
  int count = 0;
  while (checkpoint.find(layer_tensor_names(scheme, count).fc1_blocks)) ++count;
  return count == 0 ? "none" : "0-" + std::to_string(count - 1);
}

// A layer saved with bf16 experts, quantised to MXFP4 (LoadOptions::quantize_bf16_experts).
LoadedLayer load_bf16_experts(const Checkpoint& checkpoint, int layer) {
  const LayerTensorNames names = layer_tensor_names(CheckpointScheme::kHuggingFace, layer);
  const DenseExpertNames dense = dense_expert_names(layer);
  LayerReader reader(checkpoint, layer, CheckpointScheme::kHuggingFace);
  const auto gate_up = reader.require(dense.gate_up);
  const auto& dims = gate_up.tensor->shape;
  if (gate_up.tensor->dtype != Dtype::kBF16 || dims.size() != 3 || dims[2] % 2 != 0) {
    throw Error(printable(gate_up.file->path()) + ": tensor '" + dense.gate_up + "': expected [E, H, 2I] BF16, got " +
                gate_up.tensor->describe());
  }
  const MoeShape shape = checked_layer_shape(gate_up, dense.gate_up, dims[0], dims[1], dims[2] / 2, gpt_oss_top_k(checkpoint),
                                          gpt_oss_spec(checkpoint));
  const int64_t e = shape.num_experts, h = shape.hidden, i = shape.intermediate;
  auto bf16_view = [](std::span<const uint8_t> bytes) {
    return std::span<const Bf16>(reinterpret_cast<const Bf16*>(bytes.data()), bytes.size() / 2);
  };
  LoadedLayer loaded{quantize_bf16_experts(shape, reader.copy<Bf16>({names.router_weight, Dtype::kBF16, {e, h}}),
                                           reader.copy<Bf16>({names.router_bias, Dtype::kBF16, {e}}),
                                           bf16_view(reader.bytes({dense.gate_up, Dtype::kBF16, {e, h, 2 * i}})),
                                           reader.copy<Bf16>({names.fc1_bias, Dtype::kBF16, {e, 2 * i}}),
                                           bf16_view(reader.bytes({dense.down, Dtype::kBF16, {e, i, h}})),
                                           reader.copy<Bf16>({names.fc2_bias, Dtype::kBF16, {e, h}})),
                     CheckpointScheme::kHuggingFace, true};
  return loaded;
}

}  // namespace

LoadedLayer load_gpt_oss_layer(const Checkpoint& checkpoint, int layer, const LoadOptions& options) {
  if (layer < 0) throw Error("layer " + std::to_string(layer) + " is negative");
  const std::string path = printable(checkpoint.path()), layer_name = "layer " + std::to_string(layer);
  const auto openai = layer_tensor_names(CheckpointScheme::kOpenAi, layer);
  const auto hf = layer_tensor_names(CheckpointScheme::kHuggingFace, layer);
  const bool has_openai = checkpoint.find(openai.fc1_blocks).has_value();
  const bool has_hf = checkpoint.find(hf.fc1_blocks).has_value();
  std::optional<CheckpointScheme> scheme = options.scheme;
  if (!scheme && has_openai && has_hf) {
    throw Error(path + ": " + layer_name + "'s MoE tensors are there under both the openai names ('" +
                openai.fc1_blocks + "', ...) and the Hugging Face names ('" + hf.fc1_blocks +
                "', ...); choose which to read (--scheme openai or --scheme hf)");
  }
  if (!scheme && (has_openai || has_hf))
    scheme = has_openai ? CheckpointScheme::kOpenAi : CheckpointScheme::kHuggingFace;
  if (!scheme) {
    const DenseExpertNames dense = dense_expert_names(layer);
    if (const auto gate_up = checkpoint.find(dense.gate_up)) {
      if (gate_up->tensor->dtype == Dtype::kI8) {
        throw Error(path + ": " + layer_name + "'s experts '" + dense.gate_up + "' " + gate_up->tensor->describe() +
                    " are DeepSeek-V4's MXFP4 values without their scales ('" + dense.gate_up + "_scale_inv')");
      }
      if (options.quantize_bf16_experts) return load_bf16_experts(checkpoint, layer);
      throw Error(path + ": " + layer_name + "'s experts are dense ('" + dense.gate_up + "' " +
                  gate_up->tensor->describe() +
                  "): a checkpoint saved dequantised (transformers' Mxfp4Config(dequantize=True)); mxmoe runs "
                  "MXFP4 experts: quantise them on load (--quantize-bf16-experts; lossless for weights that "
                  "were MXFP4) or give the original MXFP4 checkpoint");
    }
    throw Error(path + ": no MoE tensors for " + layer_name + " (looked for '" + openai.fc1_blocks + "', '" +
                hf.fc1_blocks + "' and '" + dense.gate_up + "'; layers present: openai " +
                layers_present(checkpoint, CheckpointScheme::kOpenAi) + ", hf " +
                layers_present(checkpoint, CheckpointScheme::kHuggingFace) + ")");
  }
  const LayerTensorNames names = layer_tensor_names(*scheme, layer);
  LayerReader reader(checkpoint, layer, *scheme);

  const auto fc1 = reader.require(names.fc1_blocks);
  const auto& dims = fc1.tensor->shape;
  if (fc1.tensor->dtype != Dtype::kU8 || dims.size() != 4 || dims[3] != kMxfp4BlockBytes || dims[1] % 2 != 0 ||
      dims[0] < 1 || dims[1] < 2 || dims[2] < 1) {
    throw Error(printable(fc1.file->path()) + ": tensor '" + names.fc1_blocks +
                "': expected [E, 2I, H/32, 16] U8, got " + fc1.tensor->describe());
  }
  const MoeShape shape = checked_layer_shape(fc1, names.fc1_blocks, dims[0], std::min<int64_t>(dims[2], INT32_MAX) * kMxBlock,
                                             dims[1] / 2, gpt_oss_top_k(checkpoint), gpt_oss_spec(checkpoint));

  const int64_t e = shape.num_experts, h = shape.hidden, i = shape.intermediate, rows1 = shape.fc1_rows();
  LoadedLayer loaded{MoeLayerWeights{}, *scheme, false};
  MoeLayerWeights& w = loaded.weights;
  w.shape = shape;
  w.router_weight = reader.copy<Bf16>({names.router_weight, Dtype::kBF16, {e, h}});
  w.router_bias = reader.copy<Bf16>({names.router_bias, Dtype::kBF16, {e}});
  w.fc1_blocks = reader.bytes({names.fc1_blocks, Dtype::kU8, {e, rows1, h / kMxBlock, kMxfp4BlockBytes}});
  w.fc1_scales = reader.bytes({names.fc1_scales, Dtype::kU8, {e, rows1, h / kMxBlock}});
  w.fc1_bias = reader.copy<Bf16>({names.fc1_bias, Dtype::kBF16, {e, rows1}});
  w.fc2_blocks = reader.bytes({names.fc2_blocks, Dtype::kU8, {e, h, i / kMxBlock, kMxfp4BlockBytes}});
  w.fc2_scales = reader.bytes({names.fc2_scales, Dtype::kU8, {e, h, i / kMxBlock}});
  w.fc2_bias = reader.copy<Bf16>({names.fc2_bias, Dtype::kBF16, {e, h}});
  w.storage = reader.keepalive();
  w.mapped_files = reader.mapped_files();
  w.validate();
  return loaded;
}

}  // namespace mxmoe

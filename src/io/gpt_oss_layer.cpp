// Loading one gpt-oss layer's MoE tensors: detect the scheme, infer the shape from FC1's blocks,
// then hold every other tensor to exactly the dtype and shape that shape implies.
#include <algorithm>
#include <cstring>

#include "common/printable.hpp"
#include "io/gpt_oss_names.hpp"
#include "mxmoe/checkpoint.hpp"
#include "mxmoe/error.hpp"
#include "mxmoe/mx_format.hpp"

namespace mxmoe {
namespace {

constexpr int kDefaultTopK = 4;  // gpt-oss experts_per_token, when no config.json says otherwise

struct Expected {
  const std::string& name;
  Dtype dtype;
  std::vector<int64_t> shape;
};

class LayerReader {
 public:
  LayerReader(const Checkpoint& checkpoint, int layer, CheckpointScheme scheme)
      : checkpoint_(checkpoint), layer_(layer), scheme_(scheme) {}

  Checkpoint::Located require(const std::string& name) {
    auto located = checkpoint_.find(name);
    if (!located) {
      throw Error(printable(checkpoint_.path()) + ": tensor '" + name + "' is missing (layer " +
                  std::to_string(layer_) + ", " + std::string(scheme_name(scheme_)) + " scheme)");
    }
    files_.push_back(located->file);
    return *located;
  }

  std::span<const uint8_t> bytes(const Expected& e) {
    const auto located = require(e.name);
    const TensorInfo want{e.name, e.dtype, e.shape, {}};
    if (located.tensor->dtype != e.dtype || located.tensor->shape != e.shape) {
      throw Error(printable(located.file->path()) + ": tensor '" + e.name + "': expected " + want.describe() +
                  ", got " + located.tensor->describe());
    }
    return located.tensor->bytes;
  }

  std::vector<Bf16> bf16(const Expected& e) {
    const auto raw = bytes(e);
    std::vector<Bf16> out(raw.size() / 2);
    std::memcpy(out.data(), raw.data(), raw.size());
    return out;
  }

  std::vector<MoeLayerWeights::MappedFile> mapped_files() const {
    std::vector<MoeLayerWeights::MappedFile> out;
    for (const auto& file : files_) {
      const auto mapping = file->mapping();
      if (std::none_of(out.begin(), out.end(), [&](const auto& f) { return f.base == mapping.data(); })) {
        out.push_back({mapping.data(), mapping.size(), file->fd()});
      }
    }
    return out;
  }

  std::shared_ptr<const void> keepalive() const {
    return std::make_shared<const std::vector<std::shared_ptr<const SafetensorsFile>>>(files_);
  }

 private:
  const Checkpoint& checkpoint_;
  int layer_;
  CheckpointScheme scheme_;
  std::vector<std::shared_ptr<const SafetensorsFile>> files_;
};

std::string layers_present(const Checkpoint& checkpoint, CheckpointScheme scheme) {
  int count = 0;
  while (checkpoint.find(layer_tensor_names(scheme, count).fc1_blocks)) ++count;
  return count == 0 ? "none" : "0-" + std::to_string(count - 1);
}

// The shape of a layer from one expert tensor's dimensions and the config's top-k; throws Error
// quoting the tensor when they do not make a valid shape.
MoeShape layer_shape(const Checkpoint& checkpoint, const Checkpoint::Located& tensor, const std::string& name,
                     int64_t experts, int64_t hidden, int64_t intermediate) {
  MoeShape shape;
  shape.num_experts = static_cast<int>(std::min<int64_t>(experts, INT32_MAX));
  shape.intermediate = static_cast<int>(std::min<int64_t>(intermediate, INT32_MAX));
  shape.hidden = static_cast<int>(std::min<int64_t>(hidden, INT32_MAX));
  shape.top_k = checkpoint.config_top_k().value_or(kDefaultTopK);
  try {
    shape.validate();
  } catch (const Error& e) {
    throw Error(printable(tensor.file->path()) + ": tensor '" + name + "' " + tensor.tensor->describe() + ": " +
                e.what());
  }
  return shape;
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
  const MoeShape shape = layer_shape(checkpoint, gate_up, dense.gate_up, dims[0], dims[1], dims[2] / 2);
  const int64_t e = shape.num_experts, h = shape.hidden, i = shape.intermediate;
  auto bf16_view = [](std::span<const uint8_t> bytes) {
    return std::span<const Bf16>(reinterpret_cast<const Bf16*>(bytes.data()), bytes.size() / 2);
  };
  LoadedLayer loaded{quantize_bf16_experts(shape, reader.bf16({names.router_weight, Dtype::kBF16, {e, h}}),
                                           reader.bf16({names.router_bias, Dtype::kBF16, {e}}),
                                           bf16_view(reader.bytes({dense.gate_up, Dtype::kBF16, {e, h, 2 * i}})),
                                           reader.bf16({names.fc1_bias, Dtype::kBF16, {e, 2 * i}}),
                                           bf16_view(reader.bytes({dense.down, Dtype::kBF16, {e, i, h}})),
                                           reader.bf16({names.fc2_bias, Dtype::kBF16, {e, h}})),
                     CheckpointScheme::kHuggingFace, true};
  return loaded;
}

}  // namespace

std::string_view scheme_name(CheckpointScheme scheme) { return scheme == CheckpointScheme::kOpenAi ? "openai" : "hf"; }

CheckpointScheme parse_scheme(std::string_view name) {
  if (name == "openai") return CheckpointScheme::kOpenAi;
  if (name == "hf") return CheckpointScheme::kHuggingFace;
  throw Error("unknown checkpoint scheme '" + std::string(name) + "' (known: openai, hf)");
}

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
  const MoeShape shape = layer_shape(checkpoint, fc1, names.fc1_blocks, dims[0],
                                     std::min<int64_t>(dims[2], INT32_MAX) * kMxBlock, dims[1] / 2);

  const int64_t e = shape.num_experts, h = shape.hidden, i = shape.intermediate, rows1 = shape.fc1_rows();
  LoadedLayer loaded{MoeLayerWeights{}, *scheme, false};
  MoeLayerWeights& w = loaded.weights;
  w.shape = shape;
  w.router_weight = reader.bf16({names.router_weight, Dtype::kBF16, {e, h}});
  w.router_bias = reader.bf16({names.router_bias, Dtype::kBF16, {e}});
  w.fc1_blocks = reader.bytes({names.fc1_blocks, Dtype::kU8, {e, rows1, h / kMxBlock, kMxfp4BlockBytes}});
  w.fc1_scales = reader.bytes({names.fc1_scales, Dtype::kU8, {e, rows1, h / kMxBlock}});
  w.fc1_bias = reader.bf16({names.fc1_bias, Dtype::kBF16, {e, rows1}});
  w.fc2_blocks = reader.bytes({names.fc2_blocks, Dtype::kU8, {e, h, i / kMxBlock, kMxfp4BlockBytes}});
  w.fc2_scales = reader.bytes({names.fc2_scales, Dtype::kU8, {e, h, i / kMxBlock}});
  w.fc2_bias = reader.bf16({names.fc2_bias, Dtype::kBF16, {e, h}});
  w.storage = reader.keepalive();
  w.mapped_files = reader.mapped_files();
  w.validate();
  return loaded;
}

}  // namespace mxmoe

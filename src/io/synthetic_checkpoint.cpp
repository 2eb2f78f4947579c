// Writing synthetic checkpoints (gpt-oss or DeepSeek-V4 layers) in any naming scheme, optionally
// sharded with an index.
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/atomic_file.hpp"
#include "io/deepseek_v4_names.hpp"
#include "io/gpt_oss_names.hpp"
#include "mxmoe/checkpoint.hpp"
#include "mxmoe/error.hpp"
#include "mxmoe/mx_format.hpp"

namespace mxmoe {
namespace {

namespace fs = std::filesystem;

std::span<const uint8_t> as_bytes(const std::vector<Bf16>& v) {
  return {reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(Bf16)};
}

void write_json(const fs::path& path, const nlohmann::ordered_json& json) {
  const std::string text = json.dump(2) + "\n";
  const std::span<const uint8_t> piece(reinterpret_cast<const uint8_t*>(text.data()), text.size());
  write_file_atomically(path.string(), std::span(&piece, 1));
}

std::string shard_file_name(int shard, int shards) {
  if (shards == 1) return "model.safetensors";
  char name[64];
  std::snprintf(name, sizeof(name), "model-%05d-of-%05d.safetensors", shard + 1, shards);
  return name;
}

std::span<const uint8_t> as_bytes(const std::vector<float>& v) {
  return {reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(float)};
}

bool is_deepseek(CheckpointScheme scheme) {
  return scheme == CheckpointScheme::kDeepSeek || scheme == CheckpointScheme::kDeepSeekHuggingFace;
}

// Whether `scheme`'s tensors and config.json hold a layer of `spec`: gpt-oss's names hold its
// interleaved, biased experts and softmax router (at any swiglu_limit); DeepSeek-V4's hold
// concatenated experts without biases, routed by sqrt-softplus or by the caller (hash layers).
bool scheme_holds(CheckpointScheme scheme, const LayerSpec& spec) {
  LayerSpec family = is_deepseek(scheme) ? deepseek_v4_spec(spec.routed_scaling) : kGptOssSpec;
  family.activation.limit = spec.activation.limit;
  if (is_deepseek(scheme) && spec.router == RouterKind::kCallerTopK) family.router = RouterKind::kCallerTopK;
  return spec == family;
}

nlohmann::ordered_json config_json(const MoeShape& shape, CheckpointScheme scheme) {
  const float limit = shape.spec.activation.limit;
  if (scheme == CheckpointScheme::kOpenAi) {
    return {{"num_hidden_layers", shape.num_layers}, {"num_experts", shape.num_experts},
            {"experts_per_token", shape.top_k},      {"hidden_size", shape.hidden},
            {"intermediate_size", shape.intermediate}, {"swiglu_limit", limit}};
  }
  if (scheme == CheckpointScheme::kHuggingFace) {
    return {{"model_type", "gpt_oss"},         {"num_hidden_layers", shape.num_layers},
            {"num_local_experts", shape.num_experts}, {"num_experts_per_tok", shape.top_k},
            {"hidden_size", shape.hidden},     {"intermediate_size", shape.intermediate},
            {"swiglu_limit", limit}};
  }
  const bool hash_routed = shape.spec.router == RouterKind::kCallerTopK;
  return {{"model_type", "deepseek_v4"},
          {"num_hidden_layers", shape.num_layers},
          {"n_routed_experts", shape.num_experts},
          {"num_experts_per_tok", shape.top_k},
          {"hidden_size", shape.hidden},
          {"moe_intermediate_size", shape.intermediate},
          {"scoring_func", "sqrtsoftplus"},
          {"routed_scaling_factor", hash_routed ? 1.0f : shape.spec.routed_scaling},
          {"swiglu_limit", limit},
          {"num_hash_layers", hash_routed ? shape.num_layers : 0}};
}

// Layer `layer`'s tensors under gpt-oss's names, holding the bytes of `w` (none, for the file's layout).
std::vector<TensorToWrite> gpt_oss_tensors(CheckpointScheme scheme, int layer, const MoeShape& shape,
                                           const MoeLayerWeights& w) {
  const int64_t e = shape.num_experts, h = shape.hidden, i = shape.intermediate, rows1 = shape.fc1_rows();
  const LayerTensorNames n = layer_tensor_names(scheme, layer);
  return {
      {n.router_weight, Dtype::kBF16, {e, h}, as_bytes(w.router_weight)},
      {n.router_bias, Dtype::kBF16, {e}, as_bytes(w.router_bias)},
      {n.fc1_blocks, Dtype::kU8, {e, rows1, h / kMxBlock, kMxfp4BlockBytes}, w.fc1_blocks},
      {n.fc1_scales, Dtype::kU8, {e, rows1, h / kMxBlock}, w.fc1_scales},
      {n.fc1_bias, Dtype::kBF16, {e, rows1}, as_bytes(w.fc1_bias)},
      {n.fc2_blocks, Dtype::kU8, {e, h, i / kMxBlock, kMxfp4BlockBytes}, w.fc2_blocks},
      {n.fc2_scales, Dtype::kU8, {e, h, i / kMxBlock}, w.fc2_scales},
      {n.fc2_bias, Dtype::kBF16, {e, h}, as_bytes(w.fc2_bias)},
  };
}

// The same under DeepSeek-V4's names: the router where the layer has one, then the experts, stacked
// (transformers) or one expert's w1, w3 (FC1's gate rows, then its up rows) and w2 at a time.
std::vector<TensorToWrite> deepseek_v4_tensors(CheckpointScheme scheme, int layer, const MoeShape& shape,
                                               const MoeLayerWeights& w) {
  const int64_t e_count = shape.num_experts, h = shape.hidden, i = shape.intermediate;
  const int64_t k1 = h / kMxBlock, k2 = i / kMxBlock;
  const DeepseekV4LayerNames n = deepseek_v4_layer_names(scheme, layer);
  std::vector<TensorToWrite> out;
  if (shape.spec.router != RouterKind::kCallerTopK) {
    out.push_back({n.router_weight, Dtype::kBF16, {e_count, h}, as_bytes(w.router_weight)});
    out.push_back({n.selection_bias, Dtype::kF32, {e_count}, as_bytes(w.router_selection_bias)});
  }
  if (scheme == CheckpointScheme::kDeepSeekHuggingFace) {
    out.push_back({n.gate_up, Dtype::kI8, {e_count, 2 * i, h / 2}, w.fc1_blocks});
    out.push_back({n.gate_up_scale, Dtype::kF8E8M0, {e_count, 2 * i, k1}, w.fc1_scales});
    out.push_back({n.down, Dtype::kI8, {e_count, h, i / 2}, w.fc2_blocks});
    out.push_back({n.down_scale, Dtype::kF8E8M0, {e_count, h, k2}, w.fc2_scales});
    return out;
  }
  // A view of `count` bytes at `at`, or none where `w` holds no bytes (the layout).
  auto piece = [](std::span<const uint8_t> all, int64_t at, int64_t count) {
    return all.empty() ? all : all.subspan(at, count);
  };
  const int64_t half1 = i * k1 * kMxfp4BlockBytes, fc2 = h * k2 * kMxfp4BlockBytes;
  for (int64_t e = 0; e < e_count; ++e) {
    const DeepseekV4ExpertNames x = deepseek_v4_expert_names(layer, static_cast<int>(e));
    out.push_back({x.w1, Dtype::kI8, {i, h / 2}, piece(w.fc1_blocks, 2 * e * half1, half1)});
    out.push_back({x.w1_scale, Dtype::kF8E8M0, {i, k1}, piece(w.fc1_scales, 2 * e * i * k1, i * k1)});
    out.push_back({x.w3, Dtype::kI8, {i, h / 2}, piece(w.fc1_blocks, (2 * e + 1) * half1, half1)});
    out.push_back({x.w3_scale, Dtype::kF8E8M0, {i, k1}, piece(w.fc1_scales, (2 * e + 1) * i * k1, i * k1)});
    out.push_back({x.w2, Dtype::kI8, {h, i / 2}, piece(w.fc2_blocks, e * fc2, fc2)});
    out.push_back({x.w2_scale, Dtype::kF8E8M0, {h, k2}, piece(w.fc2_scales, e * h * k2, h * k2)});
  }
  return out;
}

std::vector<TensorToWrite> layer_tensors(CheckpointScheme scheme, int layer, const MoeShape& shape,
                                         const MoeLayerWeights& w) {
  return is_deepseek(scheme) ? deepseek_v4_tensors(scheme, layer, shape, w) : gpt_oss_tensors(scheme, layer, shape, w);
}

}  // namespace

void write_synthetic_checkpoint(const std::string& dir, const MoeShape& shape, CheckpointScheme scheme, int shards,
                                uint64_t seed) {
  shape.validate();
  if (!scheme_holds(scheme, shape.spec)) {
    throw Error("the " + std::string(scheme_name(scheme)) + " scheme does not hold layers of spec " +
                shape.spec.describe());
  }
  if (shards < 1 || shards > shape.num_layers) {
    throw Error("shards must be in [1, " + std::to_string(shape.num_layers) + "], got " + std::to_string(shards));
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error(dir + ": cannot create directory: " + ec.message());

  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  uint64_t total_bytes = 0;
  // A layer at a time: a file of gpt-oss-120b layers is tens of GB, more than a machine may hold.
  for (int shard = 0; shard < shards; ++shard) {
    const int first = shard * shape.num_layers / shards, last = (shard + 1) * shape.num_layers / shards;
    std::vector<TensorToWrite> layout;
    for (int layer = first; layer < last; ++layer) {
      for (auto& t : layer_tensors(scheme, layer, shape, MoeLayerWeights{})) layout.push_back(std::move(t));
    }
    const std::string file = shard_file_name(shard, shards);
    SafetensorsWriter writer((fs::path(dir) / file).string(), layout, {{"format", "pt"}});
    for (int layer = first; layer < last; ++layer) {
      const MoeLayerWeights w = make_synthetic_layer(shape, layer_seed(seed, layer));
      for (const auto& t : layer_tensors(scheme, layer, shape, w)) writer.append(t.name, t.bytes);
    }
    writer.finish();
    for (const auto& t : layout) {
      uint64_t elements = 1;
      for (int64_t d : t.shape) elements *= static_cast<uint64_t>(d);
      weight_map[t.name] = file;
      total_bytes += elements * dtype_size(t.dtype);
    }
  }
  if (shards > 1) {
    write_json(fs::path(dir) / "model.safetensors.index.json",
               {{"metadata", {{"total_size", total_bytes}}}, {"weight_map", weight_map}});
  }
  write_json(fs::path(dir) / "config.json", config_json(shape, scheme));
}

}  // namespace mxmoe

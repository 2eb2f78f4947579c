// Writing synthetic gpt-oss checkpoints in either naming scheme, optionally sharded with an index.
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/atomic_file.hpp"
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

nlohmann::ordered_json config_json(const MoeShape& shape, CheckpointScheme scheme) {
  if (scheme == CheckpointScheme::kOpenAi) {
    return {{"num_hidden_layers", shape.num_layers}, {"num_experts", shape.num_experts},
            {"experts_per_token", shape.top_k},      {"hidden_size", shape.hidden},
            {"intermediate_size", shape.intermediate}, {"swiglu_limit", kSwigluLimit}};
  }
  return {{"model_type", "gpt_oss"},         {"num_hidden_layers", shape.num_layers},
          {"num_local_experts", shape.num_experts}, {"num_experts_per_tok", shape.top_k},
          {"hidden_size", shape.hidden},     {"intermediate_size", shape.intermediate},
          {"swiglu_limit", kSwigluLimit}};
}

}  // namespace

void write_synthetic_checkpoint(const std::string& dir, const MoeShape& shape, CheckpointScheme scheme, int shards,
                                uint64_t seed) {
  shape.validate();
  if (shards < 1 || shards > shape.num_layers) {
    throw Error("shards must be in [1, " + std::to_string(shape.num_layers) + "], got " + std::to_string(shards));
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error(dir + ": cannot create directory: " + ec.message());

  const int64_t e = shape.num_experts, h = shape.hidden, i = shape.intermediate, rows1 = shape.fc1_rows();
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  uint64_t total_bytes = 0;
  // Layer `layer`'s tensors holding the bytes of `w` (none, for the file's layout).
  auto layer_tensors = [&](int layer, const MoeLayerWeights& w) {
    const LayerTensorNames n = layer_tensor_names(scheme, layer);
    return std::vector<TensorToWrite>{
        {n.router_weight, Dtype::kBF16, {e, h}, as_bytes(w.router_weight)},
        {n.router_bias, Dtype::kBF16, {e}, as_bytes(w.router_bias)},
        {n.fc1_blocks, Dtype::kU8, {e, rows1, h / kMxBlock, kMxfp4BlockBytes}, w.fc1_blocks},
        {n.fc1_scales, Dtype::kU8, {e, rows1, h / kMxBlock}, w.fc1_scales},
        {n.fc1_bias, Dtype::kBF16, {e, rows1}, as_bytes(w.fc1_bias)},
        {n.fc2_blocks, Dtype::kU8, {e, h, i / kMxBlock, kMxfp4BlockBytes}, w.fc2_blocks},
        {n.fc2_scales, Dtype::kU8, {e, h, i / kMxBlock}, w.fc2_scales},
        {n.fc2_bias, Dtype::kBF16, {e, h}, as_bytes(w.fc2_bias)},
    };
  };
  // A layer at a time: a file of gpt-oss-120b layers is tens of GB, more than a machine may hold.
  for (int shard = 0; shard < shards; ++shard) {
    const int first = shard * shape.num_layers / shards, last = (shard + 1) * shape.num_layers / shards;
    std::vector<TensorToWrite> layout;
    for (int layer = first; layer < last; ++layer) {
      for (auto& t : layer_tensors(layer, MoeLayerWeights{})) layout.push_back(std::move(t));
    }
    const std::string file = shard_file_name(shard, shards);
    SafetensorsWriter writer((fs::path(dir) / file).string(), layout, {{"format", "pt"}});
    for (int layer = first; layer < last; ++layer) {
      const MoeLayerWeights w = make_synthetic_layer(shape, layer_seed(seed, layer));
      for (const auto& t : layer_tensors(layer, w)) writer.append(t.name, t.bytes);
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

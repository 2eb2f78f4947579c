// The host stage of a model load: the layers in order, each read ahead into the page cache on a
// background thread while the one before it is handed to the sink.
#include <chrono>
#include <optional>
#include <thread>
#include <vector>

#include "io/deepseek_v4_names.hpp"
#include "io/file_ranges.hpp"
#include "io/gpt_oss_names.hpp"
#include "mxmoe/error.hpp"
#include "mxmoe/model_loader.hpp"

namespace mxmoe {
namespace {

struct FileRange {
  std::shared_ptr<const SafetensorsFile> file;
  uint64_t offset, bytes;
};

// Every MoE tensor the checkpoint holds for `layer` under `scheme`'s names, or any scheme's.
std::vector<FileRange> layer_file_ranges(const Checkpoint& checkpoint, int layer,
                                         std::optional<CheckpointScheme> only = std::nullopt) {
  std::vector<std::string> names;
  for (CheckpointScheme scheme : {CheckpointScheme::kOpenAi, CheckpointScheme::kHuggingFace}) {
    if (only && scheme != *only) continue;
    const LayerTensorNames n = layer_tensor_names(scheme, layer);
    names.insert(names.end(), {n.router_weight, n.router_bias, n.fc1_blocks, n.fc1_scales, n.fc1_bias, n.fc2_blocks,
                               n.fc2_scales, n.fc2_bias});
  }
  if (!only || *only == CheckpointScheme::kHuggingFace) {
    const DenseExpertNames dense = dense_expert_names(layer);
    names.insert(names.end(), {dense.gate_up, dense.down});
  }
  for (CheckpointScheme scheme : {CheckpointScheme::kDeepSeek, CheckpointScheme::kDeepSeekHuggingFace}) {
    if (only && scheme != *only) continue;
    const DeepseekV4LayerNames n = deepseek_v4_layer_names(scheme, layer);
    names.insert(names.end(), {n.router_weight, n.selection_bias});
    if (scheme == CheckpointScheme::kDeepSeekHuggingFace) {
      names.insert(names.end(), {n.gate_up, n.gate_up_scale, n.down, n.down_scale});
      continue;
    }
    for (int e = 0; checkpoint.find(deepseek_v4_expert_names(layer, e).w1); ++e) {
      const DeepseekV4ExpertNames x = deepseek_v4_expert_names(layer, e);
      names.insert(names.end(), {x.w1, x.w1_scale, x.w3, x.w3_scale, x.w2, x.w2_scale});
    }
  }
  std::vector<FileRange> ranges;
  for (const auto& name : names) {
    if (const auto located = checkpoint.find(name)) {
      const auto bytes = located->tensor->bytes;
      ranges.push_back({located->file, static_cast<uint64_t>(bytes.data() - located->file->mapping().data()),
                        bytes.size()});
    }
  }
  return ranges;
}

}  // namespace

int count_moe_layers(const Checkpoint& checkpoint) {
  int count = 0;
  while (!layer_file_ranges(checkpoint, count).empty()) ++count;
  return count;
}

void for_each_moe_layer(const Checkpoint& checkpoint, std::span<const int> layers, const LoadOptions& options,
                            const std::function<void(int layer, const LoadedLayer& loaded)>& sink,
                            const LayerProgressCallback& progress) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  uint64_t bytes_done = 0;
  std::jthread read_ahead;
  for (size_t i = 0; i < layers.size(); ++i) {
    const auto layer_start = Clock::now();
    if (layers[i] < 0) throw Error("layer " + std::to_string(layers[i]) + " is negative");
    const std::vector<FileRange> ranges = layer_file_ranges(checkpoint, layers[i], options.scheme);
    if (read_ahead.joinable()) read_ahead.join();
    if (i + 1 < layers.size() && layers[i + 1] >= 0) {
      read_ahead = std::jthread([next = layer_file_ranges(checkpoint, layers[i + 1], options.scheme)] {
        for (const auto& r : next) prefetch_file_range(r.file->fd(), r.offset, r.bytes);
      });
    }
    sink(layers[i], load_moe_layer(checkpoint, layers[i], options));
    uint64_t layer_bytes = 0;
    for (const auto& r : ranges) layer_bytes += r.bytes;
    bytes_done += layer_bytes;
    if (progress) {
      const auto now = Clock::now();
      progress({layers[i], static_cast<int>(i + 1), static_cast<int>(layers.size()), layer_bytes,
                std::chrono::duration<double>(now - layer_start).count(), bytes_done,
                std::chrono::duration<double>(now - start).count()});
    }
  }
}

}  // namespace mxmoe

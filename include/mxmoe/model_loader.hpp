// Loading a model's MoE layers from a checkpoint a layer at a time: each layer's tensors are checked
// (load_moe_layer), then read from the files straight into pinned staging and repacked on the
// device (MoeRunner), while a background thread has the kernel read the next layer into its page
// cache, so that a cold read of layer L + 1 overlaps the upload and repack of layer L. The process
// holds at most one layer's host state at a time (the staging buffers and the layer's small
// tensors; the expert tensors are never mapped in), whatever the model's size.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "mxmoe/checkpoint.hpp"
#include "mxmoe/runner.hpp"

namespace mxmoe {

// After each layer: which, how far along, and the checkpoint bytes (the layer's MoE tensors as
// stored) read so far.
struct LayerLoadProgress {
  int layer;  // the checkpoint's layer index
  int layers_done, layers_total;
  uint64_t layer_bytes;
  double layer_seconds;
  uint64_t bytes_done;
  double seconds_done;
};
using LayerProgressCallback = std::function<void(const LayerLoadProgress&)>;

// The layers 0..N-1 a checkpoint holds under any scheme (MXFP4 or gpt-oss's bf16 experts): N, counting
// from 0 until the first absent layer.
int count_moe_layers(const Checkpoint& checkpoint);

// The host stage: for each of `layers` in order, load_moe_layer, then sink(layer, loaded), then
// progress (where set), with the next layer's tensors read ahead into the page cache meanwhile.
// `loaded` lives until sink returns. Throws what load_moe_layer or sink throws.
void for_each_moe_layer(const Checkpoint& checkpoint, std::span<const int> layers, const LoadOptions& options,
                            const std::function<void(int layer, const LoadedLayer& loaded)>& sink,
                            const LayerProgressCallback& progress = {});

struct ModelLoadOptions {
  std::vector<int> layers;  // empty: every layer the checkpoint holds (count_moe_layers)
  LoadOptions load;
  RunnerOptions runner;  // for every layer's runner (its allocator, activations, ...)
  LayerProgressCallback progress;
};

// One runner per layer, in the order of options.layers, on the current device. Throws Error naming
// the layer's file and tensor for anything missing or mis-shaped, or the failed allocation.
std::vector<MoeRunner> load_model(const Checkpoint& checkpoint, const ModelLoadOptions& options = {});

}  // namespace mxmoe

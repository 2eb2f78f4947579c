// The device stage of a model load: a runner per layer from the host stage's layers.
#include "mxmoe/model_loader.hpp"

#include <numeric>


namespace mxmoe {

std::vector<MoeRunner> load_model(const Checkpoint& checkpoint, const ModelLoadOptions& options) {
  std::vector<int> layers = options.layers;
  if (layers.empty()) {
    layers.resize(count_moe_layers(checkpoint));
    if (layers.empty()) load_moe_layer(checkpoint, 0, options.load);  // throws, naming what it looked for
    std::iota(layers.begin(), layers.end(), 0);
  }
  std::vector<MoeRunner> runners;
  runners.reserve(layers.size());
  for_each_moe_layer(
      checkpoint, layers, options.load,
      [&](int, const LoadedLayer& loaded) { runners.emplace_back(loaded.weights, options.runner); }, options.progress);
  return runners;
}

}  // namespace mxmoe

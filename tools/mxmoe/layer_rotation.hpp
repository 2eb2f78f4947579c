// The measuring rig shared by `mxmoe bench` and `mxmoe tune` (docs/benchmarking.md): 8 or
// more layers of distinct synthetic weights on the device, fresh random activations and router
// logits per layer, the whole rotation captured in one CUDA graph so that L2 never holds the
// experts being read, replays timed with events; and the CPU-reference check of layer 0.
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <vector>

#include "clock_monitor.hpp"
#include "mxmoe/reference.hpp"
#include "mxmoe/runner.hpp"
#include "tools_internal.hpp"

namespace mxmoe::cli {

class LayerRotation {
 public:
  // `options`: the runners' (their activations decide the plans the rotation runs when given none).
  // Builds `num_layers` layers, or as many (at least 2) as leave a quarter of the device's memory
  // free: num_layers() says how many.
  LayerRotation(const MoeShape& shape, int num_layers, const RunnerOptions& options = {});
  ~LayerRotation();

  const MoeShape& shape() const { return shape_; }
  const MoeRunner& runner() const { return layers_.front()->runner; }
  int num_layers() const { return static_cast<int>(layers_.size()); }

  // New inputs for `tokens` tokens; `skewed` sends half the tokens to expert 0 first.
  void set_tokens(int tokens, bool skewed);
  int tokens() const { return tokens_; }

  struct Timing {
    double median_us = 0, min_us = 0, max_us = 0;  // per layer
    ClockReport clocks;  // the GPU's clock and power during the timed replays
  };
  // Times `replays` replays of the rotation run with `plan` (each runner's own choice when null).
  // Stops early, returning the first replay's time, when that is over `give_up_us` per layer.
  Timing time(const LayerPlan* plan, int replays, double give_up_us = 1e30, ForwardPart last = ForwardPart::kAll);

  // Relative error (by norm) of layer 0's output from the last timed run against the CPU
  // reference computed with `activations`, on up to 8 tokens spread over the batch.
  double first_layer_error(ActivationFormat activations = ActivationFormat::kBf16);

  // Averages over the layers, from the routing of the current inputs: distinct experts touched,
  // and bytes the layer must move (those experts' weights, scales, biases; activations in and out).
  double touched_experts() const;
  double counted_bytes() const;

 private:
  struct Layer {
    MoeRunner runner;
    DeviceBuffer x, logits, out;
    std::vector<Bf16> host_x;
    std::vector<float> host_logits;
  };
  MoeShape shape_;
  MoeLayerWeights first_weights_;
  std::vector<std::unique_ptr<Layer>> layers_;
  DeviceBuffer workspace_;
  cudaStream_t stream_ = nullptr;
  int tokens_ = 0;
  std::vector<int> sample_;
  std::vector<float> reference_[3];  // layer 0 on sample_ per activation format, computed once per set_tokens
  ClockMonitor clock_monitor_;
};

}  // namespace mxmoe::cli

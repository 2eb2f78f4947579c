#include "layer_rotation.hpp"

#include <algorithm>
#include <set>

#include "tools_internal.hpp"
#include "mxmoe/error.hpp"
#include "summary.hpp"

namespace mxmoe::cli {
namespace {

constexpr int kCheckedTokens = 8;
constexpr int kWarmReplays = 3;

}  // namespace

LayerRotation::LayerRotation(const MoeShape& shape, int num_layers, const RunnerOptions& options) : shape_(shape) {
  for (int l = 0; l < num_layers; ++l) {
    MoeLayerWeights w = make_synthetic_layer(shape, layer_seed(1234, l));
    layers_.push_back(std::make_unique<Layer>(Layer{MoeRunner(w, options), {}, {}, {}, {}, {}}));
    if (l == 0) first_weights_ = std::move(w);
    // A layer larger than an eighth of the device (DeepSeek-V4-Pro's 13.4 GB on an 80 GB GPU): stop
    // at the layers that leave a quarter of it for the workspace and the ceilings. Two such layers
    // still keep L2 (tens of MB) from holding what a replay reads.
    size_t free_bytes = 0, total_bytes = 0;
    cuda_check(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
    const size_t layer_bytes = layers_.front()->runner.device_bytes();
    if (l >= 1 && free_bytes < total_bytes / 4 + layer_bytes) break;
  }
  cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
}

LayerRotation::~LayerRotation() {
  if (stream_) cudaStreamDestroy(stream_);
}

void LayerRotation::set_tokens(int tokens, bool skewed) {
  tokens_ = tokens;
  const size_t x_bytes = static_cast<size_t>(tokens) * shape_.hidden * 2;
  for (size_t l = 0; l < layers_.size(); ++l) {
    Layer& layer = *layers_[l];
    layer.host_x = make_activations(tokens, shape_.hidden, derive_seed(tokens, 2 * l));
    SplitMix64 rng(derive_seed(tokens, 2 * l + 1));
    layer.host_logits.resize(static_cast<size_t>(tokens) * shape_.num_experts);
    for (auto& v : layer.host_logits) v = static_cast<float>(rng.normal());
    if (skewed) {
      for (int t = 0; t < tokens; t += 2) layer.host_logits[static_cast<size_t>(t) * shape_.num_experts] = 10.0f;
    }
    layer.x = DeviceBuffer(x_bytes, "activations");
    layer.out = DeviceBuffer(x_bytes, "output");
    layer.logits = DeviceBuffer(layer.host_logits.size() * 4, "router logits");
    cuda_check(cudaMemcpy(layer.x.get(), layer.host_x.data(), x_bytes, cudaMemcpyHostToDevice), "copying activations");
    cuda_check(cudaMemcpy(layer.logits.get(), layer.host_logits.data(), layer.host_logits.size() * 4,
                          cudaMemcpyHostToDevice),
               "copying router logits");
  }
  for (const auto& layer : layers_) layer->runner.prepare(tokens);
  workspace_ = DeviceBuffer(runner().workspace_size(tokens), "workspace");
  sample_ = sample_tokens(tokens, kCheckedTokens);
  for (auto& reference : reference_) reference.clear();
}

LayerRotation::Timing LayerRotation::time(const LayerPlan* plan, int replays, double give_up_us, ForwardPart last) {
  auto forward_all = [&] {
    for (auto& layer : layers_) {
      layer->runner.forward(static_cast<const __nv_bfloat16*>(layer->x.get()), static_cast<const float*>(layer->logits.get()),
                            static_cast<__nv_bfloat16*>(layer->out.get()), tokens_, workspace_.get(), workspace_.bytes(),
                            stream_, plan, last);
    }
  };
  forward_all();  // outside the graph: loads (or compiles) the plan's kernels
  cuda_check(cudaStreamSynchronize(stream_), "warm-up forward");
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  cuda_check(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal), "graph capture");
  forward_all();
  cuda_check(cudaStreamEndCapture(stream_, &graph), "graph capture");
  cuda_check(cudaGraphInstantiate(&exec, graph, 0), "graph instantiate");
  cudaEvent_t start, stop;
  cuda_check(cudaEventCreate(&start), "cudaEventCreate");
  cuda_check(cudaEventCreate(&stop), "cudaEventCreate");
  std::vector<double> us;
  for (int i = 0; i < kWarmReplays + replays; ++i) {
    if (i == kWarmReplays) clock_monitor_.start();
    cuda_check(cudaEventRecord(start, stream_), "cudaEventRecord");
    cuda_check(cudaGraphLaunch(exec, stream_), "graph replay");
    cuda_check(cudaEventRecord(stop, stream_), "cudaEventRecord");
    cuda_check(cudaEventSynchronize(stop), "graph replay");
    float ms = 0.0f;
    cuda_check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    const double per_layer = 1000.0 * ms / static_cast<double>(layers_.size());
    if (i == 0 && per_layer > give_up_us) {
      us.push_back(per_layer);
      break;
    }
    if (i >= kWarmReplays) us.push_back(per_layer);
  }
  const ClockReport clocks = clock_monitor_.stop();
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  std::sort(us.begin(), us.end());
  return {us[us.size() / 2], us.front(), us.back(), clocks};
}

double LayerRotation::first_layer_error(ActivationFormat activations) {
  const Layer& first = *layers_.front();
  const size_t h = shape_.hidden, e = shape_.num_experts;
  std::vector<float>& reference = reference_[static_cast<int>(activations)];
  if (reference.empty()) {
    reference = reference_forward_from_logits(first_weights_, sample_rows<Bf16>(first.host_x, sample_, h),
                                              static_cast<int>(sample_.size()),
                                              sample_rows<float>(first.host_logits, sample_, e),
                                              {.activations = activations})
                    .out;
  }
  std::vector<Bf16> out(static_cast<size_t>(tokens_) * h);
  cuda_check(cudaMemcpy(out.data(), first.out.get(), out.size() * 2, cudaMemcpyDeviceToHost), "copying the output");
  std::vector<float> gpu;
  for (int t : sample_) {
    for (size_t j = 0; j < h; ++j) gpu.push_back(bf16_to_float(out[t * h + j]));
  }
  return relative_error(gpu, std::vector<double>(reference.begin(), reference.end()));
}

double LayerRotation::touched_experts() const {
  double sum = 0.0;
  for (const auto& layer : layers_) {
    const Routing r = route(layer->host_logits, tokens_, shape_.num_experts, shape_.top_k);
    sum += static_cast<double>(std::set<int32_t>(r.experts.begin(), r.experts.end()).size());
  }
  return sum / static_cast<double>(layers_.size());
}

double LayerRotation::counted_bytes() const {
  return touched_experts() * static_cast<double>(shape_.expert_bytes()) + 2.0 * tokens_ * shape_.hidden * 2;
}

}  // namespace mxmoe::cli

// One gpt-oss MoE layer through mxmoe's library: synthetic weights (or a checkpoint's layer, given
// its path), the CPU reference, and, where a GPU is visible, the GPU runner checked against it.
// Usage: layer_example [CHECKPOINT] [TOKENS]
#include <cuda_runtime.h>

#include <cstdio>
#include <string>
#include <vector>

#include <mxmoe/checkpoint.hpp>
#include <mxmoe/device.hpp>
#include <mxmoe/error.hpp>
#include <mxmoe/reference.hpp>
#include <mxmoe/runner.hpp>

int main(int argc, char** argv) try {
  // Weights: a checkpoint's layer 0, or a small synthetic layer (E = 8, top-4, H = I = 256).
  mxmoe::MoeLayerWeights weights =
      argc > 1 ? mxmoe::load_gpt_oss_layer(mxmoe::Checkpoint::open(argv[1]), 0).weights
               : mxmoe::make_synthetic_layer(mxmoe::MoeShape{8, 4, 256, 256, 1}, 42);
  const int tokens = argc > 2 ? std::stoi(argv[2]) : 5;
  const std::vector<mxmoe::Bf16> x = mxmoe::make_activations(tokens, weights.shape.hidden, 7);

  // The CPU reference (float32, threaded): the layer's output and its routing.
  const mxmoe::ReferenceResult ref = mxmoe::reference_forward(weights, x, tokens);
  std::printf("%s, %d tokens: CPU reference done, token 0 -> experts %d %d\n", weights.shape.describe().c_str(),
              tokens, ref.routing.experts[0], ref.routing.experts[1]);
  if (mxmoe::list_gpus().empty()) return 0;

  // The GPU runner: repack and upload once, decide the launches, then forward on a stream.
  mxmoe::MoeRunner runner(weights);
  runner.prepare(tokens);
  void *d_x, *d_out, *workspace;
  const size_t bytes = x.size() * 2, workspace_bytes = runner.workspace_size(tokens);
  if (cudaMalloc(&d_x, bytes) || cudaMalloc(&d_out, bytes) || cudaMalloc(&workspace, workspace_bytes)) return 1;
  cudaMemcpy(d_x, x.data(), bytes, cudaMemcpyHostToDevice);
  runner.forward(static_cast<const __nv_bfloat16*>(d_x), static_cast<__nv_bfloat16*>(d_out), tokens, workspace,
                 workspace_bytes, nullptr);
  std::vector<mxmoe::Bf16> out(x.size());
  cudaMemcpy(out.data(), d_out, bytes, cudaMemcpyDeviceToHost);
  std::vector<float> gpu(out.size());
  for (size_t i = 0; i < out.size(); ++i) gpu[i] = mxmoe::bf16_to_float(out[i]);
  const double error = mxmoe::relative_error(gpu, std::vector<double>(ref.out.begin(), ref.out.end()));
  std::printf("GPU runner: relative error against the reference %.2e\n", error);
  cudaFree(d_x);
  cudaFree(d_out);
  cudaFree(workspace);
  return error < 1e-2 ? 0 : 1;
} catch (const mxmoe::Error& e) {
  std::fprintf(stderr, "layer_example: %s\n", e.what());
  return 1;
}

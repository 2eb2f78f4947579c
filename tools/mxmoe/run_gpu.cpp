// mxmoe run on the GPU: one runner, the router-weights entry point, event-timed forwards, and a
// check against the CPU reference on a sample of tokens.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "commands.hpp"
#include "mxmoe/device.hpp"
#include "mxmoe/reference.hpp"
#include "mxmoe/runner.hpp"
#include "tools_internal.hpp"
#include "summary.hpp"

namespace mxmoe::cli {
namespace {

constexpr int kTimedForwards = 20;
constexpr int kMaxCheckedTokens = 64;
// Against the CPU reference computed with the plan's activations (docs/benchmarking.md's
// 1e-2 for bf16; MXFP8 activations are the same function on both sides, so the same bound).
constexpr double kGpuRelTolerance = 1e-2;

template <typename T>
std::vector<T> to_host(const void* device, size_t count) {
  std::vector<T> host(count);
  cuda_check(cudaMemcpy(host.data(), device, count * sizeof(T), cudaMemcpyDeviceToHost), "copying results back");
  return host;
}

}  // namespace

GpuRun run_on_gpu(const MoeLayerWeights& weights, std::span<const Bf16> x, int num_tokens,
                  const std::vector<float>* router_logits, bool check, const RunnerOptions& options) {
  const MoeShape& shape = weights.shape;
  const GpuInfo gpu = list_gpus().front();
  cuda_check(cudaSetDevice(gpu.index), "cudaSetDevice");
  const MoeRunner runner(weights, options);
  runner.prepare(num_tokens);
  for (const BlockScaledCheckResult& c : runner.block_scaled_checks()) {
    std::printf("block-scaled check: %s against %s on %s: relative difference %.3e over one FC2 tile: %s\n",
                c.tactic.c_str(), c.reference.c_str(), c.device.c_str(), c.rel_difference,
                c.passed ? "passed" : "FAILED, bf16 activations instead");
  }
  const LayerPlan plan = runner.plan(num_tokens);
  std::printf("device: gpu %d (%s, sm_%d%d), FC1 %s, FC2 %s, %s activations\n", gpu.index, gpu.name.c_str(),
              gpu.sm_major, gpu.sm_minor, plan.fc1.name().c_str(), plan.fc2.name().c_str(),
              activation_format_name(plan.activations));

  DeviceBuffer d_x(x.size() * 2, "activations"), d_out(x.size() * 2, "output");
  DeviceBuffer workspace(runner.workspace_size(num_tokens), "workspace");
  cuda_check(cudaMemcpy(d_x.get(), x.data(), x.size() * 2, cudaMemcpyHostToDevice), "copying activations");
  cudaStream_t stream;
  cuda_check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  DeviceBuffer d_logits(router_logits ? router_logits->size() * 4 : 0, "router logits");
  if (router_logits) {
    cuda_check(cudaMemcpy(d_logits.get(), router_logits->data(), d_logits.bytes(), cudaMemcpyHostToDevice),
               "copying router logits");
  }
  auto forward = [&] {
    const auto* xp = static_cast<const __nv_bfloat16*>(d_x.get());
    auto* out = static_cast<__nv_bfloat16*>(d_out.get());
    if (router_logits) {
      runner.forward(xp, static_cast<const float*>(d_logits.get()), out, num_tokens, workspace.get(),
                     workspace.bytes(), stream);
    } else {
      runner.forward(xp, out, num_tokens, workspace.get(), workspace.bytes(), stream);
    }
  };
  forward();  // warm-up
  std::vector<float> times_us;
  cudaEvent_t start, stop;
  cuda_check(cudaEventCreate(&start), "cudaEventCreate");
  cuda_check(cudaEventCreate(&stop), "cudaEventCreate");
  for (int i = 0; i < kTimedForwards; ++i) {
    cuda_check(cudaEventRecord(start, stream), "cudaEventRecord");
    forward();
    cuda_check(cudaEventRecord(stop, stream), "cudaEventRecord");
    cuda_check(cudaEventSynchronize(stop), "forward");
    float ms = 0.0f;
    cuda_check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    times_us.push_back(1000.0f * ms);
  }
  std::sort(times_us.begin(), times_us.end());
  std::printf("tokens: %d\n", num_tokens);
  std::printf("time: %.1f us (median of %d forwards, weights L2-warm; 'mxmoe bench' measures properly)\n",
              times_us[times_us.size() / 2], kTimedForwards);
  GpuRun run{to_host<Bf16>(d_out.get(), x.size()), true};
  const std::vector<Bf16>& out = run.out;
  print_output_summary(out, num_tokens, shape.hidden);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaStreamDestroy(stream);
  if (!check) return run;

  // The reference routes from the GPU's own logits (checked separately against the CPU's), so a
  // near-tie decided by a logit's last bit cannot make the two sides pick different experts.
  const RoutingView routing = runner.routing(workspace.get(), num_tokens);
  const auto gpu_logits =
      router_logits ? *router_logits
                    : to_host<float>(routing.router_logits, static_cast<size_t>(num_tokens) * shape.num_experts);
  const std::vector<int> sample = sample_tokens(num_tokens, kMaxCheckedTokens);
  const std::vector<Bf16> x_sample = sample_rows(x, sample, shape.hidden);
  const std::vector<float> logits_sample = sample_rows<float>(gpu_logits, sample, shape.num_experts);
  std::vector<float> gpu_sample;
  for (Bf16 v : sample_rows<Bf16>(out, sample, shape.hidden)) gpu_sample.push_back(bf16_to_float(v));
  const int checked = static_cast<int>(sample.size());
  const std::vector<float> cpu_logits = mxmoe::router_logits(weights, x_sample, checked);
  const double logits_error = relative_error(logits_sample, std::vector<double>(cpu_logits.begin(), cpu_logits.end()));
  const ReferenceResult ref = reference_forward_from_logits(weights, x_sample, checked, logits_sample,
                                                           {.activations = plan.activations});
  const double error = relative_error(gpu_sample, std::vector<double>(ref.out.begin(), ref.out.end()));
  std::printf("check: %d of %d tokens against the CPU reference (%s activations)\n", checked, num_tokens,
              activation_format_name(plan.activations));
  if (!router_logits) std::printf("check: router logits relative error %.3e (bound 1e-5)\n", logits_error);
  std::printf("check: output relative error %.3e (bound %.0e)\n", error, kGpuRelTolerance);
  if (plan.activations != ActivationFormat::kBf16) {
    // What rounded activations cost: the output against the reference with bf16 activations, which
    // is within 1e-5 of the float64 evaluation (kReferenceRelTolerance).
    const ReferenceResult bf16 = reference_forward_from_logits(weights, x_sample, checked, logits_sample);
    std::printf("check: %s activations cost %.3e against bf16 activations (bound %.0e)\n",
                plan.activations == ActivationFormat::kFp8 ? "FP8" : "MXFP8",
                relative_error(gpu_sample, std::vector<double>(bf16.out.begin(), bf16.out.end())),
                kMxfp8ActivationRelTolerance);
  }
  run.check_passed = (router_logits || logits_error <= 1e-5) && error < kGpuRelTolerance;
  return run;
}

}  // namespace mxmoe::cli

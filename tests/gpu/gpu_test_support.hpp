// Helpers for the GPU tests: skipping without a GPU, device arrays, synthetic layers shared by the
// tests of one process (a gpt-oss-120b layer is 1.6 GB to generate and pack), the plans every test
// runs, and the comparison of an output with the reference.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "common/random.hpp"
#include "device/current_device.hpp"
#include "kernels/family_registry.hpp"
#include "mxmoe/device.hpp"
#include "mxmoe/reference.hpp"
#include "mxmoe/runner.hpp"

#define MXMOE_REQUIRE_GPU()                                                        \
  do {                                                                             \
    if (mxmoe::list_gpus().empty()) GTEST_SKIP() << "no CUDA GPU visible: skipped"; \
  } while (0)

#define MXMOE_CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << cudaGetErrorString(cudaGetLastError())

namespace mxmoe {

// How gtest prints an activation format in a test's parameter (found by argument-dependent lookup).
inline void PrintTo(ActivationFormat format, std::ostream* os) { *os << activation_format_name(format); }

}  // namespace mxmoe

namespace mxmoe::test {

template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(size_t count) : count_(count) {
    if (cudaMalloc(&ptr_, std::max<size_t>(count, 1) * sizeof(T)) != cudaSuccess) throw std::bad_alloc();
  }
  explicit DeviceArray(const std::vector<T>& host) : DeviceArray(host.size()) {
    cudaMemcpy(ptr_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
  }
  ~DeviceArray() { cudaFree(ptr_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  T* get() const { return static_cast<T*>(ptr_); }
  size_t size() const { return count_; }
  std::vector<T> to_host() const {
    std::vector<T> host(count_);
    cudaMemcpy(host.data(), ptr_, count_ * sizeof(T), cudaMemcpyDeviceToHost);
    return host;
  }
  // Done when it returns: cudaMemset of device memory may return first, on the legacy stream, which
  // work on a non-blocking stream (a graph replay) does not wait for.
  void fill_bytes(int value) {
    cudaMemset(ptr_, value, count_ * sizeof(T));
    cudaDeviceSynchronize();
  }

 private:
  void* ptr_ = nullptr;
  size_t count_;
};

struct TestLayer {
  MoeLayerWeights weights;
  std::unique_ptr<MoeRunner> runner;
};

// One synthetic layer per (shape, seed), built on first use and kept for the process.
inline const TestLayer& test_layer(const MoeShape& shape, uint64_t seed) {
  static std::map<std::string, std::unique_ptr<TestLayer>> cache;
  const std::string key = shape.describe() + "/" + std::to_string(seed);
  auto& slot = cache[key];
  if (!slot) {
    slot = std::make_unique<TestLayer>();
    slot->weights = make_synthetic_layer(shape, seed);
    slot->runner = std::make_unique<MoeRunner>(slot->weights);
  }
  return *slot;
}

struct GpuResult {
  std::vector<Bf16> out;
  std::vector<int> topk_experts, expert_counts, expert_offsets, sorted_pairs, pair_rows;
  std::vector<float> topk_weights, logits;
};

template <typename T>
inline std::vector<T> copy_back(const T* device, size_t count) {
  std::vector<T> host(count);
  EXPECT_EQ(cudaMemcpy(host.data(), device, count * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return host;
}

// One forward on the default stream, with its output and the routing it left in the workspace;
// `logits` ([T, routed experts]) null means the router-weights entry point.
inline GpuResult run_gpu(const MoeRunner& runner, const std::vector<Bf16>& x, int tokens, const std::vector<float>* logits,
                         const LayerPlan* plan) {
  const MoeShape& s = runner.shape();
  DeviceArray<Bf16> d_x(x);
  DeviceArray<Bf16> d_out(static_cast<size_t>(tokens) * s.hidden);
  DeviceArray<unsigned char> workspace(runner.workspace_size(tokens));
  d_out.fill_bytes(0xFF);      // bf16 NaN
  workspace.fill_bytes(0xFF);  // NaN floats, -1 indices
  auto* x_ptr = reinterpret_cast<const __nv_bfloat16*>(d_x.get());
  auto* out_ptr = reinterpret_cast<__nv_bfloat16*>(d_out.get());
  if (logits) {
    DeviceArray<float> d_logits(*logits);
    runner.forward(x_ptr, d_logits.get(), out_ptr, tokens, workspace.get(), workspace.size(), nullptr, plan);
  } else {
    runner.forward(x_ptr, out_ptr, tokens, workspace.get(), workspace.size(), nullptr, plan);
  }
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess) << cudaGetErrorString(cudaGetLastError());
  const RoutingView view = runner.routing(workspace.get(), tokens);
  const size_t pairs = static_cast<size_t>(tokens) * s.top_k;
  GpuResult r;
  r.out = d_out.to_host();
  r.topk_experts = copy_back(view.topk_experts, pairs);
  r.topk_weights = copy_back(view.topk_weights, pairs);
  r.expert_counts = copy_back(view.expert_counts, s.num_experts);
  r.expert_offsets = copy_back(view.expert_offsets, s.num_experts + 1);
  r.sorted_pairs = copy_back(view.sorted_pairs, pairs);
  r.pair_rows = copy_back(view.pair_rows, pairs);
  if (!logits) r.logits = copy_back(view.router_logits, static_cast<size_t>(tokens) * runner.routed_experts());
  return r;
}

constexpr double kMaxRelativeError = 1e-2;  // bf16 activations (docs/benchmarking.md)
// FP8 activations against the reference that rounds the same rows: the rows agree to the bf16 the
// GPU writes them in, so only the GEMMs' summation order and the SwiGLU's approximations differ.
constexpr double kFp8RelativeError = 3e-3;

inline std::vector<float> random_logits(int tokens, int experts, uint64_t seed) {
  SplitMix64 rng(seed);
  std::vector<float> logits(static_cast<size_t>(tokens) * experts);
  for (auto& v : logits) v = static_cast<float>(rng.normal());
  return logits;
}

// Every element written, relative error by norm under `bound`, and no element far off on its own.
inline void expect_close(const std::vector<Bf16>& gpu, const std::vector<float>& ref, const std::string& what,
                         double bound = kMaxRelativeError) {
  ASSERT_EQ(gpu.size(), ref.size()) << what;
  std::vector<double> ref64(ref.begin(), ref.end());
  std::vector<float> got(gpu.size());
  size_t unwritten = 0;
  double power = 0.0;
  for (size_t i = 0; i < gpu.size(); ++i) {
    got[i] = bf16_to_float(gpu[i]);
    unwritten += std::isnan(got[i]);
    power += ref64[i] * ref64[i];
  }
  EXPECT_EQ(unwritten, 0u) << what << ": outputs left NaN";
  const double rel = relative_error(got, ref64);
  EXPECT_LT(rel, bound) << what;
  const double rms = std::sqrt(power / std::max<size_t>(1, ref.size()));
  size_t far = 0, first_far = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!(std::fabs(got[i] - ref64[i]) <= 0.05 * (std::fabs(ref64[i]) + rms)) && far++ == 0) first_far = i;
  }
  EXPECT_EQ(far, 0u) << what << ": first at element " << first_far << " (gpu " << got[first_far] << ", reference "
                     << ref[first_far] << ")";
}

// Every valid tactic of this device's arch whose family takes `activations` (FP8: the bf16 families
// but the whole-layer ones, validate_plan), for both stages (a whole-layer one is the whole layer;
// an FC2-only one, the token-sum GEMV, after a GEMV FC1), FC2 K splits (as many as
// FC2's K tiles allow), and for bf16 the runner's own choice (nullopt; the test layers' runners
// take bf16 activations).
inline std::vector<std::pair<std::string, std::optional<LayerPlan>>> plans_to_test(
    const MoeShape& shape, ActivationFormat activations = ActivationFormat::kBf16) {
  std::vector<std::pair<std::string, std::optional<LayerPlan>>> plans;
  if (activations == ActivationFormat::kBf16) plans.emplace_back("heuristic", std::nullopt);
  const int fc2_k_tiles = (shape.intermediate + 63) / 64;
  const Arch& arch = *current_device_arch().arch;
  const StageShape fc1{shape, Stage::kFc1}, fc2{shape, Stage::kFc2};
  for (const Tactic& t : valid_tactics(arch.name)) {
    // A tactic that cannot take the shape (a GEMV-style ring past the shared memory at K = 7168)
    // is refused by the runner before any launch: tests of that are the tactic table's.
    const bool takes = activations == ActivationFormat::kFp8
                           ? t.family->why_no_fp8(t, Stage::kFc1).empty() && t.family->why_no_fp8(t, Stage::kFc2).empty()
                           : activations_of(t) == activations;
    if (!takes || !t.family->why_invalid(t, arch, &fc2).empty()) continue;
    if (!t.family->why_invalid(t, arch, &fc1).empty()) {
      const Tactic gemv = parse_tactic("gemv.r64x8.w4x2.u2.k1");
      if (t.family == &gemv_token_sum_family() && gemv.family->why_invalid(gemv, arch, &fc1).empty()) {
        plans.emplace_back(gemv.name() + "+fc2." + t.name(), LayerPlan{gemv, t, activations});
      }
      continue;
    }
    plans.emplace_back(t.name(), LayerPlan{t, t, activations});
    // no K split: a whole-layer launch's FC1 and FC2 items share it; a stream-K GEMV splits K itself
    if (LayerPlan{t, t, activations}.whole_layer() || t.family == &gemv_streamk_family()) continue;
    Tactic split = t;
    split.k_split = std::min(t.family == &gemv_family() ? kMaxKSplit : 2, fc2_k_tiles);
    if (!split.family->why_invalid(split, arch, &fc2).empty()) continue;
    plans.emplace_back(t.name() + "+fc2." + split.name(), LayerPlan{t, split, activations});
  }
  return plans;
}

// A parameterised layer test's case: a named shape, a token count, and the activations of the
// plans it runs (every one of plans_to_test(shape, activations)), judged against the reference
// computed with the same activations.
struct LayerCase {
  const char* name;
  MoeShape shape;
  int tokens;
  ActivationFormat activations = ActivationFormat::kBf16;
};
inline void PrintTo(const LayerCase& c, std::ostream* os) {
  *os << c.name << " T=" << c.tokens << " " << activation_format_name(c.activations);
}
inline std::string layer_case_name(const ::testing::TestParamInfo<LayerCase>& info) {
  return std::string(info.param.name) + "_T" + std::to_string(info.param.tokens) +
         (info.param.activations == ActivationFormat::kBf16 ? "" : std::string("_") +
                                                                      activation_format_name(info.param.activations));
}

}  // namespace mxmoe::test

// The block-scaled tile family (MXFP8 activations) on the GPU beyond the layer tests it shares with
// the bf16 families (test_gpu_layer.cpp: shapes, skewed routing, reruns; test_gpu_engine_form.cpp:
// the caller's top-k), against the CPU reference computed with MXFP8 activations
// (ReferenceOptions::activations): experts with no row or one; the quantising gather and FC1's
// MXFP8 output against the CPU's quantiser; a runner that asks for MXFP8 activations and its
// CUDA-graph replay; and the first-use check, passing on the family as built and failing, with the
// fallback to bf16 activations, on a twin built with a wrong scale placement. On a device other
// than a 12.x one the family runs its twin (block_scaled_mma.cuh). Outputs and workspaces are
// poisoned (NaN codes, scales and floats, -1 indices) before every run, so an element nothing wrote
// cannot pass.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string>

#include "format/mxfp8_rows.hpp"
#include "gpu_test_support.hpp"
#include "kernels/block_scaled_family.hpp"
#include "kernels/family_registry.hpp"
#include "kernels/mxfp8_quantize.cuh"
#include "mxmoe/error.hpp"
#include "mxmoe/mx_format.hpp"
#include "runner/workspace.hpp"

namespace mxmoe {
namespace {

using namespace test;  // NOLINT: the shared GPU test helpers

constexpr ActivationFormat kMxfp8 = ActivationFormat::kMxfp8;

ReferenceResult mxfp8_reference(const MoeLayerWeights& w, const std::vector<Bf16>& x, int tokens,
                                const std::vector<float>& logits, bool keep_intermediates = false) {
  return reference_forward_from_logits(w, x, tokens, logits,
                                       {.keep_intermediates = keep_intermediates, .activations = kMxfp8});
}

// Every block-scaled plan of the layer's shape matches the MXFP8 reference, and routes as it does.
void expect_every_plan_matches(const TestLayer& layer, const std::vector<Bf16>& x, int tokens,
                               const std::vector<float>& logits, const std::string& what) {
  const ReferenceResult ref = mxfp8_reference(layer.weights, x, tokens, logits);
  const auto plans = plans_to_test(layer.weights.shape, kMxfp8);
  ASSERT_GE(plans.size(), 4u) << "the block-scaled family has no valid tactic here";
  for (const auto& [name, plan] : plans) {
    const GpuResult g = run_gpu(*layer.runner, x, tokens, &logits, &*plan);
    ASSERT_EQ(g.topk_experts, std::vector<int>(ref.routing.experts.begin(), ref.routing.experts.end())) << what;
    expect_close(g.out, ref.out, what + " " + name);
  }
}

// Top-1 routing over 12 experts where tokens 0-2 go to experts 0-2 (one row each), the rest to
// expert 5: every other expert has no row, three have one.
TEST(GpuBlockScaledRouting, ExpertsWithNoRowOrOne) {
  MXMOE_REQUIRE_GPU();
  const MoeShape shape{12, 1, 256, 384, 1};
  const auto& layer = test_layer(shape, 23);
  for (int tokens : {3, 40}) {
    const std::vector<Bf16> x = make_activations(tokens, shape.hidden, 90 + tokens);
    std::vector<float> logits(static_cast<size_t>(tokens) * shape.num_experts, 0.0f);
    for (int t = 0; t < tokens; ++t) logits[static_cast<size_t>(t) * shape.num_experts + (t < 3 ? t : 5)] = 5.0f;
    expect_every_plan_matches(layer, x, tokens, logits, "T=" + std::to_string(tokens));
  }
}

// The quantising gather writes x's rows in sorted order as the CPU's quantiser encodes them, bit
// for bit; FC1 writes its SwiGLU outputs as MXFP8 rows that decode to the MXFP8 reference's FC2
// input (elements may differ by one E4M3 step where a sum sits on a rounding boundary and the two
// sides' fp32 sums differ in their last bits). With FP8 activations (a 256-row FC1 tile), the same
// rows hold one scale per 128-K block, repeated in its four 32-blocks' codes, and decode to the
// FP8 reference's values: x's exactly.
TEST(GpuBlockScaledStages, GatheredRowsAndFc1OutputAreTheReferences) {
  MXMOE_REQUIRE_GPU();
  for (const MoeShape& shape : {model_shape("gpt-oss-20b"), MoeShape{5, 3, 96, 160, 1}}) {
    for (const ActivationFormat format : {kMxfp8, ActivationFormat::kFp8}) {
      const std::string what = shape.describe() + " " + activation_format_name(format);
      const auto& layer = test_layer(shape, 17);
      const int tokens = 37, pairs = tokens * shape.top_k;
      const std::vector<Bf16> x = make_activations(tokens, shape.hidden, 55);
      const std::vector<float> logits = random_logits(tokens, shape.num_experts, 56);
      const ReferenceResult ref = reference_forward_from_logits(layer.weights, x, tokens, logits,
                                                                {.keep_intermediates = true, .activations = format});
      const Tactic fc1 = parse_tactic(format == kMxfp8 ? "bsmma.r128x32.w4x1.s4.k1" : "bsmma.r256x32.w4x1.s4.k1");
      const LayerPlan plan{fc1, parse_tactic("bsmma.r128x32.w4x1.s4.k1"), format};

      DeviceArray<Bf16> d_x(x);
      DeviceArray<float> d_logits(logits);
      DeviceArray<Bf16> out(static_cast<size_t>(tokens) * shape.hidden);
      DeviceArray<unsigned char> workspace(layer.runner->workspace_size(tokens));
      workspace.fill_bytes(0xFF);
      layer.runner->forward(reinterpret_cast<const __nv_bfloat16*>(d_x.get()), d_logits.get(),
                            reinterpret_cast<__nv_bfloat16*>(out.get()), tokens, workspace.get(), workspace.size(),
                            nullptr, &plan, ForwardPart::kFc1);
      MXMOE_CUDA_OK(cudaDeviceSynchronize());
      const auto bytes = workspace.to_host();
      const auto sorted_pairs = copy_back(layer.runner->routing(workspace.get(), tokens).sorted_pairs, pairs);
      const WorkspaceLayout layout = WorkspaceLayout::of(shape, shape.num_experts, tokens);
      auto unpack = [&](size_t offset, int k, std::vector<uint8_t>& codes, std::vector<uint8_t>& scales) {
        const size_t size = static_cast<size_t>(kernels::mxfp8_rows_bytes(pairs, k));
        codes.resize(static_cast<size_t>(pairs) * k);
        scales.resize(codes.size() / kMxBlock);
        unpack_mxfp8_rows(std::span(bytes).subspan(offset, size), pairs, k, codes, scales);
      };
      // FP8 activations: each 128-block's codes name one scale.
      auto expect_repeated_scales = [&](const std::vector<uint8_t>& scales, int k) {
        if (format != ActivationFormat::kFp8) return;
        const int blocks = k / kMxBlock;
        for (int row = 0; row < pairs; ++row) {
          for (int b = 0; b < blocks; ++b) {
            ASSERT_EQ(scales[row * blocks + b], scales[row * blocks + b / 4 * 4]) << what << " row " << row << " block " << b;
          }
        }
      };

      std::vector<uint8_t> codes, scales;
      unpack(layout.sorted_input, shape.hidden, codes, scales);
      expect_repeated_scales(scales, shape.hidden);
      std::vector<float> decoded(codes.size());
      dequantize_mxfp8(codes, scales, decoded);
      for (int row = 0; row < pairs; ++row) {
        std::vector<float> token(shape.hidden);
        for (int j = 0; j < shape.hidden; ++j) token[j] = bf16_to_float(x[(sorted_pairs[row] / shape.top_k) * shape.hidden + j]);
        if (format == kMxfp8) {
          std::vector<uint8_t> expected_codes(shape.hidden), expected_scales(shape.hidden / kMxBlock);
          quantize_mxfp8(token, expected_codes, expected_scales);
          ASSERT_EQ(std::vector<uint8_t>(codes.begin() + row * shape.hidden, codes.begin() + (row + 1) * shape.hidden),
                    expected_codes)
              << what << " sorted row " << row;
          ASSERT_EQ(std::vector<uint8_t>(scales.begin() + row * (shape.hidden / kMxBlock),
                                         scales.begin() + (row + 1) * (shape.hidden / kMxBlock)),
                    expected_scales)
              << what << " sorted row " << row;
        } else {
          round_activation_rows(format, token, shape.hidden);
          ASSERT_EQ(std::vector<float>(decoded.begin() + row * shape.hidden, decoded.begin() + (row + 1) * shape.hidden),
                    token)
              << what << " sorted row " << row;
        }
      }

      unpack(layout.activation, shape.intermediate, codes, scales);
      expect_repeated_scales(scales, shape.intermediate);
      std::vector<float> got(codes.size());
      dequantize_mxfp8(codes, scales, got);
      std::vector<double> expected;
      std::vector<float> got_pairs;
      for (int row = 0; row < pairs; ++row) {
        const float* a = ref.activation.data() + static_cast<size_t>(sorted_pairs[row]) * shape.intermediate;
        expected.insert(expected.end(), a, a + shape.intermediate);
        got_pairs.insert(got_pairs.end(), got.begin() + row * shape.intermediate,
                         got.begin() + (row + 1) * shape.intermediate);
      }
      size_t differing = 0;
      for (size_t i = 0; i < expected.size(); ++i) differing += got_pairs[i] != expected[i];
      // ~1e-5 of the elements flip by one E4M3 step (6-12 %); a layout error moves them all.
      EXPECT_LT(relative_error(got_pairs, expected), 2e-3) << what;
      EXPECT_LT(differing, expected.size() / 1000 + 1) << what << ": elements off the reference's";
    }
  }
}

// A runner that asks for MXFP8 activations plans the block-scaled tiles at every count (the
// bf16 runner never does), and its captured forward replays bit for bit with the workspace
// poisoned before every replay.
TEST(GpuBlockScaledRunner, AskedForMxfp8ItPlansAndReplaysThem) {
  MXMOE_REQUIRE_GPU();
  const MoeShape shape = model_shape("gpt-oss-20b");
  const auto& layer = test_layer(shape, 17);
  const MoeRunner runner(layer.weights, {.activations = kMxfp8});
  EXPECT_EQ(runner.activations(), kMxfp8);
  for (int tokens : {1, 8, 200}) {
    const LayerPlan plan = runner.plan(tokens);
    EXPECT_EQ(plan.activations, kMxfp8) << tokens;
    EXPECT_EQ(plan.fc1.family, &block_scaled_tile_family()) << tokens;
    EXPECT_NE(layer.runner->plan(tokens).fc1.family, &block_scaled_tile_family()) << "the bf16 runner at T=" << tokens;

    const std::vector<Bf16> x = make_activations(tokens, shape.hidden, 31);
    const std::vector<float> logits = random_logits(tokens, shape.num_experts, 32);
    const GpuResult direct = run_gpu(runner, x, tokens, &logits, nullptr);
    expect_close(direct.out, mxfp8_reference(layer.weights, x, tokens, logits).out, "T=" + std::to_string(tokens));

    DeviceArray<Bf16> d_x(x), out(direct.out.size());
    DeviceArray<float> d_logits(logits);
    DeviceArray<unsigned char> workspace(runner.workspace_size(tokens));
    cudaStream_t stream;
    MXMOE_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cudaGraph_t graph;
    MXMOE_CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    runner.forward(reinterpret_cast<const __nv_bfloat16*>(d_x.get()), d_logits.get(),
                   reinterpret_cast<__nv_bfloat16*>(out.get()), tokens, workspace.get(), workspace.size(), stream);
    MXMOE_CUDA_OK(cudaStreamEndCapture(stream, &graph));
    cudaGraphExec_t exec;
    MXMOE_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    for (int replay = 0; replay < 3; ++replay) {
      out.fill_bytes(0xFF);
      workspace.fill_bytes(0xFF);
      MXMOE_CUDA_OK(cudaGraphLaunch(exec, stream));
      MXMOE_CUDA_OK(cudaStreamSynchronize(stream));
      const auto got = out.to_host();
      EXPECT_TRUE(std::equal(got.begin(), got.end(), direct.out.begin(),
                             [](Bf16 u, Bf16 v) { return u.bits == v.bits; }))
          << tokens;
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
  }
}

// The lines of `text` that mention the block-scaled family (other warnings, of the kernel cache
// say, may share stderr).
int block_scaled_lines(const std::string& text) {
  int lines = 0;
  for (size_t at = 0; at < text.size();) {
    const size_t end = std::min(text.find('\n', at), text.size());
    lines += text.substr(at, end - at).find("block-scaled") != std::string::npos;
    at = end + 1;
  }
  return lines;
}

// Sets an environment variable for a scope (the fault build of the block-scaled kernels).
class ScopedEnvironment {
 public:
  ScopedEnvironment(std::string_view name, std::string_view value) : name_(name) { setenv(name_.c_str(), std::string(value).c_str(), 1); }
  ~ScopedEnvironment() { unsetenv(name_.c_str()); }

 private:
  std::string name_;
};

// A runner asking for MXFP8 activations with the first-use check forced, prepared for `tokens`:
// what it wrote to stderr meanwhile, and its checks.
struct CheckedRunner {
  std::unique_ptr<MoeRunner> runner;
  std::string warnings;
  std::vector<BlockScaledCheckResult> checks;
};
CheckedRunner prepare_with_check(const MoeLayerWeights& weights, int tokens) {
  CheckedRunner r;
  r.runner = std::make_unique<MoeRunner>(
      weights, RunnerOptions{.activations = kMxfp8, .block_scaled_check = BlockScaledCheck::kAlways});
  testing::internal::CaptureStderr();
  r.runner->prepare(tokens);
  r.warnings = testing::internal::GetCapturedStderr();
  r.checks = r.runner->block_scaled_checks();
  return r;
}

// Forced on any device, the first-use check passes on the family as built: the runner keeps its
// MXFP8 plans and reports the check.
TEST(GpuBlockScaledCheck, ForcedItPassesAndTheFamilyStays) {
  MXMOE_REQUIRE_GPU();
  const MoeShape shape = model_shape("gpt-oss-20b");
  const auto& layer = test_layer(shape, 17);
  const CheckedRunner checked = prepare_with_check(layer.weights, 64);
  EXPECT_EQ(block_scaled_lines(checked.warnings), 0) << checked.warnings;
  ASSERT_FALSE(checked.checks.empty());
  for (const auto& c : checked.checks) {
    EXPECT_TRUE(c.passed) << c.tactic << " " << c.rel_difference;
    EXPECT_LT(c.rel_difference, 1e-4) << c.tactic;
    EXPECT_EQ(c.tactic.rfind("bsmma.", 0), 0u) << c.tactic;
  }
  EXPECT_EQ(checked.runner->plan(64).activations, kMxfp8);
}

// A family built with a wrong scale placement (the twin reading rows g and g + 8's scales from one
// lane, what a GPU whose placement differs from the ISA's computes) fails the check: one warning
// naming the device and the tactic, the runner's plans turn to bf16 activations and its output is
// the bf16 reference's, and an explicit MXFP8 plan is refused.
TEST(GpuBlockScaledCheck, AWrongScalePlacementFailsAndTheLayerRunsInBf16) {
  MXMOE_REQUIRE_GPU();
  const ScopedEnvironment fault(kBlockScaledFaultVariable, kBlockScaledFaultRowScaleLanes);
  const MoeShape shape = model_shape("gpt-oss-20b");
  const auto& layer = test_layer(shape, 17);
  const CheckedRunner checked = prepare_with_check(layer.weights, 64);
  const MoeRunner& runner = *checked.runner;
  const std::string& warnings = checked.warnings;
  ASSERT_FALSE(checked.checks.empty());
  const BlockScaledCheckResult& failed = checked.checks.back();
  EXPECT_FALSE(failed.passed);
  EXPECT_GT(failed.rel_difference, 1e-2);
  EXPECT_EQ(block_scaled_lines(warnings), 1) << warnings;
  EXPECT_NE(warnings.find("mxmoe: warning: "), std::string::npos) << warnings;
  EXPECT_NE(warnings.find(failed.tactic), std::string::npos) << warnings;
  EXPECT_NE(warnings.find(failed.device), std::string::npos) << warnings;
  EXPECT_NE(warnings.find(current_device_arch().arch->name), std::string::npos) << warnings;

  const int tokens = 20;
  const LayerPlan plan = runner.plan(tokens);
  EXPECT_EQ(plan.activations, ActivationFormat::kBf16);
  EXPECT_NE(plan.fc1.family, &block_scaled_tile_family());
  const std::vector<Bf16> x = make_activations(tokens, shape.hidden, 61);
  const std::vector<float> logits = random_logits(tokens, shape.num_experts, 62);
  expect_close(run_gpu(runner, x, tokens, &logits, nullptr).out,
               reference_forward_from_logits(layer.weights, x, tokens, logits).out, "after the fallback");

  // Explicit block-scaled plans are refused, FP8 activations' too (their 256-row FC1 tactic is
  // checked first, and fails).
  const Tactic t = parse_tactic(failed.tactic);
  DeviceArray<Bf16> d_x(x), out(x.size());
  DeviceArray<float> d_logits(logits);
  DeviceArray<unsigned char> workspace(runner.workspace_size(tokens));
  for (const LayerPlan& explicit_plan :
       {LayerPlan{t, t, kMxfp8}, LayerPlan{parse_tactic("bsmma.r256x32.w4x1.s4.k1"), t, ActivationFormat::kFp8}}) {
    try {
      runner.forward(reinterpret_cast<const __nv_bfloat16*>(d_x.get()), d_logits.get(),
                     reinterpret_cast<__nv_bfloat16*>(out.get()), tokens, workspace.get(), workspace.size(), nullptr,
                     &explicit_plan);
      ADD_FAILURE() << explicit_plan.fc1.name() << ": accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("failed its first-use check"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace mxmoe

// The GPU MoE layer against the CPU reference: every kernel family, both model shapes and odd
// ones, token counts from 1 to 1024, skewed routing, the routing and permutation themselves,
// determinism, CUDA-graph capture, and argument checks. The layer, skewed and determinism tests run
// the bf16 families against the reference with bf16 activations, the block-scaled family (MXFP8
// activations; on a GPU other than a 12.x one its twin) against the reference computed with MXFP8
// activations, and the bf16 families on FP8-rounded rows against the reference with FP8 ones. Outputs and workspaces are poisoned (NaN, -1) before every run, so an element
// nothing wrote cannot pass.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <optional>
#include <tuple>

#include "common/random.hpp"
#include "dequant_probe.hpp"
#include "device/current_device.hpp"
#include "format/mxfp4_records.hpp"
#include "gpu_test_support.hpp"
#include "kernels/mxfp4_fragment.cuh"
#include "mxmoe/error.hpp"
#include "mxmoe/mx_format.hpp"

namespace mxmoe {
namespace {

using namespace test;  // NOLINT: the shared GPU test helpers

// The routing equals the reference's, and the permutation is the expert-sorted, pair-ordered one.
void expect_routing(const GpuResult& g, const Routing& cpu, int num_experts, const std::string& what) {
  ASSERT_EQ(g.topk_experts, std::vector<int>(cpu.experts.begin(), cpu.experts.end())) << what;
  for (size_t p = 0; p < cpu.weights.size(); ++p) ASSERT_NEAR(g.topk_weights[p], cpu.weights[p], 1e-6) << what;
  const int pairs = static_cast<int>(cpu.experts.size());
  std::vector<int> counts(num_experts, 0);
  for (int e : cpu.experts) ++counts[e];
  EXPECT_EQ(g.expert_counts, counts) << what;
  ASSERT_EQ(g.expert_offsets.front(), 0) << what;
  for (int e = 0; e < num_experts; ++e) {
    ASSERT_EQ(g.expert_offsets[e + 1] - g.expert_offsets[e], counts[e]) << what;
    for (int row = g.expert_offsets[e]; row < g.expert_offsets[e + 1]; ++row) {
      ASSERT_EQ(cpu.experts[g.sorted_pairs[row]], e) << what << " row " << row;
      if (row > g.expert_offsets[e]) {
        ASSERT_LT(g.sorted_pairs[row - 1], g.sorted_pairs[row]) << what;
      }
    }
  }
  for (int row = 0; row < pairs; ++row) ASSERT_EQ(g.pair_rows[g.sorted_pairs[row]], row) << what;
}

class GpuLayer : public ::testing::TestWithParam<LayerCase> {};

TEST_P(GpuLayer, EveryTacticMatchesTheReference) {
  MXMOE_REQUIRE_GPU();
  const auto& c = GetParam();
  const auto& layer = test_layer(c.shape, 17);
  const std::vector<Bf16> x = make_activations(c.tokens, c.shape.hidden, 1000 + c.tokens);
  const std::vector<float> logits = router_logits(layer.weights, x, c.tokens);
  const ReferenceResult ref =
      reference_forward_from_logits(layer.weights, x, c.tokens, logits, {.activations = c.activations});
  for (const auto& [name, plan] : plans_to_test(c.shape, c.activations)) {
    const GpuResult g = run_gpu(*layer.runner, x, c.tokens, &logits, plan ? &*plan : nullptr);
    expect_routing(g, ref.routing, c.shape.num_experts, name);
    expect_close(g.out, ref.out, name,
                 c.activations == ActivationFormat::kFp8 ? kFp8RelativeError : kMaxRelativeError);
  }
}

std::vector<LayerCase> layer_cases() {
  std::vector<LayerCase> cases;
  for (int t : {1, 2, 3, 4, 5, 7, 8, 9, 16, 31, 64, 100, 128, 255, 512, 1024}) {
    cases.push_back({"gpt_oss_20b", model_shape("gpt-oss-20b"), t});
    cases.push_back({"gpt_oss_120b", model_shape("gpt-oss-120b"), t});
  }
  for (int t : {1, 7, 33}) cases.push_back({"odd_E5_k3_H96_I160", MoeShape{5, 3, 96, 160, 1}, t});
  // K = 512 is 8 slices of 64 in both stages, so every tactic's ring (at most 6 slots) wraps on a
  // shape small enough for compute-sanitizer's racecheck (scripts/device-check.sh racecheck).
  cases.push_back({"ring_E5_k3_H512_I512", MoeShape{5, 3, 512, 512, 1}, 300});
  // Tensor-parallel shards of gpt-oss-20b (tensor_parallel_shard): I = 1440 over 2 ranks; 720 over 4
  // and 360 over 8 are no whole number of 32-wide scale blocks, so those shards hold 736 and 384.
  for (int t : {1, 64}) cases.push_back({"tp2_E32_k4_H2880_I1440", MoeShape{32, 4, 2880, 1440, 1}, t});
  for (int t : {9, 300}) cases.push_back({"tp4_E32_k4_H2880_I736", MoeShape{32, 4, 2880, 736, 1}, t});
  for (int t : {1, 9, 100}) cases.push_back({"tp8_E32_k4_H2880_I384", MoeShape{32, 4, 2880, 384, 1}, t});
  // The top-k holds 1, 2, 4 or 8 logits per lane in registers by E (E5, E48, gpt-oss-120b's 128,
  // E300); past 256 experts it rereads the rest.
  for (int t : {1, 9}) cases.push_back({"many_E300_k4_H64_I96", MoeShape{300, 4, 64, 96, 1}, t});
  for (int t : {1, 9}) cases.push_back({"mid_E48_k4_H64_I96", MoeShape{48, 4, 64, 96, 1}, t});
  // DeepSeek-V4's spec (SwiGLU alpha 1, limit 10, no + 1; gate and up rows concatenated; no expert
  // biases; sqrt-softplus routing with a selection bias, scaled): both real shapes (Pro's 13.4 GB
  // layer at two counts: its reference is the slowest), and small ones over more counts and E.
  for (int t : {1, 9, 64}) cases.push_back({"deepseek_v4_flash", model_shape("deepseek-v4-flash"), t});
  for (int t : {1, 9}) cases.push_back({"deepseek_v4_pro", model_shape("deepseek-v4-pro"), t});
  for (int t : {1, 7, 33, 300, 1024}) {
    cases.push_back({"v4_E24_k6_H256_I192", MoeShape{24, 6, 256, 192, 1, deepseek_v4_spec(1.5f)}, t});
  }
  for (int t : {1, 9}) cases.push_back({"v4_E300_k6_H64_I96", MoeShape{300, 6, 64, 96, 1, deepseek_v4_spec(2.5f)}, t});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuLayer, ::testing::ValuesIn(layer_cases()), layer_case_name);

// The block-scaled family over fewer counts of the same shapes (its twin on the H100 is slow), and
// the shapes where its tiles meet half 64-K slices of padding in both stages (H = 96, I = 160;
// I = 736: FC1's last 128-row tile holds one 32-column block and the padding block).
std::vector<LayerCase> mxfp8_layer_cases() {
  std::vector<LayerCase> cases;
  auto add = [&](const char* name, MoeShape shape, std::initializer_list<int> tokens) {
    for (int t : tokens) cases.push_back({name, shape, t, ActivationFormat::kMxfp8});
  };
  add("gpt_oss_20b", model_shape("gpt-oss-20b"), {1, 3, 8, 9, 31, 100, 255, 1024});
  add("gpt_oss_120b", model_shape("gpt-oss-120b"), {1, 9, 100, 512});
  add("odd_E5_k3_H96_I160", MoeShape{5, 3, 96, 160, 1}, {1, 7, 33});
  add("tp4_E32_k4_H2880_I736", MoeShape{32, 4, 2880, 736, 1}, {9, 300});
  add("many_E300_k4_H64_I96", MoeShape{300, 4, 64, 96, 1}, {1, 9});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Mxfp8Shapes, GpuLayer, ::testing::ValuesIn(mxfp8_layer_cases()), layer_case_name);

// FP8 activations: the bf16 families on rows the runner rounds (x before FC1, FC1's output before
// FC2), through the self-routed GEMVs (T = 1-7), the gathers (wgmma, mma) and the stream-K GEMV;
// K = 96 and 736 end in a short 128-block, and H = 2880 in a 64-wide one.
std::vector<LayerCase> fp8_layer_cases() {
  std::vector<LayerCase> cases;
  auto add = [&](const char* name, MoeShape shape, std::initializer_list<int> tokens) {
    for (int t : tokens) cases.push_back({name, shape, t, ActivationFormat::kFp8});
  };
  add("gpt_oss_20b", model_shape("gpt-oss-20b"), {1, 7, 64, 300});
  add("gpt_oss_120b", model_shape("gpt-oss-120b"), {1, 64});
  add("odd_E5_k3_H96_I160", MoeShape{5, 3, 96, 160, 1}, {1, 7, 33});
  add("tp4_E32_k4_H2880_I736", MoeShape{32, 4, 2880, 736, 1}, {9});
  add("deepseek_v4_flash", model_shape("deepseek-v4-flash"), {1, 64});
  add("v4_E24_k6_H256_I192", MoeShape{24, 6, 256, 192, 1, deepseek_v4_spec(1.5f)}, {1, 7, 300, 1100});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Fp8Shapes, GpuLayer, ::testing::ValuesIn(fp8_layer_cases()), layer_case_name);

class GpuSkewed : public ::testing::TestWithParam<std::tuple<int, ActivationFormat>> {};

// Every token's first choice is expert 0 (so it gets T rows, more than the GEMV's 8), the rest
// spread; most experts get nothing at small T.
TEST_P(GpuSkewed, AllTokensOnOneExpert) {
  MXMOE_REQUIRE_GPU();
  const auto [tokens, activations] = GetParam();
  const MoeShape shape = model_shape("gpt-oss-20b");
  const auto& layer = test_layer(shape, 17);
  const std::vector<Bf16> x = make_activations(tokens, shape.hidden, 77);
  std::vector<float> logits = random_logits(tokens, shape.num_experts, 78);
  for (int t = 0; t < tokens; ++t) logits[static_cast<size_t>(t) * shape.num_experts] = 10.0f;
  const ReferenceResult ref =
      reference_forward_from_logits(layer.weights, x, tokens, logits, {.activations = activations});
  for (const auto& [name, plan] : plans_to_test(shape, activations)) {
    const GpuResult g = run_gpu(*layer.runner, x, tokens, &logits, plan ? &*plan : nullptr);
    EXPECT_EQ(g.expert_counts[0], tokens);
    expect_routing(g, ref.routing, shape.num_experts, name);
    expect_close(g.out, ref.out, name, activations == ActivationFormat::kFp8 ? kFp8RelativeError : kMaxRelativeError);
  }
}

INSTANTIATE_TEST_SUITE_P(Tokens, GpuSkewed,
                         ::testing::Combine(::testing::Values(1, 9, 100, 512),
                                            ::testing::Values(ActivationFormat::kBf16, ActivationFormat::kMxfp8,
                                                              ActivationFormat::kFp8)),
                         [](const ::testing::TestParamInfo<std::tuple<int, ActivationFormat>>& info) {
                           return std::to_string(std::get<0>(info.param)) + "_" +
                                  activation_format_name(std::get<1>(info.param));
                         });

// Logits full of ties: a few values (+0 and -0 among them, which tie), NaN and -inf (which rank
// below every number and tie with each other), so that most picks are decided by the lower-expert
// rule. Small batches route in the expert kernels, in the routing kernel's one-warp path (a fused
// plan), and larger ones in its general path.
TEST(GpuLayerRouting, TiesNanAndSignedZerosRankAsTheReference) {
  MXMOE_REQUIRE_GPU();
  const MoeShape shape = model_shape("gpt-oss-20b");
  const auto& layer = test_layer(shape, 17);
  const float values[] = {1.0f, 0.5f, 0.0f, -0.0f, -0.5f, NAN, -INFINITY};
  const Tactic fused = parse_tactic("fused.r128x8.w8x1.u2.k1");
  const LayerPlan fused_plan{fused, fused};
  for (int tokens : {1, 5, 8, 40}) {
    SplitMix64 rng(600 + tokens);
    std::vector<float> logits(static_cast<size_t>(tokens) * shape.num_experts);
    for (auto& v : logits) v = values[rng.below(std::size(values))];
    const std::vector<Bf16> x = make_activations(tokens, shape.hidden, 700 + tokens);
    const ReferenceResult ref = reference_forward_from_logits(layer.weights, x, tokens, logits);
    for (const LayerPlan* plan : {static_cast<const LayerPlan*>(nullptr), &fused_plan}) {
      const std::string what = "T=" + std::to_string(tokens) + (plan ? " fused" : " heuristic");
      const GpuResult g = run_gpu(*layer.runner, x, tokens, &logits, plan);
      expect_routing(g, ref.routing, shape.num_experts, what);
      expect_close(g.out, ref.out, what);
    }
  }
}

// DeepSeek-V4's scored router on ties: 256 experts with no selection bias and logits of a few
// values, so that most picks are decided by the lower-expert rule. Small batches split each token's
// experts over warps (select_split_experts) and count the group's candidates; a warp's slice is
// one expert a lane, its keys counted, in FC1 (8 warps, the heuristic plan) at T = 1 and in the
// routing kernel (32 warps, the fused plan) at T = 1-3, and ranked by rounds in FC1 at T = 2-3 and
// in the routing kernel at T = 5 (FC1 takes a warp a token there).
TEST(GpuLayerRouting, ScoredTiesSplitOverWarpsRankAsTheReference) {
  MXMOE_REQUIRE_GPU();
  const MoeShape shape{256, 6, 64, 96, 1, deepseek_v4_spec(1.5f)};
  MoeLayerWeights weights = make_synthetic_layer(shape, 19);
  std::fill(weights.router_selection_bias.begin(), weights.router_selection_bias.end(), 0.0f);
  const MoeRunner runner(weights);
  const float values[] = {1.0f, 0.5f, 0.0f, -0.0f, -0.5f, NAN, -INFINITY};
  const Tactic fused = parse_tactic("fused.r128x8.w8x1.u2.k1");
  const LayerPlan fused_plan{fused, fused};
  EXPECT_TRUE(runner.routes_in_expert_kernels(runner.plan(1), 1));
  for (int tokens : {1, 2, 3, 5}) {
    SplitMix64 rng(800 + tokens);
    std::vector<float> logits(static_cast<size_t>(tokens) * shape.num_experts);
    for (auto& v : logits) v = values[rng.below(std::size(values))];
    const std::vector<Bf16> x = make_activations(tokens, shape.hidden, 900 + tokens);
    const ReferenceResult ref = reference_forward_from_logits(weights, x, tokens, logits);
    for (const LayerPlan* plan : {static_cast<const LayerPlan*>(nullptr), &fused_plan}) {
      const std::string what = "T=" + std::to_string(tokens) + (plan ? " fused" : " heuristic");
      const GpuResult g = run_gpu(runner, x, tokens, &logits, plan);
      expect_routing(g, ref.routing, shape.num_experts, what);
      expect_close(g.out, ref.out, what);
    }
  }
}

// A small batch routes itself in the expert kernels when its FC1 grid is resident at once, and the
// routing kernel runs otherwise, whatever the layer's router; the layer tests above run both ways
// (every tactic at T = 1-8, DeepSeek-V4's sqrt-softplus router at T = 1).
TEST(GpuLayerRouting, SelfRoutedOnlyWhenFc1FitsOneWave) {
  MXMOE_REQUIRE_GPU();
  const auto& layer = test_layer(model_shape("gpt-oss-20b"), 17);
  const Tactic gemv = parse_tactic("gemv.r128x8.w8x1.u2.k1");  // 45 CTAs per expert slot, 3 per SM
  const Tactic fused = parse_tactic("fused.r128x8.w8x1.u2.k1");
  EXPECT_TRUE(layer.runner->routes_in_expert_kernels({gemv, gemv}, 1));   // 4 slots: 180 CTAs
  EXPECT_FALSE(layer.runner->routes_in_expert_kernels({gemv, gemv}, 8));  // 32 slots: 1440 CTAs
  EXPECT_FALSE(layer.runner->routes_in_expert_kernels({gemv, gemv}, 9));  // 36 pairs
  EXPECT_FALSE(layer.runner->routes_in_expert_kernels({fused, fused}, 1));
  const auto& v4 = test_layer(MoeShape{24, 6, 256, 192, 1, deepseek_v4_spec(1.5f)}, 17);
  EXPECT_TRUE(v4.runner->routes_in_expert_kernels({gemv, gemv}, 5));   // 30 pairs, one wave
  EXPECT_FALSE(v4.runner->routes_in_expert_kernels({gemv, gemv}, 6));  // 36 pairs
}

TEST(GpuLayerRouter, LogitsFromTheRouterWeights) {
  MXMOE_REQUIRE_GPU();
  for (int tokens : {1, 5, 64, 300}) {
    const MoeShape shape = model_shape("gpt-oss-120b");
    const auto& layer = test_layer(shape, 17);
    const std::vector<Bf16> x = make_activations(tokens, shape.hidden, 500 + tokens);
    const GpuResult g = run_gpu(*layer.runner, x, tokens, nullptr, nullptr);
    const std::vector<float> cpu_logits = router_logits(layer.weights, x, tokens);
    std::vector<double> cpu64(cpu_logits.begin(), cpu_logits.end());
    EXPECT_LT(relative_error(g.logits, cpu64), 1e-5) << tokens;
    // Judge the rest from the GPU's own logits, so that a near-tie decided differently by the
    // last bit of a logit cannot flip an expert between the two sides.
    const ReferenceResult ref = reference_forward_from_logits(layer.weights, x, tokens, g.logits);
    expect_routing(g, ref.routing, shape.num_experts, "router T=" + std::to_string(tokens));
    expect_close(g.out, ref.out, "router T=" + std::to_string(tokens));
  }
}

// Both logits kernels (the small-batch one up to 64 tokens, the large one above) on odd shapes: H =
// 2080 (a last chunk of 8 that only some lanes of warp 0 take twice) and H = 8192 (every thread of
// the small-batch kernel four chunks, all loaded before its wait), partial token groups, E not a
// multiple of 8: every logit written and within 1e-4 of the CPU's (1e-5 by norm), and the layer
// right from them.
TEST(GpuLayerRouter, LogitsOfOddShapes) {
  MXMOE_REQUIRE_GPU();
  for (const MoeShape& shape : {MoeShape{37, 4, 2080, 32}, MoeShape{21, 6, 8192, 32, 1, deepseek_v4_spec(1.5f)}}) {
    const auto& layer = test_layer(shape, 23);
    for (int tokens : {1, 7, 13, 64, 65, 300}) {
      const std::string what = shape.describe() + " T=" + std::to_string(tokens);
      const std::vector<Bf16> x = make_activations(tokens, shape.hidden, 600 + tokens);
      const GpuResult g = run_gpu(*layer.runner, x, tokens, nullptr, nullptr);
      const std::vector<float> cpu = router_logits(layer.weights, x, tokens);
      ASSERT_EQ(g.logits.size(), cpu.size()) << what;
      size_t off = 0;
      for (size_t i = 0; i < cpu.size(); ++i) off += !(std::fabs(g.logits[i] - cpu[i]) <= 1e-4f * (std::fabs(cpu[i]) + 1.0f));
      EXPECT_EQ(off, 0u) << what << ": logits unwritten or off";
      EXPECT_LT(relative_error(g.logits, std::vector<double>(cpu.begin(), cpu.end())), 1e-5) << what;
      const ReferenceResult ref = reference_forward_from_logits(layer.weights, x, tokens, g.logits);
      expect_routing(g, ref.routing, shape.num_experts, what);
      expect_close(g.out, ref.out, what);
    }
  }
}

// Scale codes outside the one-multiply range [1, 128]: one FC1 block at 2^2 (code 129) and one FC2
// block at 2^-127 (code 0). MoeRunner finds such a matrix on the host, and the kernels that rely on
// that (the wgmma family) then dequantise all its records with two multiplies; every tactic must
// still match the reference, on a shape whose rings wrap.
TEST(GpuLayerScales, CodesOutsideTheOneMultiplyRangeMatchTheReference) {
  MXMOE_REQUIRE_GPU();
  const MoeShape shape{5, 3, 512, 512, 1};
  MoeLayerWeights w = make_synthetic_layer(shape, 29);
  struct Storage {
    std::shared_ptr<const void> original;
    std::vector<uint8_t> fc1_scales, fc2_scales;
  };
  auto storage = std::make_shared<Storage>(Storage{w.storage, {w.fc1_scales.begin(), w.fc1_scales.end()},
                                                   {w.fc2_scales.begin(), w.fc2_scales.end()}});
  storage->fc1_scales[storage->fc1_scales.size() / 3] = 129;
  storage->fc2_scales[storage->fc2_scales.size() / 2] = 0;
  w.fc1_scales = storage->fc1_scales;
  w.fc2_scales = storage->fc2_scales;
  w.storage = storage;
  const MoeRunner runner(w);
  for (int tokens : {33, 300}) {
    const std::vector<Bf16> x = make_activations(tokens, shape.hidden, 31 + tokens);
    const std::vector<float> logits = router_logits(w, x, tokens);
    const ReferenceResult ref = reference_forward_from_logits(w, x, tokens, logits, {});
    for (const auto& [name, plan] : plans_to_test(shape, ActivationFormat::kBf16)) {
      const GpuResult g = run_gpu(runner, x, tokens, &logits, plan ? &*plan : nullptr);
      expect_routing(g, ref.routing, shape.num_experts, name);
      expect_close(g.out, ref.out, name + " T=" + std::to_string(tokens));
    }
  }
}

TEST(GpuLayerDeterminism, BitIdenticalRunAfterRun) {
  MXMOE_REQUIRE_GPU();
  for (const char* model : {"gpt-oss-20b", "gpt-oss-120b"}) {
    const MoeShape shape = model_shape(model);
    const auto& layer = test_layer(shape, 17);
    const int tokens = 255;
    const std::vector<Bf16> x = make_activations(tokens, shape.hidden, 9);
    const std::vector<float> logits = random_logits(tokens, shape.num_experts, 10);
    auto plans = plans_to_test(shape);
    for (const ActivationFormat rounded : {ActivationFormat::kMxfp8, ActivationFormat::kFp8}) {
      for (auto& [name, plan] : plans_to_test(shape, rounded)) {
        plans.emplace_back(name + " " + activation_format_name(rounded), std::move(plan));
      }
    }
    for (const auto& [name, plan] : plans) {
      const GpuResult a = run_gpu(*layer.runner, x, tokens, &logits, plan ? &*plan : nullptr);
      const GpuResult b = run_gpu(*layer.runner, x, tokens, &logits, plan ? &*plan : nullptr);
      ASSERT_TRUE(std::equal(a.out.begin(), a.out.end(), b.out.begin(),
                             [](Bf16 p, Bf16 q) { return p.bits == q.bits; }))
          << model << " " << name;
      EXPECT_EQ(a.sorted_pairs, b.sorted_pairs);
    }
  }
}

// The runner's own plan, a fused (whole-layer) one, a stream-K one, and with FP8 activations a
// GEMV (which routes a small batch itself) and the stream-K one; the workspace is poisoned before
// every replay, so the fused launch's counters and the stream-K flags must be zeroed inside the
// graph, and the FP8 rounding must run in it.
TEST(GpuLayerGraph, CapturedForwardReplaysExactly) {
  MXMOE_REQUIRE_GPU();
  const MoeShape shape = model_shape("gpt-oss-20b");
  const auto& layer = test_layer(shape, 17);
  const Tactic fused = parse_tactic("fused.r128x8.w8x1.u2.k1");
  const Tactic stream_k = parse_tactic("sk.r384x8.w24.u2.k1");
  const Tactic gemv = parse_tactic("gemv.r64x8.w4x2.u2.k1");
  const LayerPlan fused_plan{fused, fused}, stream_plan{stream_k, stream_k};
  const LayerPlan fp8_gemv{gemv, gemv, ActivationFormat::kFp8}, fp8_stream{stream_k, stream_k, ActivationFormat::kFp8};
  for (const LayerPlan* plan :
       {static_cast<const LayerPlan*>(nullptr), &fused_plan, &stream_plan, &fp8_gemv, &fp8_stream}) {
    const std::string which =
        plan ? " " + plan->fc1.name() + " " + activation_format_name(plan->activations) : " heuristic";
    for (int tokens : {1, 8, 200}) {
      const std::vector<Bf16> x = make_activations(tokens, shape.hidden, 31);
      const std::vector<float> logits = random_logits(tokens, shape.num_experts, 32);
      const GpuResult direct = run_gpu(*layer.runner, x, tokens, &logits, plan);
      const GpuResult direct_router = run_gpu(*layer.runner, x, tokens, nullptr, plan);

      DeviceArray<Bf16> d_x(x);
      DeviceArray<float> d_logits(logits);
      DeviceArray<Bf16> out(direct.out.size()), out_router(direct.out.size());
      DeviceArray<unsigned char> workspace(layer.runner->workspace_size(tokens));
      cudaStream_t stream;
      MXMOE_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
      cudaGraph_t graph;
      MXMOE_CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
      auto* xp = reinterpret_cast<const __nv_bfloat16*>(d_x.get());
      layer.runner->forward(xp, d_logits.get(), reinterpret_cast<__nv_bfloat16*>(out.get()), tokens, workspace.get(),
                            workspace.size(), stream, plan);
      layer.runner->forward(xp, reinterpret_cast<__nv_bfloat16*>(out_router.get()), tokens, workspace.get(),
                            workspace.size(), stream, plan);
      MXMOE_CUDA_OK(cudaStreamEndCapture(stream, &graph));
      cudaGraphExec_t exec;
      MXMOE_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
      for (int replay = 0; replay < 3; ++replay) {
        out.fill_bytes(0xFF);
        out_router.fill_bytes(0xFF);
        workspace.fill_bytes(0xFF);
        MXMOE_CUDA_OK(cudaGraphLaunch(exec, stream));
        MXMOE_CUDA_OK(cudaStreamSynchronize(stream));
        const auto a = out.to_host(), b = out_router.to_host();
        auto same = [](const std::vector<Bf16>& p, const std::vector<Bf16>& q) {
          return std::equal(p.begin(), p.end(), q.begin(), [](Bf16 u, Bf16 v) { return u.bits == v.bits; });
        };
        EXPECT_TRUE(same(a, direct.out)) << tokens << which;
        EXPECT_TRUE(same(b, direct_router.out)) << tokens << which;
      }
      cudaGraphExecDestroy(exec);
      cudaGraphDestroy(graph);
      cudaStreamDestroy(stream);
    }
  }
}

TEST(GpuLayerArguments, BadArgumentsThrowBeforeAnyLaunch) {
  MXMOE_REQUIRE_GPU();
  const MoeShape shape{6, 2, 64, 96, 1};
  const auto& layer = test_layer(shape, 3);
  const MoeRunner& runner = *layer.runner;
  const int tokens = 4;
  DeviceArray<unsigned char> x(tokens * shape.hidden * 2 + 16), out(tokens * shape.hidden * 2 + 16);
  DeviceArray<float> logits(tokens * shape.num_experts);
  DeviceArray<unsigned char> workspace(runner.workspace_size(tokens));
  auto* xp = reinterpret_cast<const __nv_bfloat16*>(x.get());
  auto* op = reinterpret_cast<__nv_bfloat16*>(out.get());
  EXPECT_THROW(runner.forward(xp, logits.get(), op, tokens, workspace.get(), workspace.size() - 1, nullptr), Error);
  EXPECT_THROW(runner.forward(xp, logits.get(), op, -1, workspace.get(), workspace.size(), nullptr), Error);
  EXPECT_THROW(runner.forward(reinterpret_cast<const __nv_bfloat16*>(x.get() + 2), logits.get(), op, tokens,
                              workspace.get(), workspace.size(), nullptr),
               Error);
  EXPECT_THROW(runner.forward(xp, nullptr, op, tokens, workspace.get(), workspace.size(), nullptr), Error);
  LayerPlan bad = runner.plan(tokens);
  bad.fc1.k_split = 2;
  EXPECT_THROW(runner.forward(xp, logits.get(), op, tokens, workspace.get(), workspace.size(), nullptr, &bad), Error);
  bad = runner.plan(tokens);
  bad.fc2.tile_rows = 48;  // not compiled
  EXPECT_THROW(runner.forward(xp, logits.get(), op, tokens, workspace.get(), workspace.size(), nullptr, &bad), Error);
  EXPECT_NO_THROW(runner.forward(xp, logits.get(), op, 0, workspace.get(), workspace.size(), nullptr));
}

TEST(GpuDequant, EveryCodeUnderEveryScaleMatchesTheCpuDecoder) {
  MXMOE_REQUIRE_GPU();
  // Record s has every scale byte = s, and value codes cycling through all 16 codes in every
  // fragment slot, so all 16 x 256 (code, scale) pairs pass through every slot. Dequantised one
  // record at a time and in pairs (s, s + 1): a pair takes one multiply only where both scales do
  // (1-128), so pairs (0, 1) and (128, 129) take the two-multiply path for an in-range scale too.
  const int records = 256;
  std::vector<unsigned char> host(static_cast<size_t>(records) * kernels::kRecordBytes);
  for (int s = 0; s < records; ++s) {
    unsigned char* r = host.data() + static_cast<size_t>(s) * kernels::kRecordBytes;
    for (int word = 0; word < kernels::kRecordValueBytes / 4; ++word) {
      uint32_t bits = 0;
      for (int reg = 0; reg < 4; ++reg) {
        for (int half = 0; half < 2; ++half) bits |= kernels::e2m1_place_code((word * 7 + reg * 5 + half * 3 + s) % 16, reg, half);
      }
      std::memcpy(r + 4 * word, &bits, 4);
    }
    std::fill(r + kernels::kRecordValueBytes, r + kernels::kRecordBytes, static_cast<unsigned char>(s));
  }
  DeviceArray<unsigned char> d_records(host);
  for (const bool in_pairs : {false, true}) {
    SCOPED_TRACE(in_pairs ? "dequantize_records, two records a warp" : "dequantize_record");
    DeviceArray<float> d_out(static_cast<size_t>(records) * 32 * 4 * 8);
    MXMOE_CUDA_OK(cudaMemset(d_out.get(), 0xFF, static_cast<size_t>(records) * 32 * 4 * 8 * sizeof(float)));  // NaN
    MXMOE_CUDA_OK(test::run_dequant_probe(d_records.get(), records, in_pairs, d_out.get()));
    MXMOE_CUDA_OK(cudaDeviceSynchronize());
    const auto out = d_out.to_host();
    for (int s = 0; s < records; ++s) {
      for (int lane = 0; lane < 32; ++lane) {
        for (int j = 0; j < 4; ++j) {
          uint32_t word;
          std::memcpy(&word, host.data() + static_cast<size_t>(s) * kernels::kRecordBytes + 16 * lane + 4 * j, 4);
          for (int reg = 0; reg < 4; ++reg) {
            for (int half = 0; half < 2; ++half) {
              const float expected =
                  decode_e2m1(static_cast<uint8_t>(kernels::e2m1_code_at(word, reg, half))) * decode_e8m0(static_cast<uint8_t>(s));
              const float got = out[((static_cast<size_t>(s) * 32 + lane) * 4 + j) * 8 + 2 * reg + half];
              if (std::isnan(expected)) {
                ASSERT_TRUE(std::isnan(got)) << "scale " << s;
              } else {
                ASSERT_EQ(got, expected) << "scale " << s << " lane " << lane << " step " << j << " reg " << reg;
              }
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace mxmoe

// The CPU reference: routing semantics, agreement with the float64 evaluation (1e-5 by norm, bf16
// output within rounding), thread-count independence, and its intermediates.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "common/random.hpp"
#include "mxmoe/error.hpp"
#include "mxmoe/mx_format.hpp"
#include "mxmoe/reference.hpp"
#include "ref/swiglu.hpp"
#include "test_support.hpp"

namespace mxmoe {
namespace {

TEST(Route, TopKDescendingTiesToLowerIndexSoftmaxOverSelected) {
  const std::vector<float> logits{1.0f, 3.0f, 3.0f, 2.0f, 3.0f,  // ties at 3.0: experts 1, 2, 4
                                  0.0f, NAN,  -1.0f, 5.0f, 0.0f};
  const Routing r = route(logits, 2, 5, 3);
  EXPECT_EQ(r.experts, (std::vector<int32_t>{1, 2, 4, 3, 0, 4}));
  EXPECT_NEAR(r.weights[0], 1.0f / 3.0f, 1e-7);
  const double denominator = std::exp(5.0) + 2.0;  // exp(5), exp(0), exp(0) over the selected only
  EXPECT_NEAR(r.weights[3], std::exp(5.0) / denominator, 1e-6);
  EXPECT_NEAR(r.weights[4], 1.0 / denominator, 1e-6);
  EXPECT_NEAR(r.weights[5], 1.0 / denominator, 1e-6);
}

TEST(Route, RejectsBadShapes) {
  const std::vector<float> logits(10);
  EXPECT_THROW(route(logits, 3, 5, 2), Error);
  EXPECT_THROW(route(logits, 2, 5, 6), Error);
  EXPECT_THROW(route(logits, 2, 5, 0), Error);
}

TEST(Swiglu, ClampsAsGptOssDoes) {
  const double alpha = kSwigluAlpha;
  const double sig = 1.0 / (1.0 + std::exp(-alpha * 7.0));
  EXPECT_DOUBLE_EQ(gpt_oss_swiglu(10.0, 0.0), 7.0 * sig * 1.0);         // glu clamped above
  EXPECT_DOUBLE_EQ(gpt_oss_swiglu(10.0, -10.0), 7.0 * sig * -6.0);      // linear clamped below
  EXPECT_DOUBLE_EQ(gpt_oss_swiglu(10.0, 10.0), 7.0 * sig * 8.0);        // and above
  const double g = -10.0;                                               // glu has no lower clamp
  EXPECT_DOUBLE_EQ(gpt_oss_swiglu(g, 1.0), g / (1.0 + std::exp(-alpha * g)) * 2.0);
}

struct ShapeCase {
  const char* name;
  MoeShape shape;
  int tokens;
};

void PrintTo(const ShapeCase& c, std::ostream* os) { *os << c.name; }

class ReferenceVsFloat64 : public ::testing::TestWithParam<ShapeCase> {};

TEST_P(ReferenceVsFloat64, AgreesToOneInTenToTheFifthAndRoundsToBf16) {
  const auto& c = GetParam();
  const uint64_t seed = 1000 + c.tokens;
  const MoeLayerWeights w = make_synthetic_layer(c.shape, seed);
  const std::vector<Bf16> x = make_activations(c.tokens, c.shape.hidden, seed + 1);
  const ReferenceResult ref = reference_forward(w, x, c.tokens);
  const Float64Result f64 = evaluate_layer_f64(w, x, c.tokens);

  ASSERT_EQ(ref.routing.experts, f64.experts);
  for (size_t j = 0; j < f64.weights.size(); ++j) EXPECT_NEAR(ref.routing.weights[j], f64.weights[j], 1e-6);
  const double rel = relative_error(ref.out, f64.out);
  EXPECT_LE(rel, kReferenceRelTolerance);
  EXPECT_GT(rel, 0.0) << "float32 and float64 should differ somewhat; identical results suggest a shared path";
  double rms = 0.0;
  for (double v : f64.out) rms += v * v;
  rms = std::sqrt(rms / static_cast<double>(f64.out.size()));
  EXPECT_GT(rms, 0.1) << "synthetic outputs should be O(1)";
  const Bf16RoundingCheck rounding = check_bf16_rounding(ref.out_bf16, f64.out, kReferenceRelTolerance * rms);
  EXPECT_EQ(rounding.failures, 0u) << "first at " << rounding.first_failure << ", worst " << rounding.worst_ratio << " of the bound";
  for (size_t j = 0; j < ref.out.size(); ++j) ASSERT_EQ(ref.out_bf16[j].bits, float_to_bf16(ref.out[j]).bits);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, ReferenceVsFloat64,
    ::testing::Values(ShapeCase{"small", MoeShape{6, 2, 64, 96, 1}, 7},
                      ShapeCase{"odd", MoeShape{5, 3, 96, 160, 1}, 13},
                      ShapeCase{"one_expert", MoeShape{1, 1, 32, 32, 1}, 3},
                      ShapeCase{"all_experts", MoeShape{4, 4, 128, 64, 1}, 5},
                      ShapeCase{"gpt_oss_20b", MoeShape{32, 4, 2880, 2880, 1}, 2},
                      ShapeCase{"gpt_oss_120b", MoeShape{128, 4, 2880, 2880, 1}, 1}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(Reference, ResultDoesNotDependOnThreadCount) {
  const MoeShape shape{8, 2, 128, 96, 1};
  const MoeLayerWeights w = make_synthetic_layer(shape, 3);
  const std::vector<Bf16> x = make_activations(37, shape.hidden, 4);
  const ReferenceResult one = reference_forward(w, x, 37, {.threads = 1});
  const ReferenceResult many = reference_forward(w, x, 37, {.threads = 5});
  ASSERT_EQ(one.out.size(), many.out.size());
  for (size_t j = 0; j < one.out.size(); ++j) ASSERT_EQ(one.out[j], many.out[j]) << j;
}

TEST(Reference, IntermediatesComposeToTheOutput) {
  const MoeShape shape = test::small_shape(1);
  const MoeLayerWeights w = make_synthetic_layer(shape, 11);
  const int tokens = 4, k = shape.top_k, h = shape.hidden, i = shape.intermediate;
  const std::vector<Bf16> x = make_activations(tokens, h, 12);
  const ReferenceResult r = reference_forward(w, x, tokens, {.keep_intermediates = true});
  ASSERT_EQ(r.fc1_out.size(), static_cast<size_t>(tokens * k * 2 * i));
  ASSERT_EQ(r.activation.size(), static_cast<size_t>(tokens * k * i));
  ASSERT_EQ(r.expert_out.size(), static_cast<size_t>(tokens * k * h));
  int clamped = 0;
  for (int p = 0; p < tokens * k; ++p) {
    for (int j = 0; j < i; ++j) {
      const float glu = r.fc1_out[p * 2 * i + 2 * j], lin = r.fc1_out[p * 2 * i + 2 * j + 1];
      EXPECT_EQ(r.activation[p * i + j], gpt_oss_swiglu(glu, lin));
      clamped += (glu > kSwigluLimit || std::fabs(lin) > kSwigluLimit);
    }
  }
  EXPECT_GT(clamped, 0) << "synthetic weights should exercise the clamp";
  for (int t = 0; t < tokens; ++t) {
    for (int j = 0; j < h; ++j) {
      double sum = 0.0;
      for (int s = 0; s < k; ++s) sum += r.routing.weights[t * k + s] * r.expert_out[(t * k + s) * h + j];
      EXPECT_NEAR(r.out[t * h + j], sum, 1e-5 * (1.0 + std::fabs(sum)));
    }
  }
  EXPECT_TRUE(reference_forward(w, x, tokens).fc1_out.empty()) << "intermediates are kept only on request";
}

// MXFP8 activations: FC1's input and FC2's are rounded, nothing else. x whose every 32-block is
// exactly MXFP8 (E4M3 codes times one power of two) leaves FC1 as the bf16 path computes it; the
// activation is the bf16 path's rounded; the output stays within the MXFP8 bound of float64.
TEST(Reference, Mxfp8ActivationsRoundFc1AndFc2InputsOnly) {
  const MoeShape shape{5, 3, 96, 160, 1};
  const MoeLayerWeights w = make_synthetic_layer(shape, 31);
  const int tokens = 6;
  SplitMix64 rng(32);
  std::vector<Bf16> x(static_cast<size_t>(tokens) * shape.hidden);
  for (auto& v : x) v = float_to_bf16(decode_e4m3(static_cast<uint8_t>(rng.next() % 0x7F)) * (rng.next() % 2 ? 0.25f : -0.25f));
  const ReferenceOptions mxfp8{.keep_intermediates = true, .activations = ActivationFormat::kMxfp8};
  const ReferenceResult q = reference_forward(w, x, tokens, mxfp8);
  const ReferenceResult b = reference_forward(w, x, tokens, {.keep_intermediates = true});
  EXPECT_EQ(q.routing.experts, b.routing.experts);
  EXPECT_EQ(q.fc1_out, b.fc1_out);
  std::vector<float> rounded = b.activation;
  round_to_mxfp8(rounded);
  EXPECT_EQ(q.activation, rounded);
  EXPECT_NE(q.activation, b.activation) << "the activation should need rounding";

  const std::vector<Bf16> normal = make_activations(tokens, shape.hidden, 33);
  const double error = relative_error(reference_forward(w, normal, tokens, {.activations = ActivationFormat::kMxfp8}).out,
                                      evaluate_layer_f64(w, normal, tokens).out);
  EXPECT_GT(error, kReferenceRelTolerance);
  EXPECT_LT(error, kMxfp8ActivationRelTolerance);
}

// FP8 activations (per-128 power-of-two scales, DeepSeek-V4's quantiser): FC1's input and FC2's are
// rounded per row in blocks of 128 (H = 288, I = 160: a 32- and a 32-wide tail block), nothing
// else; the float64 evaluation in the same mode agrees with the reference as in bf16, and the cost
// against bf16 activations is that of 3-bit mantissas. Both V4 presets' spec and gpt-oss's.
TEST(Reference, Fp8ActivationsRoundFc1AndFc2InputsPer128) {
  for (const MoeShape& shape : {MoeShape{5, 3, 288, 160, 1}, MoeShape{6, 2, 288, 160, 1, deepseek_v4_spec(1.5f)}}) {
    SCOPED_TRACE(shape.describe());
    const MoeLayerWeights w = make_synthetic_layer(shape, 41);
    const int tokens = 7;
    const std::vector<Bf16> x = make_activations(tokens, shape.hidden, 42);
    const ReferenceOptions fp8{.keep_intermediates = true, .activations = ActivationFormat::kFp8};
    const ReferenceResult q = reference_forward(w, x, tokens, fp8);
    const ReferenceResult b = reference_forward(w, x, tokens, {.keep_intermediates = true});
    EXPECT_EQ(q.routing.experts, b.routing.experts);
    EXPECT_NE(q.fc1_out, b.fc1_out) << "x should need rounding";
    std::vector<float> rounded = b.activation;
    round_activation_rows(ActivationFormat::kFp8, rounded, shape.intermediate);
    // FC1 saw rounded inputs, so its activation differs from bf16's before rounding; the reference's
    // own activation is its FC1 output's SwiGLU, rounded: every element an E4M3 code times its
    // block's scale.
    for (size_t p = 0; p < q.activation.size() / shape.intermediate; ++p) {
      for (int first = 0; first < shape.intermediate; first += kFp8ActivationBlock) {
        const int n = std::min(kFp8ActivationBlock, shape.intermediate - first);
        const float* block = q.activation.data() + p * shape.intermediate + first;
        float amax = 0.0f;
        for (int j = 0; j < n; ++j) amax = std::max(amax, std::fabs(block[j]));
        const float scale = fp8_activation_scale(amax);
        for (int j = 0; j < n; ++j) {
          ASSERT_EQ(decode_e4m3(encode_e4m3(block[j] / scale)) * scale, block[j]) << p << " " << first + j;
        }
      }
    }
    const double same_mode = relative_error(q.out, evaluate_layer_f64(w, x, tokens, ActivationFormat::kFp8).out);
    EXPECT_LT(same_mode, 1e-3) << "an E4M3 rounding flipped by the float32 accumulation moves one element by 2^-4";
    const double cost = relative_error(q.out, evaluate_layer_f64(w, x, tokens).out);
    std::printf("fp8 activations, %s: against float64 in the same mode %.2e, against bf16 activations %.2e\n",
                shape.describe().c_str(), same_mode, cost);
    EXPECT_GT(cost, 1e-3);
    EXPECT_LT(cost, kMxfp8ActivationRelTolerance);
  }
}

TEST(Reference, SkewedRoutingAndUnusedExperts) {
  const MoeShape shape{8, 2, 64, 64, 1};
  const MoeLayerWeights w = make_synthetic_layer(shape, 21);
  const int tokens = 9;
  const std::vector<Bf16> x = make_activations(tokens, shape.hidden, 22);
  // Every token's first slot goes to expert 5, its second to expert 2 or 7; five experts see nothing.
  std::vector<float> logits(tokens * shape.num_experts, 0.0f);
  for (int t = 0; t < tokens; ++t) {
    logits[t * 8 + 5] = 4.0f;
    logits[t * 8 + (t % 2 ? 2 : 7)] = 3.0f - 0.1f * t;
  }
  const ReferenceResult r = reference_forward_from_logits(w, x, tokens, logits);
  for (int t = 0; t < tokens; ++t) EXPECT_EQ(r.routing.experts[t * 2], 5);
  // The float64 evaluation routes from the router weights, so compare through the routed entry point.
  for (int t = 0; t < tokens; ++t) {
    Routing one{1, 2, {r.routing.experts[t * 2], r.routing.experts[t * 2 + 1]},
                {r.routing.weights[t * 2], r.routing.weights[t * 2 + 1]}};
    const ReferenceResult single = reference_forward_routed(
        w, std::span<const Bf16>(x).subspan(static_cast<size_t>(t) * shape.hidden, shape.hidden), one);
    for (int j = 0; j < shape.hidden; ++j) ASSERT_EQ(single.out[j], r.out[t * shape.hidden + j]) << t << " " << j;
  }
}

TEST(Reference, EntryPointsAgree) {
  const MoeShape shape = test::small_shape(1);
  const MoeLayerWeights w = make_synthetic_layer(shape, 31);
  const std::vector<Bf16> x = make_activations(6, shape.hidden, 32);
  const ReferenceResult a = reference_forward(w, x, 6);
  const ReferenceResult b = reference_forward_from_logits(w, x, 6, router_logits(w, x, 6));
  EXPECT_EQ(a.out, b.out);
}

TEST(Reference, RejectsMismatchedInputs) {
  const MoeShape shape = test::small_shape(1);
  const MoeLayerWeights w = make_synthetic_layer(shape, 41);
  const std::vector<Bf16> x = make_activations(3, shape.hidden, 42);
  EXPECT_THROW(reference_forward(w, std::span<const Bf16>(x).first(100), 3), Error);
  Routing bad{1, shape.top_k, {0, shape.num_experts}, {0.5f, 0.5f}};
  EXPECT_THROW(reference_forward_routed(w, std::span<const Bf16>(x).first(shape.hidden), bad), Error);
  MoeLayerWeights truncated = w;
  truncated.fc2_scales = truncated.fc2_scales.first(10);
  EXPECT_THROW(reference_forward(truncated, x, 3), Error);
}

TEST(Bf16, RoundsToNearestEven) {
  EXPECT_EQ(float_to_bf16(1.0f).bits, 0x3f80);
  EXPECT_EQ(float_to_bf16(std::bit_cast<float>(0x3f808000u)).bits, 0x3f80);  // tie, even stays
  EXPECT_EQ(float_to_bf16(std::bit_cast<float>(0x3f818000u)).bits, 0x3f82);  // tie, odd rounds up
  EXPECT_EQ(float_to_bf16(std::bit_cast<float>(0x3f808001u)).bits, 0x3f81);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(NAN))));
  EXPECT_EQ(float_to_bf16(INFINITY).bits, 0x7f80);
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()).bits, 0x7f80);  // overflows to infinity
}

TEST(CheckBf16Rounding, FlagsAnElementOffByOneUlp) {
  const std::vector<double> expected{1.0, -2.5, 1e-3};
  std::vector<Bf16> out{float_to_bf16(1.0f), float_to_bf16(-2.5f), float_to_bf16(1e-3f)};
  EXPECT_EQ(check_bf16_rounding(out, expected, 0.0).failures, 0u);
  out[1].bits += 1;
  const auto check = check_bf16_rounding(out, expected, 0.0);
  EXPECT_EQ(check.failures, 1u);
  EXPECT_EQ(check.first_failure, 1u);
  EXPECT_NEAR(check.worst_ratio, 2.0, 1e-9);  // one ulp off, half an ulp allowed
}

}  // namespace
}  // namespace mxmoe

// The layer spec (layer_spec.hpp) and the DeepSeek-V4 layer it describes: the presets, the spec's
// checks, the sqrt-softplus router and the SiLU-clamped activation against hand-computed values, the
// weights each spec has, the reference against the float64 evaluation at the V4 shapes, and shards.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "common/random.hpp"
#include "mxmoe/error.hpp"
#include "mxmoe/reference.hpp"
#include "ref/swiglu.hpp"

namespace mxmoe {
namespace {

constexpr LayerSpec kV4Flash = deepseek_v4_spec(1.5f);

TEST(LayerSpec, PresetsHoldTheModelsFacts) {
  EXPECT_EQ(model_shape("gpt-oss-120b").spec, kGptOssSpec);
  const MoeShape flash = model_shape("deepseek-v4-flash"), pro = model_shape("deepseek-v4-pro");
  EXPECT_EQ(flash, MoeShape(256, 6, 4096, 2048, 43, deepseek_v4_spec(1.5f)));
  EXPECT_EQ(pro, MoeShape(384, 6, 7168, 3072, 61, deepseek_v4_spec(2.5f)));
  for (const MoeShape& v4 : {flash, pro}) {
    EXPECT_EQ(v4.spec.activation, (SwigluActivation{1.0f, 10.0f, 0.0f}));
    EXPECT_EQ(v4.spec.gate_up, GateUpLayout::kConcatenated);
    EXPECT_FALSE(v4.spec.expert_biases);
    EXPECT_EQ(v4.spec.router, RouterKind::kSqrtSoftplus);
    EXPECT_NO_THROW(v4.validate());
  }
  // MXFP4 experts without biases: Flash 3.4 GB and Pro 13.4 GB a layer (the figures).
  EXPECT_NEAR(flash.expert_bytes() * 256.0, 3.42e9, 0.01e9);
  EXPECT_NEAR(pro.expert_bytes() * 384.0, 13.4e9, 0.1e9);
  EXPECT_EQ(MoeShape(32, 4, 2880, 2880).describe(), "E=32 k=4 H=2880 I=2880");
  EXPECT_EQ(flash.describe(), "E=256 k=6 H=4096 I=2048 swiglu(alpha=1, limit=10, up+0) [gate; up] no-bias sqrt-softplus*1.5");
}

TEST(LayerSpec, RejectsBadFieldsByName) {
  auto error_of = [](LayerSpec spec) {
    try {
      MoeShape(8, 2, 64, 64, 1, spec).validate();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  LayerSpec s = kV4Flash;
  s.activation.alpha = 0.0f;
  EXPECT_NE(error_of(s).find("alpha"), std::string::npos);
  s = kV4Flash;
  s.activation.limit = NAN;
  EXPECT_NE(error_of(s).find("limit"), std::string::npos);
  s = kV4Flash;
  s.routed_scaling = -1.0f;
  EXPECT_NE(error_of(s).find("routed_scaling"), std::string::npos);
  s = kGptOssSpec;
  s.routed_scaling = 2.0f;  // the softmax router has no scale
  EXPECT_NE(error_of(s).find("routed_scaling"), std::string::npos);
  s = kV4Flash;
  s.router = static_cast<RouterKind>(7);
  EXPECT_NE(error_of(s).find("router"), std::string::npos);
}

TEST(SiluClamped, MatchesHandComputedValues) {
  const SwigluActivation v4 = kV4Flash.activation;
  auto silu = [](double g) { return g / (1.0 + std::exp(-g)); };
  EXPECT_DOUBLE_EQ(swiglu(v4, 2.0, 3.0), 2.0 / (1.0 + std::exp(-2.0)) * 3.0);
  EXPECT_DOUBLE_EQ(swiglu(v4, 12.0, 1.0), silu(10.0));            // gate clamped above at 10
  EXPECT_DOUBLE_EQ(swiglu(v4, -12.0, 1.0), silu(-12.0));          // not below
  EXPECT_DOUBLE_EQ(swiglu(v4, 1.0, 11.0), silu(1.0) * 10.0);      // up clamped to +-10
  EXPECT_DOUBLE_EQ(swiglu(v4, 1.0, -11.0), silu(1.0) * -10.0);
  EXPECT_DOUBLE_EQ(swiglu(v4, 0.5, 0.0), 0.0);                     // no +1 on up
  // The same by hand: silu(2) 3, silu(10), silu(-12), silu(1) 10.
  EXPECT_NEAR(swiglu(v4, 2.0, 3.0), 5.284782467867294, 1e-12);
  EXPECT_NEAR(swiglu(v4, 12.0, 1.0), 9.999546021312975, 1e-12);
  EXPECT_NEAR(swiglu(v4, -12.0, 1.0), -7.373009522657661e-05, 1e-16);
  EXPECT_NEAR(swiglu(v4, 1.0, 11.0), 7.310585786300049, 1e-12);
  // float: alpha 1 and offset 0 are exact, so the general formula is SiLU bit for bit.
  const float g = 1.375f, u = -2.25f;
  EXPECT_EQ(swiglu(v4, g, u), g / (1.0f + std::exp(-g)) * u);
  EXPECT_EQ(swiglu(kGptOssSpec.activation, g, u), gpt_oss_swiglu(g, u));
}

TEST(RouteSqrtSoftplus, ChoosesOnBiasedScoresWeighsUnbiasedRenormalisedAndScaled) {
  // Scores sqrt(softplus(l)); expert 3 has the largest score but a bias that drops it below 0 and 2.
  const std::vector<float> logits{2.0f, -1.0f, 1.5f, 3.0f, 0.0f};
  const std::vector<float> bias{0.0f, 0.0f, 0.25f, -1.0f, 0.0f};
  const Routing r = route_sqrt_softplus(logits, bias, 1, 5, 2, 2.5f);
  auto score = [](double l) { return std::sqrt(std::log1p(std::exp(l))); };
  ASSERT_EQ(r.experts, (std::vector<int32_t>{2, 0}));  // keys 1.46, 0.56, 1.30 + 0.25, 1.75 - 1, 0.83
  const double sum = score(1.5) + score(2.0);
  EXPECT_NEAR(r.weights[0], score(1.5) / sum * 2.5, 1e-6);
  EXPECT_NEAR(r.weights[1], score(2.0) / sum * 2.5, 1e-6);
  EXPECT_NEAR(r.weights[0], 1.1803162445073754, 1e-6);  // by hand
  EXPECT_NEAR(r.weights[1], 1.3196837554926244, 1e-6);
  EXPECT_NEAR(r.weights[0] + r.weights[1], 2.5, 1e-6) << "weights sum to routed_scaling";
}

TEST(RouteSqrtSoftplus, TiesGoToTheLowerExpertNanLastAndLargeLogitsStayFinite) {
  // Experts 1 and 3 tie; 2's NaN score ranks last whatever its bias; 4's large score loses to its bias.
  const std::vector<float> logits{-5.0f, 0.7f, NAN, 0.7f, 100.0f};
  const std::vector<float> bias{0.0f, 0.0f, 9.0f, 0.0f, -20.0f};
  const Routing r = route_sqrt_softplus(logits, bias, 1, 5, 3, 1.0f);
  EXPECT_EQ(r.experts, (std::vector<int32_t>{1, 3, 0}));
  const std::vector<float> big{100.0f, 30.0f};  // softplus(l) = l beyond 20, as torch's threshold
  const Routing b = route_sqrt_softplus(big, std::vector<float>{0.0f, 0.0f}, 1, 2, 2, 1.0f);
  EXPECT_NEAR(b.weights[0], 10.0 / (10.0 + std::sqrt(30.0)), 1e-6);
  EXPECT_THROW(route_sqrt_softplus(big, std::vector<float>{0.0f}, 1, 2, 2, 1.0f), Error);  // bias of 1, not 2
}

TEST(LayerWeights, HoldTheTensorsTheirSpecHas) {
  const MoeLayerWeights v4 = make_synthetic_layer(MoeShape(8, 3, 64, 96, 1, kV4Flash), 5);
  EXPECT_NO_THROW(v4.validate());
  EXPECT_TRUE(v4.router_bias.empty() && v4.fc1_bias.empty() && v4.fc2_bias.empty());
  EXPECT_EQ(v4.router_selection_bias.size(), 8u);
  const MoeLayerWeights gpt_oss = make_synthetic_layer(MoeShape(8, 3, 64, 96, 1), 5);
  EXPECT_TRUE(gpt_oss.router_selection_bias.empty());
  MoeLayerWeights bad = v4;
  bad.router_bias = gpt_oss.router_bias;  // a logit bias on a sqrt-softplus router
  EXPECT_THROW(bad.validate(), Error);
  bad = v4;
  bad.fc2_bias = gpt_oss.fc2_bias;
  EXPECT_THROW(bad.validate(), Error);
  bad = gpt_oss;
  bad.router_selection_bias = v4.router_selection_bias;
  EXPECT_THROW(bad.validate(), Error);

  LayerSpec caller = kV4Flash;
  caller.router = RouterKind::kCallerTopK;
  caller.routed_scaling = 1.0f;
  const MoeLayerWeights hash_layer = make_synthetic_layer(MoeShape(8, 3, 64, 96, 1, caller), 5);
  EXPECT_TRUE(hash_layer.router_weight.empty() && hash_layer.router_selection_bias.empty());
  const std::vector<Bf16> x = make_activations(2, 64, 6);
  EXPECT_THROW(reference_forward(hash_layer, x, 2), Error);
  const Routing routing{2, 3, {0, 5, 7, 1, 2, 3}, {0.5f, 0.25f, 0.25f, 1.0f, 0.5f, 0.25f}};
  EXPECT_EQ(reference_forward_routed(hash_layer, x, routing).out.size(), 2u * 64);
}

// The concatenated layout holds the interleaved layout's rows, reordered: the same experts in either
// order give the same layer, bit for bit.
TEST(GateUpLayout, ConcatenatedRowsAreTheInterleavedRowsReordered) {
  LayerSpec interleaved_spec = kV4Flash;
  interleaved_spec.gate_up = GateUpLayout::kInterleaved;
  const int e = 6, h = 64, i = 96;
  const MoeLayerWeights a = make_synthetic_layer(MoeShape(e, 2, h, i, 1, interleaved_spec), 9);
  struct Reordered {
    std::vector<uint8_t> blocks, scales;
    std::shared_ptr<const void> base;
  };
  auto fc1 = std::make_shared<Reordered>();
  fc1->blocks.resize(a.fc1_blocks.size());
  fc1->scales.resize(a.fc1_scales.size());
  fc1->base = a.storage;
  const size_t row_bytes = h / 2, row_scales = h / kMxBlock;
  for (size_t x = 0; x < e; ++x) {
    for (size_t j = 0; j < i; ++j) {
      for (size_t half = 0; half < 2; ++half) {
        const size_t from = x * 2 * i + 2 * j + half, to = x * 2 * i + half * i + j;
        std::copy_n(a.fc1_blocks.begin() + from * row_bytes, row_bytes, fc1->blocks.begin() + to * row_bytes);
        std::copy_n(a.fc1_scales.begin() + from * row_scales, row_scales, fc1->scales.begin() + to * row_scales);
      }
    }
  }
  MoeLayerWeights b = a;
  b.shape.spec.gate_up = GateUpLayout::kConcatenated;
  b.fc1_blocks = fc1->blocks;
  b.fc1_scales = fc1->scales;
  b.storage = fc1;
  const std::vector<Bf16> x = make_activations(5, h, 10);
  EXPECT_EQ(reference_forward(a, x, 5).out, reference_forward(b, x, 5).out);
  EXPECT_EQ(evaluate_layer_f64(a, x, 5).out, evaluate_layer_f64(b, x, 5).out);
}

// A V4 layer at its real H, I, k and R routed experts, holding only the experts that x routes to:
// whole layers are 3.4 GB (Flash) and 13.4 GB (Pro). Every pair is held, so the layer computes as
// the whole one would.
MoeLayerWeights layer_holding_routed_experts(const MoeShape& full, std::span<const Bf16> x, int tokens,
                                             uint64_t seed) {
  const int routed = full.num_experts, held = tokens * full.top_k;
  MoeShape shape = full;
  shape.num_experts = held;
  MoeLayerWeights w = make_synthetic_layer(shape, seed);
  SplitMix64 rng(seed + 1);
  w.router_weight.resize(static_cast<size_t>(routed) * full.hidden);
  for (auto& v : w.router_weight) v = float_to_bf16(static_cast<float>(rng.normal() / std::sqrt(full.hidden)));
  w.router_selection_bias.resize(routed);
  for (auto& b : w.router_selection_bias) b = static_cast<float>(0.1 * rng.normal());
  w.routed_experts = routed;
  for (int e = 0; e < held; ++e) w.global_experts.push_back(e);
  const Routing routing = route_layer(w, router_logits(w, x, tokens), tokens);
  std::set<int32_t> chosen(routing.experts.begin(), routing.experts.end());
  for (int e = 0; chosen.size() < static_cast<size_t>(held); ++e) chosen.insert(e);
  w.global_experts.assign(chosen.begin(), chosen.end());
  return w;
}

struct V4Case {
  const char* label;
  const char* preset;
  int tokens;
};
void PrintTo(const V4Case& c, std::ostream* os) { *os << c.preset; }

class V4ReferenceVsFloat64 : public ::testing::TestWithParam<V4Case> {};

TEST_P(V4ReferenceVsFloat64, AgreesToOneInTenToTheFifthAndRoundsToBf16) {
  const V4Case& c = GetParam();
  const MoeShape full = model_shape(c.preset);
  const std::vector<Bf16> x = make_activations(c.tokens, full.hidden, 70 + c.tokens);
  const MoeLayerWeights w = layer_holding_routed_experts(full, x, c.tokens, 71);
  const ReferenceResult ref = reference_forward(w, x, c.tokens, {.keep_intermediates = true});
  const Float64Result f64 = evaluate_layer_f64(w, x, c.tokens);

  ASSERT_EQ(ref.routing.experts, f64.experts);
  const std::vector<int32_t> local = w.local_experts();
  for (int32_t e : ref.routing.experts) ASSERT_GE(local[e], 0) << "every pair held";
  for (int t = 0; t < c.tokens; ++t) {
    double sum = 0.0;
    for (int s = 0; s < full.top_k; ++s) {
      const size_t p = static_cast<size_t>(t) * full.top_k + s;
      EXPECT_NEAR(ref.routing.weights[p], f64.weights[p], 1e-6);
      sum += ref.routing.weights[p];
    }
    EXPECT_NEAR(sum, full.spec.routed_scaling, 1e-5);
  }
  const double rel = relative_error(ref.out, f64.out);
  EXPECT_LE(rel, kReferenceRelTolerance);
  EXPECT_GT(rel, 0.0);
  double rms = 0.0;
  for (double v : f64.out) rms += v * v;
  rms = std::sqrt(rms / static_cast<double>(f64.out.size()));
  EXPECT_GT(rms, 0.1) << "synthetic outputs should be O(1)";
  EXPECT_LT(rms, 10.0) << "synthetic outputs should be O(1)";
  const Bf16RoundingCheck rounding = check_bf16_rounding(ref.out_bf16, f64.out, kReferenceRelTolerance * rms);
  EXPECT_EQ(rounding.failures, 0u) << "first at " << rounding.first_failure << ", worst " << rounding.worst_ratio;
  int clamped = 0;
  const int i = full.intermediate;
  for (size_t p = 0; p < ref.fc1_out.size() / (2 * i); ++p) {
    for (int j = 0; j < i; ++j) clamped += ref.fc1_out[p * 2 * i + j] > 10.0f || std::fabs(ref.fc1_out[p * 2 * i + i + j]) > 10.0f;
  }
  EXPECT_GT(clamped, 0) << "synthetic weights should exercise the clamp";
}

INSTANTIATE_TEST_SUITE_P(Presets, V4ReferenceVsFloat64,
                         ::testing::Values(V4Case{"flash", "deepseek-v4-flash", 3}, V4Case{"pro", "deepseek-v4-pro", 3}),
                         [](const auto& info) { return std::string(info.param.label); });

TEST(V4Reference, SmallLayerAgreesWithFloat64AndDoesNotDependOnThreads) {
  const MoeShape shape(24, 6, 96, 160, 1, kV4Flash);
  const MoeLayerWeights w = make_synthetic_layer(shape, 81);
  const std::vector<Bf16> x = make_activations(13, shape.hidden, 82);
  const ReferenceResult one = reference_forward(w, x, 13, {.threads = 1});
  const ReferenceResult many = reference_forward(w, x, 13, {.threads = 3});
  EXPECT_EQ(one.out, many.out);
  const Float64Result f64 = evaluate_layer_f64(w, x, 13);
  EXPECT_EQ(one.routing.experts, f64.experts);
  EXPECT_LE(relative_error(one.out, f64.out), kReferenceRelTolerance);
}

// The range the spec is to cover: top-k 1 to 8 among up to 512 experts.
TEST(V4Reference, EveryTopKFromOneToEightAmong512Experts) {
  for (int k = 1; k <= 8; ++k) {
    const MoeShape shape(512, k, 64, 96, 1, kV4Flash);
    const MoeLayerWeights w = make_synthetic_layer(shape, 100 + k);
    const std::vector<Bf16> x = make_activations(5, shape.hidden, 200 + k);
    const ReferenceResult ref = reference_forward(w, x, 5);
    const Float64Result f64 = evaluate_layer_f64(w, x, 5);
    EXPECT_EQ(ref.routing.experts, f64.experts) << k;
    EXPECT_LE(relative_error(ref.out, f64.out), kReferenceRelTolerance) << k;
  }
}

TEST(V4Shards, TensorAndExpertParallelShardsSumToTheLayer) {
  const MoeShape shape(18, 6, 64, 160, 1, kV4Flash);
  const MoeLayerWeights w = make_synthetic_layer(shape, 91);
  const std::vector<Bf16> x = make_activations(7, shape.hidden, 92);
  const Float64Result whole = evaluate_layer_f64(w, x, 7);
  for (int world : {2, 3}) {
    std::vector<double> tp(whole.out.size()), ep(whole.out.size());
    for (int rank = 0; rank < world; ++rank) {
      const MoeLayerWeights tp_shard = tensor_parallel_shard(w, rank, world);
      EXPECT_TRUE(tp_shard.fc1_bias.empty() && tp_shard.fc2_bias.empty());
      const Float64Result a = evaluate_layer_f64(tp_shard, x, 7);
      EXPECT_EQ(a.experts, whole.experts) << "every shard routes as the layer";
      const Float64Result b = evaluate_layer_f64(expert_parallel_shard(w, rank, world), x, 7);
      for (size_t j = 0; j < tp.size(); ++j) {
        tp[j] += a.out[j];
        ep[j] += b.out[j];
      }
    }
    std::vector<float> tp_f(tp.begin(), tp.end()), ep_f(ep.begin(), ep.end());
    EXPECT_LE(relative_error(tp_f, whole.out), 1e-6) << world;
    EXPECT_LE(relative_error(ep_f, whole.out), 1e-6) << world;
  }
}

}  // namespace
}  // namespace mxmoe

// The engine form (the caller's top-k, MoeRunner::forward_experts) and expert-parallel shards on the
// GPU against the CPU reference: every kernel family (the block-scaled one against the reference
// with MXFP8 activations), int32 and int64 ids, slots that go to no expert (-1, ids past the
// layer), repeated experts in a token, shards that get no pair at all, and
// graph capture. Outputs and workspaces are poisoned before every run, so an element nothing wrote
// cannot pass.
#include <gtest/gtest.h>

#include <array>
#include <climits>
#include <cstdint>

#include "gpu_test_support.hpp"
#include "mxmoe/error.hpp"

namespace mxmoe {
namespace {

using namespace test;  // NOLINT: the shared GPU test helpers

// A caller's routing of `tokens` tokens over R routed experts: random experts (a token may repeat
// one), random positive weights that need not sum to 1, and every seventh slot an id that goes to
// no expert (-1, R, or an int64 id past 2^32).
struct GivenRouting {
  std::vector<int64_t> ids;
  std::vector<float> weights;
  Routing reference;  // the same routing as the reference takes it (ids outside [0, R) as kNoExpert)
};

GivenRouting given_routing(int tokens, int top_k, int routed, uint64_t seed) {
  SplitMix64 rng(seed);
  GivenRouting g;
  g.reference = {tokens, top_k, {}, {}};
  for (int p = 0; p < tokens * top_k; ++p) {
    int64_t id = static_cast<int64_t>(rng.below(routed));
    if (p % 7 == 3) id = std::array<int64_t, 3>{-1, routed, int64_t{1} << 33}[rng.below(3)];
    g.ids.push_back(id);
    g.weights.push_back(static_cast<float>(0.1 + rng.uniform()));
    g.reference.experts.push_back(id >= 0 && id < routed ? static_cast<int32_t>(id) : kNoExpert);
    g.reference.weights.push_back(g.weights.back());
  }
  return g;
}

// One engine-form forward on the default stream; int64 ids, or int32 ones (ids past 2^31 wrap, so
// the routing must not hold any for an int32 run).
std::vector<Bf16> run_experts(const MoeRunner& runner, const std::vector<Bf16>& x, int tokens,
                              const GivenRouting& routing, bool ids_int64, const LayerPlan* plan,
                              std::vector<int>* pair_rows = nullptr) {
  const MoeShape& s = runner.shape();
  std::vector<int32_t> ids32(routing.ids.begin(), routing.ids.end());
  DeviceArray<Bf16> d_x(x);
  DeviceArray<int64_t> d_ids64(routing.ids);
  DeviceArray<int32_t> d_ids32(ids32);
  DeviceArray<float> d_weights(routing.weights);
  DeviceArray<Bf16> d_out(static_cast<size_t>(tokens) * s.hidden);
  DeviceArray<unsigned char> workspace(runner.workspace_size(tokens));
  d_out.fill_bytes(0xFF);
  workspace.fill_bytes(0xFF);
  const GivenTopK topk{ids_int64 ? static_cast<const void*>(d_ids64.get()) : d_ids32.get(), ids_int64,
                       d_weights.get()};
  runner.forward_experts(reinterpret_cast<const __nv_bfloat16*>(d_x.get()), topk,
                         reinterpret_cast<__nv_bfloat16*>(d_out.get()), tokens, workspace.get(), workspace.size(),
                         nullptr, plan);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess) << cudaGetErrorString(cudaGetLastError());
  if (pair_rows) {
    *pair_rows = copy_back(runner.routing(workspace.get(), tokens).pair_rows, static_cast<size_t>(tokens) * s.top_k);
  }
  return d_out.to_host();
}

GivenRouting without_wide_ids(GivenRouting g) {
  for (auto& id : g.ids) {
    if (id > INT32_MAX) id = -1;
  }
  return g;
}

// DeepSeek-V4's hash-routed layers: its experts, routed by the caller (token ids choose them).
LayerSpec hash_spec() {
  LayerSpec spec = deepseek_v4_spec(1.0f);
  spec.router = RouterKind::kCallerTopK;
  return spec;
}

class GpuEngineForm : public ::testing::TestWithParam<LayerCase> {};

TEST_P(GpuEngineForm, GivenTopKMatchesTheReference) {
  MXMOE_REQUIRE_GPU();
  const auto& c = GetParam();
  const auto& layer = test_layer(c.shape, 17);
  const std::vector<Bf16> x = make_activations(c.tokens, c.shape.hidden, 2000 + c.tokens);
  const GivenRouting routing = given_routing(c.tokens, c.shape.top_k, c.shape.num_experts, 3000 + c.tokens);
  const ReferenceOptions options{.activations = c.activations};
  const ReferenceResult ref = reference_forward_routed(layer.weights, x, routing.reference, options);
  const GivenRouting narrow = without_wide_ids(routing);
  const ReferenceResult ref_narrow = reference_forward_routed(layer.weights, x, narrow.reference, options);
  for (const auto& [name, plan] : plans_to_test(c.shape, c.activations)) {
    std::vector<int> pair_rows;
    expect_close(run_experts(*layer.runner, x, c.tokens, routing, true, plan ? &*plan : nullptr, &pair_rows), ref.out,
                 name + " int64");
    for (size_t p = 0; p < pair_rows.size(); ++p) {
      ASSERT_EQ(pair_rows[p] < 0, routing.reference.experts[p] == kNoExpert) << name << " pair " << p;
    }
    expect_close(run_experts(*layer.runner, x, c.tokens, narrow, false, plan ? &*plan : nullptr), ref_narrow.out,
                 name + " int32");
  }
}

std::vector<LayerCase> engine_cases() {
  std::vector<LayerCase> cases;
  // 1-64: the one-warp and general permutations fed by the given top-k; 300 and 1100: the parallel
  // top-k launch first (past 256 tokens).
  for (int t : {1, 3, 9, 33, 64, 300, 1100}) cases.push_back({"gpt_oss_20b", model_shape("gpt-oss-20b"), t});
  for (int t : {1, 64}) cases.push_back({"gpt_oss_120b", model_shape("gpt-oss-120b"), t});
  for (int t : {1, 7, 33}) cases.push_back({"odd_E5_k3_H96_I160", MoeShape{5, 3, 96, 160, 1}, t});
  // The block-scaled family (MXFP8 activations): fewer sorted rows than pairs where slots go to no
  // expert.
  for (int t : {1, 9, 300}) {
    cases.push_back({"gpt_oss_20b", model_shape("gpt-oss-20b"), t, ActivationFormat::kMxfp8});
  }
  for (int t : {1, 33}) cases.push_back({"odd_E5_k3_H96_I160", MoeShape{5, 3, 96, 160, 1}, t, ActivationFormat::kMxfp8});
  // DeepSeek-V4: a score layer's experts, and a hash-routed layer, which has only this form.
  for (int t : {1, 64}) cases.push_back({"deepseek_v4_flash", model_shape("deepseek-v4-flash"), t});
  for (int t : {1, 9, 300}) cases.push_back({"v4_hash_E24_k6_H256_I192", MoeShape{24, 6, 256, 192, 1, hash_spec()}, t});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuEngineForm, ::testing::ValuesIn(engine_cases()), layer_case_name);

// An expert-parallel shard's output for logits over the layer's experts (`logits` non-null) or for
// the routing `given`.
std::vector<Bf16> run_shard(const MoeRunner& runner, const std::vector<Bf16>& x, int tokens,
                            const std::vector<float>* logits, const GivenRouting* given, const LayerPlan* plan) {
  return given ? run_experts(runner, x, tokens, *given, true, plan) : run_gpu(runner, x, tokens, logits, plan).out;
}

void shards_match_the_reference_and_sum_to_the_layer(const MoeShape& shape) {
  SCOPED_TRACE(shape.describe());
  const auto& layer = test_layer(shape, 17);
  for (int tokens : {1, 9, 64, 300}) {
    const std::vector<Bf16> x = make_activations(tokens, shape.hidden, 40 + tokens);
    const std::vector<float> logits = random_logits(tokens, shape.num_experts, 50 + tokens);
    const GivenRouting given = given_routing(tokens, shape.top_k, shape.num_experts, 60 + tokens);
    const ReferenceResult full = reference_forward_from_logits(layer.weights, x, tokens, logits);
    const ReferenceResult full_given = reference_forward_routed(layer.weights, x, given.reference);
    for (int world : {2, 3, 4}) {
      std::vector<double> sum(full.out.size()), sum_given(full.out.size());
      for (int rank = 0; rank < world; ++rank) {
        const MoeLayerWeights shard = expert_parallel_shard(layer.weights, rank, world);
        const MoeRunner runner(shard);
        const std::string what = "T=" + std::to_string(tokens) + " rank " + std::to_string(rank) + " of " +
                                 std::to_string(world);
        const ReferenceResult ref = reference_forward_from_logits(shard, x, tokens, logits);
        const ReferenceResult ref_given = reference_forward_routed(shard, x, given.reference);
        const std::vector<Bf16> out = run_shard(runner, x, tokens, &logits, nullptr, nullptr);
        const std::vector<Bf16> out_given = run_shard(runner, x, tokens, nullptr, &given, nullptr);
        expect_close(out, ref.out, what);
        expect_close(out_given, ref_given.out, what + " given");
        if (world == 4 && rank == 1) {  // every family on a shard's shape
          for (const auto& [name, plan] : plans_to_test(shard.shape)) {
            expect_close(run_shard(runner, x, tokens, &logits, nullptr, plan ? &*plan : nullptr), ref.out, what + " " + name);
            expect_close(run_shard(runner, x, tokens, nullptr, &given, plan ? &*plan : nullptr), ref_given.out,
                         what + " " + name + " given");
          }
        }
        for (size_t j = 0; j < sum.size(); ++j) {
          sum[j] += bf16_to_float(out[j]);
          sum_given[j] += bf16_to_float(out_given[j]);
        }
      }
      EXPECT_LT(relative_error(full.out, sum), 5e-3) << "T=" << tokens << " world " << world;
      EXPECT_LT(relative_error(full_given.out, sum_given), 5e-3) << "T=" << tokens << " world " << world << " given";
    }
  }
}

// Each shard over 2, 3 and 4 ranks matches its own reference, through the layer form (router
// logits over all the layer's experts) and the engine form (the shard of rank 1 of 4 under every
// tactic), and the shards' outputs sum to the layer's within the rounding of their bf16 outputs:
// gpt-oss-20b, and a layer of DeepSeek-V4's spec (sqrt-softplus routing with its selection bias over
// all 24 experts, scaled by 1.5; [gate; up] rows).
TEST(GpuExpertParallel, ShardsMatchTheReferenceAndSumToTheLayer) {
  MXMOE_REQUIRE_GPU();
  for (const MoeShape& shape : {model_shape("gpt-oss-20b"), MoeShape{24, 6, 256, 192, 1, deepseek_v4_spec(1.5f)}}) {
    shards_match_the_reference_and_sum_to_the_layer(shape);
  }
}

// Every token routed to experts of rank 0 of 4: the other ranks get no pair, and every family must
// still write their output (zeros), the whole-layer launch included.
TEST(GpuExpertParallel, ShardsWithNoPairWriteZeros) {
  MXMOE_REQUIRE_GPU();
  const MoeShape shape = model_shape("gpt-oss-20b");
  const auto& layer = test_layer(shape, 17);
  const MoeLayerWeights shard = expert_parallel_shard(layer.weights, 2, 4);
  const MoeRunner runner(shard);
  for (int tokens : {1, 9, 300}) {
    const std::vector<Bf16> x = make_activations(tokens, shape.hidden, 70);
    std::vector<float> logits = random_logits(tokens, shape.num_experts, 71);
    for (int t = 0; t < tokens; ++t) {
      for (int e = 0; e < shape.top_k; ++e) logits[static_cast<size_t>(t) * shape.num_experts + e] = 20.0f + e;
    }
    const std::vector<float> zeros(static_cast<size_t>(tokens) * shape.hidden, 0.0f);
    for (const auto& [name, plan] : plans_to_test(shard.shape)) {
      expect_close(run_shard(runner, x, tokens, &logits, nullptr, plan ? &*plan : nullptr), zeros,
                   name + " T=" + std::to_string(tokens));
    }
  }
}

// The engine form captured in a graph replays bit-identically, with the workspace poisoned before
// every replay.
TEST(GpuEngineFormGraph, CapturedForwardReplaysExactly) {
  MXMOE_REQUIRE_GPU();
  const MoeShape shape = model_shape("gpt-oss-20b");
  const auto& layer = test_layer(shape, 17);
  for (int tokens : {1, 8, 200}) {
    const std::vector<Bf16> x = make_activations(tokens, shape.hidden, 81);
    const GivenRouting routing = given_routing(tokens, shape.top_k, shape.num_experts, 82);
    const std::vector<Bf16> direct = run_experts(*layer.runner, x, tokens, routing, true, nullptr);
    DeviceArray<Bf16> d_x(x), out(direct.size());
    DeviceArray<int64_t> ids(routing.ids);
    DeviceArray<float> weights(routing.weights);
    DeviceArray<unsigned char> workspace(layer.runner->workspace_size(tokens));
    cudaStream_t stream;
    MXMOE_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cudaGraph_t graph;
    MXMOE_CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    layer.runner->forward_experts(reinterpret_cast<const __nv_bfloat16*>(d_x.get()),
                                  GivenTopK{ids.get(), true, weights.get()},
                                  reinterpret_cast<__nv_bfloat16*>(out.get()), tokens, workspace.get(),
                                  workspace.size(), stream);
    MXMOE_CUDA_OK(cudaStreamEndCapture(stream, &graph));
    cudaGraphExec_t exec;
    MXMOE_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    for (int replay = 0; replay < 2; ++replay) {
      out.fill_bytes(0xFF);
      workspace.fill_bytes(0xFF);
      MXMOE_CUDA_OK(cudaGraphLaunch(exec, stream));
      MXMOE_CUDA_OK(cudaStreamSynchronize(stream));
      const auto got = out.to_host();
      EXPECT_TRUE(std::equal(got.begin(), got.end(), direct.begin(), [](Bf16 u, Bf16 v) { return u.bits == v.bits; }))
          << tokens;
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
  }
}

TEST(GpuEngineFormArguments, MisalignedOrNullRoutingThrows) {
  MXMOE_REQUIRE_GPU();
  const auto& layer = test_layer(MoeShape{6, 2, 64, 96, 1}, 3);
  DeviceArray<Bf16> x(64 * 4), out(64 * 4);
  DeviceArray<int64_t> ids(8);
  DeviceArray<float> weights(8);
  DeviceArray<unsigned char> workspace(layer.runner->workspace_size(4));
  ids.fill_bytes(0);
  weights.fill_bytes(0);
  auto call = [&](GivenTopK topk) {
    layer.runner->forward_experts(reinterpret_cast<const __nv_bfloat16*>(x.get()), topk,
                                  reinterpret_cast<__nv_bfloat16*>(out.get()), 4, workspace.get(), workspace.size(),
                                  nullptr);
  };
  EXPECT_THROW(call({nullptr, true, weights.get()}), Error);
  EXPECT_THROW(call({ids.get(), true, nullptr}), Error);
  EXPECT_THROW(call({reinterpret_cast<const char*>(ids.get()) + 4, true, weights.get()}), Error);
  EXPECT_NO_THROW(call({reinterpret_cast<const char*>(ids.get()) + 4, false, weights.get()}));
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// A layer its caller routes has no router: the layer form is refused, naming the form to call.
TEST(GpuEngineFormArguments, ACallerRoutedLayerRefusesTheLayerForm) {
  MXMOE_REQUIRE_GPU();
  const auto& layer = test_layer(MoeShape{6, 2, 64, 96, 1, hash_spec()}, 3);
  DeviceArray<Bf16> x(64 * 4), out(64 * 4);
  DeviceArray<float> logits(6 * 4);
  DeviceArray<unsigned char> workspace(layer.runner->workspace_size(4));
  auto* x16 = reinterpret_cast<const __nv_bfloat16*>(x.get());
  auto* out16 = reinterpret_cast<__nv_bfloat16*>(out.get());
  for (const bool given_logits : {false, true}) {
    try {
      if (given_logits) {
        layer.runner->forward(x16, logits.get(), out16, 4, workspace.get(), workspace.size(), nullptr);
      } else {
        layer.runner->forward(x16, out16, 4, workspace.get(), workspace.size(), nullptr);
      }
      ADD_FAILURE() << "the layer form ran on a caller-routed layer";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("forward_experts"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

}  // namespace
}  // namespace mxmoe

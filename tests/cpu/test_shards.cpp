// Tensor-parallel shards of a layer: each holds a slice of the intermediate dimension (widened to
// whole scale blocks, zeros outside its own columns), and their outputs sum to the layer's, for
// slices that are and are not whole blocks (I = 2880 over 2, 4 and 8 ranks: 1440, 720, 360).
// Expert-parallel shards: each holds some experts and the whole router; pairs routed elsewhere add
// nothing, so their outputs sum to the layer's too.
#include <gtest/gtest.h>

#include "format/mxfp4_records.hpp"
#include "mxmoe/error.hpp"
#include "mxmoe/reference.hpp"

namespace mxmoe {
namespace {

TEST(TensorParallelShard, ShardsSumToTheLayer) {
  const MoeShape shape{6, 2, 64, 2880, 1};
  const MoeLayerWeights layer = make_synthetic_layer(shape, 21);
  const int tokens = 9;
  const std::vector<Bf16> x = make_activations(tokens, shape.hidden, 22);
  const ReferenceResult full = reference_forward(layer, x, tokens);
  for (int world : {2, 4, 8}) {
    std::vector<double> sum(full.out.size(), 0.0);
    for (int rank = 0; rank < world; ++rank) {
      const MoeLayerWeights shard = tensor_parallel_shard(layer, rank, world);
      const int first = 2880 * rank / world, end = 2880 * (rank + 1) / world;
      EXPECT_EQ(shard.shape.intermediate, (end + 31) / 32 * 32 - first / 32 * 32) << world << " " << rank;
      // The padding's scales stay in the one-multiply range, as the layer's are.
      EXPECT_TRUE(scales_take_one_multiply(shard.fc1_scales)) << world << " " << rank;
      EXPECT_TRUE(scales_take_one_multiply(shard.fc2_scales)) << world << " " << rank;
      const ReferenceResult part = reference_forward(shard, x, tokens);
      EXPECT_EQ(part.routing.experts, full.routing.experts);
      for (size_t j = 0; j < sum.size(); ++j) sum[j] += part.out[j];
    }
    EXPECT_LT(relative_error(full.out, sum), 1e-6) << "world " << world;
  }
}

TEST(TensorParallelShard, RejectsRanksOutsideTheWorld) {
  const MoeLayerWeights layer = make_synthetic_layer(MoeShape{4, 2, 64, 64, 1}, 1);
  EXPECT_THROW(tensor_parallel_shard(layer, 2, 2), Error);
  EXPECT_THROW(tensor_parallel_shard(layer, -1, 2), Error);
  EXPECT_THROW(tensor_parallel_shard(layer, 0, 0), Error);
  EXPECT_THROW(tensor_parallel_shard(layer, 0, 65), Error);  // fewer than one column per rank
  EXPECT_NO_THROW(tensor_parallel_shard(layer, 0, 1));
}

TEST(ExpertParallelShard, ShardsSumToTheLayerAndRouteAsIt) {
  const MoeShape shape{10, 3, 64, 96, 1};
  const MoeLayerWeights layer = make_synthetic_layer(shape, 31);
  const int tokens = 13;
  const std::vector<Bf16> x = make_activations(tokens, shape.hidden, 32);
  const ReferenceResult full = reference_forward(layer, x, tokens);
  const Float64Result full64 = evaluate_layer_f64(layer, x, tokens);
  for (int world : {1, 2, 3}) {
    std::vector<double> sum(full.out.size(), 0.0), sum64(full.out.size(), 0.0);
    for (int rank = 0; rank < world; ++rank) {
      const MoeLayerWeights shard = expert_parallel_shard(layer, rank, world);
      const int first = 10 * rank / world, end = 10 * (rank + 1) / world;
      ASSERT_EQ(shard.shape.num_experts, end - first);
      EXPECT_EQ(shard.num_routed_experts(), 10);
      EXPECT_EQ(shard.global_experts.front(), first);
      const std::vector<int32_t> local = shard.local_experts();
      for (int e = 0; e < 10; ++e) EXPECT_EQ(local[e], e >= first && e < end ? e - first : -1);
      const ReferenceResult part = reference_forward(shard, x, tokens);
      EXPECT_EQ(part.routing.experts, full.routing.experts);  // routed ids are the layer's
      const Float64Result part64 = evaluate_layer_f64(shard, x, tokens);
      for (size_t j = 0; j < sum.size(); ++j) {
        sum[j] += part.out[j];
        sum64[j] += part64.out[j];
      }
    }
    EXPECT_LT(relative_error(full.out, sum), 1e-6) << "world " << world;
    std::vector<float> sum64_as_float(sum64.begin(), sum64.end());
    EXPECT_LT(relative_error(sum64_as_float, full64.out), 1e-6) << "world " << world;
  }
}

TEST(ExpertParallelShard, AnyExpertListAndPairsToNoExpert) {
  const MoeShape shape{8, 2, 64, 64, 1};
  const MoeLayerWeights layer = make_synthetic_layer(shape, 41);
  const int tokens = 5;
  const std::vector<Bf16> x = make_activations(tokens, shape.hidden, 42);
  Routing routing{tokens, 2, {0, 5, 7, kNoExpert, 3, 3, 1, 6, kNoExpert, kNoExpert}, {}};
  routing.weights.assign(routing.experts.size(), 0.5f);
  const MoeLayerWeights odd = expert_shard(layer, std::vector<int32_t>{7, 3, 0});
  const MoeLayerWeights rest = expert_shard(layer, std::vector<int32_t>{1, 2, 4, 5, 6});
  const ReferenceResult full = reference_forward_routed(layer, x, routing);
  const ReferenceResult a = reference_forward_routed(odd, x, routing), b = reference_forward_routed(rest, x, routing);
  std::vector<double> sum(full.out.size());
  for (size_t j = 0; j < sum.size(); ++j) sum[j] = static_cast<double>(a.out[j]) + b.out[j];
  EXPECT_LT(relative_error(full.out, sum), 1e-6);
  // The last token's slots both go to no expert: its output is zero.
  for (int j = 0; j < shape.hidden; ++j) EXPECT_EQ(full.out[4 * shape.hidden + j], 0.0f);
  routing.experts[0] = 8;  // past the layer's experts
  EXPECT_THROW(reference_forward_routed(odd, x, routing), Error);
}

TEST(ExpertParallelShard, RejectsBadExpertLists) {
  const MoeLayerWeights layer = make_synthetic_layer(MoeShape{8, 2, 64, 64, 1}, 1);
  EXPECT_THROW(expert_parallel_shard(layer, 4, 4), Error);
  EXPECT_THROW(expert_parallel_shard(layer, 0, 9), Error);  // fewer than one expert per rank
  EXPECT_THROW(expert_parallel_shard(layer, 0, 8), Error);  // fewer experts than the top-k
  EXPECT_THROW(expert_shard(layer, std::vector<int32_t>{1, 1}), Error);
  EXPECT_THROW(expert_shard(layer, std::vector<int32_t>{1, 8}), Error);
  EXPECT_THROW(expert_shard(expert_parallel_shard(layer, 0, 2), std::vector<int32_t>{0, 1}), Error);
  MoeLayerWeights broken = expert_parallel_shard(layer, 0, 2);
  broken.global_experts[1] = broken.global_experts[0];
  EXPECT_THROW(broken.validate(), Error);
  // A tensor-parallel shard of an expert-parallel one keeps its experts and its router.
  const MoeLayerWeights both = tensor_parallel_shard(expert_parallel_shard(layer, 1, 2), 0, 2);
  EXPECT_EQ(both.global_experts, (std::vector<int32_t>{4, 5, 6, 7}));
  EXPECT_EQ(both.num_routed_experts(), 8);
}

}  // namespace
}  // namespace mxmoe

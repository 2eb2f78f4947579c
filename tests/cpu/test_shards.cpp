// Tensor-parallel shards of a layer: each holds a slice of the intermediate dimension (widened to
// whole scale blocks, zeros outside its own columns), and their outputs sum to the layer's, for
// slices that are and are not whole blocks (I = 2880 over 2, 4 and 8 ranks: 1440, 720, 360).
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace mxmoe

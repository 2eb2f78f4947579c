#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "io/gpt_oss_names.hpp"
#include "mxmoe/checkpoint.hpp"
#include "mxmoe/error.hpp"
#include "test_support.hpp"

namespace mxmoe {
namespace {

namespace fs = std::filesystem;

void expect_same_weights(const MoeLayerWeights& a, const MoeLayerWeights& b) {
  EXPECT_EQ(a.shape.num_experts, b.shape.num_experts);
  EXPECT_EQ(a.shape.top_k, b.shape.top_k);
  EXPECT_EQ(a.shape.hidden, b.shape.hidden);
  EXPECT_EQ(a.shape.intermediate, b.shape.intermediate);
  auto same_bf16 = [](const std::vector<Bf16>& x, const std::vector<Bf16>& y) {
    return x.size() == y.size() &&
           std::equal(x.begin(), x.end(), y.begin(), [](Bf16 p, Bf16 q) { return p.bits == q.bits; });
  };
  auto same_bytes = [](std::span<const uint8_t> x, std::span<const uint8_t> y) {
    return std::equal(x.begin(), x.end(), y.begin(), y.end());
  };
  EXPECT_TRUE(same_bf16(a.router_weight, b.router_weight));
  EXPECT_TRUE(same_bf16(a.router_bias, b.router_bias));
  EXPECT_TRUE(same_bf16(a.fc1_bias, b.fc1_bias));
  EXPECT_TRUE(same_bf16(a.fc2_bias, b.fc2_bias));
  EXPECT_TRUE(same_bytes(a.fc1_blocks, b.fc1_blocks));
  EXPECT_TRUE(same_bytes(a.fc1_scales, b.fc1_scales));
  EXPECT_TRUE(same_bytes(a.fc2_blocks, b.fc2_blocks));
  EXPECT_TRUE(same_bytes(a.fc2_scales, b.fc2_scales));
}

struct WriteCase {
  CheckpointScheme scheme;
  int shards;
};

void PrintTo(const WriteCase& c, std::ostream* os) { *os << scheme_name(c.scheme) << " x" << c.shards; }

class SyntheticCheckpoint : public ::testing::TestWithParam<WriteCase> {};

TEST_P(SyntheticCheckpoint, LoadsBackEveryLayerBitForBit) {
  const fs::path dir = test::scratch_dir();
  MoeShape shape = test::small_shape(3);
  shape.top_k = 3;  // must come back through config.json
  write_synthetic_checkpoint(dir.string(), shape, GetParam().scheme, GetParam().shards, 42);
  EXPECT_EQ(fs::exists(dir / "model.safetensors.index.json"), GetParam().shards > 1);

  const Checkpoint checkpoint = Checkpoint::open(dir.string());
  EXPECT_EQ(checkpoint.config_top_k(), 3);
  for (int layer = 0; layer < shape.num_layers; ++layer) {
    const LoadedLayer loaded = load_gpt_oss_layer(checkpoint, layer);
    EXPECT_EQ(loaded.scheme, GetParam().scheme);
    expect_same_weights(loaded.weights, make_synthetic_layer(shape, layer_seed(42, layer)));
  }
  try {
    load_gpt_oss_layer(checkpoint, 3);
    FAIL() << "layer 3 does not exist";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layers present"), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Schemes, SyntheticCheckpoint,
                         ::testing::Values(WriteCase{CheckpointScheme::kOpenAi, 1}, WriteCase{CheckpointScheme::kOpenAi, 2},
                                           WriteCase{CheckpointScheme::kHuggingFace, 1},
                                           WriteCase{CheckpointScheme::kHuggingFace, 3}),
                         [](const auto& info) {
                           return std::string(scheme_name(info.param.scheme)) + "_" + std::to_string(info.param.shards) +
                                  "_shards";
                         });

TEST(Checkpoint, DirectoryWithoutIndexAndSingleFilePathsLoad) {
  const fs::path dir = test::scratch_dir();
  const MoeShape shape = test::small_shape(2);
  write_synthetic_checkpoint(dir.string(), shape, CheckpointScheme::kHuggingFace, 2, 5);
  fs::remove(dir / "model.safetensors.index.json");
  expect_same_weights(load_gpt_oss_layer(Checkpoint::open(dir.string()), 1).weights,
                      make_synthetic_layer(shape, layer_seed(5, 1)));
  const fs::path first = dir / "model-00001-of-00002.safetensors";
  expect_same_weights(load_gpt_oss_layer(Checkpoint::open(first.string()), 0).weights,
                      make_synthetic_layer(shape, layer_seed(5, 0)));
}

TEST(Checkpoint, WithoutConfigTopKDefaultsToFour) {
  const fs::path dir = test::scratch_dir();
  write_synthetic_checkpoint(dir.string(), test::small_shape(1), CheckpointScheme::kOpenAi, 1, 5);
  fs::remove(dir / "config.json");
  EXPECT_EQ(load_gpt_oss_layer(Checkpoint::open(dir.string()), 0).weights.shape.top_k, 4);
}

TEST(Checkpoint, RejectsUnsupportedSwigluLimitAndBadTopK) {
  const fs::path dir = test::scratch_dir();
  write_synthetic_checkpoint(dir.string(), test::small_shape(1), CheckpointScheme::kOpenAi, 1, 5);
  test::write_file(dir / "config.json", R"({"swiglu_limit": 8.0, "experts_per_token": 4})");
  EXPECT_THROW(Checkpoint::open(dir.string()), Error);
  test::write_file(dir / "config.json", R"({"experts_per_token": 0})");
  EXPECT_THROW(Checkpoint::open(dir.string()), Error);
  test::write_file(dir / "config.json", R"({"experts_per_token": 7})");  // more than the 6 experts
  EXPECT_THROW(load_gpt_oss_layer(Checkpoint::open(dir.string()), 0), Error);
}

TEST(Checkpoint, DuplicateTensorAcrossFilesIsAnError) {
  const fs::path dir = test::scratch_dir();
  write_synthetic_checkpoint(dir.string(), test::small_shape(1), CheckpointScheme::kOpenAi, 1, 5);
  fs::copy_file(dir / "model.safetensors", dir / "copy.safetensors");
  EXPECT_THROW(Checkpoint::open(dir.string()), Error);
}

TEST(Checkpoint, EmptyDirectoryAndMissingPathAreErrors) {
  const fs::path dir = test::scratch_dir();
  EXPECT_THROW(Checkpoint::open(dir.string()), Error);
  EXPECT_THROW(Checkpoint::open((dir / "nope").string()), Error);
}

class BadCheckpoint : public ::testing::TestWithParam<test::BadCheckpoint> {};

TEST_P(BadCheckpoint, LoaderThrowsOneErrorNamingFileAndProblem) {
  const fs::path dir = test::scratch_dir();
  const fs::path path = GetParam().make(dir);
  try {
    load_gpt_oss_layer(Checkpoint::open(path.string()), 0);
    FAIL() << "no error for " << GetParam().name;
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(dir.string()), std::string::npos) << message;
    for (const auto& word : GetParam().error_mentions) EXPECT_NE(message.find(word), std::string::npos) << message;
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, BadCheckpoint, ::testing::ValuesIn(test::bad_checkpoints()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace mxmoe

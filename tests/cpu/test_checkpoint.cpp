#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "common/random.hpp"
#include "io/gpt_oss_names.hpp"
#include "mxmoe/checkpoint.hpp"
#include "mxmoe/error.hpp"
#include "mxmoe/mx_format.hpp"
#include "mxmoe/reference.hpp"
#include "mxmoe/runner.hpp"
#include "test_support.hpp"

namespace mxmoe {
namespace {

namespace fs = std::filesystem;

// A message as the failure report can print it.
std::string printable_for_test(const std::string& text) {
  std::string out;
  for (unsigned char c : text) out += (c >= 0x20 && c < 0x7f) ? std::string(1, static_cast<char>(c)) : "?";
  return out;
}

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
  EXPECT_EQ(checkpoint.config().top_k, 3);
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

TEST(Checkpoint, SwigluLimitFromConfigAndBadTopKRejected) {
  const fs::path dir = test::scratch_dir();
  write_synthetic_checkpoint(dir.string(), test::small_shape(1), CheckpointScheme::kOpenAi, 1, 5);
  test::write_file(dir / "config.json", R"({"swiglu_limit": 8.0, "experts_per_token": 4})");
  const MoeShape shape = load_gpt_oss_layer(Checkpoint::open(dir.string()), 0).weights.shape;
  EXPECT_EQ(shape.spec.activation.limit, 8.0f);
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

// One expert tensor [E, rows, K / 32, 16] decoded and laid out as transformers holds it dense:
// [E, K, rows] (x @ W).
std::vector<Bf16> dense_transposed(std::span<const uint8_t> blocks, std::span<const uint8_t> scales, size_t experts,
                                   size_t rows, size_t k) {
  std::vector<Bf16> dense(experts * k * rows);
  std::vector<float> row_values(k);
  for (size_t e = 0; e < experts; ++e) {
    for (size_t r = 0; r < rows; ++r) {
      const size_t at = e * rows + r;
      dequantize_mxfp4(blocks.subspan(at * k / 2, k / 2), scales.subspan(at * k / kMxBlock, k / kMxBlock), row_values);
      for (size_t j = 0; j < k; ++j) dense[(e * k + j) * rows + r] = float_to_bf16(row_values[j]);
    }
  }
  return dense;
}

std::span<const uint8_t> bytes_of(const std::vector<Bf16>& v) {
  return {reinterpret_cast<const uint8_t*>(v.data()), v.size() * 2};
}

// Layer 0 of `w` as transformers saves it after Mxfp4Config(dequantize=True): dense bf16 experts.
void write_bf16_expert_checkpoint(const fs::path& file, const MoeLayerWeights& w) {
  const MoeShape& s = w.shape;
  const size_t e = s.num_experts, h = s.hidden, i = s.intermediate, rows1 = s.fc1_rows();
  const std::vector<Bf16> gate_up = dense_transposed(w.fc1_blocks, w.fc1_scales, e, rows1, h);
  const std::vector<Bf16> down = dense_transposed(w.fc2_blocks, w.fc2_scales, e, h, i);
  const LayerTensorNames names = layer_tensor_names(CheckpointScheme::kHuggingFace, 0);
  const DenseExpertNames dense = dense_expert_names(0);
  const auto E = static_cast<int64_t>(e), H = static_cast<int64_t>(h), I = static_cast<int64_t>(i);
  const TensorToWrite tensors[] = {
      {names.router_weight, Dtype::kBF16, {E, H}, bytes_of(w.router_weight)},
      {names.router_bias, Dtype::kBF16, {E}, bytes_of(w.router_bias)},
      {dense.gate_up, Dtype::kBF16, {E, H, 2 * I}, bytes_of(gate_up)},
      {names.fc1_bias, Dtype::kBF16, {E, 2 * I}, bytes_of(w.fc1_bias)},
      {dense.down, Dtype::kBF16, {E, I, H}, bytes_of(down)},
      {names.fc2_bias, Dtype::kBF16, {E, H}, bytes_of(w.fc2_bias)},
  };
  write_safetensors(file.string(), tensors);
}

// The experts' values, decoded: quantised codes and scales may differ where the values do not.
std::vector<float> decoded(std::span<const uint8_t> blocks, std::span<const uint8_t> scales) {
  std::vector<float> values(blocks.size() * 2);
  dequantize_mxfp4(blocks, scales, values);
  return values;
}

TEST(Checkpoint, Bf16ExpertsAreAnErrorUnlessQuantisedAndThenLoseNothing) {
  const fs::path dir = test::scratch_dir();
  const MoeShape shape = test::small_shape(1);
  const MoeLayerWeights original = make_synthetic_layer(shape, 11);
  write_bf16_expert_checkpoint(dir / "model.safetensors", original);
  test::write_file(dir / "config.json", R"({"num_experts_per_tok": 2})");
  const Checkpoint checkpoint = Checkpoint::open(dir.string());
  try {
    load_gpt_oss_layer(checkpoint, 0);
    FAIL() << "a bf16 expert checkpoint loaded without being asked to quantise";
  } catch (const Error& e) {
    const std::string message = e.what();
    for (const char* word : {"dequantised", "--quantize-bf16-experts", "model.layers.0.mlp.experts.gate_up_proj"}) {
      EXPECT_NE(message.find(word), std::string::npos) << message;
    }
  }
  LoadOptions options;
  options.quantize_bf16_experts = true;
  const LoadedLayer loaded = load_gpt_oss_layer(checkpoint, 0, options);
  EXPECT_TRUE(loaded.quantized_from_bf16);
  const MoeLayerWeights& w = loaded.weights;
  EXPECT_EQ(decoded(w.fc1_blocks, w.fc1_scales), decoded(original.fc1_blocks, original.fc1_scales));
  EXPECT_EQ(decoded(w.fc2_blocks, w.fc2_scales), decoded(original.fc2_blocks, original.fc2_scales));
  const std::vector<Bf16> x = make_activations(5, shape.hidden, 3);
  const auto a = reference_forward(w, x, 5).out_bf16, b = reference_forward(original, x, 5).out_bf16;
  EXPECT_TRUE(std::equal(a.begin(), a.end(), b.begin(), b.end(), [](Bf16 p, Bf16 q) { return p.bits == q.bits; }));
}

TEST(Checkpoint, BothSchemesInOneFileMustBeChosenBetween) {
  const fs::path dir = test::scratch_dir();
  const MoeShape shape = test::small_shape(1);
  write_synthetic_checkpoint((dir / "openai").string(), shape, CheckpointScheme::kOpenAi, 1, 5);
  write_synthetic_checkpoint((dir / "hf").string(), shape, CheckpointScheme::kHuggingFace, 1, 6);
  fs::create_directories(dir / "both");
  fs::copy_file(dir / "openai" / "model.safetensors", dir / "both" / "a.safetensors");
  fs::copy_file(dir / "hf" / "model.safetensors", dir / "both" / "b.safetensors");
  fs::copy_file(dir / "hf" / "config.json", dir / "both" / "config.json");
  const Checkpoint both = Checkpoint::open((dir / "both").string());
  try {
    load_gpt_oss_layer(both, 0);
    FAIL() << "a checkpoint with both schemes loaded one silently";
  } catch (const Error& e) {
    const std::string message = e.what();
    for (const char* word : {"block.0.mlp.mlp1_weight.blocks", "model.layers.0.mlp.experts.gate_up_proj_blocks",
                             "--scheme"}) {
      EXPECT_NE(message.find(word), std::string::npos) << message;
    }
  }
  for (const auto& [scheme, seed] : {std::pair{CheckpointScheme::kOpenAi, 5}, std::pair{CheckpointScheme::kHuggingFace, 6}}) {
    LoadOptions options;
    options.scheme = scheme;
    const LoadedLayer loaded = load_gpt_oss_layer(both, 0, options);
    EXPECT_EQ(loaded.scheme, scheme);
    expect_same_weights(loaded.weights, make_synthetic_layer(shape, layer_seed(seed, 0)));
  }
}

TEST(Checkpoint, ConfigJsonGivenAsTheCheckpointSaysSo) {
  const fs::path dir = test::scratch_dir();
  write_synthetic_checkpoint(dir.string(), test::small_shape(1), CheckpointScheme::kHuggingFace, 1, 5);
  try {
    Checkpoint::open((dir / "config.json").string());
    FAIL() << "config.json opened as a checkpoint";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("JSON file"), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find("header length"), std::string::npos) << e.what();
  }
}

// Random byte mutations of a small checkpoint: loading each either succeeds or throws one Error,
// and no error quotes a byte of the file that is not printable ASCII.
TEST(Checkpoint, MutatedFilesFailWithPrintableErrors) {
  const fs::path dir = test::scratch_dir();
  write_synthetic_checkpoint((dir / "clean").string(), MoeShape{2, 1, 32, 32, 1}, CheckpointScheme::kHuggingFace, 1,
                             5);
  const std::string clean = test::read_file(dir / "clean" / "model.safetensors");
  uint64_t header_length = 0;
  for (int i = 7; i >= 0; --i) header_length = (header_length << 8) | static_cast<unsigned char>(clean[i]);
  SplitMix64 rng(2026);
  int errors = 0;
  for (int round = 0; round < 400; ++round) {
    std::string bytes = clean;
    const int flips = 1 + static_cast<int>(rng.below(4));
    for (int f = 0; f < flips; ++f) {
      // Mostly inside the JSON header, where names and values are quoted from; sometimes anywhere.
      const size_t at = rng.below(4) ? 8 + rng.below(header_length) : rng.below(bytes.size());
      bytes[at] = static_cast<char>(rng.below(256));
    }
    if (rng.below(8) == 0) bytes.resize(rng.below(bytes.size()));
    const fs::path file = dir / "mutated.safetensors";
    test::write_file(file, bytes);
    try {
      load_gpt_oss_layer(Checkpoint::open(file.string()), 0);
    } catch (const Error& e) {
      ++errors;
      const std::string message = e.what();
      const auto bad = std::find_if(message.begin(), message.end(), [](char c) {
        return static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f;
      });
      ASSERT_EQ(bad, message.end()) << "round " << round << ": byte " << static_cast<int>(static_cast<unsigned char>(*bad))
                                    << " in: " << printable_for_test(message);
    }
  }
  EXPECT_GT(errors, 200);
}

}  // namespace
}  // namespace mxmoe

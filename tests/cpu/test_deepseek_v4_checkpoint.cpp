// DeepSeek-V4 checkpoints in both namings: written, read back to the same weights and the same
// reference output; a missing, mis-shaped or mis-typed tensor refused with one line naming it.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "io/deepseek_v4_names.hpp"
#include "mxmoe/checkpoint.hpp"
#include "mxmoe/error.hpp"
#include "mxmoe/reference.hpp"
#include "test_support.hpp"

namespace mxmoe {
namespace {

namespace fs = std::filesystem;

// E 8, k 3, H 64, I 96: every tensor small, both K dimensions two or more scale blocks.
MoeShape small_v4_shape(int layers, RouterKind router = RouterKind::kSqrtSoftplus) {
  LayerSpec spec = deepseek_v4_spec(router == RouterKind::kSqrtSoftplus ? 1.5f : 1.0f);
  spec.router = router;
  return MoeShape{8, 3, 64, 96, layers, spec};
}

bool same_bytes(std::span<const uint8_t> a, std::span<const uint8_t> b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end());
}

class DeepseekV4Checkpoint : public ::testing::TestWithParam<CheckpointScheme> {};

TEST_P(DeepseekV4Checkpoint, RoundTripsWeightsSpecAndReferenceOutput) {
  const fs::path dir = test::scratch_dir();
  const MoeShape shape = small_v4_shape(2);
  write_synthetic_checkpoint(dir.string(), shape, GetParam(), 2, 11);
  const Checkpoint checkpoint = Checkpoint::open(dir.string());
  for (int layer = 0; layer < 2; ++layer) {
    const LoadedLayer loaded = load_moe_layer(checkpoint, layer);
    const MoeLayerWeights want = make_synthetic_layer(shape, layer_seed(11, layer));
    const MoeLayerWeights& got = loaded.weights;
    EXPECT_EQ(loaded.scheme, GetParam());
    EXPECT_EQ(got.shape, MoeShape(8, 3, 64, 96, 1, shape.spec)) << got.shape.describe();
    EXPECT_TRUE(same_bytes(got.fc1_blocks, want.fc1_blocks));
    EXPECT_TRUE(same_bytes(got.fc1_scales, want.fc1_scales));
    EXPECT_TRUE(same_bytes(got.fc2_blocks, want.fc2_blocks));
    EXPECT_TRUE(same_bytes(got.fc2_scales, want.fc2_scales));
    EXPECT_EQ(got.router_selection_bias, want.router_selection_bias);
    ASSERT_EQ(got.router_weight.size(), want.router_weight.size());
    for (size_t j = 0; j < got.router_weight.size(); ++j) ASSERT_EQ(got.router_weight[j].bits, want.router_weight[j].bits);

    const int tokens = 7;
    const auto x = make_activations(tokens, shape.hidden, activation_seed(11, layer));
    const ReferenceResult a = reference_forward(got, x, tokens), b = reference_forward(want, x, tokens);
    EXPECT_EQ(a.routing.experts, b.routing.experts);
    EXPECT_EQ(a.out, b.out);
  }
}

TEST_P(DeepseekV4Checkpoint, HashRoutedLayersTakeTheCallersTopKAndHaveNoRouter) {
  const fs::path dir = test::scratch_dir();
  const MoeShape shape = small_v4_shape(1, RouterKind::kCallerTopK);
  write_synthetic_checkpoint(dir.string(), shape, GetParam(), 1, 3);
  const MoeLayerWeights w = load_moe_layer(Checkpoint::open(dir.string()), 0).weights;
  EXPECT_EQ(w.shape.spec.router, RouterKind::kCallerTopK);
  EXPECT_TRUE(w.router_weight.empty());
  EXPECT_TRUE(same_bytes(w.fc1_blocks, make_synthetic_layer(shape, layer_seed(3, 0)).fc1_blocks));
}

TEST_P(DeepseekV4Checkpoint, SpecComesFromConfigJson) {
  const fs::path dir = test::scratch_dir();
  write_synthetic_checkpoint(dir.string(), small_v4_shape(1), GetParam(), 1, 3);
  test::write_file(dir / "config.json",
                   R"({"num_experts_per_tok": 2, "routed_scaling_factor": 2.5, "swiglu_limit": 7.5,
                       "scoring_func": "sqrtsoftplus", "mlp_layer_types": ["moe"]})");
  const MoeShape got = load_moe_layer(Checkpoint::open(dir.string()), 0).weights.shape;
  EXPECT_EQ(got.top_k, 2);
  EXPECT_EQ(got.spec.routed_scaling, 2.5f);
  EXPECT_EQ(got.spec.activation.limit, 7.5f);
  EXPECT_EQ(got.spec.router, RouterKind::kSqrtSoftplus);

  test::write_file(dir / "config.json", R"({"num_experts_per_tok": 2, "routed_scaling_factor": 2.5,
                                           "scoring_func": "softmax"})");
  EXPECT_THROW(load_moe_layer(Checkpoint::open(dir.string()), 0), Error);
  test::write_file(dir / "config.json", R"({"num_experts_per_tok": 2})");
  EXPECT_THROW(load_moe_layer(Checkpoint::open(dir.string()), 0), Error);
}

INSTANTIATE_TEST_SUITE_P(BothNamings, DeepseekV4Checkpoint,
                         ::testing::Values(CheckpointScheme::kDeepSeek, CheckpointScheme::kDeepSeekHuggingFace),
                         [](const auto& info) {
                           return info.param == CheckpointScheme::kDeepSeek ? "DeepSeek" : "Transformers";
                         });

// Rewrites the one-file checkpoint in `dir` with `name` changed by `edit` (or dropped where it
// returns false).
void rewrite_tensor(const fs::path& dir, const std::string& name, const std::function<bool(TensorToWrite&)>& edit) {
  const auto file = SafetensorsFile::open((dir / "model.safetensors").string());
  std::vector<TensorToWrite> tensors;
  std::vector<std::vector<uint8_t>> held;
  for (const auto& t : file->tensors()) {
    TensorToWrite w{t.name, t.dtype, t.shape, t.bytes};
    if (t.name == name && !edit(w)) continue;
    held.emplace_back(w.bytes.begin(), w.bytes.end());
    w.bytes = held.back();
    tensors.push_back(std::move(w));
  }
  const std::string path = (dir / "model.safetensors").string();
  write_safetensors(path + ".new", tensors);
  fs::rename(path + ".new", path);
}

struct BadTensor {
  CheckpointScheme scheme;
  std::string name;
  std::string what;  // "missing", "shape", "dtype"
};

class DeepseekV4BadTensor : public ::testing::TestWithParam<BadTensor> {};

TEST_P(DeepseekV4BadTensor, RefusedWithOneLineNamingIt) {
  const BadTensor& c = GetParam();
  const fs::path dir = test::scratch_dir();
  write_synthetic_checkpoint(dir.string(), small_v4_shape(1), c.scheme, 1, 5);
  std::vector<uint8_t> bigger;
  rewrite_tensor(dir, c.name, [&](TensorToWrite& t) {
    if (c.what == "missing") return false;
    if (c.what == "shape") {
      t.shape.back() *= 2;
      bigger.assign(t.bytes.begin(), t.bytes.end());
      bigger.insert(bigger.end(), t.bytes.begin(), t.bytes.end());
      t.bytes = bigger;
    } else {
      // Another dtype of the same size, so that the file stays well formed.
      t.dtype = t.dtype == Dtype::kF32 ? Dtype::kI32 : t.dtype == Dtype::kBF16 ? Dtype::kF16 : Dtype::kF8E4M3;
    }
    return true;
  });
  try {
    load_moe_layer(Checkpoint::open(dir.string()), 0);
    FAIL() << "loaded a layer with " << c.name << " " << c.what;
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("'" + c.name + "'"), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
}

std::vector<BadTensor> bad_tensors() {
  std::vector<BadTensor> out;
  const auto own = deepseek_v4_layer_names(CheckpointScheme::kDeepSeek, 0);
  const auto expert = deepseek_v4_expert_names(0, 5);
  const auto hf = deepseek_v4_layer_names(CheckpointScheme::kDeepSeekHuggingFace, 0);
  for (const char* what : {"missing", "shape", "dtype"}) {
    for (const std::string& name : {own.router_weight, own.selection_bias, expert.w1, expert.w3_scale, expert.w2,
                                    expert.w2_scale}) {
      out.push_back({CheckpointScheme::kDeepSeek, name, what});
    }
    for (const std::string& name : {hf.router_weight, hf.selection_bias, hf.gate_up, hf.gate_up_scale, hf.down,
                                    hf.down_scale}) {
      out.push_back({CheckpointScheme::kDeepSeekHuggingFace, name, what});
    }
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(EveryTensor, DeepseekV4BadTensor, ::testing::ValuesIn(bad_tensors()),
                         [](const auto& info) { return "case" + std::to_string(info.index); });

TEST(DeepseekV4Checkpoint, GptOssSchemesDoNotHoldTheV4SpecNorTheReverse) {
  const fs::path dir = test::scratch_dir();
  EXPECT_THROW(write_synthetic_checkpoint(dir.string(), small_v4_shape(1), CheckpointScheme::kHuggingFace, 1, 0), Error);
  EXPECT_THROW(write_synthetic_checkpoint(dir.string(), test::small_shape(1), CheckpointScheme::kDeepSeek, 1, 0), Error);
}

}  // namespace
}  // namespace mxmoe

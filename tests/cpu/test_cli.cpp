// The mxmoe command as a user meets it: exit codes, one-line errors, --help everywhere, run on the
// embedded shape and on checkpoints of every scheme.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <regex>
#include <vector>

#include "io/activation_file.hpp"
#include "mxmoe/checkpoint.hpp"
#include "mxmoe/reference.hpp"
#include "mxmoe/safetensors.hpp"
#include "test_support.hpp"

namespace mxmoe {
namespace {

namespace fs = std::filesystem;

constexpr const char* kSmallShape = "--experts 6 --top-k 2 --hidden 64 --intermediate 96";

void expect_one_error_line(const test::CliResult& r) {
  EXPECT_EQ(r.err.rfind("mxmoe: error: ", 0), 0u) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}

std::string checksum(const std::string& out) {
  std::smatch m;
  return std::regex_search(out, m, std::regex("checksum ([0-9a-f]{16})")) ? m[1].str() : "";
}

// Every subcommand's --help names each of its options (the list below is the interface README.md
// documents), and every subcommand refuses an option it does not have with exit 2 and one line.
TEST(Cli, HelpAndVersion) {
  const std::map<std::string, std::vector<std::string>> options = {
      {"run",
       {"model", "experts", "top-k", "hidden", "intermediate", "checkpoint", "layer", "tokens", "device", "seed",
        "check", "scheme", "quantize-bf16-experts", "input", "output", "activations", "self-check"}},
      {"make-checkpoint",
       {"model", "experts", "top-k", "hidden", "intermediate", "layers", "out", "scheme", "shards", "seed"}},
      {"load", {"checkpoint", "layers", "scheme", "quantize-bf16-experts", "quiet", "json"}},
      {"bench", {"model", "tokens", "layers", "replays", "skewed", "compare", "breakdown", "json", "plan", "activations"}},
      {"tune", {"model", "tokens", "layers", "replays", "activations"}},
      {"cache", {"arch", "cache-dir", "family"}},
      {"probe", {"arch", "target"}},
  };
  const auto top = test::run_cli("--help");
  EXPECT_EQ(top.exit_code, 0);
  for (const auto& [command, names] : options) {
    EXPECT_NE(top.out.find("\n  " + command + " "), std::string::npos) << "mxmoe --help does not list " << command;
    const auto help = test::run_cli(command + " --help");
    EXPECT_EQ(help.exit_code, 0) << command;
    EXPECT_EQ(help.out.rfind("usage: mxmoe " + command + " ", 0), 0u) << help.out;
    for (const auto& name : names) {
      EXPECT_TRUE(std::regex_search(help.out, std::regex("\\n  --" + name + "( |\\n)")))
          << "'mxmoe " << command << " --help' does not describe --" << name << ":\n"
          << help.out;
    }
    const auto bad = test::run_cli(command + " --no-such-option");
    EXPECT_EQ(bad.exit_code, 2) << command;
    expect_one_error_line(bad);
    EXPECT_NE(bad.err.find("--no-such-option"), std::string::npos) << bad.err;
  }
  const auto version = test::run_cli("--version");
  EXPECT_EQ(version.exit_code, 0);
  EXPECT_EQ(version.out, std::string("mxmoe ") + MXMOE_VERSION + "\n");
}

TEST(Cli, UsageErrorsExitTwoWithOneLine) {
  EXPECT_EQ(test::run_cli("").exit_code, 2);
  for (const char* args :
       {"frobnicate", "run --tokens 0", "run --tokens abc", "run --device tpu", "run --bogus", "run --tokens",
        "run --model gpt-oss-7b", "run --hidden 100", "make-checkpoint --layers 2",
        "make-checkpoint --out /tmp/x --scheme gguf", "bench --layers 4", "bench --replays 5", "bench --tokens 1,x",
        "bench --model gpt-oss-7b", "bench --model gpt-oss-20b,", "tune --model deepseek-v4-pro,nope",
        "bench --plan gemv.r64", "bench --plan gemv.r64x8.w4x2.u2.k1,tiled.r128",
        "run --activations fp16", "run --self-check", "run --activations mxfp8 --self-check --device cpu",
        "cache prewarm --family nope",
        "cache prewarm --arch sm_100a --family wgmma", "cache bench --arch sm_120a --family wgmma --default-set"}) {
    const auto r = test::run_cli(args);
    EXPECT_EQ(r.exit_code, 2) << args << ": " << r.err;
    expect_one_error_line(r);
  }
}

TEST(Cli, RunWithNoArgumentsUsesTheEmbeddedGptOss20bShape) {
  const auto r = test::run_cli("run");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("E=32 k=4 H=2880 I=2880"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("device: cpu"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("time: "), std::string::npos) << r.out;
  EXPECT_FALSE(checksum(r.out).empty()) << r.out;
}

TEST(Cli, RunCheckPrintsTheFloat64Comparison) {
  const auto r = test::run_cli(std::string("run ") + kSmallShape + " --tokens 5 --check");
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex("relative error of the float32 result ([0-9.e+-]+)"))) << r.out;
  EXPECT_LE(std::stod(m[1].str()), 1e-5);
  EXPECT_NE(r.out.find("0 of 320 elements outside"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("routing identical"), std::string::npos) << r.out;
}

TEST(Cli, RunMxfp8ActivationsCheckReportsTheirError) {
  const auto r = test::run_cli(std::string("run ") + kSmallShape + " --tokens 5 --activations mxfp8 --check");
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  EXPECT_NE(r.out.find("mxfp8 activations"), std::string::npos) << r.out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex("against the float64 evaluation ([0-9.e+-]+)"))) << r.out;
  EXPECT_GT(std::stod(m[1].str()), 1e-3) << "MXFP8 rounding should show";
  EXPECT_LT(std::stod(m[1].str()), 1e-1);
  EXPECT_NE(r.out.find("routing identical"), std::string::npos) << r.out;
}

TEST(Cli, RunFp8ActivationsCheckAgainstTheSameRoundingInFloat64) {
  const auto r =
      test::run_cli(std::string("run ") + kSmallShape + " --tokens 5 --activations fp8 --device cpu --check");
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  EXPECT_NE(r.out.find("fp8 activations"), std::string::npos) << r.out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex("against the float64 evaluation ([0-9.e+-]+)"))) << r.out;
  EXPECT_LT(std::stod(m[1].str()), kSameRoundingRelTolerance);
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex("against the bf16-activation reference ([0-9.e+-]+)"))) << r.out;
  EXPECT_GT(std::stod(m[1].str()), 1e-3) << "FP8 rounding should show";
  EXPECT_LT(std::stod(m[1].str()), 1e-1);
  EXPECT_NE(r.out.find("routing identical"), std::string::npos) << r.out;
}

TEST(Cli, RunIsDeterministicAndSeeded) {
  const std::string args = std::string("run ") + kSmallShape + " --tokens 3";
  EXPECT_EQ(checksum(test::run_cli(args + " --seed 1").out), checksum(test::run_cli(args + " --seed 1").out));
  EXPECT_NE(checksum(test::run_cli(args + " --seed 1").out), checksum(test::run_cli(args + " --seed 2").out));
}

TEST(Cli, RunFromCheckpointsOfBothSchemesMatchesTheEmbeddedWeights) {
  const fs::path dir = test::scratch_dir();
  const std::string embedded = checksum(test::run_cli(std::string("run ") + kSmallShape + " --layer 1 --seed 9").out);
  ASSERT_FALSE(embedded.empty());
  for (const char* scheme : {"openai", "hf"}) {
    const fs::path out = dir / scheme;
    const auto made = test::run_cli(std::string("make-checkpoint ") + kSmallShape +
                                    " --layers 2 --shards 2 --seed 9 --scheme " + scheme + " --out " + out.string());
    ASSERT_EQ(made.exit_code, 0) << made.err;
    const auto r = test::run_cli("run --checkpoint " + out.string() + " --layer 1 --seed 9 --check");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find(std::string(scheme) + " scheme"), std::string::npos) << r.out;
    EXPECT_EQ(checksum(r.out), embedded) << scheme;
  }
}

// A DeepSeek-V4 layer at a small shape (the preset's spec, small sizes), on the CPU in every build
// (the GPU's V4 layers are tests/gpu's).
TEST(Cli, RunFromDeepseekV4CheckpointsOfBothNamingsMatchesTheEmbeddedWeights) {
  const std::string small_v4 = "--model deepseek-v4-flash --experts 8 --top-k 3 --hidden 64 --intermediate 96";
  const fs::path dir = test::scratch_dir();
  const std::string embedded =
      checksum(test::run_cli("run " + small_v4 + " --device cpu --layer 1 --seed 9").out);
  ASSERT_FALSE(embedded.empty());
  for (const char* scheme : {"deepseek", "deepseek-hf"}) {
    const fs::path out = dir / scheme;
    const auto made = test::run_cli("make-checkpoint " + small_v4 + " --layers 2 --seed 9 --scheme " + scheme +
                                    " --out " + out.string());
    ASSERT_EQ(made.exit_code, 0) << made.err;
    const auto r = test::run_cli("run --device cpu --checkpoint " + out.string() + " --layer 1 --seed 9 --check");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find(std::string("(") + scheme + " scheme"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("sqrt-softplus*1.5"), std::string::npos) << r.out;
    EXPECT_EQ(checksum(r.out), embedded) << scheme;
  }
  const auto missing = test::run_cli("run --device cpu --checkpoint " + (dir / "deepseek").string() + " --layer 2");
  EXPECT_EQ(missing.exit_code, 1);
  expect_one_error_line(missing);
  EXPECT_NE(missing.err.find("deepseek 0-1"), std::string::npos) << missing.err;
}

// A hash-routed layer chooses its experts from token ids, which only the caller has.
TEST(Cli, RunRefusesAHashRoutedLayerWithOneLine) {
  const fs::path dir = test::scratch_dir();
  LayerSpec spec = deepseek_v4_spec(1.0f);
  spec.router = RouterKind::kCallerTopK;
  write_synthetic_checkpoint(dir.string(), MoeShape{8, 3, 64, 96, 1, spec}, CheckpointScheme::kDeepSeek, 1, 0);
  const auto r = test::run_cli("run --device cpu --checkpoint " + dir.string());
  EXPECT_EQ(r.exit_code, 1);
  expect_one_error_line(r);
  EXPECT_NE(r.err.find("hash-routed"), std::string::npos) << r.err;
}

TEST(Cli, CheckpointShapeMustMatchAnExplicitModel) {
  const fs::path dir = test::scratch_dir();
  ASSERT_EQ(
      test::run_cli(std::string("make-checkpoint ") + kSmallShape + " --layers 1 --out " + dir.string()).exit_code, 0);
  const auto r = test::run_cli("run --model gpt-oss-120b --checkpoint " + dir.string());
  EXPECT_EQ(r.exit_code, 1);
  expect_one_error_line(r);
  EXPECT_NE(r.err.find("gpt-oss-120b"), std::string::npos) << r.err;
  EXPECT_EQ(test::run_cli("run --checkpoint " + dir.string() + " --experts 4").exit_code, 2);
}

// --input takes a framework's activations (float32 .npy here), --output writes the layer's result;
// on the CPU that is the reference's own output, bit for bit.
TEST(Cli, RunReadsInputAndWritesOutput) {
  const fs::path dir = test::scratch_dir();
  const MoeShape shape{6, 2, 64, 96, 1};
  const int tokens = 7;
  const std::vector<Bf16> x = make_activations(tokens, shape.hidden, 99);
  write_output((dir / "x.npy").string(), x, tokens, shape.hidden);  // float32, each value a bf16
  const auto r = test::run_cli(std::string("run ") + kSmallShape + " --device cpu --input " + (dir / "x.npy").string() +
                               " --output " + (dir / "y.safetensors").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("tokens: 7"), std::string::npos) << r.out;
  const auto expected = reference_forward(make_synthetic_layer(shape, layer_seed(0, 0)), x, tokens).out_bf16;
  const auto y = SafetensorsFile::open((dir / "y.safetensors").string());
  const TensorInfo* t = y->find("y");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->describe(), "[7, 64] BF16");
  ASSERT_EQ(t->bytes.size(), expected.size() * 2);
  EXPECT_EQ(std::memcmp(t->bytes.data(), expected.data(), t->bytes.size()), 0);

  // The .npy output holds the same values as float32, which read back as the same bf16.
  ASSERT_EQ(test::run_cli(std::string("run ") + kSmallShape + " --device cpu --input " + (dir / "x.npy").string() +
                          " --output " + (dir / "y.npy").string())
                .exit_code,
            0);
  const ActivationInput back = read_activations((dir / "y.npy").string(), shape.hidden, shape.num_experts);
  EXPECT_EQ(back.num_tokens, tokens);
  EXPECT_EQ(std::memcmp(back.x.data(), expected.data(), expected.size() * 2), 0);

  const auto wrong = test::run_cli("run --device cpu --input " + (dir / "x.npy").string());  // H = 2880
  EXPECT_EQ(wrong.exit_code, 1);
  expect_one_error_line(wrong);
  EXPECT_NE(wrong.err.find("[T, 2880]"), std::string::npos) << wrong.err;
  EXPECT_EQ(test::run_cli(std::string("run ") + kSmallShape + " --tokens 3 --input " + (dir / "x.npy").string()).exit_code,
            2);
  EXPECT_EQ(test::run_cli("run --quantize-bf16-experts").exit_code, 2);  // goes with --checkpoint
}

class CliBadCheckpoint : public ::testing::TestWithParam<test::BadCheckpoint> {};

TEST_P(CliBadCheckpoint, ExitsOneWithOneErrorLine) {
  const fs::path dir = test::scratch_dir();
  const fs::path path = GetParam().make(dir);
  const auto r = test::run_cli("run --checkpoint " + path.string());
  EXPECT_EQ(r.exit_code, 1) << r.err;
  expect_one_error_line(r);
  EXPECT_NE(r.err.find(dir.string()), std::string::npos) << r.err;
  for (const auto& word : GetParam().error_mentions) EXPECT_NE(r.err.find(word), std::string::npos) << r.err;
}

INSTANTIATE_TEST_SUITE_P(Cases, CliBadCheckpoint, ::testing::ValuesIn(test::bad_checkpoints()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace mxmoe

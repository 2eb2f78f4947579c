// mxmoe run: one MoE layer forward on seeded random activations, from an embedded model shape with
// synthetic weights or from a checkpoint's layer; --check compares with an independent evaluation.
#include <chrono>
#include <cmath>
#include <cstdio>

#include "cli.hpp"
#include "commands.hpp"
#include "summary.hpp"
#include "tools_internal.hpp"
#include "mxmoe/checkpoint.hpp"
#include "mxmoe/device.hpp"
#include "mxmoe/error.hpp"
#include "mxmoe/reference.hpp"

namespace mxmoe::cli {
namespace {

constexpr OptionSpec kOptions[] = {
    kModelOption,
    kShapeOptions[0],
    kShapeOptions[1],
    kShapeOptions[2],
    kShapeOptions[3],
    {"checkpoint", "PATH", "read the layer from a gpt-oss or DeepSeek-V4 safetensors checkpoint (file or directory)"},
    {"layer", "N", "layer index (default 0)"},
    {"tokens", "T", "tokens in the batch (default 4)"},
    {"device", "auto|cpu|gpu", "where to run (default auto: the GPU if there is one)"},
    {"seed", "S", "seed of the activations and of synthetic weights (default 0)"},
    {"check", "", "compare with a float64 evaluation and print the relative error"},
    {"activations", "bf16|mxfp8|fp8",
     "the activations' format in the expert GEMMs (default bf16; mxfp8: the block-scaled tiles; fp8: per-128\n"
     "E4M3 as DeepSeek-V4 quantises them: the bf16 kernels on rounded rows, on sm_120a / sm_121a the block-scaled tiles)"},
    {"self-check", "", "with --activations mxfp8 on a GPU: run the block-scaled family's first-use check on any GPU"},
    {"scheme", "openai|hf|deepseek|deepseek-hf", "which names to read where a checkpoint holds the layer under several"},
    {"quantize-bf16-experts", "", "quantise a checkpoint's bf16 experts (a dequantised save) to MXFP4 on load"},
    {"input", "FILE", "the activations (and optionally router_logits) from a .safetensors or .npy file"},
    {"output", "FILE", "write the layer's output to a .safetensors (BF16) or .npy (float32) file"},
};

constexpr CommandSpec kSpec{
    "run",
    "[--model M] [--checkpoint PATH [--scheme S] [--quantize-bf16-experts]] [--layer N] [--tokens T | --input FILE]\n"
    "                 [--output FILE] [--device auto|cpu|gpu] [--activations bf16|mxfp8|fp8 [--self-check]] [--seed S]\n"
    "                 [--check]",
    "Runs one MoE layer forward on seeded unit-normal bf16 activations (or those of --input) and prints the\n"
    "shape, the device, the time and a summary of the output (its norm and a checksum of its bf16 bits).\n"
    "With no --checkpoint the weights are synthetic MXFP4, seeded by --seed and the layer, identical to what\n"
    "make-checkpoint writes. --input takes x [T, H] from a .safetensors file (tensor 'x', BF16, F16 or F32,\n"
    "and optionally 'router_logits' [T, E] F32) or a .npy file (float32, float16, or uint16 holding bf16);\n"
    "--output writes y [T, H] as BF16 (.safetensors, tensor 'y') or float32 (.npy).",
    kOptions};

// Tokens checked by --check: all of a small batch, else 8 spread over it (rows are independent).
constexpr int kMaxCheckedTokens = 8;

// Compares the float32 reference with the float64 evaluation on a sample of tokens; returns false
// when either figure misses its bound.
bool check_against_f64(const MoeLayerWeights& weights, std::span<const Bf16> x, int num_tokens,
                       const ReferenceResult& result) {
  const size_t h = weights.shape.hidden, k = weights.shape.top_k;
  const std::vector<int> sample = sample_tokens(num_tokens, kMaxCheckedTokens);
  const int checked = static_cast<int>(sample.size());
  const std::vector<Bf16> x_sample = sample_rows(x, sample, h);
  const std::vector<float> out_sample = sample_rows<float>(result.out, sample, h);
  const std::vector<Bf16> out_bf16_sample = sample_rows<Bf16>(result.out_bf16, sample, h);
  const std::vector<int32_t> experts_sample = sample_rows<int32_t>(result.routing.experts, sample, k);
  const Float64Result f64 = evaluate_layer_f64(weights, x_sample, checked);
  const double rel = relative_error(out_sample, f64.out);
  double rms = 0.0;
  for (double v : f64.out) rms += v * v;
  rms = std::sqrt(rms / static_cast<double>(f64.out.size()));
  const Bf16RoundingCheck rounding = check_bf16_rounding(out_bf16_sample, f64.out, kReferenceRelTolerance * rms);
  const bool same_experts = experts_sample == f64.experts;
  std::printf("check: %d of %d tokens against a float64 evaluation\n", checked, num_tokens);
  std::printf("check: routing %s\n", same_experts ? "identical" : "DIFFERS");
  std::printf("check: relative error of the float32 result %.3e (bound %.0e)\n", rel, kReferenceRelTolerance);
  std::printf("check: bf16 output within rounding: %zu of %zu elements outside (worst at %.2f of its bound)\n",
              rounding.failures, out_bf16_sample.size(), rounding.worst_ratio);
  return same_experts && rel <= kReferenceRelTolerance && rounding.failures == 0;
}

// A result with rounded activations against a float64 evaluation on a sample of tokens, and against
// the bf16-activation reference on all (its cost); false when the first misses its bound. MXFP8 is
// held to the evaluation of bf16 activations (kMxfp8ActivationRelTolerance), FP8 to the one that
// rounds the same rows (kSameRoundingRelTolerance).
bool check_rounded_against_f64(const MoeLayerWeights& weights, std::span<const Bf16> x, int num_tokens,
                               const ReferenceResult& result, ActivationFormat format) {
  const bool mxfp8 = format == ActivationFormat::kMxfp8;
  const ActivationFormat evaluated = mxfp8 ? ActivationFormat::kBf16 : format;
  const double bound = mxfp8 ? kMxfp8ActivationRelTolerance : kSameRoundingRelTolerance;
  const size_t h = weights.shape.hidden;
  const std::vector<int> sample = sample_tokens(num_tokens, kMaxCheckedTokens);
  const std::vector<Bf16> x_sample = sample_rows(x, sample, h);
  const std::vector<float> out_sample = sample_rows<float>(result.out, sample, h);
  const Float64Result f64 = evaluate_layer_f64(weights, x_sample, static_cast<int>(sample.size()), evaluated);
  const double rel_f64 = relative_error(out_sample, f64.out);
  const ReferenceResult bf16 = reference_forward(weights, x, num_tokens);
  const double rel_bf16 = relative_error(result.out, std::vector<double>(bf16.out.begin(), bf16.out.end()));
  const bool same_routing = bf16.routing.experts == result.routing.experts;
  std::printf("check: %s activations, %zu of %d tokens against a float64 evaluation of %s activations\n",
              mxfp8 ? "MXFP8" : "FP8", sample.size(), num_tokens, mxfp8 ? "bf16" : "FP8");
  std::printf("check: routing %s\n", same_routing ? "identical" : "DIFFERS");
  std::printf("check: relative error against the float64 evaluation %.3e (bound %.0e)\n", rel_f64, bound);
  std::printf("check: relative error against the bf16-activation reference %.3e\n", rel_bf16);
  return same_routing && rel_f64 <= bound;
}

}  // namespace

int run_command(std::span<const std::string> args) {
  const auto parsed = parse(kSpec, args);
  if (!parsed) return 0;
  const std::string device = parsed->get("device", "auto");
  if (device != "auto" && device != "cpu" && device != "gpu") {
    throw UsageError("--device: expected auto, cpu or gpu, got '" + device + "'");
  }
  const int num_tokens = static_cast<int>(parsed->get_int("tokens", 4, 1, 1 << 20));
  const int layer = static_cast<int>(parsed->get_int("layer", 0, 0, 1 << 20));
  const uint64_t seed = parsed->get_u64("seed", 0);

  MoeLayerWeights weights;
  std::string source;
  if (parsed->has("checkpoint")) {
    if (has_shape_override(*parsed)) throw UsageError("--checkpoint takes its shape from the file; drop the shape overrides");
    const Checkpoint checkpoint = Checkpoint::open(parsed->get("checkpoint", ""));
    LoadOptions options;
    options.quantize_bf16_experts = parsed->flag("quantize-bf16-experts");
    if (parsed->has("scheme")) {
      try {
        options.scheme = parse_scheme(parsed->get("scheme", ""));
      } catch (const Error& e) {
        throw UsageError(std::string("--scheme: ") + e.what());
      }
    }
    LoadedLayer loaded = load_moe_layer(checkpoint, layer, options);
    weights = std::move(loaded.weights);
    if (weights.shape.spec.router == RouterKind::kCallerTopK) {
      throw Error(checkpoint.path() + ": layer " + std::to_string(layer) +
                  " is hash-routed (its experts come from token ids): mxmoe runs it only in the engine form, with "
                  "the caller's top-k (mxmoe.experts in Python)");
    }
    if (parsed->has("model")) {
      const MoeShape expected = shape_from_args(*parsed);
      if (expected.num_experts != weights.shape.num_experts || expected.hidden != weights.shape.hidden ||
          expected.intermediate != weights.shape.intermediate) {
        throw Error(checkpoint.path() + ": layer " + std::to_string(layer) + " has shape " + weights.shape.describe() +
                    ", not the " + parsed->get("model", "") + " shape " + expected.describe());
      }
    }
    source = "from " + checkpoint.path() + " (" + std::string(scheme_name(loaded.scheme)) + " scheme" +
             (loaded.quantized_from_bf16 ? ", bf16 experts quantised to MXFP4" : "") + ")";
  } else {
    if (parsed->has("scheme") || parsed->flag("quantize-bf16-experts")) {
      throw UsageError("--scheme and --quantize-bf16-experts go with --checkpoint");
    }
    weights = make_synthetic_layer(shape_from_args(*parsed), layer_seed(seed, layer));
    source = parsed->get("model", "gpt-oss-20b") + (has_shape_override(*parsed) ? " with overrides" : "") +
             ", synthetic (seed " + std::to_string(seed) + ")";
  }
  if (parsed->has("input") && parsed->has("tokens")) throw UsageError("--input takes the token count from the file; drop --tokens");
  ActivationInput input;
  if (parsed->has("input")) {
    input = read_activations(parsed->get("input", ""), weights.shape.hidden, weights.shape.num_experts);
  } else {
    input.num_tokens = num_tokens;
    input.x = make_activations(num_tokens, weights.shape.hidden, activation_seed(seed, layer));
  }
  const std::vector<Bf16>& x = input.x;
  const std::vector<float>* logits = input.router_logits ? &*input.router_logits : nullptr;
  auto write = [&](std::span<const Bf16> y) {
    if (!parsed->has("output")) return;
    write_output(parsed->get("output", ""), y, input.num_tokens, weights.shape.hidden);
    std::printf("output written to %s\n", parsed->get("output", "").c_str());
  };

  const std::string activations = parsed->get("activations", "bf16");
  ActivationFormat format;
  try {
    format = parse_activation_format(activations);
  } catch (const Error& e) {
    throw UsageError(std::string("--activations: ") + e.what());
  }
  const bool mxfp8 = format == ActivationFormat::kMxfp8;
  if (parsed->flag("self-check") && !mxfp8) throw UsageError("--self-check checks the MXFP8 path: add --activations mxfp8");
  const std::vector<GpuInfo> gpus = list_gpus();
  if (device == "gpu" && gpus.empty()) throw Error("--device gpu: no CUDA GPU is visible");
  if (parsed->flag("self-check") && (device == "cpu" || gpus.empty())) {
    throw UsageError("--self-check runs on a GPU: drop it or --device cpu");
  }
  std::printf("layer: %s, layer %d, weights %s\n", weights.shape.describe().c_str(), layer, source.c_str());
  if (device == "gpu" || (device == "auto" && !gpus.empty())) {
    const RunnerOptions options{
        .activations = format,
        .block_scaled_check = parsed->flag("self-check") ? BlockScaledCheck::kAlways : BlockScaledCheck::kOnSm12x};
    const GpuRun run = run_on_gpu(weights, x, input.num_tokens, logits, parsed->flag("check"), options);
    write(run.out);
    if (!run.check_passed) throw Error("check failed: the GPU output disagrees with the CPU reference");
    return 0;
  }
  if (logits && parsed->flag("check")) {
    throw UsageError("--check on the CPU compares with a float64 evaluation that routes with the layer's router; "
                     "drop router_logits from --input, or --check");
  }
  std::printf("device: cpu (float32 reference, %s activations, %d threads)\n", activations.c_str(),
              default_thread_count());

  const auto start = std::chrono::steady_clock::now();
  const ReferenceOptions options{.activations = format};
  const ReferenceResult result = logits ? reference_forward_from_logits(weights, x, input.num_tokens, *logits, options)
                                        : reference_forward(weights, x, input.num_tokens, options);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  std::printf("tokens: %d\n", input.num_tokens);
  std::printf("time: %.3f ms\n", ms);
  print_output_summary(result.out_bf16, input.num_tokens, weights.shape.hidden);
  write(result.out_bf16);
  if (parsed->flag("check")) {
    const bool passed = format == ActivationFormat::kBf16
                            ? check_against_f64(weights, x, input.num_tokens, result)
                            : check_rounded_against_f64(weights, x, input.num_tokens, result, format);
    if (!passed) throw Error("check failed: the reference disagrees with the float64 evaluation");
  }
  return 0;
}

}  // namespace mxmoe::cli

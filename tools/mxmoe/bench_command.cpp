// mxmoe bench: the whole MoE layer timed as ../shared/docs/BENCHMARK.md prescribes. Ceilings are
// measured first; then for each model, 8+ layers of distinct weights are rotated inside one CUDA
// graph (so L2 never holds the experts being read) and the graph's replays are timed with events.
// Bytes are counted from the routing that ran; every row is checked against the CPU reference.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <set>

#include "bench_ceilings.hpp"
#include "cli.hpp"
#include "commands.hpp"
#include "common/random.hpp"
#include "mxmoe/device.hpp"
#include "mxmoe/error.hpp"
#include "mxmoe/reference.hpp"
#include "mxmoe/runner.hpp"
#include "runner/cuda_check.hpp"
#include "summary.hpp"

#ifndef MXMOE_GIT_REVISION
#define MXMOE_GIT_REVISION "unknown"
#endif

namespace mxmoe::cli {
namespace {

constexpr OptionSpec kOptions[] = {
    {"model", "NAME", "gpt-oss-20b, gpt-oss-120b or all (default all)"},
    {"tokens", "LIST", "token counts, comma-separated (default 1,2,4,5,8,9,16,32,64,128,256,512,1024,4096)"},
    {"layers", "N", "distinct layers rotated per graph replay (default 8, at least 8)"},
    {"replays", "N", "timed graph replays (default 30, at least 20)"},
    {"skewed", "", "half the tokens pick the same expert"},
    {"json", "FILE", "also write every number as JSON"},
};

constexpr CommandSpec kSpec{
    "bench", "[--model M|all] [--tokens LIST] [--layers N] [--replays N] [--skewed] [--json FILE]",
    "Times the whole MoE layer (routing, permutation, FC1 + SwiGLU, FC2, weighted un-permute) against the\n"
    "device's own measured ceilings: streaming-read bandwidth and the cuBLAS bf16 matmul rate.",
    kOptions};

constexpr int kCheckedTokens = 8;
constexpr double kMaxRelativeError = 1e-2;

struct Row {
  std::string model;
  int tokens = 0;
  double us_median = 0, us_min = 0, us_max = 0;
  double bytes = 0, touched_experts = 0;
  double gbs = 0, read_fraction = 0, tflops = 0, bf16_fraction = 0;
  std::string fc1, fc2;
  double rel_error = 0;
  double tokens_per_s = 0;
};

struct DeviceLayer {
  MoeRunner runner;
  DeviceBuffer x, logits, out;
  std::vector<float> host_logits;
};

std::vector<float> bench_logits(int tokens, int experts, uint64_t seed, bool skewed) {
  SplitMix64 rng(seed);
  std::vector<float> logits(static_cast<size_t>(tokens) * experts);
  for (auto& v : logits) v = static_cast<float>(rng.normal());
  if (skewed) {
    for (int t = 0; t < tokens; t += 2) logits[static_cast<size_t>(t) * experts] = 10.0f;
  }
  return logits;
}

// Distinct experts the routing selects, and the bytes the layer must move: those experts' MXFP4
// values, scales and biases, plus the activations in and out once.
std::pair<int, double> counted_bytes(const MoeShape& shape, const std::vector<float>& logits, int tokens) {
  const Routing r = route(logits, tokens, shape.num_experts, shape.top_k);
  const std::set<int32_t> touched(r.experts.begin(), r.experts.end());
  const double bytes = static_cast<double>(touched.size()) * shape.expert_bytes() + 2.0 * tokens * shape.hidden * 2;
  return {static_cast<int>(touched.size()), bytes};
}

Row bench_tokens(const std::string& model, const MoeShape& shape, const MoeLayerWeights& first_weights,
                 std::vector<std::unique_ptr<DeviceLayer>>& layers, int tokens, int replays, bool skewed,
                 const Ceilings& ceilings) {
  const size_t x_bytes = static_cast<size_t>(tokens) * shape.hidden * 2;
  std::vector<Bf16> first_x;
  for (size_t l = 0; l < layers.size(); ++l) {
    DeviceLayer& layer = *layers[l];
    const std::vector<Bf16> x = make_activations(tokens, shape.hidden, derive_seed(tokens, 2 * l));
    layer.host_logits = bench_logits(tokens, shape.num_experts, derive_seed(tokens, 2 * l + 1), skewed);
    layer.x = DeviceBuffer(x_bytes, "bench activations");
    layer.out = DeviceBuffer(x_bytes, "bench output");
    layer.logits = DeviceBuffer(layer.host_logits.size() * 4, "bench logits");
    cuda_check(cudaMemcpy(layer.x.get(), x.data(), x_bytes, cudaMemcpyHostToDevice), "copying activations");
    cuda_check(cudaMemcpy(layer.logits.get(), layer.host_logits.data(), layer.host_logits.size() * 4,
                          cudaMemcpyHostToDevice),
               "copying logits");
    if (l == 0) first_x = x;
  }
  DeviceBuffer workspace(layers[0]->runner.workspace_size(tokens), "bench workspace");
  cudaStream_t stream;
  cuda_check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  auto forward_all = [&] {
    for (auto& layer : layers) {
      layer->runner.forward(static_cast<const __nv_bfloat16*>(layer->x.get()), static_cast<const float*>(layer->logits.get()),
                            static_cast<__nv_bfloat16*>(layer->out.get()), tokens, workspace.get(), workspace.bytes(),
                            stream);
    }
  };
  forward_all();  // warm-up outside the graph: module loads, first-touch
  cuda_check(cudaStreamSynchronize(stream), "warm-up forward");
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  cuda_check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), "graph capture");
  forward_all();
  cuda_check(cudaStreamEndCapture(stream, &graph), "graph capture");
  cuda_check(cudaGraphInstantiate(&exec, graph, 0), "graph instantiate");
  cudaEvent_t start, stop;
  cuda_check(cudaEventCreate(&start), "cudaEventCreate");
  cuda_check(cudaEventCreate(&stop), "cudaEventCreate");
  for (int i = 0; i < 3; ++i) cuda_check(cudaGraphLaunch(exec, stream), "graph replay");
  std::vector<double> us_per_layer;
  for (int i = 0; i < replays; ++i) {
    cuda_check(cudaEventRecord(start, stream), "cudaEventRecord");
    cuda_check(cudaGraphLaunch(exec, stream), "graph replay");
    cuda_check(cudaEventRecord(stop, stream), "cudaEventRecord");
    cuda_check(cudaEventSynchronize(stop), "graph replay");
    float ms = 0.0f;
    cuda_check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    us_per_layer.push_back(1000.0 * ms / static_cast<double>(layers.size()));
  }
  std::sort(us_per_layer.begin(), us_per_layer.end());
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);

  Row row;
  row.model = model;
  row.tokens = tokens;
  row.us_median = us_per_layer[us_per_layer.size() / 2];
  row.us_min = us_per_layer.front();
  row.us_max = us_per_layer.back();
  for (const auto& layer : layers) {
    const auto [touched, bytes] = counted_bytes(shape, layer->host_logits, tokens);
    row.touched_experts += static_cast<double>(touched) / layers.size();
    row.bytes += bytes / layers.size();
  }
  const double flops = 2.0 * tokens * shape.top_k * (3.0 * shape.hidden * shape.intermediate);
  row.gbs = row.bytes / (row.us_median * 1e-6) / 1e9;
  row.read_fraction = row.gbs / ceilings.read_gbs;
  row.tflops = flops / (row.us_median * 1e-6) / 1e12;
  row.bf16_fraction = row.tflops / ceilings.bf16_tflops;
  const LayerPlan plan = layers[0]->runner.plan(tokens);
  row.fc1 = plan.fc1.name();
  row.fc2 = plan.fc2.name();
  row.tokens_per_s = 1e6 / (shape.num_layers * row.us_median);

  // Accuracy: layer 0's output (the graph ran it last with these inputs) on a sample of tokens.
  std::vector<Bf16> out(static_cast<size_t>(tokens) * shape.hidden);
  cuda_check(cudaMemcpy(out.data(), layers[0]->out.get(), x_bytes, cudaMemcpyDeviceToHost), "copying the output");
  std::vector<Bf16> x_sample;
  std::vector<float> logits_sample, gpu_sample;
  const std::vector<int> sample = sample_tokens(tokens, kCheckedTokens);
  for (int t : sample) {
    const size_t h = shape.hidden, e = shape.num_experts;
    x_sample.insert(x_sample.end(), first_x.begin() + t * h, first_x.begin() + (t + 1) * h);
    logits_sample.insert(logits_sample.end(), layers[0]->host_logits.begin() + t * e,
                         layers[0]->host_logits.begin() + (t + 1) * e);
    for (size_t j = 0; j < h; ++j) gpu_sample.push_back(bf16_to_float(out[t * h + j]));
  }
  const ReferenceResult ref =
      reference_forward_from_logits(first_weights, x_sample, static_cast<int>(sample.size()), logits_sample);
  row.rel_error = relative_error(gpu_sample, std::vector<double>(ref.out.begin(), ref.out.end()));
  return row;
}

void print_table(const std::vector<Row>& rows, const Ceilings& c) {
  std::printf("\nceilings: read %.0f GB/s, bf16 matmul %.0f TFLOP/s\n", c.read_gbs, c.bf16_tflops);
  std::printf("%-13s %5s %10s %17s %7s %6s %8s %6s %-24s %-24s %8s %8s\n", "model", "T", "us/layer", "min-max",
              "GB/s", "%read", "TFLOP/s", "%bf16", "FC1", "FC2", "rel.err", "tok/s");
  for (const auto& r : rows) {
    char spread[32];
    std::snprintf(spread, sizeof(spread), "%.1f-%.1f", r.us_min, r.us_max);
    std::printf("%-13s %5d %10.1f %17s %7.0f %5.1f%% %8.1f %5.1f%% %-24s %-24s %8.1e %8.0f%s\n", r.model.c_str(),
                r.tokens, r.us_median, spread, r.gbs, 100 * r.read_fraction, r.tflops, 100 * r.bf16_fraction,
                r.fc1.c_str(), r.fc2.c_str(), r.rel_error, r.tokens_per_s,
                r.rel_error < kMaxRelativeError ? "" : "  INACCURATE");
  }
}

void write_json(const std::string& path, const std::vector<Row>& rows, const Ceilings& c, const DeviceReport& d,
                int layers, int replays, bool skewed) {
  nlohmann::ordered_json json;
  json["device"] = {{"name", d.name},
                    {"sm", std::to_string(d.sm_major) + "." + std::to_string(d.sm_minor)},
                    {"multiprocessors", d.multiprocessors},
                    {"driver_version", d.driver_version},
                    {"sm_clock_mhz", d.sm_clock_mhz},
                    {"memory_clock_mhz", d.memory_clock_mhz},
                    {"max_sm_clock_mhz", d.max_sm_clock_mhz}};
  json["git_revision"] = MXMOE_GIT_REVISION;
  json["mxmoe_version"] = MXMOE_VERSION;
  json["protocol"] = {{"layers_rotated", layers}, {"replays", replays}, {"skewed", skewed}, {"statistic", "median"}};
  json["ceilings"] = {{"read_gbs", c.read_gbs}, {"read_bytes", c.read_bytes}, {"bf16_tflops", c.bf16_tflops},
                      {"matmul_n", c.matmul_n}};
  for (const auto& r : rows) {
    json["rows"].push_back({{"model", r.model},          {"tokens", r.tokens},
                            {"us_per_layer", r.us_median}, {"us_min", r.us_min},
                            {"us_max", r.us_max},          {"bytes", r.bytes},
                            {"touched_experts", r.touched_experts}, {"gbs", r.gbs},
                            {"read_fraction", r.read_fraction}, {"tflops", r.tflops},
                            {"bf16_fraction", r.bf16_fraction}, {"fc1_tactic", r.fc1},
                            {"fc2_tactic", r.fc2},         {"rel_error", r.rel_error},
                            {"moe_tokens_per_s", r.tokens_per_s}});
  }
  std::ofstream out(path);
  out << json.dump(2) << "\n";
  if (!out) throw Error(path + ": cannot write the JSON report");
}

}  // namespace

int bench_command(std::span<const std::string> args) {
  const auto parsed = parse(kSpec, args);
  if (!parsed) {
    std::cout << usage(kSpec);
    return 0;
  }
  const std::string model_arg = parsed->get("model", "all");
  std::vector<std::string> models;
  if (model_arg == "all") {
    for (const auto& p : model_presets()) models.emplace_back(p.name);
  } else {
    try {
      model_shape(model_arg);
    } catch (const Error& e) {
      throw UsageError(std::string("--model: ") + e.what());
    }
    models.push_back(model_arg);
  }
  const std::vector<int64_t> token_counts =
      parsed->get_int_list("tokens", {1, 2, 4, 5, 8, 9, 16, 32, 64, 128, 256, 512, 1024, 4096}, 1, 1 << 20);
  const int num_layers = static_cast<int>(parsed->get_int("layers", 8, 8, 64));
  const int replays = static_cast<int>(parsed->get_int("replays", 30, 20, 10000));
  const bool skewed = parsed->flag("skewed");
  if (list_gpus().empty()) throw Error("bench: no CUDA GPU is visible");

  const DeviceReport device = describe_device();
  std::printf("device: %s (sm_%d%d, %d SMs), driver %d, SM clock %u MHz (max %u), memory clock %u MHz, git %s\n",
              device.name.c_str(), device.sm_major, device.sm_minor, device.multiprocessors, device.driver_version,
              device.sm_clock_mhz, device.max_sm_clock_mhz, device.memory_clock_mhz, MXMOE_GIT_REVISION);
  const Ceilings ceilings = measure_ceilings();
  std::printf("ceilings: streaming read %.0f GB/s (%zu GiB), bf16 matmul %.0f TFLOP/s (cuBLAS %d^3)\n", ceilings.read_gbs,
              ceilings.read_bytes >> 30, ceilings.bf16_tflops, ceilings.matmul_n);

  std::vector<Row> rows;
  for (const auto& model : models) {
    const MoeShape shape = model_shape(model);
    std::printf("%s: building %d layers of distinct synthetic weights...\n", model.c_str(), num_layers);
    std::fflush(stdout);
    std::vector<std::unique_ptr<DeviceLayer>> layers;
    MoeLayerWeights first_weights;
    for (int l = 0; l < num_layers; ++l) {
      MoeLayerWeights w = make_synthetic_layer(shape, layer_seed(1234, l));
      layers.push_back(std::make_unique<DeviceLayer>(DeviceLayer{MoeRunner(w), {}, {}, {}, {}}));
      if (l == 0) first_weights = std::move(w);
    }
    for (int64_t tokens : token_counts) {
      rows.push_back(bench_tokens(model, shape, first_weights, layers, static_cast<int>(tokens), replays, skewed, ceilings));
      const Row& r = rows.back();
      std::printf("  T=%-5d %9.1f us/layer  %6.0f GB/s  %5.1f TFLOP/s  rel.err %.1e\n", r.tokens, r.us_median, r.gbs,
                  r.tflops, r.rel_error);
      std::fflush(stdout);
    }
  }
  print_table(rows, ceilings);
  if (parsed->has("json")) write_json(parsed->get("json", ""), rows, ceilings, device, num_layers, replays, skewed);
  const bool accurate = std::all_of(rows.begin(), rows.end(), [](const Row& r) { return r.rel_error < kMaxRelativeError; });
  if (!accurate) throw Error("bench: a row's output disagrees with the CPU reference (marked INACCURATE)");
  return 0;
}

}  // namespace mxmoe::cli

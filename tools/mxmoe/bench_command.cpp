// mxmoe bench: the whole MoE layer timed as docs/benchmarking.md describes. Ceilings are
// measured first; then for each model, 8+ layers of distinct weights are rotated inside one CUDA
// graph (so L2 never holds the experts being read) and the graph's replays are timed with events.
// Bytes are counted from the routing that ran; every row is checked against the CPU reference.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "bench_ceilings.hpp"
#include "layer_rotation.hpp"
#include "cli.hpp"
#include "commands.hpp"
#include "tools_internal.hpp"
#include "mxmoe/device.hpp"
#include "mxmoe/error.hpp"
#include "mxmoe/reference.hpp"
#include "mxmoe/runner.hpp"
#include "summary.hpp"

#ifndef MXMOE_GIT_REVISION
#define MXMOE_GIT_REVISION "unknown"
#endif

namespace mxmoe::cli {
namespace {

constexpr OptionSpec kOptions[] = {
    {"model", "NAMES", "model presets, comma-separated, or all of them (default all)"},
    {"tokens", "LIST", "token counts, comma-separated (default 1,2,4,5,8,9,16,32,64,128,256,512,1024,4096)"},
    {"layers", "N", "distinct layers rotated per graph replay (default 8, at least 8)"},
    {"replays", "N", "timed graph replays (default 30, at least 20)"},
    {"skewed", "", "half the tokens pick the same expert"},
    {"compare", "", "also time the heuristic's plan where the tuned table chose another"},
    {"breakdown", "", "also time each stage in the graph (routing, FC1, FC2, un-permute) against its bytes"},
    {"json", "FILE", "also write every number as JSON"},
    {"plan", "FC1[,FC2]", "time this plan instead of the runner's (one whole-layer tactic names both stages)"},
    {"activations", "bf16|mxfp8|fp8",
     "the runners' activations (default bf16; mxfp8: the block-scaled tiles; fp8: the bf16 families on rounded rows,\n"
     "on sm_120a / sm_121a the block-scaled tiles)"},
};

constexpr CommandSpec kSpec{
    "bench", "[--model M[,M...]|all] [--tokens LIST] [--layers N] [--replays N] [--skewed] [--compare] [--breakdown] [--json FILE] [--plan FC1[,FC2]]\n"
    "                   [--activations bf16|mxfp8|fp8]",
    "Times the whole MoE layer (routing, permutation, FC1 + SwiGLU, FC2, weighted un-permute) against the\n"
    "device's own measured ceilings: streaming-read bandwidth and the cuBLAS bf16 matmul rate. Each row's\n"
    "output is checked against the CPU reference with the plan's activations (rel.err); a row with MXFP8\n"
    "or FP8 activations also prints their cost, its error against the reference with bf16 activations. Where NVML\n"
    "is there, each row and each ceiling also gets the SM clock the card held while it was timed and how\n"
    "often the card's power cap was holding the clock down.",
    kOptions};

// Against the CPU reference with the plan's activations: the GPU and the CPU compute the same
// function, so MXFP8 and FP8 rows take bf16's bound (docs/benchmarking.md); what they cost is the
// separate `cost` figure (docs/block-scaled.md).
constexpr double kMaxRelativeError = 1e-2;

struct Row {
  std::string model;
  int layers = 0;  // in the rotation
  int tokens = 0;
  double us_median = 0, us_min = 0, us_max = 0;
  double bytes = 0, touched_experts = 0;
  double gbs = 0, read_fraction = 0, tflops = 0, bf16_fraction = 0, fp8_fraction = 0;  // fp8: of the FP8 ceiling
  std::string fc1, fc2;
  std::string activations = "bf16";
  double rel_error = 0;
  ClockReport clocks;  // during the timed replays of the row's plan
  double cost = 0;  // MXFP8 or FP8 activations: the error against the reference with bf16 activations
  double tokens_per_s = 0;
  double heuristic_us = 0;  // --compare: the heuristic plan's time (0 when not measured)
  // --breakdown: in-graph time of each stage (prefix differences), 0 when not measured
  // A whole-layer plan has one stage after the routing (FC1 + FC2 + un-permute): in fc1_us, the rest 0.
  // A batch that routes itself in FC1 (MoeRunner::routes_in_expert_kernels) has no routing
  // stage: its routing time is in fc1_us, and routing_us is 0.
  double routing_us = 0, fc1_us = 0, fc2_us = 0, unpermute_us = 0;
  bool whole_layer = false, routing_in_fc1 = false;
};

// --plan: "FC1,FC2", or one whole-layer tactic for both stages; the activations FC1's family takes,
// or FP8 where the runners' are FP8 and FC1 can take them (the bf16 families on rounded rows, a
// block-scaled tile of 256 rows).
LayerPlan parse_plan(const std::string& text, ActivationFormat runner_activations) {
  const size_t comma = text.find(',');
  const Tactic fc1 = parse_tactic(text.substr(0, comma));
  const bool fp8 = runner_activations == ActivationFormat::kFp8 && fc1.family->why_no_fp8(fc1, Stage::kFc1).empty();
  return {fc1, comma == std::string::npos ? fc1 : parse_tactic(text.substr(comma + 1)),
          fp8 ? ActivationFormat::kFp8 : activations_of(fc1)};
}

Row bench_tokens(const std::string& model, LayerRotation& rotation, int tokens, int replays, bool skewed,
                 bool compare, bool breakdown, const Ceilings& ceilings, const std::optional<LayerPlan>& forced) {
  const MoeShape& shape = rotation.shape();
  rotation.set_tokens(tokens, skewed);
  const LayerPlan plan = forced ? *forced : rotation.runner().plan(tokens);
  const LayerPlan* timed = forced ? &*forced : nullptr;  // null: each runner's prepared launches
  const LayerRotation::Timing timing = rotation.time(timed, replays);
  Row row;
  row.model = model;
  row.layers = rotation.num_layers();
  row.tokens = tokens;
  row.us_median = timing.median_us;
  row.us_min = timing.min_us;
  row.us_max = timing.max_us;
  row.clocks = timing.clocks;
  row.activations = activation_format_name(plan.activations);
  row.rel_error = rotation.first_layer_error(plan.activations);
  if (plan.activations != ActivationFormat::kBf16) row.cost = rotation.first_layer_error(ActivationFormat::kBf16);
  row.touched_experts = rotation.touched_experts();
  row.bytes = rotation.counted_bytes();
  const double flops = 2.0 * tokens * shape.top_k * (3.0 * shape.hidden * shape.intermediate);
  row.gbs = row.bytes / (row.us_median * 1e-6) / 1e9;
  row.read_fraction = row.gbs / ceilings.read_gbs;
  row.tflops = flops / (row.us_median * 1e-6) / 1e12;
  row.bf16_fraction = row.tflops / ceilings.bf16_tflops;
  row.fp8_fraction = ceilings.fp8_tflops > 0 ? row.tflops / ceilings.fp8_tflops : 0;
  row.fc1 = plan.fc1.name();
  row.fc2 = plan.fc2.name();
  row.tokens_per_s = 1e6 / (shape.num_layers * row.us_median);
  if (breakdown) {
    // The same rotation stopped after each stage: differences of graph times are the stages'
    // costs in place, launch gaps and overlap included.
    row.routing_in_fc1 = rotation.runner().routes_in_expert_kernels(plan, tokens);
    const double routing =
        row.routing_in_fc1 ? 0.0 : rotation.time(timed, replays, 1e30, ForwardPart::kRouting).median_us;
    row.whole_layer = plan.whole_layer();
    const double fc1 =
        row.whole_layer ? row.us_median : rotation.time(timed, replays, 1e30, ForwardPart::kFc1).median_us;
    const double fc2 =
        row.whole_layer ? row.us_median : rotation.time(timed, replays, 1e30, ForwardPart::kFc2).median_us;
    row.routing_us = routing;
    row.fc1_us = fc1 - routing;
    row.fc2_us = fc2 - fc1;
    row.unpermute_us = row.us_median - fc2;
  }
  if (compare) {
    const LayerPlan heuristic = rotation.runner().heuristic_plan(tokens);
    row.heuristic_us = heuristic == plan ? row.us_median : rotation.time(&heuristic, replays).median_us;
  }
  return row;
}

// " at M MHz (power cap P %)" of a timed region, or nothing where NVML gave no samples.
std::string clock_text(const ClockReport& clocks) {
  if (clocks.samples == 0) return "";
  char text[64];
  std::snprintf(text, sizeof(text), " at %u MHz (power cap %.0f %%)", clocks.sm_mhz_median, 100 * clocks.power_capped_fraction);
  return text;
}

nlohmann::ordered_json clock_json(const ClockReport& clocks) {
  return {{"samples", clocks.samples},
          {"sm_clock_mhz_median", clocks.sm_mhz_median},
          {"sm_clock_mhz_min", clocks.sm_mhz_min},
          {"power_w_median", clocks.power_w_median},
          {"power_w_max", clocks.power_w_max},
          {"power_capped_fraction", clocks.power_capped_fraction},
          {"slowdown_fraction", clocks.slowdown_fraction}};
}

// The FP8 ceiling as the ceiling lines print it.
std::string fp8_ceiling_text(const Ceilings& c) {
  if (c.fp8_tflops <= 0) return "FP8 matmul: none (" + c.fp8_missing + ")";
  char text[96];
  std::snprintf(text, sizeof(text), "FP8 matmul %.0f TFLOP/s", c.fp8_tflops);
  return text + clock_text(c.fp8_clocks);
}

void print_table(const std::vector<Row>& rows, const Ceilings& c) {
  std::printf("\nceilings: read %.0f GB/s%s, bf16 matmul %.0f TFLOP/s%s, %s\n", c.read_gbs, clock_text(c.read_clocks).c_str(),
              c.bf16_tflops, clock_text(c.bf16_clocks).c_str(), fp8_ceiling_text(c).c_str());
  const bool compared = std::any_of(rows.begin(), rows.end(), [](const Row& r) { return r.heuristic_us > 0; });
  const bool rounded = std::any_of(rows.begin(), rows.end(), [](const Row& r) { return r.activations != "bf16"; });
  const bool fp8 = std::any_of(rows.begin(), rows.end(), [](const Row& r) { return r.activations == "fp8"; });
  std::printf("%-13s %5s %10s %17s %7s %6s %8s %6s%s %-26s %-26s %5s %8s%s %8s %5s %4s%s\n", "model", "T", "us/layer", "min-max",
              "GB/s", "%read", "TFLOP/s", "%bf16", fp8 ? "   %fp8" : "", "FC1", "FC2", "act", "rel.err", rounded ? "     cost" : "",
              "tok/s", "MHz", "cap", compared ? "  heuristic us  tuned/heur" : "");
  for (const auto& r : rows) {
    char spread[32];
    std::snprintf(spread, sizeof(spread), "%.1f-%.1f", r.us_min, r.us_max);
    char comparison[48] = "";
    if (compared) std::snprintf(comparison, sizeof(comparison), "  %12.1f  %10.3f", r.heuristic_us, r.us_median / r.heuristic_us);
    char cost[16] = "";
    if (rounded) std::snprintf(cost, sizeof(cost), " %8.1e", r.cost);
    char clocks[16] = "    -    -";
    if (r.clocks.samples > 0) {
      std::snprintf(clocks, sizeof(clocks), "%5u %3.0f%%", r.clocks.sm_mhz_median, 100 * r.clocks.power_capped_fraction);
    }
    char fp8_share[16] = "";
    if (fp8) std::snprintf(fp8_share, sizeof(fp8_share), " %5.1f%%", 100 * r.fp8_fraction);
    std::printf("%-13s %5d %10.1f %17s %7.0f %5.1f%% %8.1f %5.1f%%%s %-26s %-26s %5s %8.1e%s %8.0f %s%s%s\n",
                r.model.c_str(), r.tokens, r.us_median, spread, r.gbs, 100 * r.read_fraction, r.tflops,
                100 * r.bf16_fraction, fp8_share, r.fc1.c_str(), r.fc2.c_str(), r.activations.c_str(), r.rel_error, cost,
                r.tokens_per_s, clocks, comparison, r.rel_error < kMaxRelativeError ? "" : "  INACCURATE");
  }
  if (std::any_of(rows.begin(), rows.end(), [](const Row& r) { return r.clocks.samples > 0; })) {
    std::printf("MHz: median SM clock over the timed replays (NVML); cap: share of those samples with the card's\n"
                "power cap holding its clock down\n");
  }
}

void print_breakdown(const std::vector<Row>& rows, const Ceilings& c) {
  if (std::none_of(rows.begin(), rows.end(), [](const Row& r) { return r.fc1_us > 0; })) return;
  std::printf("\nbreakdown (in-graph, per layer): stage us, and for FC1/FC2 the touched experts' bytes over the stage's time;\n"
              "a whole-layer plan's FC1 column is its one launch (FC1 + FC2 + un-permute) over both stages' bytes;\n"
              "routing 'in FC1': a small batch under a GEMV plan, routed by FC1 itself\n");
  std::printf("%-13s %5s %9s %9s %14s %14s %10s %9s %7s\n", "model", "T", "routing", "FC1", "FC1 TB/s", "FC2 TB/s", "FC2",
              "unpermute", "floor");
  for (const auto& r : rows) {
    const MoeShape s = model_shape(r.model);
    const double fc1_bytes = r.touched_experts * s.fc1_bytes_per_expert(), fc2_bytes = r.touched_experts * s.fc2_bytes_per_expert();
    if (r.whole_layer) {
      std::printf("%-13s %5d %9.1f %9.1f %14.2f %14s %10s %9s %7.1f\n", r.model.c_str(), r.tokens, r.routing_us, r.fc1_us,
                  (fc1_bytes + fc2_bytes) / (r.fc1_us * 1e-6) / 1e12, "whole", "layer", "-",
                  r.bytes / (c.read_gbs * 1e3));
      continue;
    }
    char routing[16] = "in FC1";
    if (!r.routing_in_fc1) std::snprintf(routing, sizeof(routing), "%.1f", r.routing_us);
    std::printf("%-13s %5d %9s %9.1f %14.2f %14.2f %10.1f %9.1f %7.1f\n", r.model.c_str(), r.tokens, routing,
                r.fc1_us, fc1_bytes / (r.fc1_us * 1e-6) / 1e12, fc2_bytes / (r.fc2_us * 1e-6) / 1e12, r.fc2_us,
                r.unpermute_us, r.bytes / (c.read_gbs * 1e3));
  }
}

void write_json(const std::string& path, const std::vector<Row>& rows, const Ceilings& c, const DeviceReport& d,
                int layers, int replays, bool skewed, bool tuned) {
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
  json["tuned"] = tuned;
  json["ceilings"] = {{"read_gbs", c.read_gbs},          {"read_bytes", c.read_bytes},
                      {"bf16_tflops", c.bf16_tflops},    {"fp8_tflops", c.fp8_tflops},
                      {"fp8_missing", c.fp8_missing},    {"matmul_n", c.matmul_n},
                      {"read_clocks", clock_json(c.read_clocks)}, {"bf16_clocks", clock_json(c.bf16_clocks)},
                      {"fp8_clocks", clock_json(c.fp8_clocks)}};
  for (const auto& r : rows) {
    json["rows"].push_back({{"model", r.model},          {"layers", r.layers},         {"tokens", r.tokens},
                            {"us_per_layer", r.us_median}, {"us_min", r.us_min},
                            {"us_max", r.us_max},          {"bytes", r.bytes},
                            {"touched_experts", r.touched_experts}, {"gbs", r.gbs},
                            {"read_fraction", r.read_fraction}, {"tflops", r.tflops},
                            {"bf16_fraction", r.bf16_fraction}, {"fp8_fraction", r.fp8_fraction},
                            {"fc1_tactic", r.fc1},
                            {"fc2_tactic", r.fc2},         {"activations", r.activations},
                            {"rel_error", r.rel_error},    {"cost_vs_bf16", r.cost},
                            {"clocks", clock_json(r.clocks)},
                            {"moe_tokens_per_s", r.tokens_per_s}, {"heuristic_us", r.heuristic_us},
                            {"routing_us", r.routing_us}, {"fc1_us", r.fc1_us}, {"fc2_us", r.fc2_us},
                            {"unpermute_us", r.unpermute_us}, {"whole_layer", r.whole_layer},
                            {"routing_in_fc1", r.routing_in_fc1}});
  }
  std::ofstream out(path);
  out << json.dump(2) << "\n";
  if (!out) throw Error(path + ": cannot write the JSON report");
}

}  // namespace

int bench_command(std::span<const std::string> args) {
  const auto parsed = parse(kSpec, args);
  if (!parsed) return 0;
  const std::vector<std::string> models = model_list(parsed->get("model", "all"));
  const std::vector<int64_t> token_counts =
      parsed->get_int_list("tokens", {1, 2, 4, 5, 8, 9, 16, 32, 64, 128, 256, 512, 1024, 4096}, 1, 1 << 20);
  const int num_layers = static_cast<int>(parsed->get_int("layers", 8, 8, 64));
  const int replays = static_cast<int>(parsed->get_int("replays", 30, 20, 10000));
  const bool skewed = parsed->flag("skewed");
  RunnerOptions options;
  options.activations = gpu_activations(*parsed);
  std::optional<LayerPlan> forced;
  if (parsed->has("plan")) {
    try {
      forced = parse_plan(parsed->get("plan", ""), options.activations);
    } catch (const Error& e) {
      throw UsageError(std::string("--plan: ") + e.what());
    }
  }
  if (list_gpus().empty()) throw Error("bench: no CUDA GPU is visible");

  const DeviceReport device = describe_device();
  std::printf("device: %s (sm_%d%d, %d SMs), driver %d, SM clock %u MHz (max %u), memory clock %u MHz, git %s\n",
              device.name.c_str(), device.sm_major, device.sm_minor, device.multiprocessors, device.driver_version,
              device.sm_clock_mhz, device.max_sm_clock_mhz, device.memory_clock_mhz, MXMOE_GIT_REVISION);
  const Ceilings ceilings = measure_ceilings();
  std::printf("ceilings: streaming read %.0f GB/s (%zu GiB)%s, bf16 matmul %.0f TFLOP/s (cuBLAS %d^3)%s, %s (cuBLASLt "
              "E4M3)\n",
              ceilings.read_gbs, ceilings.read_bytes >> 30, clock_text(ceilings.read_clocks).c_str(), ceilings.bf16_tflops,
              ceilings.matmul_n, clock_text(ceilings.bf16_clocks).c_str(), fp8_ceiling_text(ceilings).c_str());

  std::vector<Row> rows;
  bool tuned = false;
  for (const auto& model : models) {
    std::printf("%s: building %d layers of distinct synthetic weights...\n", model.c_str(), num_layers);
    std::fflush(stdout);
    LayerRotation rotation(model_shape(model), num_layers, options);
    if (rotation.num_layers() < num_layers) {
      std::printf("  %d layers of %.1f GB fit the device's memory: the rotation holds those\n", rotation.num_layers(),
                  static_cast<double>(rotation.runner().device_bytes()) / 1e9);
    }
    tuned = tuned || rotation.runner().tuned();
    for (int64_t tokens : token_counts) {
      rows.push_back(bench_tokens(model, rotation, static_cast<int>(tokens), replays, skewed, parsed->flag("compare"),
                                  parsed->flag("breakdown"), ceilings, forced));
      const Row& r = rows.back();
      std::printf("  T=%-5d %9.1f us/layer  %6.0f GB/s  %5.1f TFLOP/s  rel.err %.1e", r.tokens, r.us_median, r.gbs,
                  r.tflops, r.rel_error);
      if (r.activations != "bf16") std::printf("  %s cost %.1e", r.activations == "fp8" ? "FP8" : "MXFP8", r.cost);
      std::printf("\n");
      std::fflush(stdout);
    }
    for (const BlockScaledCheckResult& c : rotation.runner().block_scaled_checks()) {
      std::printf("  block-scaled check: %s against %s on %s: relative difference %.3e: %s\n", c.tactic.c_str(),
                  c.reference.c_str(), c.device.c_str(), c.rel_difference, c.passed ? "passed" : "FAILED");
    }
  }
  print_table(rows, ceilings);
  print_breakdown(rows, ceilings);
  if (parsed->has("json")) write_json(parsed->get("json", ""), rows, ceilings, device, num_layers, replays, skewed, tuned);
  const bool accurate = std::all_of(rows.begin(), rows.end(), [](const Row& r) { return r.rel_error < kMaxRelativeError; });
  if (!accurate) throw Error("bench: a row's output disagrees with the CPU reference (marked INACCURATE)");
  return 0;
}

}  // namespace mxmoe::cli

// mxmoe load: a checkpoint's MoE layers onto the GPU a layer at a time (load_model), with a progress
// line per layer and the load's rate and peak host memory at the end.
#include <sys/resource.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli.hpp"
#include "commands.hpp"
#include "mxmoe/device.hpp"
#include "mxmoe/error.hpp"
#include "mxmoe/model_loader.hpp"

namespace mxmoe::cli {
namespace {

constexpr OptionSpec kOptions[] = {
    {"checkpoint", "PATH", "a gpt-oss or DeepSeek-V4 safetensors checkpoint (file or directory)"},
    {"layers", "A-B|N", "the layers to load (default all the checkpoint holds)"},
    {"scheme", "openai|hf|deepseek|deepseek-hf", "which names to read where a checkpoint holds the layers under several"},
    {"quantize-bf16-experts", "", "quantise a checkpoint's bf16 experts (a dequantised save) to MXFP4 on load"},
    {"quiet", "", "no progress lines, only the summary"},
    {"json", "FILE", "also write the per-layer and total figures as JSON"},
};

constexpr CommandSpec kSpec{
    "load", "--checkpoint PATH [--layers A-B] [--scheme S] [--quantize-bf16-experts] [--quiet] [--json FILE]",
    "Loads a checkpoint's MoE layers onto the first GPU, one layer at a time, the way load_model does: each\n"
    "layer's tensors are checked, read from the files into pinned memory and repacked on the GPU while the\n"
    "next layer is read ahead. Prints a line per layer to stderr (layers done, GB, GB/s of checkpoint bytes)\n"
    "and a summary to stdout: total time, GB/s, device memory and the process's peak host RSS.",
    kOptions};

constexpr double kGB = 1e9;

// "A-B" or "N", each within [0, count).
std::vector<int> parse_layers(const std::string& text, int count) {
  const size_t dash = text.find('-');
  auto number = [&](std::string_view s) {
    int v = 0;
    for (char c : s) {
      if (c < '0' || c > '9' || v > 1'000'000) throw UsageError("--layers: '" + text + "' is not A-B or N");
      v = v * 10 + (c - '0');
    }
    if (s.empty()) throw UsageError("--layers: '" + text + "' is not A-B or N");
    return v;
  };
  const int first = number(std::string_view(text).substr(0, dash));
  const int last = dash == std::string::npos ? first : number(std::string_view(text).substr(dash + 1));
  if (first > last) throw UsageError("--layers: " + text + " is an empty range");
  if (last >= count) {
    throw UsageError("--layers: " + text + " reaches past the checkpoint's layers (0-" + std::to_string(count - 1) +
                     ")");
  }
  std::vector<int> layers;
  for (int l = first; l <= last; ++l) layers.push_back(l);
  return layers;
}

double peak_rss_bytes() {
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) * 1024;  // Linux reports KiB
}

}  // namespace

int load_command(std::span<const std::string> args) {
  const auto parsed = parse(kSpec, args);
  if (!parsed) return 0;
  if (!parsed->has("checkpoint")) throw UsageError("load: --checkpoint PATH is required");
  ModelLoadOptions options;
  if (parsed->has("scheme")) {
    try {
      options.load.scheme = parse_scheme(parsed->get("scheme", ""));
    } catch (const Error& e) {
      throw UsageError(std::string("--scheme: ") + e.what());
    }
  }
  options.load.quantize_bf16_experts = parsed->flag("quantize-bf16-experts");

  const Checkpoint checkpoint = Checkpoint::open(parsed->get("checkpoint", ""));
  const int count = count_moe_layers(checkpoint);
  if (count == 0) load_moe_layer(checkpoint, 0, options.load);  // throws, naming what it looked for
  options.layers = parse_layers(parsed->get("layers", "0-" + std::to_string(count - 1)), count);
  // Every layer's tensors are checked on the host first (headers and the small tensors; the expert
  // tensors are not read), so that a bad checkpoint is refused the same way with or without a GPU.
  // Quantising bf16 experts is a whole layer's work on the CPU: those layers are checked as they load.
  if (!options.load.quantize_bf16_experts) {
    for (int layer : options.layers) load_moe_layer(checkpoint, layer, options.load);
  }
  if (list_gpus().empty()) throw Error("load: no CUDA GPU is visible");

  const bool quiet = parsed->flag("quiet");
  nlohmann::ordered_json per_layer = nlohmann::ordered_json::array();
  uint64_t bytes = 0;
  double seconds = 0;
  options.progress = [&](const LayerLoadProgress& p) {
    bytes = p.bytes_done;
    seconds = p.seconds_done;
    per_layer.push_back({{"layer", p.layer}, {"bytes", p.layer_bytes}, {"seconds", p.layer_seconds}});
    if (quiet) return;
    std::fprintf(stderr, "layer %d (%d/%d): %.2f GB in %.3f s, %.2f GB/s; so far %.2f GB, %.2f GB/s\n", p.layer,
                 p.layers_done, p.layers_total, p.layer_bytes / kGB, p.layer_seconds,
                 p.layer_bytes / kGB / p.layer_seconds, p.bytes_done / kGB, p.bytes_done / kGB / p.seconds_done);
  };
  const std::vector<MoeRunner> runners = load_model(checkpoint, options);
  size_t device_bytes = 0;
  for (const auto& r : runners) device_bytes += r.device_bytes();
  const double rss = peak_rss_bytes();
  std::printf("loaded %zu layers of %s from %s: %.2f GB in %.2f s, %.2f GB/s; %.2f GB on %s; peak host RSS %.2f GB\n",
              runners.size(), runners.front().shape().describe().c_str(), checkpoint.path().c_str(), bytes / kGB,
              seconds, bytes / kGB / seconds, device_bytes / kGB, list_gpus().front().name.c_str(), rss / kGB);
  if (parsed->has("json")) {
    const std::string path = parsed->get("json", "");
    std::ofstream out(path);
    out << nlohmann::ordered_json{{"checkpoint", checkpoint.path()},
                                  {"device", list_gpus().front().name},
                                  {"layers", per_layer},
                                  {"bytes", bytes},
                                  {"seconds", seconds},
                                  {"gb_per_s", bytes / kGB / seconds},
                                  {"device_bytes", device_bytes},
                                  {"peak_rss_bytes", rss}}
                  .dump(2)
        << "\n";
    if (!out) throw Error(path + ": cannot write");
  }
  return 0;
}

}  // namespace mxmoe::cli

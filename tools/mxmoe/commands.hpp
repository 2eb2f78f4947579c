// The subcommands of `mxmoe`. Each returns the process exit code, prints its own output, and throws
// cli::UsageError (exit 2) or mxmoe::Error (exit 1) for the main program to report.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "mxmoe/layer_weights.hpp"
#include "mxmoe/runner.hpp"

namespace mxmoe::cli {

int run_command(std::span<const std::string> args);
int make_checkpoint_command(std::span<const std::string> args);
int load_command(std::span<const std::string> args);
int bench_command(std::span<const std::string> args);
int probe_command(std::span<const std::string> args);
int cache_command(std::span<const std::string> args);
int tune_command(std::span<const std::string> args);

// The GPU half of `mxmoe run`: forward on the first GPU (from `router_logits` when given, else from
// the layer's router), timing, summary, and with `check` the comparison with the CPU reference.
struct GpuRun {
  std::vector<Bf16> out;  // [num_tokens, H]
  bool check_passed;
};
// `options` choose the runner's activations (MXFP8: the block-scaled tiles, checked against the
// CPU reference with MXFP8 activations) and when it checks the block-scaled family first.
GpuRun run_on_gpu(const MoeLayerWeights& weights, std::span<const Bf16> x, int num_tokens,
                  const std::vector<float>* router_logits, bool check, const RunnerOptions& options = {});

}  // namespace mxmoe::cli

// The subcommands of `mxmoe`. Each returns the process exit code, prints its own output, and throws
// cli::UsageError (exit 2) or mxmoe::Error (exit 1) for the main program to report.
#pragma once

#include <span>
#include <string>

#include "mxmoe/layer_weights.hpp"

namespace mxmoe::cli {

int run_command(std::span<const std::string> args);
int make_checkpoint_command(std::span<const std::string> args);
int bench_command(std::span<const std::string> args);
int probe_command(std::span<const std::string> args);
int cache_command(std::span<const std::string> args);
int tune_command(std::span<const std::string> args);

// The GPU half of `mxmoe run`: forward on the first GPU, timing, summary, and with `check` the
// comparison with the CPU reference; false when the check fails.
bool run_on_gpu(const MoeLayerWeights& weights, std::span<const Bf16> x, int num_tokens, bool check);

}  // namespace mxmoe::cli

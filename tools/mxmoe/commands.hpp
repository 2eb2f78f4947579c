// The subcommands of `mxmoe`. Each returns the process exit code, prints its own output, and throws
// cli::UsageError (exit 2) or mxmoe::Error (exit 1) for the main program to report.
#pragma once

#include <span>
#include <string>

namespace mxmoe::cli {

int run_command(std::span<const std::string> args);
int make_checkpoint_command(std::span<const std::string> args);

}  // namespace mxmoe::cli

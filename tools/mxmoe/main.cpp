// mxmoe: the command-line front of the library. Exit 0 on success, 2 on a usage error, 1 on any
// other error; errors are one line on stderr beginning "mxmoe: error:".
#include <cstdio>
#include <iostream>
#include <new>
#include <string>
#include <vector>

#include "cli.hpp"
#include "commands.hpp"
#include "mxmoe/error.hpp"

namespace {

struct Subcommand {
  const char* name;
  const char* summary;
  int (*entry)(std::span<const std::string>);
};

constexpr Subcommand kSubcommands[] = {
    {"run", "one MoE layer forward on seeded activations (CPU reference or GPU)", mxmoe::cli::run_command},
    {"make-checkpoint", "write a synthetic MXFP4 checkpoint (gpt-oss or DeepSeek-V4)", mxmoe::cli::make_checkpoint_command},
    {"load", "load a checkpoint's MoE layers onto the GPU, with progress and the load's rate", mxmoe::cli::load_command},
    {"bench", "time the layer on the GPU against measured read and matmul ceilings", mxmoe::cli::bench_command},
    {"tune", "time every valid tactic on this GPU and store the fastest plans", mxmoe::cli::tune_command},
    {"cache", "list, clear, prewarm or time the compiled-kernel cache (no GPU needed)", mxmoe::cli::cache_command},
    {"probe", "which PTX instructions each GPU target accepts (no GPU needed)", mxmoe::cli::probe_command},
};

std::string top_usage() {
  std::string text =
      "usage: mxmoe <command> [options]\n\n"
      "mxmoe runs the mixture-of-experts layers of MXFP4 models (gpt-oss-20b/120b, DeepSeek-V4-Flash/Pro)\n"
      "on NVIDIA GPUs, with a CPU reference for every path.\n\ncommands:\n";
  for (const auto& c : kSubcommands) {
    std::string name = std::string("  ") + c.name;
    name.resize(20, ' ');
    text += name + c.summary + "\n";
  }
  return text + "\n'mxmoe <command> --help' describes a command's options; 'mxmoe --version' prints the version.\n";
}

// One line, whatever the message holds.
int report(const std::string& message, int exit_code) {
  std::string line = message;
  for (char& c : line) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  std::fprintf(stderr, "mxmoe: error: %s\n", line.c_str());
  return exit_code;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  try {
    if (args.empty()) {
      std::cerr << top_usage();
      return 2;
    }
    if (args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
      std::cout << top_usage();
      return 0;
    }
    if (args[0] == "--version") {
      std::cout << "mxmoe " << MXMOE_VERSION << "\n";
      return 0;
    }
    for (const auto& c : kSubcommands) {
      if (args[0] == c.name) return c.entry(std::span(args).subspan(1));
    }
    throw mxmoe::cli::UsageError("unknown command '" + args[0] + "' (see 'mxmoe --help')");
  } catch (const mxmoe::cli::UsageError& e) {
    return report(e.what(), 2);
  } catch (const mxmoe::Error& e) {
    return report(e.what(), 1);
  } catch (const std::bad_alloc&) {
    return report("out of host memory", 1);
  } catch (const std::exception& e) {
    return report(e.what(), 1);
  }
}

// mxmoe probe: which PTX instructions each GPU target accepts, measured by compiling the probe table
// with the NVRTC mxmoe runs on. No GPU is needed; the answer is the assembler's, not a document's.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "cli.hpp"
#include "commands.hpp"
#include "tools_internal.hpp"
#include "mxmoe/error.hpp"

namespace mxmoe::cli {
namespace {

constexpr OptionSpec kOptions[] = {
    {"arch", "NAME|all", "probe the NVRTC target mxmoe uses for a supported arch (e.g. sm_120a), or for all"},
    {"target", "LIST", "probe these raw NVRTC targets, comma-separated (e.g. sm_120,sm_120f)"},
};

constexpr CommandSpec kSpec{
    "probe", "[--arch NAME|all] [--target LIST]",
    "Compiles a small kernel per PTX instruction the expert kernels may use (ldmatrix, cp.async.bulk, the\n"
    "block-scaled mma.sync kinds, wgmma, tcgen05, setmaxnreg, ...) for each target through NVRTC and prints\n"
    "which targets accept which instruction, then the assembler's reason for every rejection. Without options\n"
    "it probes sm_90a, sm_100a/f, sm_120a/f and sm_121a/f. No GPU is needed.",
    kOptions};

// Arch-specific and family targets side by side, so that the a-versus-f question reads off the matrix.
constexpr const char* kDefaultTargets[] = {"sm_90a", "sm_100a", "sm_100f", "sm_120a", "sm_120f", "sm_121a", "sm_121f"};

struct Target {
  std::string name;
  bool from_target_option;  // a bad one is the user's typo rather than an old toolchain
};

std::vector<Target> targets_from_args(const ParsedArgs& args) {
  std::vector<Target> targets;
  auto add = [&](std::string name, bool from_target_option) {
    const bool seen = std::any_of(targets.begin(), targets.end(), [&](const Target& t) { return t.name == name; });
    if (!seen) targets.push_back({std::move(name), from_target_option});
  };
  if (args.has("arch")) {
    const std::string arch = args.get("arch", "");
    if (arch == "all") {
      for (const auto& a : supported_archs()) add(std::string(a.target), false);
    } else {
      try {
        add(std::string(arch_by_name(arch).target), false);
      } catch (const Error& e) {
        throw UsageError(std::string("--arch: ") + e.what());
      }
    }
  }
  if (args.has("target")) {
    const std::string list = args.get("target", "");
    for (size_t begin = 0; begin <= list.size();) {
      const size_t end = std::min(list.find(',', begin), list.size());
      const std::string name = list.substr(begin, end - begin);
      if (name.empty()) throw UsageError("--target: empty target in '" + list + "'");
      add(name, true);
      begin = end + 1;
    }
  }
  if (targets.empty()) {
    for (const char* t : kDefaultTargets) add(t, false);
  }
  return targets;
}

// A target NVRTC does not know would reject every probe for a reason that has nothing to do with the
// instruction, so it is refused before the matrix is built.
void check_target_known(const Target& target) {
  constexpr PtxProbe kEmptyKernel{"empty kernel", "", R"(extern "C" __global__ void probe() {})", ""};
  const ProbeOutcome outcome = run_probe(kEmptyKernel, target.name);
  if (outcome.accepted) return;
  const std::string message =
      "NVRTC " + nvrtc_version() + " does not accept the target '" + target.name + "': " + outcome.message;
  if (target.from_target_option) throw UsageError("--target: " + message);
  throw Error(message);
}

std::string pad(std::string_view text, size_t width) {
  std::string out(text);
  out.resize(std::max(width, out.size() + 1), ' ');
  return out;
}

}  // namespace

int probe_command(std::span<const std::string> args) {
  const auto parsed = parse(kSpec, args);
  if (!parsed) return 0;
  const std::vector<Target> targets = targets_from_args(*parsed);
  for (const auto& t : targets) check_target_known(t);

  const auto probes = ptx_probes();
  std::vector<ProbeOutcome> outcomes(probes.size() * targets.size());
  const auto start = std::chrono::steady_clock::now();
  // Each cell is an independent NVRTC program; NVRTC compiles distinct programs concurrently.
  parallel_for(outcomes.size(), 0, [&](size_t cell) {
    outcomes[cell] = run_probe(probes[cell / targets.size()], targets[cell % targets.size()].name);
  });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  size_t name_width = 6;
  for (const auto& p : probes) name_width = std::max(name_width, p.name.size() + 2);
  size_t column_width = 4;
  for (const auto& t : targets) column_width = std::max(column_width, t.name.size() + 2);

  std::printf("NVRTC %s, %zu probes x %zu targets, %.1f s of compiles\n\n", nvrtc_version().c_str(), probes.size(),
              targets.size(), seconds);
  std::string line = pad("probe", name_width);
  for (const auto& t : targets) line += pad(t.name, column_width);
  std::printf("%sPTX ISA says\n", line.c_str());
  for (size_t p = 0; p < probes.size(); ++p) {
    line = pad(probes[p].name, name_width);
    for (size_t t = 0; t < targets.size(); ++t) {
      line += pad(outcomes[p * targets.size() + t].accepted ? "ok" : "no", column_width);
    }
    std::printf("%s%s\n", line.c_str(), std::string(probes[p].needs).c_str());
  }

  bool any_rejected = false;
  for (size_t cell = 0; cell < outcomes.size(); ++cell) {
    if (outcomes[cell].accepted) continue;
    if (!any_rejected) std::printf("\n");
    any_rejected = true;
    std::printf("%s @ %s: %s\n", std::string(probes[cell / targets.size()].name).c_str(),
                targets[cell % targets.size()].name.c_str(), outcomes[cell].message.c_str());
  }
  return 0;
}

}  // namespace mxmoe::cli

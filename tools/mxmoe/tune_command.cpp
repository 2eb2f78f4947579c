// mxmoe tune: times every valid tactic on this GPU per (model shape, token-count bucket) and
// persists the winners, which forward() then uses. Each candidate's output is checked against the
// CPU reference before it may win; the heuristic's own plan is a candidate, so a tuned plan is
// never slower than it in the sweep's own measurement.
//
// The sweep is coordinate-wise: FC1's tactic with FC2 at the heuristic's choice, then FC2's tactic
// and K split with FC1 at its winner; then every whole-layer tactic. A candidate whose
// first replay takes more than 3 times the best so far is not replayed further. The sweep's
// fastest of ~50 noisy timings is biased towards luck, so a winner other than the heuristic's plan
// is timed against it again, alternately, and stored only if it is faster by more than the
// noise (kMinGain); otherwise the heuristic's plan is.
#include <cstdio>

#include "cli.hpp"
#include "commands.hpp"
#include "tools_internal.hpp"
#include "layer_rotation.hpp"
#include "mxmoe/device.hpp"
#include "mxmoe/error.hpp"
#include "mxmoe/runner.hpp"

namespace mxmoe::cli {
namespace {

constexpr OptionSpec kOptions[] = {
    {"model", "NAMES", "model presets, comma-separated, or all of them (default all)"},
    {"tokens", "LIST", "token-count buckets (default 1,2,4,5,8,9,16,32,64,128,256,512,1024,4096)"},
    {"layers", "N", "distinct layers rotated per timing (default 8, at least 8)"},
    {"replays", "N", "timed replays per candidate (default 10)"},
    {"activations", "bf16|mxfp8|fp8",
     "tune the plans of this activation format (default bf16; mxfp8: the block-scaled tiles; fp8: the bf16 families,\n"
     "and on sm_120a / sm_121a the block-scaled tiles too)"},
};

constexpr CommandSpec kSpec{
    "tune", "[--model M[,M...]|all] [--tokens LIST] [--layers N] [--replays N] [--activations bf16|mxfp8|fp8]",
    "Times every valid tactic of this GPU's arch for FC1 and FC2 (with K splits) at each token-count bucket,\n"
    "checks each against the CPU reference, and stores the fastest plans in the cache directory's tuned\n"
    "table for this device (a plan other than the heuristic's only when timing both again, alternately,\n"
    "confirms it more than 1% faster); 'mxmoe run', 'mxmoe bench' and the library's forward() then use\n"
    "them (a batch takes the plan of the smallest tuned bucket at least its size; past the largest, the\n"
    "heuristic's). Plans with MXFP8 or FP8 activations are tuned and stored apart, for runners that ask for\n"
    "them; their candidates are checked against the CPU reference with those activations.",
    kOptions};

constexpr double kMaxRelativeError = 1e-2;
constexpr double kGiveUpFactor = 3.0;
constexpr int kConfirmRounds = 3;
constexpr double kMinGain = 0.01;

struct Best {
  LayerPlan plan;
  double us = 1e30;
};

// Times `plan` unless it is hopeless; keeps it when it is accurate and faster than `best`.
void try_plan(LayerRotation& rotation, const LayerPlan& plan, int replays, Best& best) {
  const double us = rotation.time(&plan, replays, kGiveUpFactor * best.us).median_us;
  const double error = rotation.first_layer_error(plan.activations);
  const bool accurate = error < kMaxRelativeError;
  std::printf("    %-24s %-24s %10.1f us%s\n", plan.fc1.name().c_str(), plan.fc2.name().c_str(), us,
              accurate ? "" : "  INACCURATE: not eligible");
  if (accurate && us < best.us) best = {plan, us};
}

// The sweep's winner against the heuristic's plan, timed alternately kConfirmRounds times each:
// the winner stays only if its summed medians beat the heuristic's by more than kMinGain.
// `heuristic_mean_us` becomes the heuristic's mean over the rounds.
Best confirm(LayerRotation& rotation, const Best& winner, const LayerPlan& heuristic, int replays,
             double& heuristic_mean_us) {
  double winner_us = 0, heuristic_us = 0;
  for (int round = 0; round < kConfirmRounds; ++round) {
    winner_us += rotation.time(&winner.plan, replays).median_us;
    heuristic_us += rotation.time(&heuristic, replays).median_us;
  }
  const bool keeps = winner_us < (1.0 - kMinGain) * heuristic_us;
  std::printf("    confirm: %s + %s %.1f us, heuristic %.1f us: %s\n", winner.plan.fc1.name().c_str(),
              winner.plan.fc2.name().c_str(), winner_us / kConfirmRounds, heuristic_us / kConfirmRounds,
              keeps ? "kept" : "within the noise, the heuristic's plan stays");
  heuristic_mean_us = heuristic_us / kConfirmRounds;
  return keeps ? Best{winner.plan, winner_us / kConfirmRounds} : Best{heuristic, heuristic_mean_us};
}

}  // namespace

int tune_command(std::span<const std::string> args) {
  const auto parsed = parse(kSpec, args);
  if (!parsed) return 0;
  const std::vector<std::string> models = model_list(parsed->get("model", "all"));
  const std::vector<int64_t> buckets =
      parsed->get_int_list("tokens", {1, 2, 4, 5, 8, 9, 16, 32, 64, 128, 256, 512, 1024, 4096}, 1, 1 << 20);
  const int num_layers = static_cast<int>(parsed->get_int("layers", 8, 8, 64));
  const int replays = static_cast<int>(parsed->get_int("replays", 10, 3, 1000));
  RunnerOptions options;
  options.activations = gpu_activations(*parsed);
  const std::vector<GpuInfo> gpus = list_gpus();
  if (gpus.empty()) throw Error("tune: no CUDA GPU is visible");
  const DeviceArch device = current_device_arch();
  const std::string cache_dir = default_kernel_cache().dir();

  for (const auto& model : models) {
    const MoeShape shape = model_shape(model);
    std::printf("%s on %s (%s): building %d layers...\n", model.c_str(), gpus.front().name.c_str(),
                device.arch->name.data(), num_layers);
    std::fflush(stdout);
    LayerRotation rotation(shape, num_layers, options);
    std::map<int, TunedEntry> entries;
    for (int64_t bucket : buckets) {
      const int tokens = static_cast<int>(bucket);
      rotation.set_tokens(tokens, false);
      const LayerPlan heuristic = rotation.runner().heuristic_plan(tokens);
      if (heuristic.activations != options.activations) {
        throw Error("tune: the block-scaled family failed its first-use check on this device, so it has no " +
                    std::string(activation_format_name(options.activations)) + " plans to tune");
      }
      std::printf("  T=%d\n", tokens);
      Best best;
      try_plan(rotation, heuristic, replays, best);
      double heuristic_us = best.us;
      // The arch's tactics of the families that take these activations (FP8's: the bf16 families,
      // on rows the runner rounds, and where the tensor cores apply block scales the block-scaled
      // one; validate_plan drops the whole-layer ones and a block-scaled FC1 of 128 rows).
      std::vector<Tactic> tactics;
      for (const Tactic& t : valid_tactics(device.arch->name)) {
        const ActivationFormat takes = activations_of(t);
        const bool fp8_takes = takes == ActivationFormat::kBf16 || multiplies_block_scaled(*device.arch);
        if (options.activations == ActivationFormat::kFp8 ? fp8_takes : takes == options.activations) tactics.push_back(t);
      }
      // A plan that cannot take the shape (a GEMV-style ring past the shared memory at K = 7168, more K
      // splits than FC2 has K tiles) is left out, as the runner would refuse it.
      auto try_valid = [&](const LayerPlan& plan) {
        try {
          validate_plan(shape, plan, *device.arch);
        } catch (const Error&) {
          return;
        }
        try_plan(rotation, plan, replays, best);
      };
      for (const Tactic& fc1 : tactics) {
        if (!(fc1 == heuristic.fc1) && !LayerPlan{fc1, fc1}.whole_layer()) {
          try_valid({fc1, heuristic.fc2, options.activations});
        }
      }
      const Tactic best_fc1 = best.plan.fc1;
      for (const Tactic& fc2 : tactics) {
        for (int split = 1; split <= kMaxKSplit; split *= 2) {
          Tactic t = fc2;
          t.k_split = split;
          const LayerPlan plan{best_fc1, t, options.activations};
          if (!(plan == best.plan)) try_valid(plan);
        }
      }
      for (const Tactic& t : tactics) {  // whole-layer plans: one tactic for both stages
        if (LayerPlan{t, t}.whole_layer()) try_valid({t, t, options.activations});
      }
      if (best.us >= 1e30) throw Error("tune: no accurate plan for " + model + " at T = " + std::to_string(tokens));
      if (!(best.plan == heuristic) && heuristic_us < 1e30) {
        best = confirm(rotation, best, heuristic, replays, heuristic_us);
      }
      entries[tokens] = {best.plan, best.us, heuristic_us};
      std::printf("  T=%d: tuned %s + %s %.1f us, heuristic %.1f us (%.2fx)\n", tokens, best.plan.fc1.name().c_str(),
                  best.plan.fc2.name().c_str(), best.us, heuristic_us, heuristic_us / best.us);
      std::fflush(stdout);
      // After each bucket: kept if a later one fails.
      TunedPlans::store(cache_dir, gpus.front().name, *device.arch, shape, entries, options.activations);
    }
    std::printf("%s: stored %zu plans in %s\n", model.c_str(), entries.size(),
                TunedPlans::path(cache_dir, gpus.front().name, *device.arch).c_str());
  }
  return 0;
}

}  // namespace mxmoe::cli

// mxmoe cache: list, clear, prewarm and time the kernel cache. Needs no GPU: kernels are compiled
// for a named arch.
#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "cli.hpp"
#include "commands.hpp"
#include "tools_internal.hpp"
#include "mxmoe/device.hpp"
#include "mxmoe/error.hpp"

namespace mxmoe::cli {
namespace {

constexpr OptionSpec kOptions[] = {
    {"arch", "NAME", "sm_90a, sm_100a, sm_120a, sm_121a or all (prewarm, bench; default all / sm_90a)"},
    {"cache-dir", "DIR", "the cache directory (default $MXMOE_CACHE_DIR, $XDG_CACHE_HOME/mxmoe, ~/.cache/mxmoe)"},
    {"family", "NAME", "prewarm, bench: only this kernel family's tactics (e.g. bsmma; default every family)"},
    {"default-set", "", "prewarm, bench: only the heuristic's tactics (the ahead-of-time set) instead of every valid one"},
};

constexpr CommandSpec kSpec{
    "cache", "ls|clear|prewarm|bench [--arch NAME|all] [--cache-dir DIR] [--family NAME] [--default-set]",
    "Manages the on-disk cache of compiled expert kernels.\n"
    "  ls        list the entries: key, tactic, arch, size, age (and damage or the assembler's\n"
    "            performance warnings, if any)\n"
    "  clear     remove every entry\n"
    "  prewarm   compile every valid tactic of the arch(es) that the library's ahead-of-time set lacks\n"
    "            (or, with $MXMOE_KERNEL_SOURCE_DIR, every one, from those sources)\n"
    "  bench     time cold compiles (every valid tactic, in a scratch cache), warm loads of the stored\n"
    "            entries, and a parallel prewarm of the whole table",
    kOptions};

std::vector<const Arch*> archs_of(const std::string& name) {
  std::vector<const Arch*> archs;
  try {
    if (name == "all") {
      for (const auto& a : supported_archs()) archs.push_back(&a);
    } else {
      archs.push_back(&arch_by_name(name));
    }
  } catch (const Error& e) {
    throw UsageError(std::string("--arch: ") + e.what());
  }
  return archs;
}

struct Job {
  Tactic tactic;
  const Arch* arch;
};

struct JobFilter {
  const KernelFamily* family = nullptr;  // nullptr: every family
  bool default_set = false;              // only default_tactics(), the heuristic's
};

// The valid tactics of the archs that pass the filter.
std::vector<Job> table_jobs(const std::vector<const Arch*>& archs, const JobFilter& filter) {
  const std::vector<Tactic> defaults = default_tactics();
  std::vector<Job> jobs;
  for (const Arch* a : archs) {
    for (const Tactic& t : valid_tactics(a->name)) {
      if (filter.family && t.family != filter.family) continue;
      if (filter.default_set && std::find(defaults.begin(), defaults.end(), t) == defaults.end()) continue;
      jobs.push_back({t, a});
    }
  }
  if (jobs.empty()) {
    std::string names;
    for (const Arch* a : archs) names += (names.empty() ? "" : ", ") + std::string(a->name);
    throw UsageError(names + " has no valid tactic" +
                     (filter.family ? " of family '" + std::string(filter.family->prefix()) + "'" : "") +
                     (filter.default_set ? " in the default set" : ""));
  }
  return jobs;
}

// Runs `work` over the jobs on every core; processes started together begin at different jobs
// (rotated by pid) so that they compile different entries instead of queueing on one lock. The
// first error a job throws (a kernel that does not compile) stops the rest and is rethrown here.
template <typename Work>
void for_each_parallel(const std::vector<Job>& jobs, Work work) {
  const size_t rotation = static_cast<size_t>(getpid()) % std::max<size_t>(1, jobs.size());
  parallel_for(jobs.size(), 0, [&](size_t j) { work(jobs[(j + rotation) % jobs.size()]); });
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

int list(KernelCache& cache) {
  const auto entries = cache.list();
  std::printf("%s: %zu entries; %zu kernels built into the library\n", cache.dir().c_str(), entries.size(),
              ahead_of_time_entries());
  for (const auto& e : entries) {
    if (!e.problem.empty()) {
      std::printf("  %-40s DAMAGED (%s)\n", std::filesystem::path(e.file).filename().c_str(), e.problem.c_str());
      continue;
    }
    std::printf("  %s  %-26s %-8s %8zu bytes  %8.0f s old\n", e.key.c_str(), e.tactic.c_str(), e.arch.c_str(), e.bytes,
                e.age_seconds);
    for (const auto& w : e.assembler_warnings) std::printf("      the assembler: %s\n", w.c_str());
  }
  return 0;
}

int prewarm(KernelCache& cache, const std::vector<const Arch*>& archs, const JobFilter& filter) {
  const auto jobs = table_jobs(archs, filter);
  std::atomic<int> compiled{0}, ready{0};
  std::mutex print;
  const auto start = std::chrono::steady_clock::now();
  for_each_parallel(jobs, [&](const Job& job) {
    const auto result = cache.get(job.tactic, *job.arch);
    (result.origin == KernelCache::Origin::kCompiled ? compiled : ready)++;
    std::lock_guard lock(print);
    std::printf("  %-8s %-26s %s\n", job.arch->name.data(), job.tactic.name().c_str(),
                result.origin == KernelCache::Origin::kCompiled      ? "compiled"
                : result.origin == KernelCache::Origin::kAheadOfTime ? "built in"
                                                                     : "cached");
  });
  std::printf("prewarm: %zu tactics, %d compiled, %d already there, %.1f s\n", jobs.size(), compiled.load(),
              ready.load(), seconds_since(start));
  return 0;
}

int bench(const std::vector<const Arch*>& archs, const JobFilter& filter) {
  const std::string scratch = std::filesystem::temp_directory_path() / ("mxmoe-cache-bench-" + std::to_string(getpid()));
  std::filesystem::remove_all(scratch);
  const auto jobs = table_jobs(archs, filter);
  // Cold: one compile at a time, so each time is a compile's own.
  std::vector<double> cold;
  {
    KernelCache cache(scratch);
    for (const auto& job : jobs) {
      const auto start = std::chrono::steady_clock::now();
      KernelBinary b = compile_tactic(job.tactic, *job.arch);
      cold.push_back(seconds_since(start));
      std::printf("  cold %-8s %-26s %.2f s\n", job.arch->name.data(), b.tactic.c_str(), cold.back());
    }
  }
  // Prewarm: the whole table into an empty cache, on every core.
  double prewarm_seconds = 0.0;
  {
    KernelCache cache(scratch);
    const auto start = std::chrono::steady_clock::now();
    for_each_parallel(jobs, [&](const Job& job) { cache.get(job.tactic, *job.arch); });
    prewarm_seconds = seconds_since(start);
  }
  // Warm: a fresh process-level cache reading every entry back from disk (read + verify).
  std::vector<double> warm;
  {
    KernelCache cache(scratch);
    for (const auto& job : jobs) {
      const auto start = std::chrono::steady_clock::now();
      const auto r = cache.get(job.tactic, *job.arch);
      warm.push_back(seconds_since(start));
      if (r.origin == KernelCache::Origin::kCompiled) throw Error("cache bench: " + r.binary.tactic + " was not cached");
    }
  }
  // With a GPU of a benched arch: the driver's module load too (cudaLibraryLoadData + both kernels).
  std::vector<double> module_loads;
  if (!list_gpus().empty()) {
    const Arch* device_arch = current_device_arch().arch;
    KernelCache cache(scratch);
    for (const auto& job : jobs) {
      if (job.arch != device_arch) continue;
      const KernelBinary b = cache.get(job.tactic, *job.arch).binary;
      const auto start = std::chrono::steady_clock::now();
      cudaLibrary_t library;
      cudaKernel_t kernel;
      cuda_check(cudaLibraryLoadData(&library, b.cubin->data(), nullptr, nullptr, 0, nullptr, nullptr, 0), "module load");
      for (const auto& name : b.kernel_names) cuda_check(cudaLibraryGetKernel(&kernel, library, name.c_str()), name);
      module_loads.push_back(seconds_since(start));
      cudaLibraryUnload(library);
    }
  }
  std::filesystem::remove_all(scratch);
  std::printf("cache bench: %zu tactics over %zu arch(es) on %u cores\n", jobs.size(), archs.size(),
              std::thread::hardware_concurrency());
  std::printf("  cold compile per tactic: median %.2f s, max %.2f s\n", median(cold), *std::max_element(cold.begin(), cold.end()));
  std::printf("  warm load per entry:     median %.2f ms, max %.2f ms (read + verify; the ahead-of-time set skips even this)\n",
              1000 * median(warm), 1000 * *std::max_element(warm.begin(), warm.end()));
  if (!module_loads.empty()) {
    std::printf("  module load on the GPU:  median %.2f ms, max %.2f ms (%zu modules)\n", 1000 * median(module_loads),
                1000 * *std::max_element(module_loads.begin(), module_loads.end()), module_loads.size());
  }
  std::printf("  prewarm of the whole table: %.1f s\n", prewarm_seconds);
  return 0;
}

}  // namespace

int cache_command(std::span<const std::string> args) {
  if (args.empty()) throw UsageError("cache: expected ls, clear, prewarm or bench (see 'mxmoe cache --help')");
  const auto parsed = parse(kSpec, args.subspan(args[0].rfind("--", 0) == 0 ? 0 : 1));
  if (!parsed) return 0;
  const std::string action = args[0];
  KernelCache cache(parsed->get("cache-dir", KernelCache::default_dir()));
  if (action == "ls") return list(cache);
  if (action == "clear") {
    std::printf("%s: removed %zu entries\n", cache.dir().c_str(), cache.clear());
    return 0;
  }
  const std::string family = parsed->get("family", "");
  const JobFilter filter{.family = family_by_prefix(family), .default_set = parsed->flag("default-set")};
  if (!family.empty() && !filter.family) {
    std::string known;
    for (const KernelFamily* f : kernel_families()) known += (known.empty() ? "" : ", ") + std::string(f->prefix());
    throw UsageError("--family: unknown kernel family '" + family + "' (expected one of " + known + ")");
  }
  if (action == "prewarm") return prewarm(cache, archs_of(parsed->get("arch", "all")), filter);
  if (action == "bench") return bench(archs_of(parsed->get("arch", "sm_90a")), filter);
  throw UsageError("cache: unknown action '" + action + "' (expected ls, clear, prewarm or bench)");
}

}  // namespace mxmoe::cli

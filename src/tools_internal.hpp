// The library internals that the programs in tools/ (the mxmoe command, the AOT generator) may use
// besides the public API in include/mxmoe/: they include this header and no other from src/
// (Layout.ToolsIncludeOnlyThePublicApiAndToolsInternal checks). Not a stable API.
#pragma once

#include "common/parallel.hpp"       // parallel_for
#include "common/random.hpp"         // SplitMix64, derive_seed
#include "device/arch.hpp"           // Arch, supported_archs, arch_by_name
#include "device/cuda_check.hpp"     // cuda_check, DeviceBuffer
#include "device/current_device.hpp" // current_device_arch
#include "io/activation_file.hpp"     // read_activations, write_output
#include "jit/aot.hpp"               // ahead_of_time_entries
#include "jit/kernel_binary.hpp"     // compile_tactic, serialize_entry
#include "jit/kernel_cache.hpp"      // KernelCache, default_kernel_cache
#include "jit/kernel_sources.hpp"    // kKernelSourceDirVariable
#include "jit/nvrtc_compiler.hpp"    // nvrtc_version
#include "probe/ptx_probe.hpp"       // ptx_probes, run_probe
#include "kernels/family_registry.hpp"  // kernel_families, family_by_prefix
#include "tactics/heuristic.hpp"     // default_tactics, multiplies_block_scaled
#include "tactics/tuned_plans.hpp"   // TunedPlans
#include "tactics/validate_plan.hpp" // validate_plan

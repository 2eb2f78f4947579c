// The PTX capability probe: for each instruction the kernels may use, a small translation unit that
// NVRTC compiles for a target, so that which targets accept which instructions is measured on the
// installed toolchain instead of read from notes written against another one.
#pragma once

#include <span>
#include <string>
#include <string_view>

namespace mxmoe {

struct PtxProbe {
  std::string_view name;    // "mma.mxf4.block_scale.2X", unique
  std::string_view group;   // "mma", "ldmatrix", "tcgen05", ...
  std::string_view source;  // a complete translation unit with one extern "C" __global__ function
  std::string_view needs;   // what the PTX ISA says supports it, e.g. "sm_90a", "sm_120a+"
};

std::span<const PtxProbe> ptx_probes();
// Throws Error naming the probe when there is none of that name.
const PtxProbe& ptx_probe_by_name(std::string_view name);

struct ProbeOutcome {
  bool accepted = false;
  std::string message;  // empty when accepted; else the first error line of the NVRTC/ptxas log
};

// One NVRTC compile of the probe for `target` (any NVRTC real target, e.g. "sm_120f").
ProbeOutcome run_probe(const PtxProbe& probe, std::string_view target);

}  // namespace mxmoe

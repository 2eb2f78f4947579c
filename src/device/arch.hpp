// The GPU architectures mxmoe compiles for, the NVRTC target each uses, and the limits its tactic
// table is checked against.
#pragma once

#include <span>
#include <string>
#include <string_view>

namespace mxmoe {

struct Arch {
  std::string_view name;    // what users write: "sm_90a"
  std::string_view target;  // what NVRTC gets (see docs/arch-targets.md for the suffix choice)
  int major, minor;         // compute capability
  int smem_per_block;       // opt-in dynamic shared memory limit, bytes
};

std::span<const Arch> supported_archs();
// Throws Error listing the supported names.
const Arch& arch_by_name(std::string_view name);
// The arch of a device of this compute capability; throws Error for an unsupported device.
const Arch& arch_for_device(int major, int minor);

}  // namespace mxmoe

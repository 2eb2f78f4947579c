// The loaded expert kernels of a tactic on the current device: its binary from the kernel cache
// (ahead-of-time set, disk or NVRTC), loaded with cudaLibraryLoadData once per device and process.
#pragma once

#include "mxmoe/tactic.hpp"

namespace mxmoe {

struct ExpertKernels {
  const void* fc1;  // cudaKernel_t, which the runtime's launch and attribute calls take as it is
  const void* fc2;
};

// Loads on first use; later calls return the same handles without touching the driver.
const ExpertKernels& expert_kernels(const Tactic& tactic);

}  // namespace mxmoe

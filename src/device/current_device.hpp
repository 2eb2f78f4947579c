// The device the calling thread's CUDA context is on: its arch and size, and how many CTAs of a
// loaded kernel it holds at once.
#pragma once

#include "device/arch.hpp"

namespace mxmoe {

struct DeviceArch {
  const Arch* arch;
  int multiprocessors;
};
// Throws Error for an unsupported GPU.
DeviceArch current_device_arch();

// CTAs of `kernel` (a cudaKernel_t) with `threads` threads and `smem_bytes` of dynamic shared memory
// that the current device holds at once (occupancy per SM times SMs), asked of the driver once per
// device, kernel and size.
long long resident_ctas(const void* kernel, int threads, int smem_bytes);

}  // namespace mxmoe

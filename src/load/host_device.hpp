// 16-byte loads and stores (and a 4-byte store) for the load kernels' steps, which run on the device (as one vector
// access) and, in the CPU tests that emulate a CTA with them, on the host (as a memcpy, which has
// no alignment or aliasing rule to break).
#pragma once

#include <vector_types.h>

#include <cstring>

#include "format/record_layout.hpp"  // MXMOE_HOST_DEVICE

namespace mxmoe::load {

MXMOE_HOST_DEVICE uint4 load16(const void* from) {
#if defined(__CUDA_ARCH__)
  return *static_cast<const uint4*>(from);
#else
  uint4 v;
  std::memcpy(&v, from, 16);
  return v;
#endif
}

MXMOE_HOST_DEVICE void store16(void* to, uint4 v) {
#if defined(__CUDA_ARCH__)
  *static_cast<uint4*>(to) = v;
#else
  std::memcpy(to, &v, 16);
#endif
}

MXMOE_HOST_DEVICE void store4(void* to, unsigned v) {
#if defined(__CUDA_ARCH__)
  *static_cast<unsigned*>(to) = v;
#else
  std::memcpy(to, &v, 4);
#endif
}

}  // namespace mxmoe::load

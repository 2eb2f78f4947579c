// The expert-kernel sources, embedded in the library at build time so that NVRTC can compile any
// tactic for any arch at run time without the source tree or the toolkit's headers.
#pragma once

#include <span>

namespace mxmoe {

struct EmbeddedSource {
  const char* name;  // include path, e.g. "kernels/expert_gemv.cuh"
  const char* text;
};

std::span<const EmbeddedSource> embedded_kernel_sources();

}  // namespace mxmoe

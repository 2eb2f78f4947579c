// The kernel sources NVRTC compiles: the ones embedded in the library, or, where the environment
// names MXMOE_KERNEL_SOURCE_DIR, the same files read from that directory (laid out as src/: e.g.
// DIR/kernels/expert_wgmma.cuh). The second is for kernel experiments on a GPU machine: edit a
// header, run again, with no rebuild. A kernel's key covers the text of every source, so nothing
// compiled from other sources is used, the ahead-of-time set included, and the cache keeps both.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "jit/embedded_sources.hpp"

namespace mxmoe {

constexpr const char* kKernelSourceDirVariable = "MXMOE_KERNEL_SOURCE_DIR";

// Read once per process; the first call with the variable set says so on stderr (warn_once).
// Throws Error naming the variable and the file where the directory lacks one of the embedded
// sources or cannot read it.
std::span<const EmbeddedSource> kernel_sources();

// The embedded sources' names and the text of each from `dir` (what kernel_sources() reads).
struct SourceFile {
  std::string name, text;
};
std::vector<SourceFile> read_kernel_sources(const std::string& dir);

}  // namespace mxmoe

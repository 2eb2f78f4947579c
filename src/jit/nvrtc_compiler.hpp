// Compiling CUDA C++ to a cubin with NVRTC, with the embedded kernel sources available to #include;
// each kernel's register count is read from the cubin (jit/cubin_info.hpp), not from the log.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace mxmoe {

struct CompileRequest {
  std::string source;                         // the translation unit
  std::vector<std::string> name_expressions;  // kernels to instantiate and name, e.g. "&ns::k<1, true>"
  std::string arch;                           // real target: "sm_90a", "sm_120f", ...
  std::vector<std::string> extra_options = {};  // after nvrtc_options(), e.g. ptxas's --verbose in a test;
                                                // not in the kernel key: nothing cached uses them
};

// A line in which the assembler says that the code it made runs slower than written: the warpgroup
// MMAs serialised (ptxas's "Potential Performance Loss", C75xx: too few registers for the MMA
// pipeline, accumulators written between its stages, ...) or registers spilled to local memory.
// NVRTC succeeds with these; only its log tells.
struct AssemblerWarning {
  std::string function;  // the mangled kernel name the line names
  std::string message;   // the line without its prefix and function, e.g. "(C7512) wgmma.mma_async
                         // instructions are serialized due to insufficient register resources"
};
std::vector<AssemblerWarning> assembler_warnings(std::string_view log);
// Whether a warning's message says the MMAs were serialised (C75xx), and the bytes of spill stores
// it names (0 for any other).
bool serialises_mma(std::string_view message);
int spill_store_bytes(std::string_view message);

struct CompileResult {
  bool ok = false;
  std::string log;                          // NVRTC's log (the assembler's message on a rejected instruction)
  std::vector<uint8_t> cubin;
  std::vector<std::string> lowered_names;   // mangled kernel names, one per name expression
  std::vector<AssemblerWarning> warnings;   // assembler_warnings(log)
  std::vector<int> registers;               // per thread, one per name expression, from the cubin's ELF
  double seconds = 0.0;
};

// The options every compile uses; part of every cache key. They include ptxas's --warn-on-spills,
// so that spills reach the log beside the MMA serialisation notes ptxas prints anyway, and
// --no-cache: NVRTC (12.9 on) otherwise takes a program it has compiled before from the CUDA
// driver's compute cache (~/.nv/ComputeCache) without running ptxas, and its log then holds none
// of ptxas's lines. (mxmoe's own kernel cache keeps the binaries.)
const std::vector<std::string>& nvrtc_options();
// "13.0"; throws Error if NVRTC cannot be loaded.
std::string nvrtc_version();
CompileResult compile_cuda(const CompileRequest& request);

}  // namespace mxmoe

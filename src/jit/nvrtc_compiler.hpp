// Compiling CUDA C++ to a cubin with NVRTC, with the embedded kernel sources available to #include.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mxmoe {

struct CompileRequest {
  std::string source;                         // the translation unit
  std::vector<std::string> name_expressions;  // kernels to instantiate and name, e.g. "&ns::k<1, true>"
  std::string arch;                           // real target: "sm_90a", "sm_120f", ...
};

struct CompileResult {
  bool ok = false;
  std::string log;                          // NVRTC's log (the assembler's message on a rejected instruction)
  std::vector<uint8_t> cubin;
  std::vector<std::string> lowered_names;   // mangled kernel names, one per name expression
  double seconds = 0.0;
};

// The options every compile uses; part of every cache key.
const std::vector<std::string>& nvrtc_options();
// "13.0"; throws Error if NVRTC cannot be loaded.
std::string nvrtc_version();
CompileResult compile_cuda(const CompileRequest& request);

}  // namespace mxmoe

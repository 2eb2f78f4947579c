#include "jit/nvrtc_compiler.hpp"

#include <nvrtc.h>

#include <chrono>

#include "jit/embedded_sources.hpp"
#include "mxmoe/error.hpp"

namespace mxmoe {

const std::vector<std::string>& nvrtc_options() {
  // -default-device: plain (constexpr) helpers shared with the host compile as device functions.
  static const std::vector<std::string> options{"-std=c++20", "-DNDEBUG", "--fmad=true", "-default-device"};
  return options;
}

std::string nvrtc_version() {
  int major = 0, minor = 0;
  if (nvrtcVersion(&major, &minor) != NVRTC_SUCCESS) throw Error("cannot query the NVRTC version");
  return std::to_string(major) + "." + std::to_string(minor);
}

CompileResult compile_cuda(const CompileRequest& request) {
  std::vector<const char*> header_texts, header_names;
  for (const auto& s : embedded_kernel_sources()) {
    header_texts.push_back(s.text);
    header_names.push_back(s.name);
  }
  nvrtcProgram program;
  nvrtcResult status = nvrtcCreateProgram(&program, request.source.c_str(), "mxmoe_jit.cu",
                                          static_cast<int>(header_texts.size()), header_texts.data(), header_names.data());
  if (status != NVRTC_SUCCESS) throw Error(std::string("nvrtcCreateProgram: ") + nvrtcGetErrorString(status));
  for (const auto& name : request.name_expressions) nvrtcAddNameExpression(program, name.c_str());

  std::vector<std::string> options = nvrtc_options();
  options.push_back("--gpu-architecture=" + request.arch);
  std::vector<const char*> option_ptrs;
  for (const auto& o : options) option_ptrs.push_back(o.c_str());

  CompileResult result;
  const auto start = std::chrono::steady_clock::now();
  status = nvrtcCompileProgram(program, static_cast<int>(option_ptrs.size()), option_ptrs.data());
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  size_t log_size = 0;
  nvrtcGetProgramLogSize(program, &log_size);
  result.log.resize(log_size);
  if (log_size > 0) nvrtcGetProgramLog(program, result.log.data());
  while (!result.log.empty() && (result.log.back() == '\0' || result.log.back() == '\n')) result.log.pop_back();
  result.ok = status == NVRTC_SUCCESS;
  if (result.ok) {
    size_t cubin_size = 0;
    nvrtcGetCUBINSize(program, &cubin_size);
    result.cubin.resize(cubin_size);
    nvrtcGetCUBIN(program, reinterpret_cast<char*>(result.cubin.data()));
    for (const auto& name : request.name_expressions) {
      const char* lowered = nullptr;
      nvrtcGetLoweredName(program, name.c_str(), &lowered);
      result.lowered_names.emplace_back(lowered ? lowered : "");
    }
  }
  nvrtcDestroyProgram(&program);
  return result;
}

}  // namespace mxmoe

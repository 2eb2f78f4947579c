#include "jit/nvrtc_compiler.hpp"

#include <nvrtc.h>

#include <chrono>
#include <regex>
#include <sstream>

#include "jit/cubin_info.hpp"
#include "jit/kernel_sources.hpp"
#include "mxmoe/error.hpp"

namespace mxmoe {

const std::vector<std::string>& nvrtc_options() {
  // -default-device: plain (constexpr) helpers shared with the host compile as device functions.
  static const std::vector<std::string> options{"-std=c++20", "-DNDEBUG", "--fmad=true", "-default-device",
                                                "--ptxas-options=--warn-on-spills", "--no-cache"};
  return options;
}

std::vector<AssemblerWarning> assembler_warnings(std::string_view log) {
  // ptxas info    : (C7512) Potential Performance Loss: wgmma.mma_async instructions are serialized due to
  //                 insufficient register resources for the function '<name>'
  // ptxas warning : Registers are spilled to local memory in function '<name>', 8 bytes spill stores, ...
  static const std::regex line_form(R"(^ptxas (?:info|warning) *: *(.*?) (?:for|in) (?:the )?function '([^']*)'(.*)$)");
  static const std::string kLoss = "Potential Performance Loss: ";
  std::vector<AssemblerWarning> warnings;
  std::istringstream lines{std::string(log)};
  std::smatch m;
  for (std::string line; std::getline(lines, line);) {
    const bool loss = line.find(kLoss) != std::string::npos;
    if (!loss && line.find("spilled to local memory") == std::string::npos) continue;
    if (!std::regex_match(line, m, line_form)) {
      warnings.push_back({"", line});  // a form this parser does not know still counts
      continue;
    }
    std::string message = m[1].str() + m[3].str();
    if (const auto at = message.find(kLoss); at != std::string::npos) message.erase(at, kLoss.size());
    warnings.push_back({m[2].str(), message});
  }
  return warnings;
}

bool serialises_mma(std::string_view message) {
  return message.find("instructions are serialized") != std::string_view::npos;
}

int spill_store_bytes(std::string_view message) {
  static const std::regex spill_form(R"((\d+) bytes spill stores)");
  std::match_results<std::string_view::const_iterator> m;
  return std::regex_search(message.begin(), message.end(), m, spill_form) ? std::stoi(m[1].str()) : 0;
}

std::string nvrtc_version() {
  int major = 0, minor = 0;
  if (nvrtcVersion(&major, &minor) != NVRTC_SUCCESS) throw Error("cannot query the NVRTC version");
  return std::to_string(major) + "." + std::to_string(minor);
}

CompileResult compile_cuda(const CompileRequest& request) {
  std::vector<const char*> header_texts, header_names;
  for (const auto& s : kernel_sources()) {
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
  options.insert(options.end(), request.extra_options.begin(), request.extra_options.end());
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
  result.warnings = assembler_warnings(result.log);
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
  if (result.ok) {
    const std::map<std::string, int> registers = cubin_registers(result.cubin);
    for (const std::string& name : result.lowered_names) {
      const auto it = registers.find(name);
      if (it == registers.end()) throw Error("the cubin NVRTC made has no register count for kernel '" + name + "'");
      result.registers.push_back(it->second);
    }
  }
  return result;
}

}  // namespace mxmoe

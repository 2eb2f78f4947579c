#include "jit/nvrtc_compiler.hpp"

#include <nvrtc.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <optional>

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

namespace {

// `line` as "ptxas info|warning : <message> for|in [the ]function '<name>'<rest>", into {name,
// message + rest}; nothing for another form. The first " function '" separator that follows
// " for" or " in" (with "the" between or not) ends the message. By hand, not std::regex: no
// locale in the process's library code (common/read_file.hpp says why).
std::optional<AssemblerWarning> parse_warning_line(std::string_view line) {
  std::string_view body;
  for (const std::string_view prefix : {"ptxas info", "ptxas warning"}) {
    if (line.substr(0, prefix.size()) == prefix) body = line.substr(prefix.size());
  }
  const size_t colon = body.find_first_not_of(' ');
  if (colon == std::string_view::npos || body[colon] != ':') return std::nullopt;
  body.remove_prefix(std::min(body.size(), body.find_first_not_of(' ', colon + 1)));
  size_t best = std::string_view::npos, name_at = 0;
  for (const std::string_view separator : {" for the function '", " in the function '", " for function '", " in function '"}) {
    const size_t at = body.find(separator);
    if (at < best) best = at, name_at = at + separator.size();
  }
  if (best == std::string_view::npos) return std::nullopt;
  const size_t name_end = body.find('\'', name_at);
  if (name_end == std::string_view::npos) return std::nullopt;
  return AssemblerWarning{std::string(body.substr(name_at, name_end - name_at)),
                          std::string(body.substr(0, best)) + std::string(body.substr(name_end + 1))};
}

}  // namespace

std::vector<AssemblerWarning> assembler_warnings(std::string_view log) {
  // ptxas info    : (C7512) Potential Performance Loss: wgmma.mma_async instructions are serialized due to
  //                 insufficient register resources for the function '<name>'
  // ptxas warning : Registers are spilled to local memory in function '<name>', 8 bytes spill stores, ...
  constexpr std::string_view kLoss = "Potential Performance Loss: ";
  std::vector<AssemblerWarning> warnings;
  while (!log.empty()) {
    const size_t end = std::min(log.find('\n'), log.size());
    const std::string_view line = log.substr(0, end);
    log.remove_prefix(std::min(log.size(), end + 1));
    const bool loss = line.find(kLoss) != std::string_view::npos;
    if (!loss && line.find("spilled to local memory") == std::string_view::npos) continue;
    std::optional<AssemblerWarning> w = parse_warning_line(line);
    if (!w) {
      warnings.push_back({"", std::string(line)});  // a form this parser does not know still counts
      continue;
    }
    if (const auto at = w->message.find(kLoss); at != std::string::npos) w->message.erase(at, kLoss.size());
    warnings.push_back(std::move(*w));
  }
  return warnings;
}

bool serialises_mma(std::string_view message) {
  return message.find("instructions are serialized") != std::string_view::npos;
}

int spill_store_bytes(std::string_view message) {
  const size_t at = message.find(" bytes spill stores");
  if (at == std::string_view::npos) return 0;
  size_t first = at;
  while (first > 0 && message[first - 1] >= '0' && message[first - 1] <= '9') --first;
  int bytes = 0;
  std::from_chars(message.data() + first, message.data() + at, bytes);
  return bytes;
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

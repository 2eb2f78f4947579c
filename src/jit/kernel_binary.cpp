#include "jit/kernel_binary.hpp"

#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>

#include "common/hash.hpp"
#include "common/warnings.hpp"
#include "jit/kernel_sources.hpp"
#include "kernels/family_registry.hpp"
#include "mxmoe/error.hpp"

namespace mxmoe {
namespace {

constexpr std::string_view kMagic = "MXMOE-KERNEL 1\n";

std::string payload_hash(std::span<const uint8_t> payload) {
  return Hash128().add(payload.data(), payload.size()).hex();
}

}  // namespace

CompileRequest compile_request(const Tactic& tactic, const Arch& arch) {
  // One module per tactic holds both stages: FC1 (SwiGLU epilogue) first, then FC2.
  require_family(tactic, "compiling a tactic");
  const KernelInstantiation k = tactic.family->instantiation(tactic.binary());
  return {.source = "#include \"" + k.header + "\"\n",
          .name_expressions = {k.fc1, k.fc2},
          .arch = std::string(arch.target)};
}

std::string kernel_key(const Tactic& tactic, const Arch& arch) {
  const CompileRequest r = compile_request(tactic, arch);
  Hash128 h;
  h.add("mxmoe kernel key 1").add(MXMOE_VERSION).add(nvrtc_version()).add(r.arch).add(r.source);
  for (const auto& s : kernel_sources()) h.add(s.name).add(s.text);
  for (const auto& n : r.name_expressions) h.add(n);
  for (const auto& o : nvrtc_options()) h.add(o);
  return h.hex();
}

KernelBinary compile_tactic(const Tactic& tactic, const Arch& arch) {
  const CompileResult result = compile_cuda(compile_request(tactic, arch));
  if (!result.ok) {
    throw Error("compiling " + tactic.binary().name() + " for " + std::string(arch.name) + " failed: " + result.log);
  }
  KernelBinary b;
  b.key = kernel_key(tactic, arch);
  b.tactic = tactic.binary().name();
  b.arch = std::string(arch.name);
  b.kernel_names = result.lowered_names;
  b.registers = result.registers;
  if (const std::string why = tactic.family->why_unfit_binary(tactic.binary(), b.registers); !why.empty()) {
    throw Error("compiling " + b.tactic + " for " + std::string(arch.name) + ": " + why);
  }
  b.cubin = std::make_shared<const std::vector<uint8_t>>(result.cubin);
  for (const AssemblerWarning& w : result.warnings) {
    const std::string stage = w.function == result.lowered_names.at(0)   ? "FC1"
                              : w.function == result.lowered_names.at(1) ? "FC2"
                                                                         : "kernel " + w.function;
    b.assembler_warnings.push_back(stage + ": " + w.message);
    if (serialises_mma(w.message)) {
      warn_once(b.tactic + " for " + b.arch + ", the assembler: " + b.assembler_warnings.back());
    }
  }
  b.compile_seconds = result.seconds;
  b.created_unix =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  return b;
}

std::vector<uint8_t> serialize_entry(const KernelBinary& b) {
  const nlohmann::ordered_json header{{"key", b.key},
                                      {"tactic", b.tactic},
                                      {"arch", b.arch},
                                      {"kernels", b.kernel_names},
                                      {"payload_bytes", b.cubin->size()},
                                      {"payload_hash", payload_hash(*b.cubin)},
                                      {"nvrtc", nvrtc_version()},
                                      {"mxmoe", MXMOE_VERSION},
                                      {"compile_seconds", b.compile_seconds},
                                      {"created_unix", b.created_unix},
                                      {"assembler_warnings", b.assembler_warnings},
                                      {"registers", b.registers}};
  const std::string text = std::string(kMagic) + header.dump() + "\n";
  std::vector<uint8_t> bytes(text.begin(), text.end());
  bytes.insert(bytes.end(), b.cubin->begin(), b.cubin->end());
  return bytes;
}

std::optional<KernelBinary> parse_entry(std::span<const uint8_t> bytes, const std::string& expected_key,
                                        std::string* problem) {
  auto fail = [&](const std::string& why) -> std::optional<KernelBinary> {
    if (problem) *problem = why;
    return std::nullopt;
  };
  if (bytes.size() < kMagic.size() || std::memcmp(bytes.data(), kMagic.data(), kMagic.size()) != 0) {
    return fail("not a kernel entry");
  }
  const auto* begin = bytes.data() + kMagic.size();
  const auto* end = bytes.data() + bytes.size();
  const auto* newline = std::find(begin, end, static_cast<uint8_t>('\n'));
  if (newline == end) return fail("truncated header");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(begin, newline);
    KernelBinary b;
    b.key = header.at("key").get<std::string>();
    b.tactic = header.at("tactic").get<std::string>();
    b.arch = header.at("arch").get<std::string>();
    b.kernel_names = header.at("kernels").get<std::vector<std::string>>();
    b.compile_seconds = header.at("compile_seconds").get<double>();
    b.created_unix = header.at("created_unix").get<int64_t>();
    // These two are absent from entries of earlier versions (which `cache ls` still lists).
    b.assembler_warnings = header.value("assembler_warnings", std::vector<std::string>{});
    b.registers = header.value("registers", std::vector<int>{});
    if (!expected_key.empty() && b.key != expected_key) return fail("its key is " + b.key);
    const std::span<const uint8_t> payload(newline + 1, end);
    if (payload.size() != header.at("payload_bytes").get<size_t>()) {
      return fail("payload of " + std::to_string(payload.size()) + " bytes, header says " +
                  std::to_string(header.at("payload_bytes").get<size_t>()));
    }
    if (payload_hash(payload) != header.at("payload_hash").get<std::string>()) return fail("payload checksum mismatch");
    if (b.kernel_names.size() != 2) return fail("expected 2 kernel names");
    b.cubin = std::make_shared<const std::vector<uint8_t>>(payload.begin(), payload.end());
    return b;
  } catch (const nlohmann::json::exception& e) {
    return fail(std::string("bad header: ") + e.what());
  }
}

}  // namespace mxmoe

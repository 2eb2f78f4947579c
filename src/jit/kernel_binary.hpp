// One compiled tactic: the NVRTC request that builds it, the key that names it, and the byte format
// it is stored in (the on-disk cache and the ahead-of-time blob share it).
//
// Key: a 128-bit hash of everything that changes the binary: the embedded kernel sources, the
// translation unit and kernel names of the tactic, the NVRTC options and target, the NVRTC version
// and the mxmoe version (k_split is a launch parameter and stays out).
//
// Entry format: the line "MXMOE-KERNEL 1", a one-line JSON header (key, tactic, arch, kernel names,
// payload size and hash, compiler, compile time, creation time, the assembler's performance
// warnings and register counts), then the cubin. A reader checks
// the magic, that the header parses, that the key is the one asked for, and the payload's size and
// hash, so a truncated or damaged entry is never loaded.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "device/arch.hpp"
#include "jit/nvrtc_compiler.hpp"
#include "mxmoe/tactic.hpp"

namespace mxmoe {

CompileRequest compile_request(const Tactic& tactic, const Arch& arch);
std::string kernel_key(const Tactic& tactic, const Arch& arch);

struct KernelBinary {
  std::string key;
  std::string tactic;                     // binary name (k_split 1)
  std::string arch;
  std::vector<std::string> kernel_names;  // lowered names: FC1, FC2
  std::shared_ptr<const std::vector<uint8_t>> cubin;
  // The assembler's performance warnings (AssemblerWarning), each as "FC1: <message>" or "FC2: ...".
  // No tactic the families offer has its MMAs serialised, and only the GEMV-style decode kernels
  // spill, a few words (tests/cpu/test_tactics.cpp, EveryValidTacticCompiles...).
  std::vector<std::string> assembler_warnings;
  std::vector<int> registers;             // per thread, per kernel (FC1, FC2), from the cubin (cubin_info.hpp)
  double compile_seconds = 0.0;
  int64_t created_unix = 0;
};

// Compiles with NVRTC; throws Error carrying the compiler's log, or the family's reason where the
// assembled kernels cannot run as its launches assume (KernelFamily::why_unfit_binary). The
// assembler's performance warnings are kept in the binary, and serialised MMAs also reported once
// each (warn_once): such a tactic still runs correctly, only slower than its design.
KernelBinary compile_tactic(const Tactic& tactic, const Arch& arch);

std::vector<uint8_t> serialize_entry(const KernelBinary& binary);
// nullopt and the reason when `bytes` is not a whole, undamaged entry for `expected_key` (any key
// when empty).
std::optional<KernelBinary> parse_entry(std::span<const uint8_t> bytes, const std::string& expected_key,
                                        std::string* problem);

}  // namespace mxmoe

// What a compiled cubin says about its kernels, read from its ELF rather than from the compiler's
// log: the registers per thread ptxas gave each function.
//
// A CUDA cubin is a little-endian ELF64 (machine EM_CUDA). Its `.nv.info` sections hold
// attributes, each a format byte, an attribute byte and a 16-bit field: for format EIFMT_SVAL the
// size of the value that follows, for the others the value itself. EIATTR_REGCOUNT (an SVAL of
// 8 bytes: the function's symbol index, then its register count) sits in the module-wide
// `.nv.info` in the cubins NVRTC 13 makes; one in a function's own `.nv.info.<function>` counts
// the same.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>

namespace mxmoe {

// Registers per thread of every function the cubin's EIATTR_REGCOUNT attributes name, by (mangled)
// symbol name. Throws Error naming what is wrong where `cubin` is not a whole CUDA ELF (bad magic,
// class or machine, a header, section or attribute past its end, a symbol index out of range).
std::map<std::string, int> cubin_registers(std::span<const uint8_t> cubin);

}  // namespace mxmoe

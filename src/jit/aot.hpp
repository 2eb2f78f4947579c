// The ahead-of-time kernel set: default_tactics() compiled for every arch in MXMOE_AOT_ARCHS when
// the library was built (tools/aot/aot_gen.cpp), embedded in the library, looked up by key.
#pragma once

#include <optional>
#include <string>

#include "jit/kernel_binary.hpp"

namespace mxmoe {

std::optional<KernelBinary> find_ahead_of_time(const std::string& key);
size_t ahead_of_time_entries();

}  // namespace mxmoe

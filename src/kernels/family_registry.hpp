// The kernel families, in the order the tactic table lists their candidates and the tuner tries
// them.
#pragma once

#include <span>
#include <string_view>

#include "kernels/kernel_family.hpp"

namespace mxmoe {

std::span<const KernelFamily* const> kernel_families();
// nullptr when no family has the prefix.
const KernelFamily* family_by_prefix(std::string_view prefix);
// Throws Error naming the families when `t.family` is none of them.
const KernelFamily& family_of(const Tactic& t);

}  // namespace mxmoe

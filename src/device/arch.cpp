#include "device/arch.hpp"

#include <array>

#include "mxmoe/error.hpp"

namespace mxmoe {
namespace {

// Shared memory per block (opt-in): 227 KB on sm_90 and sm_100, 99 KB on the sm_12x parts
// (CUDA programming guide, compute capabilities table).
constexpr std::array<Arch, 4> kArchs{{
    {"sm_90a", "sm_90a", 9, 0, 232448},
    {"sm_100a", "sm_100a", 10, 0, 232448},
    {"sm_120a", "sm_120a", 12, 0, 101376},
    {"sm_121a", "sm_121a", 12, 1, 101376},
}};

std::string known_names() {
  std::string names;
  for (const auto& a : kArchs) names += (names.empty() ? "" : ", ") + std::string(a.name);
  return names;
}

}  // namespace

std::span<const Arch> supported_archs() { return kArchs; }

const Arch& arch_by_name(std::string_view name) {
  for (const auto& a : kArchs) {
    if (a.name == name) return a;
  }
  throw Error("unsupported arch '" + std::string(name) + "' (supported: " + known_names() + ")");
}

const Arch& arch_for_device(int major, int minor) {
  for (const auto& a : kArchs) {
    if (a.major == major && a.minor == minor) return a;
  }
  throw Error("unsupported GPU: compute capability " + std::to_string(major) + "." + std::to_string(minor) +
              " (mxmoe runs on " + known_names() + ")");
}

}  // namespace mxmoe

#include "kernels/family_registry.hpp"

#include "mxmoe/error.hpp"

namespace mxmoe {

// The accessors the families' units (src/kernels/<kernel>_family.cpp) define, then the list.
const KernelFamily &gemv_ring_family(), &gemv_family(), &fused_layer_family(), &gemv_streamk_family(),
    &mma_tile_family(), &wgmma_family(), &block_scaled_tile_family();

std::span<const KernelFamily* const> kernel_families() {
  static const KernelFamily* const families[] = {&gemv_ring_family(), &gemv_family(), &fused_layer_family(),
                                                 &gemv_streamk_family(), &mma_tile_family(),
                                                 &wgmma_family(), &block_scaled_tile_family()};
  return families;
}

const KernelFamily* family_by_prefix(std::string_view prefix) {
  for (const KernelFamily* f : kernel_families()) {
    if (f->prefix() == prefix) return f;
  }
  return nullptr;
}

const KernelFamily& family_of(const Tactic& t) {
  if (const KernelFamily* f = family_by_prefix(t.family)) return *f;
  std::string known;
  for (const KernelFamily* f : kernel_families())
    known += (known.empty() ? "'" : ", '") + std::string(f->prefix()) + "'";
  throw Error("unknown kernel family '" + t.family + "' (expected " + known + ")");
}

}  // namespace mxmoe

#include "kernels/family_registry.hpp"

#include <string>

#include "mxmoe/error.hpp"

namespace mxmoe {

std::span<const KernelFamily* const> kernel_families() {
  static const KernelFamily* const families[] = {&gemv_ring_family(),    &gemv_family(),     &gemv_token_sum_family(),
                                                 &fused_layer_family(),  &gemv_streamk_family(), &mma_tile_family(),
                                                 &wgmma_family(),        &block_scaled_tile_family()};
  return families;
}

const KernelFamily* family_by_prefix(std::string_view prefix) {
  for (const KernelFamily* f : kernel_families()) {
    if (f->prefix() == prefix) return f;
  }
  return nullptr;
}

void require_family(const Tactic& t, std::string_view what) {
  if (t.family) return;
  throw Error(std::string(what) + ": a tactic without a kernel family (tile " + std::to_string(t.tile_rows) + "x" +
              std::to_string(t.tile_tokens) + "); make tactics with parse_tactic or take them from the tactic table");
}

}  // namespace mxmoe

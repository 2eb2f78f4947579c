// Launching an expert-GEMM tactic: grid and shared memory from the tactic and shape, kernels from
// the cache.
#include <algorithm>

#include "kernels/smem_bytes.hpp"
#include "runner/cuda_check.hpp"
#include "runner/expert_modules.hpp"
#include "runner/kernel_launch.hpp"

namespace mxmoe {

void launch_expert_gemm(Stage stage, const Tactic& tactic, const kernels::ExpertGemmArgs& args, int num_pairs,
                        cudaStream_t stream) {
  const ExpertKernels& k = expert_kernels(tactic);
  kernels::ExpertGemmArgs a = args;
  a.staged_rows = std::min(tactic.tile_tokens, num_pairs / args.top_k);  // an expert gets a token at most once
  int k_split = tactic.k_split;
  void* params[] = {&a, &k_split};
  const unsigned max_active = static_cast<unsigned>(std::min(args.num_experts, num_pairs));
  const unsigned row_tiles = static_cast<unsigned>(args.rows / 16);
  dim3 grid;
  int smem = 0;
  if (tactic.family == KernelFamily::kGemvRing) {
    const unsigned columns = static_cast<unsigned>(tactic.warps_rows);
    grid = dim3((row_tiles + columns - 1) / columns, max_active, static_cast<unsigned>(k_split));
    smem = kernels::ring_smem_bytes(tactic.tile_tokens, a.staged_rows, args.k_tiles, k_split, tactic.warps_rows,
                                    tactic.stages);
  } else if (tactic.family == KernelFamily::kGemv) {
    const unsigned columns = static_cast<unsigned>(tactic.warps_rows);
    grid = dim3((row_tiles + columns - 1) / columns, max_active, static_cast<unsigned>(k_split));
    smem = kernels::gemv_smem_bytes(tactic.tile_tokens, a.staged_rows, args.k_tiles, k_split, tactic.warps_rows,
                                    tactic.warps_tokens);
  } else {
    grid = dim3(static_cast<unsigned>(num_pairs / tactic.tile_tokens) + max_active,
                static_cast<unsigned>((args.rows + tactic.tile_rows - 1) / tactic.tile_rows), static_cast<unsigned>(k_split));
    smem = kernels::mma_tile_smem_bytes(tactic.tile_rows, tactic.tile_tokens, tactic.stages);
  }
  launch_programmatic(stage == Stage::kFc1 ? k.fc1 : k.fc2, grid, dim3(32 * tactic.warps()), params,
                      static_cast<size_t>(smem), stream,
                      std::string(stage == Stage::kFc1 ? "FC1 " : "FC2 ") + tactic.name() + " launch");
}

}  // namespace mxmoe

// Launching an expert-GEMM tactic: grid and shared memory from the tactic and shape, kernels from
// the cache.
#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>

#include "kernels/smem_bytes.hpp"
#include "runner/cuda_check.hpp"
#include "runner/expert_modules.hpp"
#include "runner/kernel_launch.hpp"
#include "tactics/tactic_choice.hpp"

namespace mxmoe {
namespace {

// CTAs of `kernel` the current device holds at once (occupancy per SM times SMs), looked up once
// per device, kernel and shared-memory size.
long long resident_ctas(const void* kernel, int threads, int smem, const std::string& name) {
  static std::mutex mutex;
  static std::map<std::tuple<int, const void*, int>, long long> known;
  int device = 0;
  cuda_check(cudaGetDevice(&device), "cudaGetDevice");
  std::lock_guard lock(mutex);
  const auto key = std::make_tuple(device, kernel, smem);
  if (const auto it = known.find(key); it != known.end()) return it->second;
  int sms = 0, per_sm = 0;
  cuda_check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "multiprocessor count");
  cuda_check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, static_cast<size_t>(smem)),
             "occupancy of " + name);
  return known.emplace(key, static_cast<long long>(per_sm) * sms).first->second;
}

// An expert-GEMM launch's grid, dynamic shared memory and staged token rows (the stream-K GEMV's
// grid is the resident count: launch_expert_gemm).
struct ExpertLaunch {
  dim3 grid;
  int smem = 0;
  int staged_rows = 0;
};

// `routes_itself`: the kernel routes a small batch itself (args.route_logits), which takes shared memory.
ExpertLaunch expert_launch(const Tactic& tactic, const ExpertStageShape& shape, int num_pairs, bool routes_itself) {
  if (routes_itself && !can_route_in_expert_kernels({tactic, tactic}, num_pairs / shape.top_k, shape.top_k)) {
    throw Error("internal: " + tactic.name() + " cannot route " + std::to_string(num_pairs) +
                " pairs itself (only GEMV tactics do, up to " + std::to_string(kernels::kSmallBatchPairs) + ")");
  }
  ExpertLaunch l;
  l.staged_rows = std::min(tactic.tile_tokens, num_pairs / shape.top_k);  // an expert gets a token at most once
  const int k_split = tactic.k_split;
  const unsigned max_active = static_cast<unsigned>(std::min(shape.num_experts, num_pairs));
  const unsigned row_tiles = static_cast<unsigned>(shape.rows / 16);
  l.smem = expert_stage_smem_bytes(tactic, l.staged_rows, shape.k_tiles, shape.num_experts, routes_itself);
  if (tactic.family == KernelFamily::kGemvRing || tactic.family == KernelFamily::kGemv) {
    const unsigned columns = static_cast<unsigned>(tactic.warps_rows);
    l.grid = dim3((row_tiles + columns - 1) / columns, max_active, static_cast<unsigned>(k_split));
  } else if (tactic.family == KernelFamily::kMmaTile) {
    l.grid = dim3(static_cast<unsigned>(num_pairs / tactic.tile_tokens) + max_active,
                  static_cast<unsigned>((shape.rows + tactic.tile_rows - 1) / tactic.tile_rows),
                  static_cast<unsigned>(k_split));
  }  // the stream-K GEMV's grid is the resident CTAs (launch_expert_gemm)
  return l;
}

}  // namespace

bool expert_gemm_routing_itself_fits_one_wave(Stage stage, const Tactic& tactic, const ExpertStageShape& shape,
                                              int num_pairs) {
  const ExpertKernels& k = expert_kernels(tactic);
  const ExpertLaunch l = expert_launch(tactic, shape, num_pairs, true);
  const long long ctas = static_cast<long long>(l.grid.x) * l.grid.y * l.grid.z;
  return ctas <= resident_ctas(stage == Stage::kFc1 ? k.fc1 : k.fc2, 32 * tactic.warps(), l.smem, tactic.name());
}

void launch_expert_gemm(Stage stage, const Tactic& tactic, const kernels::ExpertGemmArgs& args, int num_pairs,
                        cudaStream_t stream) {
  const ExpertKernels& k = expert_kernels(tactic);
  const ExpertStageShape shape{args.rows, args.k_tiles, args.num_experts, args.top_k};
  ExpertLaunch l = expert_launch(tactic, shape, num_pairs, args.route_logits != nullptr);
  kernels::ExpertGemmArgs launch_args = args;
  launch_args.staged_rows = l.staged_rows;
  const void* kernel = stage == Stage::kFc1 ? k.fc1 : k.fc2;
  if (tactic.family == KernelFamily::kGemvStreamK) {  // every CTA resident at once: they wait on each other
    const long long resident = resident_ctas(kernel, 32 * tactic.warps(), l.smem, tactic.name());
    if (resident < 1) {
      throw Error(tactic.name() + ": no CTA fits an SM (" + std::to_string(l.smem) + " bytes of shared memory)");
    }
    l.grid = dim3(static_cast<unsigned>(std::min<long long>(resident, kernels::kMaxStreamCtas)));
  }
  int k_split = tactic.k_split;
  void* params[] = {&launch_args, &k_split};
  launch_programmatic(kernel, l.grid, dim3(32 * tactic.warps()), params,
                      static_cast<size_t>(l.smem), stream,
                      std::string(stage == Stage::kFc1 ? "FC1 " : "FC2 ") + tactic.name() + " launch");
}

void launch_fused_layer(const Tactic& tactic, const kernels::FusedLayerArgs& args, int num_pairs, cudaStream_t stream) {
  const ExpertKernels& k = expert_kernels(tactic);
  kernels::FusedLayerArgs a = args;
  a.fc1.staged_rows = a.fc2.staged_rows = std::min(tactic.tile_tokens, num_pairs / args.fc1.top_k);
  const int columns = tactic.warps_rows, threads = 32 * tactic.warps();
  const int smem = kernels::fused_smem_bytes(tactic.tile_tokens, a.fc1.staged_rows, a.fc1.k_tiles, a.fc2.k_tiles, columns,
                                             tactic.warps_tokens, args.fc1.num_experts);
  // As many CTAs as are resident at once, and no more than there can be items.
  const long long resident = resident_ctas(k.fc1, threads, smem, tactic.name());
  const long long max_active = std::min(args.fc1.num_experts, num_pairs);
  const long long groups = (args.fc1.rows / 16 + columns - 1) / columns + (args.fc2.rows / 16 + columns - 1) / columns;
  const unsigned ctas = static_cast<unsigned>(std::max(1LL, std::min(resident, max_active * groups)));
  void* params[] = {&a};
  launch_programmatic(k.fc1, dim3(ctas), dim3(threads), params, static_cast<size_t>(smem), stream,
                      "fused layer " + tactic.name() + " launch");
}

}  // namespace mxmoe

// The compiled kernel set and its launchers. Every expert-GEMM binary is one row of kExpertKernels;
// compiled_tactics() lists them.
#include <algorithm>
#include <mutex>
#include <string>
#include <vector>

#include "kernels/expert_gemv.cuh"
#include "kernels/expert_mma_tile.cuh"
#include "mxmoe/error.hpp"
#include "route/route_kernels.cuh"
#include "route/unpermute_kernel.cuh"
#include "runner/cuda_check.hpp"
#include "runner/kernel_launch.hpp"

namespace mxmoe {
namespace {

using kernels::ExpertGemmArgs;
using ExpertKernel = void (*)(ExpertGemmArgs, int);

struct ExpertKernels {
  Tactic tactic;
  ExpertKernel fc1;
  ExpertKernel fc2;
  int smem_bytes;  // tiled family; the GEMV's depends on K and is computed per launch
};

template <int kWarps, int kUnroll>
ExpertKernels gemv() {
  return {Tactic{KernelFamily::kGemv, kWarps * kernels::kRecordRows, kernels::kGemvTokens, kWarps, 1, kUnroll, 1},
          kernels::expert_gemv_kernel<kWarps, true, kUnroll>, kernels::expert_gemv_kernel<kWarps, false, kUnroll>, 0};
}

template <int kRows, int kTokens, int kWarpsRows, int kWarpsTokens, int kStages>
ExpertKernels mma_tile() {
  return {Tactic{KernelFamily::kMmaTile, kRows, kTokens, kWarpsRows, kWarpsTokens, kStages, 1},
          kernels::expert_mma_tile_kernel<kRows, kTokens, kWarpsRows, kWarpsTokens, kStages, true>,
          kernels::expert_mma_tile_kernel<kRows, kTokens, kWarpsRows, kWarpsTokens, kStages, false>,
          kernels::MmaTileSmem<kRows, kTokens, kStages>::kBytes};
}

const std::vector<ExpertKernels>& expert_kernels() {
  static const std::vector<ExpertKernels> table{
      gemv<4, 4>(),                    // decode: 64 rows per CTA, 4 records in flight per lane
      mma_tile<128, 16, 4, 1, 4>(),    // small tiles: 9-16 rows per expert
      mma_tile<128, 32, 4, 1, 4>(),    // 17-32
      mma_tile<128, 64, 2, 2, 3>(),    // large tiles: prefill
      mma_tile<128, 128, 2, 4, 3>(),
  };
  return table;
}

const ExpertKernels& find_kernels(const Tactic& tactic) {
  for (const auto& k : expert_kernels()) {
    Tactic t = tactic;
    t.k_split = 1;
    if (k.tactic == t) return k;
  }
  throw Error("tactic " + tactic.name() + " is not compiled into this library");
}

int device_smem_optin() {
  int device = 0, bytes = 0;
  cuda_check(cudaGetDevice(&device), "cudaGetDevice");
  cuda_check(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device), "shared memory limit");
  return bytes;
}

void launch(const void* kernel, dim3 grid, dim3 block, void** args, int smem, cudaStream_t stream,
            const std::string& what) {
  cuda_check(cudaLaunchKernel(kernel, grid, block, args, static_cast<size_t>(smem), stream), what);
}

unsigned blocks(long long n, long long per_block) { return static_cast<unsigned>((n + per_block - 1) / per_block); }

}  // namespace

std::span<const Tactic> compiled_tactics() {
  static const std::vector<Tactic> tactics = [] {
    std::vector<Tactic> v;
    for (const auto& k : expert_kernels()) v.push_back(k.tactic);
    return v;
  }();
  return tactics;
}

void prepare_kernels() {
  static std::mutex mutex;
  static std::vector<int> prepared_devices;
  std::lock_guard lock(mutex);
  int device = 0;
  cuda_check(cudaGetDevice(&device), "cudaGetDevice");
  if (std::find(prepared_devices.begin(), prepared_devices.end(), device) != prepared_devices.end()) return;
  const int optin = device_smem_optin();
  for (const auto& k : expert_kernels()) {
    const int bytes = k.tactic.family == KernelFamily::kGemv ? optin : k.smem_bytes;
    if (bytes > optin) continue;  // launching it reports the limit
    for (ExpertKernel fn : {k.fc1, k.fc2}) {
      cuda_check(cudaFuncSetAttribute(reinterpret_cast<const void*>(fn), cudaFuncAttributeMaxDynamicSharedMemorySize, bytes),
                 "shared memory limit of " + k.tactic.name());
    }
  }
  prepared_devices.push_back(device);
}

void launch_router_logits(const __nv_bfloat16* x, const __nv_bfloat16* weight, const float* bias, float* logits,
                          int num_tokens, int num_experts, int hidden, cudaStream_t stream) {
  void* args[] = {&x, &weight, &bias, &logits, &num_tokens, &num_experts, &hidden};
  launch(reinterpret_cast<const void*>(kernels::router_logits_kernel),
         dim3(blocks(num_tokens, kernels::kLogitTokens), blocks(num_experts, kernels::kLogitWarps)),
         dim3(kernels::kLogitWarps * 32), args, 0, stream, "router logits launch");
}

void launch_select_experts(const float* logits, int num_tokens, int num_experts, int top_k,
                           const kernels::RouteBuffers& route, cudaStream_t stream) {
  kernels::RouteBuffers r = route;
  void* args[] = {&logits, &num_tokens, &num_experts, &top_k, &r};
  launch(reinterpret_cast<const void*>(kernels::select_experts_kernel), dim3(blocks(num_tokens, kernels::kSelectWarps)),
         dim3(kernels::kSelectWarps * 32), args, 0, stream, "top-k launch");
}

void launch_permute(int num_pairs, int num_experts, const kernels::RouteBuffers& route, cudaStream_t stream) {
  kernels::RouteBuffers r = route;
  void* args[] = {&num_pairs, &num_experts, &r};
  const int smem = 4 * (kernels::permute_segments(num_experts) * num_experts + num_experts + 1);
  launch(reinterpret_cast<const void*>(kernels::permute_kernel), dim3(1), dim3(kernels::kPermuteThreads), args, smem,
         stream, "permutation launch");
}

void launch_expert_gemm(Stage stage, const Tactic& tactic, const kernels::ExpertGemmArgs& args, int num_pairs,
                        cudaStream_t stream) {
  const ExpertKernels& k = find_kernels(tactic);
  const ExpertKernel fn = stage == Stage::kFc1 ? k.fc1 : k.fc2;
  kernels::ExpertGemmArgs a = args;
  int k_split = tactic.k_split;
  void* params[] = {&a, &k_split};
  const unsigned max_active = static_cast<unsigned>(std::min(args.num_experts, num_pairs));
  const int row_tiles = args.rows / kernels::kRecordRows;
  dim3 grid;
  int smem = k.smem_bytes;
  if (tactic.family == KernelFamily::kGemv) {
    grid = dim3(blocks(row_tiles, tactic.warps()), max_active, k_split);
    smem = kernels::gemv_smem_bytes(args.k_tiles, k_split);
  } else {
    grid = dim3(static_cast<unsigned>(num_pairs / tactic.tile_tokens) + max_active, blocks(args.rows, tactic.tile_rows),
                k_split);
  }
  launch(reinterpret_cast<const void*>(fn), grid, dim3(32 * tactic.warps()), params, smem, stream,
         (stage == Stage::kFc1 ? "FC1 " : "FC2 ") + tactic.name() + " launch");
}

void launch_unpermute(const float* expert_out, long long split_stride, int k_split, int hidden, int top_k,
                      int num_tokens, const kernels::RouteBuffers& route, __nv_bfloat16* out, cudaStream_t stream) {
  kernels::RouteBuffers r = route;
  void* args[] = {&expert_out, &split_stride, &k_split, &hidden, &top_k, &r, &out};
  launch(reinterpret_cast<const void*>(kernels::unpermute_kernel),
         dim3(static_cast<unsigned>(num_tokens), blocks(hidden, 8 * kernels::kUnpermuteThreads)),
         dim3(kernels::kUnpermuteThreads), args, 0, stream, "un-permute launch");
}

}  // namespace mxmoe

#include "runner/route_launch.hpp"

#include <string>

#include "device/cuda_check.hpp"
#include "route/fp8_round_rows_kernel.cuh"
#include "route/gather_rows_kernel.cuh"
#include "route/route_kernels.cuh"
#include "route/unpermute_kernel.cuh"

namespace mxmoe {
namespace {

void launch(const void* kernel, dim3 grid, dim3 block, void** args, int smem, cudaStream_t stream, const char* what) {
  launch_programmatic(kernel, grid, block, args, static_cast<size_t>(smem), stream, what);
}

unsigned blocks(long long n, long long per_block) { return static_cast<unsigned>((n + per_block - 1) / per_block); }

}  // namespace

void launch_router_logits(const __nv_bfloat16* x, const __nv_bfloat16* weight, const float* bias, float* logits,
                          int num_tokens, int num_experts, int hidden, cudaStream_t stream) {
  void* args[] = {&x, &weight, &bias, &logits, &num_tokens, &num_experts, &hidden};
  if (num_tokens <= kernels::kSmallBatchTokens) {
    launch(reinterpret_cast<const void*>(kernels::router_logits_small_batch_kernel),
           dim3(static_cast<unsigned>(num_experts), blocks(num_tokens, kernels::kLogitTokens)),
           dim3(kernels::kLogitWarps * 32), args, 0, stream, "router logits launch");
    return;
  }
  launch(reinterpret_cast<const void*>(kernels::router_logits_kernel),
         dim3(blocks(num_tokens, kernels::kLogitTokens), blocks(num_experts, kernels::kLogitWarps)),
         dim3(kernels::kLogitWarps * 32), args, 0, stream, "router logits launch");
}

void launch_routing(const kernels::RouteInput& in, int num_tokens, int num_experts, int top_k,
                    const kernels::RouteBuffers& route, cudaStream_t stream) {
  kernels::RouteBuffers r = route;
  kernels::RouteInput fused = in;
  if (num_tokens > kernels::kFusedRouteTokens || num_tokens * top_k > kernels::kFusedRoutePairs) {
    void* args[] = {&fused, &num_tokens, &top_k, &r};
    launch(reinterpret_cast<const void*>(kernels::select_experts_kernel), dim3(blocks(num_tokens, kernels::kSelectWarps)),
           dim3(kernels::kSelectWarps * 32), args, 0, stream, "top-k launch");
    fused = {};  // the permutation reads the top-k the launch above wrote
  }
  void* args[] = {&fused, &num_tokens, &num_experts, &top_k, &r};
  const bool routes = fused.logits || fused.topk_ids;
  const int smem_pairs = routes ? num_tokens * top_k : 0;
  const int smem = kernels::permute_segments(num_experts, num_tokens * top_k, smem_pairs) * num_experts * 4 +
                   kernels::permute_fixed_smem(num_experts, smem_pairs);
  // A fused small batch takes the one-warp path (kernels::small_permute_warps).
  const bool small = routes && kernels::permutes_in_one_warp(num_tokens, top_k);
  const int threads =
      small ? 32 * kernels::small_permute_warps(num_tokens, fused.router.sqrt_softplus != 0) : kernels::kPermuteThreads;
  launch(reinterpret_cast<const void*>(kernels::permute_kernel), dim3(1), dim3(static_cast<unsigned>(threads)), args,
         smem, stream, "permutation launch");
}

void launch_gather_rows(const __nv_bfloat16* x, int hidden, int top_k, int num_experts, int num_tokens,
                        const kernels::RouteBuffers& route, __nv_bfloat16* sorted, cudaStream_t stream) {
  const auto* source = reinterpret_cast<const uint4*>(x);
  auto* destination = reinterpret_cast<uint4*>(sorted);
  int row_chunks = hidden / 8;
  kernels::RouteBuffers r = route;
  void* args[] = {&source, &row_chunks, &top_k, &num_experts, &r, &destination};
  launch(reinterpret_cast<const void*>(kernels::gather_rows_kernel),
         dim3(blocks(static_cast<long long>(num_tokens) * top_k, kernels::kGatherWarps)), dim3(kernels::kGatherWarps * 32),
         args, 0, stream, "gather launch");
}

void launch_gather_quantize_rows(const __nv_bfloat16* x, int hidden, int top_k, int num_experts, int num_tokens,
                                 const kernels::RouteBuffers& route, void* sorted, bool fp8, cudaStream_t stream) {
  const auto* source = reinterpret_cast<const unsigned short*>(x);
  long long rows_capacity = static_cast<long long>(num_tokens) * top_k;
  kernels::RouteBuffers r = route;
  void* args[] = {&source, &hidden, &top_k, &num_experts, &r, &sorted, &rows_capacity};
  launch(fp8 ? reinterpret_cast<const void*>(kernels::gather_quantize_rows_kernel<true>)
             : reinterpret_cast<const void*>(kernels::gather_quantize_rows_kernel<false>),
         dim3(blocks(rows_capacity, kernels::kGatherWarps)), dim3(kernels::kGatherWarps * 32), args, 0, stream,
         "quantising gather launch");
}

void launch_fp8_round_rows(const __nv_bfloat16* in, __nv_bfloat16* out, int row_length, long long rows,
                           const int* row_count, cudaStream_t stream) {
  const auto* source = reinterpret_cast<const unsigned short*>(in);
  auto* destination = reinterpret_cast<unsigned short*>(out);
  const long long items = rows * ((row_length + kernels::kFp8RoundBlock - 1) / kernels::kFp8RoundBlock);
  void* args[] = {&source, &destination, &row_length, &rows, &row_count};
  launch(reinterpret_cast<const void*>(kernels::fp8_round_rows_kernel), dim3(blocks(items, kernels::kFp8RoundWarps)),
         dim3(kernels::kFp8RoundWarps * 32), args, 0, stream, "FP8 rounding launch");
}

void launch_unpermute(const void* expert_out, bool bf16_rows, long long split_stride, int k_split, int hidden, int top_k,
                      int num_tokens, const kernels::RouteBuffers& route, __nv_bfloat16* out, cudaStream_t stream) {
  kernels::RouteBuffers r = route;
  int bf16 = bf16_rows;
  void* args[] = {&expert_out, &bf16, &split_stride, &k_split, &hidden, &top_k, &r, &out};
  launch(reinterpret_cast<const void*>(kernels::unpermute_kernel),
         dim3(static_cast<unsigned>(num_tokens), blocks(hidden, 8 * kernels::kUnpermuteThreads)),
         dim3(kernels::kUnpermuteThreads), args, 0, stream, "un-permute launch");
}

}  // namespace mxmoe

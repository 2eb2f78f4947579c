// Host-side launchers of the routing kernels (router logits, top-k + softmax and the permutation,
// the weighted un-permute), compiled by nvcc into the library.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "route/route_buffers.hpp"

namespace mxmoe {

void launch_router_logits(const __nv_bfloat16* x, const __nv_bfloat16* weight, const float* bias, float* logits,
                          int num_tokens, int num_experts, int hidden, cudaStream_t stream);
// The top-k (from logits or given, `in`) and the expert-sorted permutation: one single-CTA launch for
// small batches, a parallel top-k then the permutation for large ones.
void launch_routing(const kernels::RouteInput& in, int num_tokens, int num_experts, int top_k,
                    const kernels::RouteBuffers& route, cudaStream_t stream);
// x [T, hidden] gathered into sorted-row order at `sorted` ([pairs, hidden]), for an FC1 that reads
// it so (KernelFamily::reads_sorted_input).
void launch_gather_rows(const __nv_bfloat16* x, int hidden, int top_k, int num_experts, int num_tokens,
                        const kernels::RouteBuffers& route, __nv_bfloat16* sorted, cudaStream_t stream);
// The same quantised to MXFP8 rows of K = hidden at `sorted` (room for num_tokens x top_k rows,
// kernels/mxfp8_quantize.cuh), for the block-scaled family's FC1; with `fp8`, as FP8 activations
// (a scale per 128 along K, repeated in its four 32-blocks' codes).
void launch_gather_quantize_rows(const __nv_bfloat16* x, int hidden, int top_k, int num_experts, int num_tokens,
                                 const kernels::RouteBuffers& route, void* sorted, bool fp8, cudaStream_t stream);
// Rows of bf16 (`rows` of `row_length`, a multiple of 32; from *row_count on left alone when
// row_count is given) rounded to FP8 activations' values (route/fp8_round_rows_kernel.cuh) into
// `out`, which may be `in`.
void launch_fp8_round_rows(const __nv_bfloat16* in, __nv_bfloat16* out, int row_length, long long rows,
                           const int* row_count, cudaStream_t stream);
// `expert_out`: FC2's fp32 partials, k_split of them split_stride apart, or with `bf16_rows` its
// bf16 rows (one split); the pairs' rows and weights from `route` (a routing kernel's, or FC1's
// for a batch that routes itself).
void launch_unpermute(const void* expert_out, bool bf16_rows, long long split_stride, int k_split, int hidden, int top_k,
                      int num_tokens, const kernels::RouteBuffers& route, __nv_bfloat16* out, cudaStream_t stream);

}  // namespace mxmoe

// The load's small kernels: the record repack (its steps, layout and budget: repack_records.cuh),
// the row vectors (a pack_row_vector per thread: a few MB a layer) and the router weight's rounding
// to bf16.
#include <cuda_bf16.h>

#include <algorithm>
#include <string>

#include "device/cuda_check.hpp"
#include "load/repack_records.cuh"
#include "load/repack_records.hpp"

namespace mxmoe {
namespace {

using load::kRepackThreads;
using load::RepackArgs;

__global__ void __launch_bounds__(kRepackThreads) repack_records_kernel(RepackArgs a, unsigned* scales_out_of_range) {
  __shared__ load::RepackStage stage;
  bool out_of_range = false;
  for (long long item = blockIdx.x; item < a.items; item += gridDim.x) {
    out_of_range |= load::stage_repack_item(a, item, threadIdx.x, stage);
    __syncthreads();
    load::write_record(a, item, threadIdx.x / 32, threadIdx.x % 32, stage);
    __syncthreads();
  }
  if (__syncthreads_or(out_of_range) && threadIdx.x == 0) atomicOr(scales_out_of_range, 1u);
}

template <typename T>
__global__ void pack_row_vector_kernel(const T* values, int rows, long long count, int row_order, float* out) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    out[i] = load::packed_row_value(values, rows, row_order, i);
  }
}

__global__ void round_to_bf16_kernel(const float* values, long long count, uint16_t* out) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    out[i] = __bfloat16_as_ushort(__float2bfloat16_rn(values[i]));
  }
}

// Grid-stride kernels: the grid is capped here, and each kernel loops over what is left.
unsigned grid_for(long long items, long long per_block) {
  return static_cast<unsigned>(std::min<long long>((items + per_block - 1) / per_block, 1 << 20));
}

constexpr int kElementwiseThreads = 256;

}  // namespace

void launch_repack_records(const RecordGeometry& g, RowOrder order, const uint8_t* blocks, const uint8_t* scales,
                           uint8_t* records, unsigned* scales_out_of_range, cudaStream_t stream) {
  const RepackArgs args = load::repack_args(g, order, blocks, scales, records);
  if (args.items == 0) return;
  repack_records_kernel<<<grid_for(args.items, 1), kRepackThreads, 0, stream>>>(args, scales_out_of_range);
  cuda_check(cudaGetLastError(), "record repack launch");
}

void launch_pack_row_vector(const RecordGeometry& g, RowOrder order, const void* values, Dtype dtype, float* out,
                            cudaStream_t stream) {
  const long long count = static_cast<long long>(g.experts) * g.rows;
  if (count == 0) return;
  const int row_order = static_cast<int>(order);
  const unsigned grid = grid_for(count, kElementwiseThreads);
  if (dtype == Dtype::kBF16) {
    pack_row_vector_kernel<<<grid, kElementwiseThreads, 0, stream>>>(static_cast<const uint16_t*>(values), g.rows,
                                                                     count, row_order, out);
  } else if (dtype == Dtype::kF32) {
    pack_row_vector_kernel<<<grid, kElementwiseThreads, 0, stream>>>(static_cast<const float*>(values), g.rows, count,
                                                                     row_order, out);
  } else {
    throw Error("row vector on the device: expected BF16 or F32 values, got " + std::string(dtype_name(dtype)));
  }
  cuda_check(cudaGetLastError(), "row vector launch");
}

void launch_round_to_bf16(const float* values, long long count, uint16_t* out, cudaStream_t stream) {
  if (count == 0) return;
  round_to_bf16_kernel<<<grid_for(count, kElementwiseThreads), kElementwiseThreads, 0, stream>>>(values, count, out);
  cuda_check(cudaGetLastError(), "bf16 rounding launch");
}

}  // namespace mxmoe

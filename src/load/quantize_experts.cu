// The device quantiser's kernel (its steps, layout and budget: quantize_experts.cuh) and launcher.
#include <algorithm>
#include <string>

#include "device/cuda_check.hpp"
#include "load/quantize_experts.cuh"
#include "load/quantize_experts.hpp"

namespace mxmoe {
namespace {

using load::kQuantizeThreads;
using load::QuantizeArgs;

template <typename T>
__global__ void __launch_bounds__(kQuantizeThreads) quantize_experts_kernel(QuantizeArgs a) {
  __shared__ load::QuantizeStage stage;
  for (long long item = blockIdx.x; item < a.items; item += gridDim.x) {
    load::stage_quantize_item<T>(a, item, threadIdx.x, stage);
    __syncthreads();
    load::encode_quantize_item(a, item, threadIdx.x / 32, threadIdx.x % 32, stage);
    __syncthreads();
    load::write_quantize_item(a, item, threadIdx.x, stage);
  }
}

}  // namespace

void launch_quantize_experts(const void* dense, Dtype dtype, int experts, int k, int rows, uint8_t* blocks,
                             uint8_t* scales, cudaStream_t stream) {
  const QuantizeArgs args = load::quantize_args(dense, experts, k, rows, blocks, scales);
  if (args.items == 0) return;
  const auto grid = static_cast<unsigned>(std::min<long long>(args.items, 1 << 20));  // grid-stride beyond
  if (dtype == Dtype::kBF16) {
    quantize_experts_kernel<uint16_t><<<grid, kQuantizeThreads, 0, stream>>>(args);
  } else if (dtype == Dtype::kF32) {
    quantize_experts_kernel<float><<<grid, kQuantizeThreads, 0, stream>>>(args);
  } else {
    throw Error("quantising experts on the device: expected BF16 or F32, got " + std::string(dtype_name(dtype)));
  }
  cuda_check(cudaGetLastError(), "expert quantisation launch");
}

}  // namespace mxmoe

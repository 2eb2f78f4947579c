// Loading a runner's weights onto the current device: from host tensors in the checkpoint layout
// (uploaded through pinned staging, then repacked by the device), or from tensors already on the
// device (MXFP4 repacked, dense quantised then repacked), never through a host repack.
#pragma once

#include <cuda_bf16.h>

#include "device/cuda_check.hpp"
#include "mxmoe/device_layer.hpp"
#include "mxmoe/layer_weights.hpp"

namespace mxmoe {

// One allocation holding, each piece 256-byte aligned: FC1's records | FC1's bias | FC2's records |
// FC2's bias (fp32, packed row order) | the router weight (bf16 [R, H]) | the router bias (fp32
// [R]) | the router's selection bias (fp32 [R]) | an expert-parallel shard's local experts (int32
// [R]; absent for a whole layer). A tensor the layer's spec does not have (expert biases, the
// router's biases, the router of a layer its caller routes) is zeros: adding it changes nothing, so
// the kernels take every spec's layer the same way.
struct PackedLayer {
  DeviceBuffer buffer;
  unsigned char* fc1_records = nullptr;
  float* fc1_bias = nullptr;
  unsigned char* fc2_records = nullptr;
  float* fc2_bias = nullptr;
  __nv_bfloat16* router_weight = nullptr;
  float* router_bias = nullptr;
  float* selection_bias = nullptr;
  int* local_experts = nullptr;
  bool fc1_scales_one_multiply = false, fc2_scales_one_multiply = false;  // scales_take_one_multiply
};


// Both return once the weights are on the device; their load-time scratch (two flags, and expert
// chunks of the checkpoint layout of at most `scratch_limit` bytes, or one expert where that is
// larger) comes from `allocator` too and is released before they return. Throw Error naming the
// tensor or the allocation that failed.
inline constexpr size_t kLoadScratchBytes = 256u << 20;
PackedLayer load_layer(const MoeLayerWeights& weights, const DeviceAllocator& allocator,
                       size_t scratch_limit = kLoadScratchBytes);
PackedLayer load_layer(const DeviceLayerTensors& tensors, const DeviceAllocator& allocator,
                       size_t scratch_limit = kLoadScratchBytes);

}  // namespace mxmoe

// Building a runner from tensors that are already in device memory (an engine's loaded parameters,
// transformers' experts), and the allocator a runner takes its device memory from.
//
// DeviceLayerTensors names one layer's tensors by device address, dtype and shape, as the caller
// holds them (contiguous, row-major, on the current device). The experts come in one of two forms:
//   MXFP4, the checkpoint layout (layer_weights.hpp): fc1_blocks [E, 2I, H/32, 16] (or [E, 2I, H/2])
//          U8, fc1_scales [E, 2I, H/32] U8, fc2_blocks [E, H, I/32, 16] (or [E, H, I/2]) U8,
//          fc2_scales [E, H, I/32] U8; repacked into the kernels' records on the device;
//   dense, transformers' layout: gate_up [E, H, 2I] (gate and linear columns interleaved), down
//          [E, I, H], BF16 or F32; quantised to MXFP4 on the device by the OCP rules of
//          mx_format.hpp, bit for bit as quantize_bf16_experts does on the host, then repacked.
// Both forms take router_weight [E, H], router_bias [E], router_selection_bias [E], fc1_bias
// [E, 2I] (transformers' gate_up_proj_bias) and fc2_bias [E, H] (down_proj_bias), each BF16 or F32,
// where the shape's spec has them (layer_weights.hpp says which) and null where it does not. The
// rows of FC1 (fc1_* and gate_up's columns) pair gate with up as the spec's GateUpLayout says. The
// runner keeps the router weight in bf16 (F32 is rounded to nearest even) and the biases in fp32 (F32
// exactly).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "mxmoe/moe_shape.hpp"
#include "mxmoe/safetensors.hpp"

namespace mxmoe {

// Where a runner's device memory comes from: the weights, and the scratch it uses while it loads
// them. allocate(bytes, context) returns device memory on the current device (256-byte aligned) or
// null when it has none; release(ptr, bytes, context) takes back what allocate gave, with the same
// size. No callbacks: cudaMalloc and cudaFree.
struct DeviceAllocator {
  void* (*allocate)(size_t bytes, void* context) = nullptr;
  void (*release)(void* ptr, size_t bytes, void* context) = nullptr;
  void* context = nullptr;
};

struct DeviceTensor {
  const void* data = nullptr;
  Dtype dtype = Dtype::kU8;
  std::vector<int64_t> shape;
};

struct DeviceLayerTensors {
  MoeShape shape{};
  DeviceTensor router_weight{}, router_bias{}, router_selection_bias{};
  DeviceTensor fc1_blocks{}, fc1_scales{}, fc2_blocks{}, fc2_scales{};  // MXFP4 experts, or
  DeviceTensor gate_up{}, down{};                                       // dense experts
  DeviceTensor fc1_bias{}, fc2_bias{};
  // The stream on which the tensors are ready: the load runs on it, and the runner's constructor
  // returns once it is done, so the tensors may be freed or changed after.
  cudaStream_t stream = nullptr;

  bool dense() const { return gate_up.data != nullptr || down.data != nullptr; }
  // Throws Error naming the first tensor that is missing (a null address) or given where the spec
  // has none, has another dtype or shape than `shape` asks for, or is misaligned (MXFP4 values and
  // dense experts: 16 bytes), and for MXFP4 and dense experts given together. Reads no device memory.
  void validate() const;
};

}  // namespace mxmoe

// Launcher of the device quantiser: dense experts in transformers' layout to MXFP4 in the checkpoint
// layout, bit for bit what quantize_mxfp4 (format/mx_blocks.cpp) gives each row on the host.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "mxmoe/safetensors.hpp"

namespace mxmoe {

// dense [experts, k, rows] (BF16 or F32, 16-byte aligned; x @ dense[e] gives the rows), quantised
// along k for each row: blocks [experts, rows, k / 32, 16] (16-byte aligned) and scales
// [experts, rows, k / 32]. k and rows are multiples of 32. Asynchronous on `stream`.
void launch_quantize_experts(const void* dense, Dtype dtype, int experts, int k, int rows, uint8_t* blocks,
                             uint8_t* scales, cudaStream_t stream);

}  // namespace mxmoe

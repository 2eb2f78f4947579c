#pragma once

#include <cuda_runtime.h>

namespace mxmoe::test {

// Dequantizes `records` packed records (device memory) into 32 x 4 x 8 floats each.
cudaError_t run_dequant_probe(const unsigned char* device_records, int records, float* device_out);

}  // namespace mxmoe::test

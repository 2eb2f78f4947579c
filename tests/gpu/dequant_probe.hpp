#pragma once

#include <cuda_runtime.h>

namespace mxmoe::test {

// Dequantizes `records` packed records (device memory) into 32 x 4 x 8 floats each: one at a time
// (dequantize_record), or `in_pairs` two at a time (dequantize_records; `records` even).
cudaError_t run_dequant_probe(const unsigned char* device_records, int records, bool in_pairs, float* device_out);

}  // namespace mxmoe::test

// Launchers of the load-time kernels that turn checkpoint-layout tensors already on the device into
// what the runner keeps: records (the bytes format/mxfp4_records.cpp's pack_records writes) and
// fp32 row vectors (pack_row_vector's), and the router weight in bf16. Asynchronous on `stream`.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "format/mxfp4_records.hpp"
#include "mxmoe/safetensors.hpp"

namespace mxmoe {

// blocks [g.experts, g.rows, g.k / 2] and scales [g.experts, g.rows, g.k / 32] (blocks 16-byte
// aligned) into g.bytes() of records (16-byte aligned). Sets *scales_out_of_range (device memory)
// to 1 where a scale code lies outside [1, 128] (scales_take_one_multiply false); leaves it
// otherwise, so several launches can share one flag.
void launch_repack_records(const RecordGeometry& g, RowOrder order, const uint8_t* blocks, const uint8_t* scales,
                           uint8_t* records, unsigned* scales_out_of_range, cudaStream_t stream);

// values [g.experts, g.rows] (BF16 or F32) into fp32 in packed row order.
void launch_pack_row_vector(const RecordGeometry& g, RowOrder order, const void* values, Dtype dtype, float* out,
                            cudaStream_t stream);

// `count` F32 values rounded to nearest even into bf16 bits.
void launch_round_to_bf16(const float* values, long long count, uint16_t* out, cudaStream_t stream);

}  // namespace mxmoe

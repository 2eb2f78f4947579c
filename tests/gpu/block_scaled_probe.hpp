#pragma once

#include <cuda_runtime.h>

namespace mxmoe::test {

// Multiplies `tiles` records of 16 rows x 64 K (device memory) by 8 MXFP8 tokens (E4M3 codes
// [8][64], each 32-K block in MMA order, kernels/block_scaled_mma.cuh; scale codes [8][2]) with the
// block-scaled inner step, one warp per record: the SM12x form on a 12.x device, the twin on any
// other. out: [tiles][16][8] floats.
cudaError_t run_block_scaled_probe(const unsigned char* records, int tiles, const unsigned char* token_codes,
                                   const unsigned char* token_scales, float* out, bool sm12x);

// Quantises `rows` bf16 rows of `k` (a multiple of 32) to MXFP8 with the GPU quantiser
// (kernels/mxfp8_quantize.cuh): codes [rows][k], each block in MMA order, scales [rows][k / 32].
cudaError_t run_mxfp8_quantize_probe(const unsigned short* x, int rows, int k, unsigned char* codes,
                                     unsigned char* scales);

}  // namespace mxmoe::test

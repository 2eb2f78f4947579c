#pragma once

#include <cuda_runtime.h>

namespace mxmoe::test {

// Which form of the block-scaled step the probe runs: the SM12x instruction (a 12.x device only),
// the twin, or the twin with the deliberately wrong scale lanes of the self-check's tests.
enum class ProbeStep { kSm120, kTwin, kTwinRowsOfOneLane };

// Multiplies `tiles` records of 16 rows x 64 K (device memory) by 8 MXFP8 tokens (E4M3 codes
// [8][64], each 32-K block in MMA order, kernels/block_scaled_mma.cuh; scale codes [8][2]) with the
// block-scaled inner step, one warp per record. out: [tiles][16][8] floats.
cudaError_t run_block_scaled_probe(const unsigned char* records, int tiles, const unsigned char* token_codes,
                                   const unsigned char* token_scales, float* out, ProbeStep step);

// Quantises `rows` bf16 rows of `k` (a multiple of 32) to MXFP8 with the GPU quantiser
// (kernels/mxfp8_quantize.cuh): codes [rows][k], each block in MMA order, scales [rows][k / 32];
// with `fp8`, as FP8 activations (one scale per 128-block, in each of its 32-blocks' codes).
cudaError_t run_mxfp8_quantize_probe(const unsigned short* x, int rows, int k, unsigned char* codes,
                                     unsigned char* scales, bool fp8 = false);

}  // namespace mxmoe::test

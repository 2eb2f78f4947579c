// Probe kernels for the GPU tests of the MXFP8 path: each warp runs one record through the
// block-scaled inner step (kernels/block_scaled_mma.cuh) against 8 MXFP8 tokens, loading its
// registers as the fragment model says, or quantises one bf16 row with the GPU quantiser
// (kernels/mxfp8_quantize.cuh), so that the tests can compare with the CPU.
#include <cuda_runtime.h>

#include <type_traits>

#include "block_scaled_probe.hpp"
#include "kernels/block_scaled_mma.cuh"
#include "kernels/mxfp8_quantize.cuh"

namespace mxmoe::test {
namespace {

// Both forms take the same registers: A from the record words, B from the token row, scale A the
// record's scale word moved for thread-id 0, scale B token g's codes of blocks 0 and 1 in bytes 0
// and 2.
template <class Step>
__global__ void block_scaled_probe_kernel(const unsigned char* records, const unsigned char* token_codes,
                                          const unsigned char* token_scales, float* out) {
  const int lane = threadIdx.x, g = lane / 4, t = lane % 4;
  const unsigned char* record = records + static_cast<long long>(blockIdx.x) * kernels::kRecordBytes;
  const uint4 v = *reinterpret_cast<const uint4*>(record + 16 * lane);
  const unsigned words[4] = {v.x, v.y, v.z, v.w};
  const unsigned scale_word = *reinterpret_cast<const unsigned*>(record + kernels::kRecordValueBytes + 4 * g);
  const auto rows = Step::row_scales(kernels::scale_a_register(scale_word, lane));
  const auto tokens = Step::token_scales(token_scales[2 * g] | static_cast<unsigned>(token_scales[2 * g + 1]) << 16);
  float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  auto step = [&](auto block) {
    constexpr int kBlock = decltype(block)::value;
    unsigned a[4];
    for (int r = 0; r < 4; ++r) a[r] = kernels::e4m3_a_register(words, kBlock, r);
    const unsigned char* row = token_codes + g * 64 + kernels::kScaleBlock * kBlock;
    const unsigned b[2] = {*reinterpret_cast<const unsigned*>(row + 4 * t),
                           *reinterpret_cast<const unsigned*>(row + 16 + 4 * t)};
    Step::template mma<kBlock>(d, a, b, rows, tokens);
  };
  step(std::integral_constant<int, 0>{});
  step(std::integral_constant<int, 1>{});
  float* o = out + static_cast<long long>(blockIdx.x) * 16 * 8;
  for (int i = 0; i < 4; ++i) o[(g + 8 * (i / 2)) * 8 + 2 * t + i % 2] = d[i];
}

// One warp per row, 8 blocks (256 K) per step; quads past the row quantise zeros and store nothing.
// With `fp8` each half-warp holds a 128-block.
__global__ void mxfp8_quantize_probe_kernel(const unsigned short* x, int k, unsigned char* codes,
                                            unsigned char* scales, bool fp8) {
  const int row = blockIdx.x, lane = threadIdx.x, q = lane % 4;
  for (int first = 0; first < k; first += 8 * kernels::kScaleBlock) {
    const int block = first / kernels::kScaleBlock + lane / 4;
    const bool inside = block * kernels::kScaleBlock < k;
    const uint4 values = inside ? *reinterpret_cast<const uint4*>(x + static_cast<long long>(row) * k +
                                                                  block * kernels::kScaleBlock + 8 * q)
                                : make_uint4(0, 0, 0, 0);
    float wide[8];
    kernels::widen_bf16x8(values, wide);
    const kernels::Mxfp8Share share = fp8 ? kernels::quantize_fp8_share(wide) : kernels::quantize_mxfp8_share(wide);
    if (!inside) continue;
    unsigned* out = reinterpret_cast<unsigned*>(codes + static_cast<long long>(row) * k + block * kernels::kScaleBlock);
    out[4 * (q / 2) + 2 * (q % 2)] = share.words[0];
    out[4 * (q / 2) + 2 * (q % 2) + 1] = share.words[1];
    if (q == 0) scales[static_cast<long long>(row) * (k / kernels::kScaleBlock) + block] = share.scale_code;
  }
}

}  // namespace

cudaError_t run_mxfp8_quantize_probe(const unsigned short* x, int rows, int k, unsigned char* codes,
                                     unsigned char* scales, bool fp8) {
  mxfp8_quantize_probe_kernel<<<rows, 32>>>(x, k, codes, scales, fp8);
  return cudaGetLastError();
}

cudaError_t run_block_scaled_probe(const unsigned char* records, int tiles, const unsigned char* token_codes,
                                   const unsigned char* token_scales, float* out, ProbeStep step) {
  using kernels::TwinScaleLanes;
  switch (step) {
    case ProbeStep::kSm120:
      block_scaled_probe_kernel<kernels::BlockScaledMmaSm120><<<tiles, 32>>>(records, token_codes, token_scales, out);
      break;
    case ProbeStep::kTwin:
      block_scaled_probe_kernel<kernels::BlockScaledMmaTwin<TwinScaleLanes::kIsa>>
          <<<tiles, 32>>>(records, token_codes, token_scales, out);
      break;
    case ProbeStep::kTwinRowsOfOneLane:
      block_scaled_probe_kernel<kernels::BlockScaledMmaTwin<TwinScaleLanes::kRowsOfOneLane>>
          <<<tiles, 32>>>(records, token_codes, token_scales, out);
      break;
  }
  return cudaGetLastError();
}

}  // namespace mxmoe::test

// A probe kernel for the GPU tests: each warp dequantizes one record with the kernels' own
// dequantize_record, or two consecutive records at once with dequantize_records (by one path for
// both, chosen from both records' scales as the host chooses it for a matrix the wgmma family
// reads), and writes every fragment element out as float, so a
// test can compare every E2M1 code under every E8M0 scale with the CPU decoder.
#include <cuda_runtime.h>

#include "dequant_probe.hpp"
#include "kernels/mxfp4_fragment.cuh"

namespace mxmoe::test {
namespace {

// out[((record * 32 + lane) * 4 + j) * 8 + 2 * reg + half]; kRecords records a warp, from record
// kRecords * blockIdx.x.
template <int kRecords>
__global__ void dequant_probe_kernel(const unsigned char* records, float* out) {
  const int first = kRecords * blockIdx.x, lane = threadIdx.x;
  uint4 values[kRecords];
  unsigned scale_words[kRecords];
  for (int i = 0; i < kRecords; ++i) {
    const unsigned char* r = records + static_cast<long long>(first + i) * kernels::kRecordBytes;
    values[i] = *reinterpret_cast<const uint4*>(r + 16 * lane);
    scale_words[i] = *reinterpret_cast<const unsigned*>(r + kernels::kRecordValueBytes + 4 * (lane / 4));
  }
  unsigned a[kRecords][4][4];
  if constexpr (kRecords == 1) {
    kernels::dequantize_record(values[0], scale_words[0], a[0], kernels::scale_codes_take_one_multiply(scale_words[0]));
  } else {
    bool one_multiply = true;  // as the host decides for a matrix: every scale code in range
    for (int i = 0; i < kRecords; ++i) one_multiply &= kernels::scale_codes_take_one_multiply(scale_words[i]);
    kernels::dequantize_records(values, scale_words, a, one_multiply);
  }
  for (int i = 0; i < kRecords; ++i) {
    for (int j = 0; j < 4; ++j) {
      for (int reg = 0; reg < 4; ++reg) {
        float* o = out + ((static_cast<long long>(first + i) * 32 + lane) * 4 + j) * 8 + 2 * reg;
        o[0] = __uint_as_float(a[i][j][reg] << 16);
        o[1] = __uint_as_float(a[i][j][reg] & 0xFFFF0000u);
      }
    }
  }
}

}  // namespace

cudaError_t run_dequant_probe(const unsigned char* device_records, int records, bool in_pairs, float* device_out) {
  if (in_pairs) {
    dequant_probe_kernel<2><<<records / 2, 32>>>(device_records, device_out);
  } else {
    dequant_probe_kernel<1><<<records, 32>>>(device_records, device_out);
  }
  return cudaGetLastError();
}

}  // namespace mxmoe::test

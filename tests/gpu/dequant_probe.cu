// A probe kernel for the GPU tests: each warp dequantizes one record with the kernels' own
// dequantize_record and writes every fragment element out as float, so a test can compare every
// E2M1 code under every E8M0 scale with the CPU decoder.
#include <cuda_runtime.h>

#include "dequant_probe.hpp"
#include "kernels/mxfp4_fragment.cuh"

namespace mxmoe::test {
namespace {

// out[((record * 32 + lane) * 4 + j) * 8 + 2 * reg + half]
__global__ void dequant_probe_kernel(const unsigned char* records, float* out) {
  const int record = blockIdx.x, lane = threadIdx.x;
  const unsigned char* r = records + static_cast<long long>(record) * kernels::kRecordBytes;
  unsigned a[4][4];
  kernels::dequantize_record(*reinterpret_cast<const uint4*>(r + 16 * lane),
                             *reinterpret_cast<const unsigned*>(r + kernels::kRecordValueBytes + 4 * (lane / 4)), a);
  for (int j = 0; j < 4; ++j) {
    for (int reg = 0; reg < 4; ++reg) {
      float* o = out + ((static_cast<long long>(record) * 32 + lane) * 4 + j) * 8 + 2 * reg;
      o[0] = __uint_as_float(a[j][reg] << 16);
      o[1] = __uint_as_float(a[j][reg] & 0xFFFF0000u);
    }
  }
}

}  // namespace

cudaError_t run_dequant_probe(const unsigned char* device_records, int records, float* device_out) {
  dequant_probe_kernel<<<records, 32>>>(device_records, device_out);
  return cudaGetLastError();
}

}  // namespace mxmoe::test

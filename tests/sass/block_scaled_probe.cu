// Both forms of the block-scaled inner step (src/kernels/block_scaled_mma.cuh) in one kernel each,
// for python/tests/test_sass.py to compile per arch and read the SASS of: the SM12x form must
// become the block-scaled QMMA.SF on sm_120a / sm_121a.
#include "kernels/block_scaled_mma.cuh"

namespace mxmoe::kernels {

// One lane's record words, token words and scale words in, the accumulators of two blocks out.
template <class Mma>
__global__ void block_scaled_probe(const uint4* records, const uint2* tokens, const uint2* scales, float4* out) {
  const uint4 v = records[threadIdx.x];
  const unsigned words[4] = {v.x, v.y, v.z, v.w};
  const uint2 b0 = tokens[2 * threadIdx.x], b1 = tokens[2 * threadIdx.x + 1];
  const uint2 s = scales[threadIdx.x];
  unsigned a[2][4];
  for (int r = 0; r < 4; ++r) {
    a[0][r] = e4m3_a_register(words, 0, r);
    a[1][r] = e4m3_a_register(words, 1, r);
  }
  const auto rows = Mma::row_scales(s.x);
  const auto token_scales = Mma::token_scales(s.y);
  float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  Mma::template mma<0>(d, a[0], {b0.x, b0.y}, rows, token_scales);
  Mma::template mma<1>(d, a[1], {b1.x, b1.y}, rows, token_scales);
  out[threadIdx.x] = make_float4(d[0], d[1], d[2], d[3]);
}

template __global__ void block_scaled_probe<BlockScaledMmaSm120>(const uint4*, const uint2*, const uint2*, float4*);
template __global__ void block_scaled_probe<BlockScaledMmaTwin<>>(const uint4*, const uint2*, const uint2*, float4*);

}  // namespace mxmoe::kernels

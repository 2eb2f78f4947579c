// The block-scaled inner step on the GPU (kernels/block_scaled_mma.cuh through the probe kernel):
// the product of packed records and MXFP8 tokens against the CPU's dense product. On a 12.x device
// this runs the block-scaled mma.sync, on any other the twin (on the H100, the E4M3 mma.sync that
// ptxas widens to f16 MMAs).
#include <gtest/gtest.h>

#include <cmath>

#include "block_scaled_probe.hpp"
#include "block_scaled_problem.hpp"
#include "gpu_test_support.hpp"

namespace mxmoe {
namespace {

TEST(GpuBlockScaled, InnerStepIsTheDenseProduct) {
  MXMOE_REQUIRE_GPU();
  int major = 0;
  MXMOE_CUDA_OK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
  for (uint64_t seed : {11u, 12u}) {
    const int tiles = 24;
    const test::BlockScaledProblem p = test::random_block_scaled_problem(seed, tiles);
    test::DeviceArray<unsigned char> records(p.records), codes(p.token_codes), scales(p.token_scales);
    test::DeviceArray<float> out(static_cast<size_t>(tiles) * 16 * 8);
    MXMOE_CUDA_OK(test::run_block_scaled_probe(records.get(), tiles, codes.get(), scales.get(), out.get(), major == 12));
    MXMOE_CUDA_OK(cudaDeviceSynchronize());
    const auto got = out.to_host();
    for (int row = 0; row < 16 * tiles; ++row) {
      for (int token = 0; token < 8; ++token) {
        // fp32 accumulation of 64 exact products: within 64 roundings of the products' magnitude.
        const double dense = p.dense(row, token), magnitude = p.dense(row, token, true);
        EXPECT_NEAR(got[row * 8 + token], dense, 64 * 0x1p-24 * magnitude + 1e-30)
            << "seed " << seed << " row " << row << " token " << token;
      }
    }
  }
}

}  // namespace
}  // namespace mxmoe

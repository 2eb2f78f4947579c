// The MXFP8 path's device pieces through the probe kernels: the block-scaled inner step
// (kernels/block_scaled_mma.cuh), the product of packed records and MXFP8 tokens against the CPU's
// dense product (on a 12.x device the block-scaled mma.sync, on any other the twin: on the H100
// the E4M3 mma.sync that ptxas widens to f16 MMAs); and the GPU quantiser
// (kernels/mxfp8_quantize.cuh) against the CPU's, bit for bit.
#include <gtest/gtest.h>

#include <cmath>

#include "block_scaled_probe.hpp"
#include "block_scaled_problem.hpp"
#include "gpu_test_support.hpp"
#include "mxmoe/bf16.hpp"
#include "mxmoe/mx_format.hpp"

namespace mxmoe {
namespace {

// The product of each probe step, [tiles][16][8].
std::vector<float> probe_product(const test::BlockScaledProblem& p, int tiles, test::ProbeStep step) {
  test::DeviceArray<unsigned char> records(p.records), codes(p.token_codes), scales(p.token_scales);
  test::DeviceArray<float> out(static_cast<size_t>(tiles) * 16 * 8);
  EXPECT_EQ(test::run_block_scaled_probe(records.get(), tiles, codes.get(), scales.get(), out.get(), step), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess) << cudaGetErrorString(cudaGetLastError());
  return out.to_host();
}

// The twin on any device (sm_89 and up), and on a 12.x device also the block-scaled instruction.
TEST(GpuBlockScaled, InnerStepIsTheDenseProduct) {
  MXMOE_REQUIRE_GPU();
  int major = 0;
  MXMOE_CUDA_OK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
  std::vector<test::ProbeStep> steps{test::ProbeStep::kTwin};
  if (major == 12) steps.push_back(test::ProbeStep::kSm120);
  for (uint64_t seed : {11u, 12u}) {
    const int tiles = 24;
    const test::BlockScaledProblem p = test::random_block_scaled_problem(seed, tiles);
    for (test::ProbeStep step : steps) {
      const auto got = probe_product(p, tiles, step);
      for (int row = 0; row < 16 * tiles; ++row) {
        for (int token = 0; token < 8; ++token) {
          // fp32 accumulation of 64 exact products: within 64 roundings of the products' magnitude.
          const double dense = p.dense(row, token), magnitude = p.dense(row, token, true);
          ASSERT_NEAR(got[row * 8 + token], dense, 64 * 0x1p-24 * magnitude + 1e-30)
              << "seed " << seed << (step == test::ProbeStep::kSm120 ? " sm120" : " twin") << " row " << row
              << " token " << token;
        }
      }
    }
  }
}

// The fault the self-check's tests build (the twin reading rows g and g + 8's scales from one lane)
// is visible in the product on the device, as the CPU emulation says it is.
TEST(GpuBlockScaled, TheTwinsWrongScaleLanesGiveAnotherProduct) {
  MXMOE_REQUIRE_GPU();
  const int tiles = 4;
  const test::BlockScaledProblem p = test::random_block_scaled_problem(13, tiles);
  const auto got = probe_product(p, tiles, test::ProbeStep::kTwinRowsOfOneLane);
  int wrong = 0;
  for (int row = 0; row < 16 * tiles; ++row) {
    for (int token = 0; token < 8; ++token) {
      const double dense = p.dense(row, token), magnitude = p.dense(row, token, true);
      wrong += std::fabs(got[row * 8 + token] - dense) > 64 * 0x1p-24 * magnitude + 1e-30;
    }
  }
  EXPECT_GT(wrong, 16 * tiles * 8 / 4);
}

// Rows of every kind of bf16: random bit patterns (blocks with NaN or infinity, zero and
// subnormal elements, ties, elements far below their block's largest), and bounded-exponent and
// unit-normal rows for fine rounding; K = 2880 leaves a partial step of the probe's 8 blocks.
std::vector<uint16_t> quantizer_rows(int rows, int k) {
  SplitMix64 rng(41);
  std::vector<uint16_t> x(static_cast<size_t>(rows) * k);
  for (int r = 0; r < rows; ++r) {
    for (int j = 0; j < k; ++j) {
      uint16_t bits = static_cast<uint16_t>(rng.next());
      if (r == 4) bits = static_cast<uint16_t>((bits & 0x807F) | ((117 + rng.next() % 20) << 7));
      if (r == 5) bits = float_to_bf16(static_cast<float>(rng.normal())).bits;
      x[static_cast<size_t>(r) * k + j] = bits;
    }
  }
  return x;
}

TEST(GpuMxfp8Quantize, MatchesTheCpuQuantiserBitForBit) {
  MXMOE_REQUIRE_GPU();
  const int rows = 6, k = 2880;
  const std::vector<uint16_t> x = quantizer_rows(rows, k);
  test::DeviceArray<uint16_t> d_x(x);
  test::DeviceArray<unsigned char> codes(x.size()), scales(x.size() / kMxBlock);
  MXMOE_CUDA_OK(test::run_mxfp8_quantize_probe(reinterpret_cast<const unsigned short*>(d_x.get()), rows, k, codes.get(),
                                               scales.get()));
  MXMOE_CUDA_OK(cudaDeviceSynchronize());
  const auto got_codes = codes.to_host();
  const auto got_scales = scales.to_host();

  std::vector<float> values(x.size());
  for (size_t i = 0; i < x.size(); ++i) values[i] = bf16_to_float(Bf16{x[i]});
  std::vector<uint8_t> expected_codes(x.size()), expected_scales(x.size() / kMxBlock);
  quantize_mxfp8(values, expected_codes, expected_scales);
  int nan_blocks = 0;
  for (size_t block = 0; block < expected_scales.size(); ++block) {
    nan_blocks += expected_scales[block] == kE8m0Nan;
    ASSERT_EQ(got_scales[block], expected_scales[block]) << "block " << block;
    for (int p = 0; p < kMxBlock; ++p) {
      ASSERT_EQ(got_codes[block * kMxBlock + p], expected_codes[block * kMxBlock + kernels::mma_order_k(p)])
          << "block " << block << " position " << p << " value "
          << values[block * kMxBlock + kernels::mma_order_k(p)];
    }
  }
  EXPECT_GT(nan_blocks, 0) << "the random rows should hold NaN and infinite blocks";
}

// The same rows as FP8 activations (quantize_fp8_share): each 128-block's four 32-blocks carry one
// scale code, and the rows decode to the CPU's FP8 values (round_activation_rows), NaN where a
// 128-block holds a NaN or an infinity; K = 2880 ends in a 64-wide 128-block. A warp's two halves
// hold two 128-blocks, one of them often NaN: the quantiser must not diverge around its shuffle.
TEST(GpuMxfp8Quantize, Fp8RowsDecodeToTheCpuRoundingWithOneScaleA128Block) {
  MXMOE_REQUIRE_GPU();
  const int rows = 6, k = 2880, blocks = k / kMxBlock;
  const std::vector<uint16_t> x = quantizer_rows(rows, k);
  test::DeviceArray<uint16_t> d_x(x);
  test::DeviceArray<unsigned char> codes(x.size()), scales(x.size() / kMxBlock);
  MXMOE_CUDA_OK(test::run_mxfp8_quantize_probe(reinterpret_cast<const unsigned short*>(d_x.get()), rows, k, codes.get(),
                                               scales.get(), true));
  MXMOE_CUDA_OK(cudaDeviceSynchronize());
  const auto got_codes = codes.to_host();
  const auto got_scales = scales.to_host();

  std::vector<uint8_t> natural(got_codes.size());  // each block back in K order
  for (size_t block = 0; block < got_scales.size(); ++block) {
    for (int p = 0; p < kMxBlock; ++p) natural[block * kMxBlock + kernels::mma_order_k(p)] = got_codes[block * kMxBlock + p];
  }
  std::vector<float> got(x.size()), expected(x.size());
  dequantize_mxfp8(natural, got_scales, got);
  for (size_t i = 0; i < x.size(); ++i) expected[i] = bf16_to_float(Bf16{x[i]});
  round_activation_rows(ActivationFormat::kFp8, expected, k);
  int nan_blocks = 0;
  for (int r = 0; r < rows; ++r) {
    for (int b = 0; b < blocks; ++b) {
      ASSERT_EQ(got_scales[r * blocks + b], got_scales[r * blocks + b / 4 * 4]) << "row " << r << " block " << b;
      nan_blocks += b % 4 == 0 && got_scales[r * blocks + b] == kE8m0Nan;
    }
  }
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_TRUE(std::isnan(expected[i]) ? std::isnan(got[i]) : got[i] == expected[i])
        << "element " << i << ": " << got[i] << " against " << expected[i] << " (x " << bf16_to_float(Bf16{x[i]}) << ")";
  }
  EXPECT_GT(nan_blocks, 0) << "the random rows should hold NaN and infinite blocks";
}

}  // namespace
}  // namespace mxmoe

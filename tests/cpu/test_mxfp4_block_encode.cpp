// The host-device block encoder that the GPU quantiser runs (format/mxfp4_block_encode.hpp) against
// the CPU quantiser (quantize_mxfp4, encode_e2m1), bit for bit: every bf16 value, the E2M1
// midpoints and the floats beside them, and blocks of every hard kind in fp32 and in bf16.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "common/random.hpp"
#include "format/mxfp4_block_encode.hpp"
#include "mxmoe/bf16.hpp"
#include "mxmoe/mx_format.hpp"
#include "quantizer_inputs.hpp"

namespace mxmoe {
namespace {

void expect_magnitude_code(float magnitude) {
  ASSERT_EQ(format::e2m1_magnitude_code(magnitude), encode_e2m1(magnitude)) << magnitude;
}

TEST(Mxfp4BlockEncode, MagnitudeCodesAreEncodeE2m1s) {
  for (uint32_t bits = 0; bits < 0x7F80; ++bits) {  // every finite non-negative bf16
    expect_magnitude_code(bf16_to_float(Bf16{static_cast<uint16_t>(bits)}));
  }
  for (float midpoint : {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f}) {
    float below = midpoint, above = midpoint;
    for (int step = 0; step < 4; ++step) {
      expect_magnitude_code(below);
      expect_magnitude_code(above);
      below = std::nextafter(below, 0.0f);
      above = std::nextafter(above, 8.0f);
    }
  }
  SplitMix64 rng(5);
  for (int i = 0; i < 200000; ++i) expect_magnitude_code(static_cast<float>(rng.uniform() * 8.0));
}

// Each block through both encoders: the same 16 bytes and the same scale code.
void expect_blocks_match(const std::vector<float>& values, const char* what) {
  const size_t blocks = values.size() / kMxBlock;
  std::vector<uint8_t> cpu_packed(values.size() / 2), cpu_scales(blocks);
  quantize_mxfp4(values, cpu_packed, cpu_scales);
  for (size_t b = 0; b < blocks; ++b) {
    uint32_t packed[4];  // little-endian words: the bytes in memory order on this host
    const uint32_t scale = format::encode_mxfp4_block(values.data() + b * kMxBlock, packed);
    ASSERT_EQ(scale, cpu_scales[b]) << what << " block " << b << " (kind " << b % 9 << ")";
    ASSERT_EQ(std::memcmp(packed, cpu_packed.data() + b * 16, 16), 0)
        << what << " block " << b << " (kind " << b % 9 << ")";
  }
}

TEST(Mxfp4BlockEncode, HardBlocksMatchTheCpuQuantiser) {
  const std::vector<float> values = test::hard_blocks(9 * 4000, 11);
  expect_blocks_match(values, "fp32");
  expect_blocks_match(test::to_float(test::to_bf16(values)), "bf16");
}

TEST(Mxfp4BlockEncode, EveryBf16ValueInBlocksMatchesTheCpuQuantiser) {
  // Blocks of 32 consecutive bf16 codes (those holding a NaN or an infinity encode as NaN blocks),
  // then the same codes shuffled so that each shares a block with unrelated magnitudes.
  std::vector<float> values(1 << 16);
  for (uint32_t bits = 0; bits < values.size(); ++bits) values[bits] = bf16_to_float(Bf16{static_cast<uint16_t>(bits)});
  expect_blocks_match(values, "consecutive");
  SplitMix64 rng(3);
  for (size_t i = values.size() - 1; i > 0; --i) std::swap(values[i], values[rng.below(static_cast<uint32_t>(i + 1))]);
  expect_blocks_match(values, "shuffled");
}

}  // namespace
}  // namespace mxmoe

// One MXFP4 block encoded by the rules of mx_format.hpp, as host-device functions: the GPU quantiser
// (load/quantize_experts.cu) runs them, and tests/cpu/test_mxfp4_block_encode.cpp holds them to the
// CPU encoder (format/mx_blocks.cpp, format/minifloat.cpp) bit for bit.
//
// The CPU encoder finds each element's code by rounding value / scale with nearbyint; here the same
// codes come from the seven midpoints between the E2M1 magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6, a tie
// going to the code with the even mantissa bit: 0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2,
// 2.5 -> 2, 3.5 -> 4, 5 -> 4. Scaling by the block scale is a multiply by a power of two; it rounds
// only where the product falls below the smallest normal float, far below the 0.25 that rounds to
// zero, and keeps the sign, as ldexp does (so needs the GPU's denormals: no flush-to-zero).
#pragma once

#include <bit>
#include <cstdint>

#include "format/record_layout.hpp"  // MXMOE_HOST_DEVICE
#include "mxmoe/mx_format.hpp"

namespace mxmoe::format {

// std::bit_cast is constexpr, so the device side compiles it too (--expt-relaxed-constexpr).
MXMOE_HOST_DEVICE uint32_t float_bits(float value) { return std::bit_cast<uint32_t>(value); }
MXMOE_HOST_DEVICE float bits_float(uint32_t bits) { return std::bit_cast<float>(bits); }

// The E2M1 magnitude code (0-7) of a finite magnitude, rounded to nearest even and saturated at 6.
MXMOE_HOST_DEVICE uint32_t e2m1_magnitude_code(float magnitude) {
  return magnitude <= 0.25f   ? 0u
         : magnitude < 0.75f  ? 1u
         : magnitude <= 1.25f ? 2u
         : magnitude < 1.75f  ? 3u
         : magnitude <= 2.5f  ? 4u
         : magnitude < 3.5f   ? 5u
         : magnitude <= 5.0f  ? 6u
                              : 7u;
}

// Encodes values[0..31] into words[0..3]: the block's 16 bytes of E2M1 pairs (byte i holds
// elements 2i, low nibble, and 2i + 1), little-endian, so element 8w + i is nibble i of word w.
// Returns the E8M0 scale code: 255 (and zero codes) for a block holding a NaN or an infinity, 0 for
// an all-zero block, else floor(log2(amax)) - 2 + 127 clamped to [0, 254].
MXMOE_HOST_DEVICE uint32_t encode_mxfp4_block(const float* values, uint32_t* words) {
  bool finite = true;
  float amax = 0.0f;
  for (int i = 0; i < kMxBlock; ++i) {
    const float magnitude = bits_float(float_bits(values[i]) & 0x7FFFFFFFu);
    finite = finite && magnitude <= 3.40282347e38f;  // false for infinities and NaNs
    amax = magnitude > amax ? magnitude : amax;
  }
  // floor(log2(amax)) - 2 + 127 is amax's exponent field less 2, clamped at 0 (the top, 254, is out
  // of a finite amax's reach); a subnormal amax (field 0) and zero clamp to 0, as they must.
  const int exponent_field = static_cast<int>(float_bits(amax) >> 23);
  const uint32_t scale = static_cast<uint32_t>(exponent_field > 2 ? exponent_field - 2 : 0);
  // 2^(127 - scale): scale <= 252, so a normal float.
  const float factor = bits_float(static_cast<uint32_t>(254 - static_cast<int>(scale)) << 23);
  for (int w = 0; w < kMxBlock / 8; ++w) {
    words[w] = 0;
    for (int i = 0; finite && i < 8; ++i) {
      const uint32_t scaled = float_bits(values[8 * w + i] * factor);
      words[w] |= (((scaled >> 28) & 0x8u) | e2m1_magnitude_code(bits_float(scaled & 0x7FFFFFFFu))) << (4 * i);
    }
  }
  return finite ? scale : 255;
}

}  // namespace mxmoe::format

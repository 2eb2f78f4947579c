// bfloat16 on the host: the activation type of every mxmoe entry point. Stored as raw bits so that
// host containers stay trivially copyable into device memory.
#pragma once

#include <bit>
#include <cstdint>

namespace mxmoe {

struct Bf16 {
  uint16_t bits = 0;
};

inline float bf16_to_float(Bf16 v) { return std::bit_cast<float>(static_cast<uint32_t>(v.bits) << 16); }

// Round to nearest even; NaN stays a (quiet) NaN, infinities stay infinities.
inline Bf16 float_to_bf16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return Bf16{static_cast<uint16_t>((u >> 16) | 0x0040u)};
  const uint32_t rounding_bias = 0x7fffu + ((u >> 16) & 1u);
  return Bf16{static_cast<uint16_t>((u + rounding_bias) >> 16)};
}

}  // namespace mxmoe

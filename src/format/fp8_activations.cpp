// FP8 activations with DeepSeek-V4's per-128 power-of-two scales, the rows of a layer's expert
// GEMM inputs rounded by activation format, and the CPU model of folding an MXFP4 element's scale
// into an E4M3 byte (the rules are in mx_format.hpp).
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <string>

#include "mxmoe/bf16.hpp"
#include "mxmoe/error.hpp"
#include "mxmoe/mx_format.hpp"

namespace mxmoe {

float fp8_activation_scale(float amax) {
  if (!std::isfinite(amax)) return NAN;
  // ceil(log2(t)) from t's bits, as the reference's kernel takes it: the exponent, plus one unless
  // the mantissa is zero. t >= 1e-4 / 448 is a normal float.
  const float t = std::max(amax, 1e-4f) * (1.0f / kE4m3Max);
  const uint32_t bits = std::bit_cast<uint32_t>(t);
  const int exponent = static_cast<int>((bits >> 23) & 0xFF) - 127 + ((bits & 0x7FFFFF) != 0 ? 1 : 0);
  return std::ldexp(1.0f, exponent);
}

void round_to_fp8_activations(std::span<float> row) {
  for (size_t first = 0; first < row.size(); first += kFp8ActivationBlock) {
    const std::span<float> block = row.subspan(first, std::min<size_t>(kFp8ActivationBlock, row.size() - first));
    float amax = 0.0f;
    for (float v : block) amax = std::isnan(v) || std::isnan(amax) ? NAN : std::max(amax, std::fabs(v));
    const float scale = fp8_activation_scale(amax);
    for (float& v : block) v = std::isnan(scale) ? NAN : decode_e4m3(encode_e4m3(v / scale)) * scale;
  }
}

void round_activation_rows(ActivationFormat format, std::span<float> values, int row_length) {
  if (row_length <= 0 || row_length % kMxBlock != 0 || values.size() % static_cast<size_t>(row_length) != 0) {
    throw Error("round_activation_rows: " + std::to_string(values.size()) + " values are no whole rows of " +
                std::to_string(row_length) + " (a positive multiple of " + std::to_string(kMxBlock) + ")");
  }
  switch (format) {
    case ActivationFormat::kBf16:
      return;
    case ActivationFormat::kMxfp8:
      round_to_mxfp8(values);
      return;
    case ActivationFormat::kFp8:
      // The quantiser reads bf16 rows: x is bf16, and FC1's SwiGLU output is bf16 both in
      // DeepSeek-V4's reference and where the GPU writes it. Rounding its float values straight to
      // E4M3 would differ where bf16 rounds onto an E4M3 midpoint (~1 element in 32).
      for (float& v : values) v = bf16_to_float(float_to_bf16(v));
      for (size_t first = 0; first < values.size(); first += static_cast<size_t>(row_length)) {
        round_to_fp8_activations(values.subspan(first, static_cast<size_t>(row_length)));
      }
      return;
  }
}

uint8_t e2m1_to_e4m3_shifted(uint8_t code, int shift) {
  if (code > 0xF || shift < 0) {
    throw Error("e2m1_to_e4m3_shifted: code " + std::to_string(code) + " and shift " + std::to_string(shift) +
                ": expected a 4-bit code and a shift >= 0");
  }
  return encode_e4m3(std::ldexp(decode_e2m1(code), -shift));
}

}  // namespace mxmoe

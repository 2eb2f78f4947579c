// E2M1 and E4M3 element codecs: one template over the bit layout, so both formats round the same
// way (nearest even, saturating). Checked exhaustively against a brute-force nearest search in
// tests/cpu/test_mx_format.cpp.
#include <array>
#include <cmath>

#include "mxmoe/mx_format.hpp"

namespace mxmoe {
namespace {

// A sign-magnitude minifloat with no infinities: `kExpBits` exponent bits with bias `kBias`,
// `kManBits` mantissa bits, exponent field 0 holds the subnormals, `kMaxCode` is the largest finite
// magnitude code (E4M3 gives up its top code to NaN).
template <int kExpBits, int kManBits, int kBias, uint8_t kMaxCode>
struct Minifloat {
  static constexpr int kCodes = 1 << (1 + kExpBits + kManBits);
  static constexpr uint8_t kSignBit = static_cast<uint8_t>(kCodes / 2);

  static float magnitude(uint8_t code) {
    const int exp_field = code >> kManBits;
    const int mantissa = code & ((1 << kManBits) - 1);
    if (exp_field == 0) return std::ldexp(static_cast<float>(mantissa), 1 - kBias - kManBits);
    return std::ldexp(static_cast<float>(mantissa + (1 << kManBits)), exp_field - kBias - kManBits);
  }

  // |value| must be finite.
  static uint8_t encode_magnitude(float magnitude_value) {
    if (magnitude_value >= magnitude(kMaxCode)) return kMaxCode;
    const int min_normal_exp = 1 - kBias;
    const int exp = magnitude_value == 0.0f ? min_normal_exp : std::max(std::ilogb(magnitude_value), min_normal_exp);
    // Dividing by the quantum 2^(exp - kManBits) is exact; nearbyint rounds half to even.
    int mantissa = static_cast<int>(std::nearbyint(std::ldexp(magnitude_value, kManBits - exp)));
    if (exp == min_normal_exp && mantissa < (1 << kManBits)) return static_cast<uint8_t>(mantissa);
    int biased_exp = exp + kBias;
    if (mantissa == (2 << kManBits)) {
      ++biased_exp;
      mantissa = 1 << kManBits;
    }
    return static_cast<uint8_t>((biased_exp << kManBits) | (mantissa - (1 << kManBits)));
  }

  static uint8_t encode(float value, uint8_t nan_code) {
    if (std::isnan(value)) return nan_code;
    const uint8_t sign = std::signbit(value) ? kSignBit : 0;
    const float magnitude_value = std::fabs(value);
    return sign | (std::isinf(magnitude_value) ? kMaxCode : encode_magnitude(magnitude_value));
  }

  static std::array<float, kCodes> decode_table(bool top_code_is_nan) {
    std::array<float, kCodes> table{};
    for (int code = 0; code < kCodes; ++code) {
      const uint8_t magnitude_code = static_cast<uint8_t>(code & (kSignBit - 1));
      const float v = (top_code_is_nan && magnitude_code == kSignBit - 1) ? NAN : magnitude(magnitude_code);
      table[code] = (code & kSignBit) ? -v : v;
    }
    return table;
  }
};

using E2m1 = Minifloat<2, 1, 1, 0x7>;
using E4m3 = Minifloat<4, 3, 7, 0x7E>;

const std::array<float, 16> kE2m1Table = E2m1::decode_table(false);
const std::array<float, 256> kE4m3Table = E4m3::decode_table(true);

}  // namespace

float decode_e2m1(uint8_t code) { return kE2m1Table[code & 0xF]; }
uint8_t encode_e2m1(float value) { return E2m1::encode(value, 0); }
float decode_e4m3(uint8_t code) { return kE4m3Table[code]; }
uint8_t encode_e4m3(float value) { return E4m3::encode(value, 0x7F); }

}  // namespace mxmoe

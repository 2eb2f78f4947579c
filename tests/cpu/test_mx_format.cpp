// Exhaustive checks of the MX element and scale codecs against brute-force oracles.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "common/random.hpp"
#include "mxmoe/bf16.hpp"
#include "mxmoe/error.hpp"
#include "mxmoe/mx_format.hpp"

namespace mxmoe {
namespace {

// gpt_oss/torch/weights.py FP4_VALUES.
constexpr float kGptOssFp4Values[16] = {+0.0f, +0.5f, +1.0f, +1.5f, +2.0f, +3.0f, +4.0f, +6.0f,
                                        -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

bool same_float(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) || (a == b && std::signbit(a) == std::signbit(b));
}

// Brute force: the nearest finite code of the value's sign; ties to the code with an even mantissa
// (lowest bit clear); past the largest finite value, that value.
uint8_t nearest_even(float value, int codes, float (*decode)(uint8_t)) {
  const uint8_t sign = std::signbit(value) ? static_cast<uint8_t>(codes / 2) : 0;
  const double magnitude = std::fabs(static_cast<double>(value));
  int best = -1;
  float max = 0.0f;
  for (int c = 0; c < codes / 2; ++c) {
    if (!std::isnan(decode(static_cast<uint8_t>(c))) && decode(static_cast<uint8_t>(c)) > max) {
      max = decode(static_cast<uint8_t>(c));
      best = c;
    }
  }
  if (magnitude >= max) return static_cast<uint8_t>(sign | best);
  double best_distance = INFINITY;
  for (int c = 0; c < codes / 2; ++c) {
    const float v = decode(static_cast<uint8_t>(c));
    if (std::isnan(v)) continue;
    const double distance = std::fabs(magnitude - v);
    if (distance < best_distance || (distance == best_distance && (c & 1) == 0)) {
      best = c;
      best_distance = distance;
    }
  }
  return static_cast<uint8_t>(sign | best);
}

// Every code's value, every midpoint between neighbours, one float either side of each, and
// values past the largest, for both signs.
std::vector<float> probe_values(int codes, float (*decode)(uint8_t)) {
  std::vector<float> magnitudes;
  std::vector<float> values;
  for (int c = 0; c < codes / 2; ++c) {
    if (!std::isnan(decode(static_cast<uint8_t>(c)))) magnitudes.push_back(decode(static_cast<uint8_t>(c)));
  }
  for (size_t i = 0; i < magnitudes.size(); ++i) {
    values.push_back(magnitudes[i]);
    if (i + 1 < magnitudes.size()) {
      const float mid = 0.5f * (magnitudes[i] + magnitudes[i + 1]);
      values.insert(values.end(), {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY)});
    }
  }
  const float max = magnitudes.back();
  values.insert(values.end(), {std::nextafter(max, INFINITY), max * 1.04f, max * 1.1f, max * 1000.0f,
                               std::numeric_limits<float>::max(), std::numeric_limits<float>::denorm_min(), 1e-30f});
  const size_t positives = values.size();
  for (size_t i = 0; i < positives; ++i) values.push_back(-values[i]);
  return values;
}

TEST(E2m1, DecodesTheGptOssTable) {
  for (int code = 0; code < 16; ++code) EXPECT_TRUE(same_float(decode_e2m1(code), kGptOssFp4Values[code])) << code;
  EXPECT_TRUE(same_float(decode_e2m1(0xF3), kGptOssFp4Values[3])) << "only the low nibble counts";
}

TEST(E2m1, EveryCodeRoundTrips) {
  for (int code = 0; code < 16; ++code) EXPECT_EQ(encode_e2m1(decode_e2m1(code)), code) << code;
}

TEST(E2m1, RoundsToNearestEvenAndSaturates) {
  for (float v : probe_values(16, decode_e2m1)) {
    EXPECT_EQ(encode_e2m1(v), nearest_even(v, 16, decode_e2m1)) << v;
  }
  EXPECT_EQ(encode_e2m1(0.25f), 0x0);   // tie 0 / 0.5 -> 0
  EXPECT_EQ(encode_e2m1(0.75f), 0x2);   // tie 0.5 / 1 -> 1
  EXPECT_EQ(encode_e2m1(2.5f), 0x4);    // tie 2 / 3 -> 2
  EXPECT_EQ(encode_e2m1(5.0f), 0x6);    // tie 4 / 6 -> 4
  EXPECT_EQ(encode_e2m1(-5.5f), 0xF);
}

TEST(E2m1, SpecialInputs) {
  EXPECT_EQ(encode_e2m1(INFINITY), 0x7);
  EXPECT_EQ(encode_e2m1(-INFINITY), 0xF);
  EXPECT_EQ(encode_e2m1(NAN), 0x0);
  EXPECT_EQ(encode_e2m1(-0.0f), 0x8);
  EXPECT_EQ(encode_e2m1(-0.1f), 0x8);
  EXPECT_EQ(encode_e2m1(std::numeric_limits<float>::denorm_min()), 0x0);
}

TEST(E4m3, DecodesEveryCode) {
  for (int code = 0; code < 256; ++code) {
    const int exp_field = (code >> 3) & 0xF, mantissa = code & 7;
    float expected = exp_field == 0 ? std::ldexp(static_cast<float>(mantissa), -9)
                                    : std::ldexp(1.0f + mantissa / 8.0f, exp_field - 7);
    if ((code & 0x7F) == 0x7F) expected = NAN;
    if (code & 0x80) expected = -expected;
    EXPECT_TRUE(same_float(decode_e4m3(code), expected)) << code;
  }
  EXPECT_EQ(decode_e4m3(0x7E), 448.0f);
  EXPECT_EQ(decode_e4m3(0x01), 0x1p-9f);
  EXPECT_EQ(decode_e4m3(0x08), 0x1p-6f);
}

TEST(E4m3, EveryFiniteCodeRoundTrips) {
  for (int code = 0; code < 256; ++code) {
    if ((code & 0x7F) == 0x7F) continue;
    EXPECT_EQ(encode_e4m3(decode_e4m3(code)), code) << code;
  }
}

TEST(E4m3, RoundsToNearestEvenAndSaturates) {
  for (float v : probe_values(256, decode_e4m3)) {
    EXPECT_EQ(encode_e4m3(v), nearest_even(v, 256, decode_e4m3)) << v;
  }
  EXPECT_EQ(encode_e4m3(464.0f), 0x7E);  // tie 448 / (480) saturates
  EXPECT_EQ(encode_e4m3(1e9f), 0x7E);
  EXPECT_EQ(encode_e4m3(INFINITY), 0x7E);
  EXPECT_EQ(encode_e4m3(-INFINITY), 0xFE);
  EXPECT_EQ(encode_e4m3(NAN), 0x7F);
  EXPECT_EQ(encode_e4m3(0x1p-10f), 0x00);  // half the smallest subnormal: tie to even (zero)
  EXPECT_EQ(encode_e4m3(0x1.8p-10f), 0x01);
}

TEST(E8m0, DecodesEveryCode) {
  for (int code = 0; code < 255; ++code) EXPECT_EQ(decode_e8m0(code), std::ldexp(1.0f, code - 127)) << code;
  EXPECT_EQ(decode_e8m0(0), 0x1p-127f);
  EXPECT_EQ(decode_e8m0(127), 1.0f);
  EXPECT_EQ(decode_e8m0(254), 0x1p127f);
  EXPECT_TRUE(std::isnan(decode_e8m0(255)));
}

TEST(E8m0, ScaleForAmax) {
  EXPECT_EQ(e8m0_for_amax(6.0f, kE2m1Emax), 127);       // 6 fits at scale 1
  EXPECT_EQ(e8m0_for_amax(8.0f, kE2m1Emax), 128);
  EXPECT_EQ(e8m0_for_amax(7.99f, kE2m1Emax), 127);      // saturates to 6 rather than a larger scale (OCP rule)
  EXPECT_EQ(e8m0_for_amax(448.0f, kE4m3Emax), 127);
  EXPECT_EQ(e8m0_for_amax(0.0f, kE2m1Emax), 0);
  EXPECT_EQ(e8m0_for_amax(std::numeric_limits<float>::denorm_min(), kE2m1Emax), 0);
  EXPECT_EQ(e8m0_for_amax(std::numeric_limits<float>::max(), kE2m1Emax), 127 + 127 - 2);
}

TEST(Mxfp4, EvenElementIsTheLowNibble) {
  std::vector<float> values(32, 0.0f);
  values[0] = 6.0f;  // sets the scale to 1
  values[1] = 0.5f;
  values[2] = -1.0f;
  std::vector<uint8_t> packed(16), scales(1);
  quantize_mxfp4(values, packed, scales);
  EXPECT_EQ(scales[0], 127);
  EXPECT_EQ(packed[0], 0x17);
  EXPECT_EQ(packed[1], 0x0A);
}

TEST(Mxfp4, BlocksMatchElementwiseEncodingAtTheSpecScale) {
  SplitMix64 rng(7);
  std::vector<float> values(32 * 64);
  for (size_t i = 0; i < values.size(); ++i) {
    values[i] = static_cast<float>(rng.normal() * std::ldexp(1.0, static_cast<int>(i / 32) % 40 - 20));
  }
  std::vector<uint8_t> packed(values.size() / 2), scales(values.size() / 32);
  quantize_mxfp4(values, packed, scales);
  std::vector<float> decoded(values.size());
  dequantize_mxfp4(packed, scales, decoded);
  for (size_t b = 0; b < scales.size(); ++b) {
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(values[b * 32 + i]));
    const int expected_scale = std::ilogb(amax) - 2 + 127;
    ASSERT_EQ(scales[b], expected_scale) << b;
    for (int i = 0; i < 32; ++i) {
      const size_t j = b * 32 + i;
      const uint8_t code = (packed[j / 2] >> (4 * (j % 2))) & 0xF;
      EXPECT_EQ(code, encode_e2m1(std::ldexp(values[j], 127 - expected_scale))) << j;
      EXPECT_EQ(decoded[j], decode_e2m1(code) * std::ldexp(1.0f, expected_scale - 127)) << j;
    }
  }
}

TEST(Mxfp4, DecodesEveryCodeAtExtremeScales) {
  uint8_t packed[16];
  for (int i = 0; i < 16; ++i) packed[i] = static_cast<uint8_t>(i | ((15 - i) << 4));
  for (int scale : {0, 1, 126, 127, 128, 253, 254, 255}) {
    float out[32];
    decode_mxfp4_block(packed, static_cast<uint8_t>(scale), out);
    for (int i = 0; i < 16; ++i) {
      const float s = decode_e8m0(static_cast<uint8_t>(scale));
      EXPECT_TRUE(same_float(out[2 * i], kGptOssFp4Values[i] * s) || (std::isnan(s) && std::isnan(out[2 * i])));
      EXPECT_TRUE(same_float(out[2 * i + 1], kGptOssFp4Values[15 - i] * s) || (std::isnan(s) && std::isnan(out[2 * i + 1])));
    }
  }
}

TEST(MxBlocks, SpecialBlocks) {
  std::vector<uint8_t> packed(16), elements(32), scales(1);
  std::vector<float> out(32);

  std::vector<float> zeros(32, 0.0f);
  quantize_mxfp4(zeros, packed, scales);
  EXPECT_EQ(scales[0], 0);
  for (uint8_t b : packed) EXPECT_EQ(b, 0);
  dequantize_mxfp4(packed, scales, out);
  for (float v : out) EXPECT_EQ(v, 0.0f);

  for (float special : {NAN, INFINITY, -INFINITY}) {
    std::vector<float> values(32, 1.0f);
    values[5] = special;
    quantize_mxfp4(values, packed, scales);
    EXPECT_EQ(scales[0], kE8m0Nan) << special;
    dequantize_mxfp4(packed, scales, out);
    for (float v : out) EXPECT_TRUE(std::isnan(v)) << special;
    quantize_mxfp8(values, elements, scales);
    EXPECT_EQ(scales[0], kE8m0Nan) << special;
    dequantize_mxfp8(elements, scales, out);
    for (float v : out) EXPECT_TRUE(std::isnan(v)) << special;
  }

  std::vector<float> denormals(32);
  for (int i = 0; i < 32; ++i) denormals[i] = std::numeric_limits<float>::denorm_min() * static_cast<float>(i + 1);
  quantize_mxfp4(denormals, packed, scales);
  EXPECT_EQ(scales[0], 0);
  dequantize_mxfp4(packed, scales, out);
  for (int i = 0; i < 32; ++i) EXPECT_LE(std::fabs(out[i] - denormals[i]), 0x1p-129f) << i;
}

TEST(Mxfp8, RoundTripErrorIsWithinHalfAQuantum) {
  SplitMix64 rng(3);
  std::vector<float> values(32 * 256);
  for (auto& v : values) v = static_cast<float>(rng.normal() * 3.0);
  std::vector<uint8_t> elements(values.size()), scales(values.size() / 32);
  quantize_mxfp8(values, elements, scales);
  std::vector<float> decoded(values.size());
  dequantize_mxfp8(elements, scales, decoded);
  for (size_t i = 0; i < values.size(); ++i) {
    const float scale = decode_e8m0(scales[i / 32]);
    const float scaled = values[i] / scale;
    if (std::fabs(scaled) > kE4m3Max) {  // the OCP scale leaves the block maximum in [256, 512): clipped
      EXPECT_EQ(decoded[i], std::copysign(kE4m3Max, scaled) * scale) << i;
      continue;
    }
    // E4M3 keeps 3 mantissa bits; below 2^-6 the quantum is that of the subnormals, 2^-9.
    const float quantum = std::ldexp(1.0f, std::max(std::ilogb(scaled), -6) - 3);
    EXPECT_LE(std::fabs(decoded[i] - values[i]), 0.5f * quantum * scale) << i;
  }
}

// DeepSeek-V4's activation scale: the power of two at or above amax / 448 (from the float product
// amax * (1/448), as its kernel computes it), amax floored at 1e-4; NaN for a non-finite amax.
TEST(Fp8Activations, ScaleIsThePowerOfTwoAtOrAboveAmaxOver448) {
  EXPECT_EQ(fp8_activation_scale(448.0f), 1.0f);
  EXPECT_EQ(fp8_activation_scale(448.0f * 8.0f), 8.0f);
  EXPECT_EQ(fp8_activation_scale(std::nextafter(448.0f, 1e9f)), 2.0f);
  EXPECT_EQ(fp8_activation_scale(1.0f), std::ldexp(1.0f, -8));  // 1/448 lies in (2^-9, 2^-8]
  EXPECT_EQ(fp8_activation_scale(0.0f), fp8_activation_scale(1e-4f));
  EXPECT_EQ(fp8_activation_scale(1e-4f), std::ldexp(1.0f, -22));  // 1e-4 / 448 = 2.2e-7, in (2^-23, 2^-22]
  EXPECT_TRUE(std::isnan(fp8_activation_scale(std::numeric_limits<float>::infinity())));
  EXPECT_TRUE(std::isnan(fp8_activation_scale(NAN)));
  SplitMix64 rng(7);
  for (int i = 0; i < 10000; ++i) {  // against double arithmetic where the float product is not a power of two
    const float amax = static_cast<float>(std::ldexp(1.0 + rng.uniform(), static_cast<int>(rng.below(60)) - 30));
    const float t = std::max(amax, 1e-4f) * (1.0f / 448.0f);
    const double expected = std::exp2(std::ceil(std::log2(static_cast<double>(t))));
    ASSERT_EQ(fp8_activation_scale(amax), static_cast<float>(expected)) << amax;
  }
}

// A row rounds in blocks of 128 from its start (the last one shorter), each to E4M3 codes times its
// own scale; values already on that grid stay; a NaN spoils its block only.
TEST(Fp8Activations, RowsRoundPerBlockOf128) {
  SplitMix64 rng(8);
  std::vector<float> row(288);
  for (size_t j = 0; j < row.size(); ++j) {
    row[j] = static_cast<float>(rng.normal() * (j < 128 ? 1.0 : j < 256 ? 50.0 : 1e-6));  // the tail: amax < 1e-4
  }
  std::vector<float> rounded = row;
  round_to_fp8_activations(rounded);
  for (size_t first = 0; first < row.size(); first += 128) {
    const size_t n = std::min<size_t>(128, row.size() - first);
    float amax = 0.0f;
    for (size_t j = 0; j < n; ++j) amax = std::max(amax, std::fabs(row[first + j]));
    const float scale = fp8_activation_scale(amax);
    for (size_t j = 0; j < n; ++j) {
      const float scaled = row[first + j] / scale;
      ASSERT_LE(std::fabs(scaled), kE4m3Max);
      ASSERT_EQ(rounded[first + j], decode_e4m3(encode_e4m3(scaled)) * scale) << first + j;
      const float quantum = std::ldexp(1.0f, std::max(std::ilogb(scaled), -6) - 3);
      ASSERT_LE(std::fabs(rounded[first + j] - row[first + j]), 0.5f * quantum * scale) << first + j;
    }
  }
  std::vector<float> again = rounded;
  round_to_fp8_activations(again);
  EXPECT_EQ(again, rounded) << "rounding is idempotent";
  row[130] = NAN;
  round_to_fp8_activations(row);
  for (size_t j = 0; j < row.size(); ++j) EXPECT_EQ(std::isnan(row[j]), j >= 128 && j < 256) << j;
  std::vector<float> not_rows(100);
  EXPECT_THROW(round_activation_rows(ActivationFormat::kFp8, not_rows, 64), Error);
  EXPECT_EQ(parse_activation_format("fp8"), ActivationFormat::kFp8);
  EXPECT_STREQ(activation_format_name(ActivationFormat::kFp8), "fp8");
}

// A layer's FP8 rows are rounded to bf16 first (the quantiser reads bf16), which decides a float
// just past an E4M3 midpoint: 1.0625 + 2^-12 rounds up to 1.125 from float, but to bf16 1.0625, a
// tie that goes to the even 1.0.
TEST(Fp8Activations, LayerRowsRoundThroughBf16) {
  std::vector<float> row(128, 0.0f);
  row[0] = 448.0f;  // scale 1
  row[1] = 1.0625f + std::ldexp(1.0f, -12);
  std::vector<float> straight = row;
  round_to_fp8_activations(straight);
  EXPECT_EQ(straight[1], 1.125f);
  std::vector<float> layer = row;
  round_activation_rows(ActivationFormat::kFp8, layer, 128);
  EXPECT_EQ(layer[1], 1.0f);
  SplitMix64 rng(9);
  std::vector<float> values(3 * 160);
  for (float& v : values) v = static_cast<float>(rng.normal() * 3.0);
  std::vector<float> via_bf16 = values;
  for (float& v : via_bf16) v = bf16_to_float(float_to_bf16(v));
  for (size_t first = 0; first < via_bf16.size(); first += 160) {
    round_to_fp8_activations(std::span(via_bf16).subspan(first, 160));
  }
  round_activation_rows(ActivationFormat::kFp8, values, 160);
  EXPECT_EQ(values, via_bf16);
}

// The CPU model of an MXFP4 element turned into E4M3 with its block's scale folded in, relative to
// its 128-block's largest scale: exact for every code up to a shift of 8; at 9 the codes worth 0.5
// and 1.5 round (ties to even: to 0 and 2^-8), and from 13 every code flushes to zero.
TEST(Fp8Activations, E2m1ToE4m3IsExactUpToAShiftOf8) {
  for (int shift = 0; shift <= 14; ++shift) {
    for (uint8_t code = 0; code < 16; ++code) {
      const float exact = std::ldexp(decode_e2m1(code), -shift);
      const float got = decode_e4m3(e2m1_to_e4m3_shifted(code, shift));
      if (shift <= kE2m1ToE4m3ExactShift) {
        EXPECT_TRUE(same_float(got, exact)) << int(code) << " shift " << shift;
      } else {
        EXPECT_EQ(std::fabs(got), decode_e4m3(encode_e4m3(std::fabs(exact)))) << int(code) << " shift " << shift;
      }
    }
  }
  EXPECT_EQ(decode_e4m3(e2m1_to_e4m3_shifted(0x1, 9)), 0.0f);                  // 0.5 * 2^-9 = 2^-10: a tie, to 0
  EXPECT_EQ(decode_e4m3(e2m1_to_e4m3_shifted(0x3, 9)), std::ldexp(1.0f, -8));  // 1.5 * 2^-9: a tie, to 2^-8
  EXPECT_EQ(decode_e4m3(e2m1_to_e4m3_shifted(0x2, 9)), std::ldexp(1.0f, -9));  // 1.0 * 2^-9: exact
  for (uint8_t code = 0; code < 16; ++code) EXPECT_EQ(decode_e4m3(e2m1_to_e4m3_shifted(code, 13)), 0.0f) << int(code);
  EXPECT_THROW(e2m1_to_e4m3_shifted(16, 0), Error);
  EXPECT_THROW(e2m1_to_e4m3_shifted(1, -1), Error);
}

TEST(MxBlocks, SizeMismatchesThrow) {
  std::vector<float> values(48);
  std::vector<uint8_t> packed(24), scales(2);
  EXPECT_THROW(quantize_mxfp4(values, packed, scales), Error);
  std::vector<float> v32(32);
  std::vector<uint8_t> p8(8), s1(1);
  EXPECT_THROW(quantize_mxfp4(v32, p8, s1), Error);
  EXPECT_THROW(dequantize_mxfp8(p8, s1, v32), Error);
}

}  // namespace
}  // namespace mxmoe

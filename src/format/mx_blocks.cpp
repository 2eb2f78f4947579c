// E8M0 scales and whole-block MXFP4 / MXFP8 encode and decode (the rules are in mx_format.hpp).
#include <algorithm>
#include <array>
#include <cmath>
#include <string>
#include <vector>

#include "mxmoe/error.hpp"
#include "mxmoe/mx_format.hpp"

namespace mxmoe {
namespace {

void check_sizes(const char* what, size_t values, size_t element_bytes, size_t expected_element_bytes,
                 size_t scales) {
  if (values % kMxBlock != 0 || element_bytes != expected_element_bytes || scales * kMxBlock != values) {
    throw Error(std::string(what) + ": " + std::to_string(values) + " values need a multiple of " +
                std::to_string(kMxBlock) + " values, " + std::to_string(expected_element_bytes) +
                " element bytes and " + std::to_string(values / kMxBlock) + " scales; got " +
                std::to_string(element_bytes) + " element bytes and " + std::to_string(scales) + " scales");
  }
}

// Shared block walk: picks each block's scale and hands the scaled element to `store(index, value)`.
template <typename Store>
void quantize_blocks(std::span<const float> values, std::span<uint8_t> scales, int elem_emax, Store store) {
  for (size_t block = 0; block < scales.size(); ++block) {
    const float* v = values.data() + block * kMxBlock;
    float amax = 0.0f;
    bool finite = true;
    for (int i = 0; i < kMxBlock; ++i) {
      finite = finite && std::isfinite(v[i]);
      amax = std::max(amax, std::fabs(v[i]));
    }
    const uint8_t scale = finite ? e8m0_for_amax(amax, elem_emax) : kE8m0Nan;
    scales[block] = scale;
    for (int i = 0; i < kMxBlock; ++i) {
      store(block * kMxBlock + i, finite ? std::ldexp(v[i], kE8m0Bias - scale) : 0.0f);
    }
  }
}

}  // namespace

float decode_e8m0(uint8_t code) {
  return code == kE8m0Nan ? NAN : std::ldexp(1.0f, static_cast<int>(code) - kE8m0Bias);
}

uint8_t e8m0_for_amax(float amax, int elem_emax) {
  if (amax == 0.0f) return 0;
  const int exp = std::ilogb(amax) - elem_emax + kE8m0Bias;
  return static_cast<uint8_t>(std::clamp(exp, 0, 254));
}

void quantize_mxfp4(std::span<const float> values, std::span<uint8_t> packed, std::span<uint8_t> scales) {
  check_sizes("quantize_mxfp4", values.size(), packed.size(), values.size() / 2, scales.size());
  std::fill(packed.begin(), packed.end(), 0);
  quantize_blocks(values, scales, kE2m1Emax, [&](size_t i, float scaled) {
    packed[i / 2] |= static_cast<uint8_t>(encode_e2m1(scaled) << (4 * (i % 2)));
  });
}

void quantize_mxfp8(std::span<const float> values, std::span<uint8_t> elements, std::span<uint8_t> scales) {
  check_sizes("quantize_mxfp8", values.size(), elements.size(), values.size(), scales.size());
  quantize_blocks(values, scales, kE4m3Emax, [&](size_t i, float scaled) { elements[i] = encode_e4m3(scaled); });
}

void round_to_mxfp8(std::span<float> values) {
  std::vector<uint8_t> elements(values.size()), scales(values.size() / kMxBlock);
  quantize_mxfp8(values, elements, scales);
  dequantize_mxfp8(elements, scales, values);
}

void decode_mxfp4_block(const uint8_t* packed, uint8_t scale, float* out) {
  const float s = decode_e8m0(scale);
  for (int i = 0; i < kMxfp4BlockBytes; ++i) {
    out[2 * i] = decode_e2m1(packed[i] & 0xF) * s;
    out[2 * i + 1] = decode_e2m1(packed[i] >> 4) * s;
  }
}

void dequantize_mxfp4(std::span<const uint8_t> packed, std::span<const uint8_t> scales, std::span<float> values) {
  check_sizes("dequantize_mxfp4", values.size(), packed.size(), values.size() / 2, scales.size());
  for (size_t block = 0; block < scales.size(); ++block) {
    decode_mxfp4_block(packed.data() + block * kMxfp4BlockBytes, scales[block], values.data() + block * kMxBlock);
  }
}

void dequantize_mxfp8(std::span<const uint8_t> elements, std::span<const uint8_t> scales, std::span<float> values) {
  check_sizes("dequantize_mxfp8", values.size(), elements.size(), values.size(), scales.size());
  for (size_t i = 0; i < values.size(); ++i) values[i] = decode_e4m3(elements[i]) * decode_e8m0(scales[i / kMxBlock]);
}

}  // namespace mxmoe

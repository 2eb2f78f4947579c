// OCP Microscaling (MX) formats on the CPU: MXFP4 (E2M1 elements) for weights and MXFP8 (E4M3
// elements) for the activation path. One E8M0 scale (a bare power of two, bias 127, 255 = NaN) covers
// kMxBlock consecutive elements along K.
//
// Packing: MXFP4 stores two elements per byte, the even element in the low nibble (as gpt-oss's
// weights.py decodes it: `lut[blk & 0x0F]` -> element 2i, `lut[blk >> 4]` -> element 2i+1).
//
// Encoding a block (round to nearest even, saturating):
//   scale = 2^(floor(log2(amax)) - emax_elem), emax_elem = 2 for E2M1 (6 = 1.5 * 2^2), 8 for E4M3
//   (448 = 1.75 * 2^8); the scale code is clamped to [0, 254]; elements are value / scale rounded
//   to nearest even and clamped to the largest finite element (+-6, +-448).
// Special blocks: a NaN or an infinity anywhere in the block makes the scale NaN (code 255), as no
// finite scale represents it; every element then decodes to NaN. An all-zero block gets scale code 0
// and zero elements. Float denormals are ordinary inputs: they land on scale code 0 (2^-127) and
// round to the nearest representable element, usually zero.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "mxmoe/error.hpp"

namespace mxmoe {

inline constexpr int kMxBlock = 32;            // elements per E8M0 scale
inline constexpr int kMxfp4BlockBytes = 16;    // bytes of packed E2M1 per block
inline constexpr uint8_t kE8m0Nan = 255;
inline constexpr int kE8m0Bias = 127;
inline constexpr int kE2m1Emax = 2;
inline constexpr int kE4m3Emax = 8;
inline constexpr float kE2m1Max = 6.0f;
inline constexpr float kE4m3Max = 448.0f;

// Elements. Codes are the low 4 bits (E2M1) or the full byte (E4M3, the OCP "FN" variant: no
// infinities, S.1111.111 is NaN). Encoding rounds to nearest even and saturates to the largest
// finite value; the sign of a value that rounds to zero is kept (-0.1 -> -0). E2M1 has no NaN code:
// encode_e2m1(NaN) returns +0 (block encoding marks such blocks NaN through the scale instead).
float decode_e2m1(uint8_t code);
uint8_t encode_e2m1(float value);
float decode_e4m3(uint8_t code);
uint8_t encode_e4m3(float value);  // NaN -> 0x7F

// Scales. decode_e8m0(c) = 2^(c - 127); 255 is NaN.
float decode_e8m0(uint8_t code);
// The scale code for a block whose largest magnitude is `amax` (finite, >= 0) and whose element type
// has largest exponent `elem_emax`.
uint8_t e8m0_for_amax(float amax, int elem_emax);

// Blocks. `values.size()` must be a multiple of kMxBlock; `packed` holds size/2 bytes (MXFP4) or
// size bytes (MXFP8); `scales` holds size/kMxBlock codes. Sizes are checked; a mismatch throws Error.
void quantize_mxfp4(std::span<const float> values, std::span<uint8_t> packed, std::span<uint8_t> scales);
void dequantize_mxfp4(std::span<const uint8_t> packed, std::span<const uint8_t> scales, std::span<float> values);
void quantize_mxfp8(std::span<const float> values, std::span<uint8_t> elements, std::span<uint8_t> scales);
void dequantize_mxfp8(std::span<const uint8_t> elements, std::span<const uint8_t> scales, std::span<float> values);

// `values` (a multiple of kMxBlock) replaced by their MXFP8 encoding's values: what a layer with
// MXFP8 activations computes with.
void round_to_mxfp8(std::span<float> values);

// FP8 activations as DeepSeek-V4's reference quantises them: per row, blocks of kFp8ActivationBlock
// along K (the last one shorter where K is not a multiple), each with one power-of-two float scale
// s = 2^ceil(log2(max(amax, 1e-4) * (1 / 448))) (the factor 1/448 rounded to float, as its kernel
// multiplies), and elements x / s rounded to E4M3 (nearest even; |x / s| <= 448 by the scale's
// choice, saturated where the float product rounds it just over). A block whose amax is not finite
// decodes to NaN throughout. fp8_activation_scale gives s for a block's amax (>= 0 or NaN: NaN and
// infinity give NaN); round_to_fp8_activations replaces a row by its decoded values.
inline constexpr int kFp8ActivationBlock = 128;
float fp8_activation_scale(float amax);
void round_to_fp8_activations(std::span<float> row);

// The activations' format in a layer's expert GEMMs: bf16, MXFP8 (E4M3 elements, one E8M0 scale per
// 32 along K), or FP8 (E4M3 elements, one power-of-two float scale per 128 along K:
// round_to_fp8_activations) for FC1's input and for FC2's (the SwiGLU output).
enum class ActivationFormat { kBf16, kMxfp8, kFp8 };
// "bf16", "mxfp8", "fp8"; parse_activation_format throws Error naming the text for anything else.
inline const char* activation_format_name(ActivationFormat format) {
  switch (format) {
    case ActivationFormat::kMxfp8: return "mxfp8";
    case ActivationFormat::kFp8: return "fp8";
    case ActivationFormat::kBf16: break;
  }
  return "bf16";
}
inline ActivationFormat parse_activation_format(std::string_view name) {
  if (name == "bf16") return ActivationFormat::kBf16;
  if (name == "mxfp8") return ActivationFormat::kMxfp8;
  if (name == "fp8") return ActivationFormat::kFp8;
  throw Error("activation format '" + std::string(name) + "': expected bf16, mxfp8 or fp8");
}
// Rows of a layer's expert GEMM inputs rounded as `format` computes with: MXFP8 per 32
// (round_to_mxfp8), FP8 per 128 (to bf16 first, then round_to_fp8_activations: the quantiser
// reads bf16 rows), bf16 left as they are. `values` holds whole rows of `row_length` (a multiple of
// kMxBlock).
void round_activation_rows(ActivationFormat format, std::span<float> values, int row_length);

// The CPU model of turning an MXFP4 element into an E4M3 byte with its 32-block's scale folded in,
// relative to the largest scale of its 128-block: the E4M3 nearest (even on ties) to
// decode_e2m1(code) * 2^-shift, shift = (the 128-block's largest scale code) - (the element's
// block's scale code) >= 0. Exact for every code while shift <= 8 (E4M3's subnormals reach 2^-9, and
// E2M1's values are multiples of 2^-1 below 2^3); at shift 9 the codes 0.5 and 1.5 round (to 0 and
// 2^-8), and past it more of them flush to zero.
uint8_t e2m1_to_e4m3_shifted(uint8_t code, int shift);
inline constexpr int kE2m1ToE4m3ExactShift = 8;

// Hot-path helper for the reference: decode one packed MXFP4 block (16 bytes, one scale) into 32
// floats.
void decode_mxfp4_block(const uint8_t* packed, uint8_t scale, float* out);

}  // namespace mxmoe

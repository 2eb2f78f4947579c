// The inner step of the MXFP8-activation tiles: one m16n8k32 MMA of a record's 16 weight rows
// (E2M1) x 8 tokens (E4M3) over one 32-K scale block, with the weights' and the tokens' E8M0
// scales. Two forms take the same registers:
//   BlockScaledMmaSm120 (sm_120a / sm_121a): mma.sync ... kind::mxf8f6f4.block_scale, the tensor
//     cores apply the scales;
//   BlockScaledMmaTwin (sm_89+, so the Hopper parts): mma.sync m16n8k32 e4m3 x e4m3 into zeros,
//     then each partial sum times the scales that the block-scaled instruction would select, taken
//     from the same scale registers by shuffles from the lanes the ISA names.
// The weights go in as E4M3 bytes in both (E2M1 is exact in E4M3, and kind::mxf8f6f4 runs E4M3 at
// the rate of its narrower types), so that only the multiply differs: a tile kernel takes the form
// as its `Step` template parameter (BlockScaledStep below picks the arch's), and everything else it
// does, its registers included, is the same code on both.
//
// Fragments (PTX ISA, "Matrix Fragments for mma.m16n8k32" with 8-bit types): lane l, g = l / 4,
// t = l % 4, MMA positions p (the K index the instruction sees) 0-31:
//   A (16 x 32): register r byte i = (row g + 8 (r % 2), p = 4 t + i + 16 (r / 2))
//   B (32 x 8):  register r byte i = (p = 4 t + i + 16 r, token g)
//   D (16 x 8):  d[i] = (row g + 8 (i / 2), token 2 t + i % 2)
// Position p is given the block's k = mma_order_k(p) (format/record_layout.hpp says why): the A
// bytes come out of the record word with no shuffle, and an MXFP8 row in that order gives a lane
// its B registers as two aligned words.
// Scales (.scale_vec::1X: one per row of A and one per token of B; the selector {byte-id,
// thread-id} is an immediate): row m's is byte byte-id of lane 4 (m % 8) + m / 8 + 2 thread-id,
// token n's byte byte-id of lane 4 n + thread-id. Both forms use thread-id 0 and byte-id 2 b for
// scale block b of a 64-K record: scale A is the record's scale word moved down a byte in the lanes
// with t = 1 (scale_a_register), scale B a token's word [s(b0), -, s(b1), -] in every lane of its
// quad (format/record_layout.hpp, MXFP8 rows). That placement is taken from the ISA's block scaling
// section and third-party probes on SM12x; it has not run on such a GPU here, so a runner checks
// the SM12x form against the bf16 tiles on first use (runner/block_scaled_check.hpp).
#pragma once

#include "kernels/mxfp4_fragment.cuh"

namespace mxmoe::kernels {

constexpr int kScaleBlock = 32;  // K per E8M0 scale, and per block-scaled MMA

// Which lane, register and byte of the m16n8k32 fragments hold an element.
struct FragmentByte {
  int lane, reg, byte;
};
MXMOE_HOST_DEVICE FragmentByte mma_k32_a_byte(int row, int position) {
  return {4 * (row % 8) + position % 16 / 4, row / 8 + 2 * (position / 16), position % 4};
}
MXMOE_HOST_DEVICE FragmentByte mma_k32_b_byte(int position, int token) {
  return {4 * token + position % 16 / 4, position / 16, position % 4};
}
MXMOE_HOST_DEVICE int scale_a_lane(int row, int thread_id) { return 4 * (row % 8) + row / 8 + 2 * thread_id; }
MXMOE_HOST_DEVICE int scale_b_lane(int token, int thread_id) { return 4 * token + thread_id; }

// byte_perm (prmt) on the host and the device: byte i of the result is byte (selector >> 4 i) & 7
// of the 8 bytes hi:lo.
MXMOE_HOST_DEVICE unsigned select_bytes(unsigned lo, unsigned hi, unsigned selector) {
#if defined(__CUDA_ARCH__)
  return __byte_perm(lo, hi, selector);
#else
  const unsigned long long bytes = (static_cast<unsigned long long>(hi) << 32) | lo;
  unsigned out = 0;
  for (int i = 0; i < 4; ++i) out |= static_cast<unsigned>((bytes >> (8 * ((selector >> (4 * i)) & 7))) & 0xFF) << (8 * i);
  return out;
#endif
}

// E4M3 bits of the E2M1 magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 (codes 0-7), four to a word.
constexpr unsigned kE2m1AsE4m3Low = 0x3C383000u, kE2m1AsE4m3High = 0x4C484440u;

// A register r (0-3) of scale block `block` (0, 1) of a record, as E4M3 bytes, from the lane's
// record words: its bytes 0-1 are the halves of the bf16 fragment register r % 2 of word
// 2 block + r / 2, bytes 2-3 those of register r % 2 + 2. Cost: 2 pair extractions (2 to 4 ops
// each), ~11 to gather the magnitudes, a byte permute, ~8 for the signs.
MXMOE_HOST_DEVICE unsigned e4m3_a_register(const unsigned (&words)[4], int block, int r) {
  const unsigned word = words[2 * block + r / 2];
  const unsigned low = e2m1_pair_bits(word, r % 2), high = e2m1_pair_bits(word, r % 2 + 2);
  // Pair bits: magnitude code (mantissa, exponent) at bits 6-8 and 22-24, signs at 15 and 31.
  const unsigned selector =
      ((low >> 6) & 7u) | ((low >> 18) & 0x70u) | ((high << 2) & 0x700u) | ((high >> 10) & 0x7000u);
  const unsigned signs = ((low >> 8) & 0x80u) | ((low >> 16) & 0x8000u) | ((high << 8) & 0x800000u) |
                         (high & 0x80000000u);
  return select_bytes(kE2m1AsE4m3Low, kE2m1AsE4m3High, selector) | signs;
}

// The record scale word of quad g ([s(g, b0), s(g + 8, b0), s(g, b1), s(g + 8, b1)]) as lane
// (g, t)'s scale-A register for thread-id 0: lanes t = 0 and 1 carry rows g and g + 8, so the
// second moves its bytes down one; block b's scales are then byte 2 b of both.
MXMOE_HOST_DEVICE unsigned scale_a_register(unsigned scale_word, int lane) { return scale_word >> (8 * (lane % 2)); }

// An E8M0 code as the float 2^(code - 127) (code 0: 2^-127, 255: NaN).
MXMOE_HOST_DEVICE float e8m0_to_float(unsigned code) {
  const unsigned bits = code == 0 ? 0x00400000u : code == 255 ? 0x7FC00000u : code << 23;
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float value;
  __builtin_memcpy(&value, &bits, 4);
  return value;
#endif
}

// Where the twin reads a scale for its accumulators: row g + 8 u's (u = 0, 1) from lane
// scale_a_lane(g + 8 u, 0), token 2 t + u's from lane scale_b_lane(2 t + u, 0), as the
// block-scaled instruction does. kRowsOfOneLane is a deliberately wrong placement (both rows from
// row g's lane), for the tests of the first-use self-check: a build whose scale placement is wrong
// must fail it.
enum class TwinScaleLanes { kIsa, kRowsOfOneLane };
MXMOE_HOST_DEVICE int twin_row_scale_lane(int lane, int upper, TwinScaleLanes lanes) {
  const int row = lane / 4 + (lanes == TwinScaleLanes::kIsa ? 8 * upper : 0);
  return scale_a_lane(row, 0);
}
MXMOE_HOST_DEVICE int twin_token_scale_lane(int lane, int token) { return scale_b_lane(2 * (lane % 4) + token, 0); }

}  // namespace mxmoe::kernels

#if defined(__CUDACC__)
// Whether the target has the block-scaled mma.sync: sm_120a / sm_121a (and their family targets).
// The family-specific macro decides: NVRTC 13.0 leaves __CUDA_ARCH_FEAT_SM121_ALL undefined for
// sm_121a, where nvcc defines it (python/tests/test_sass.py reads the SASS of both compilers).
#if defined(__CUDA_ARCH_FAMILY_SPECIFIC__) && (__CUDA_ARCH_FAMILY_SPECIFIC__ == 1200 || __CUDA_ARCH_FAMILY_SPECIFIC__ == 1210)
#define MXMOE_HAS_BLOCK_SCALED_MMA 1
#endif

namespace mxmoe::kernels {

// Both forms: row_scales(scale_a) once per record and token_scales(scale_b) once per 8-token tile
// (the scale registers as described above, both blocks), then mma<block>(d, a, b, rows, tokens):
// d += (scale_A A) (scale_B B) for one scale block, `a` E4M3 weights, `b` E4M3 tokens.
struct BlockScaledMmaSm120 {
  using RowScales = unsigned;
  using TokenScales = unsigned;
  static __device__ __forceinline__ RowScales row_scales(unsigned scale_a) { return scale_a; }
  static __device__ __forceinline__ TokenScales token_scales(unsigned scale_b) { return scale_b; }

  template <int kBlock>
  static __device__ __forceinline__ void mma(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2],
                                             RowScales scale_a, TokenScales scale_b) {
#if defined(MXMOE_HAS_BLOCK_SCALED_MMA)
    asm("mma.sync.aligned.kind::mxf8f6f4.block_scale.scale_vec::1X.m16n8k32.row.col.f32.e4m3.e4m3.f32.ue8m0 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3}, %10, {%12, %13}, %11, {%12, %13};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "r"(scale_a), "r"(scale_b),
          "n"(2 * kBlock), "n"(0));
#else
    __trap();  // block-scaled mma.sync exists on sm_120a / sm_121a only
#endif
  }
};

// The same with the plain E4M3 MMA: the block's partial sums, then times 2^(sa - 127) 2^(sb - 127)
// with sa, sb the codes the instruction above would select for each accumulator's row and token
// (twin_row_scale_lane, twin_token_scale_lane). Cost per record and per token tile: 2 shuffles and
// 4 code conversions; per MMA, 4 multiplies and 4 fused multiply-adds.
template <TwinScaleLanes kLanes = TwinScaleLanes::kIsa>
struct BlockScaledMmaTwin {
  struct RowScales {
    float scale[2][2];  // [block][row g, row g + 8]
  };
  struct TokenScales {
    float scale[2][2];  // [block][token 2 t, token 2 t + 1]
  };
  // Byte 2 b of the words from the two lanes, as floats. Call with the whole warp.
  static __device__ __forceinline__ void gather(float (&scale)[2][2], unsigned word, int lane0, int lane1) {
    const unsigned from[2] = {__shfl_sync(0xFFFFFFFFu, word, lane0), __shfl_sync(0xFFFFFFFFu, word, lane1)};
#pragma unroll
    for (int b = 0; b < 2; ++b) {
#pragma unroll
      for (int u = 0; u < 2; ++u) scale[b][u] = e8m0_to_float((from[u] >> (16 * b)) & 0xFFu);
    }
  }
  static __device__ __forceinline__ RowScales row_scales(unsigned scale_a) {
    const int lane = threadIdx.x % 32;
    RowScales r;
    gather(r.scale, scale_a, twin_row_scale_lane(lane, 0, kLanes), twin_row_scale_lane(lane, 1, kLanes));
    return r;
  }
  static __device__ __forceinline__ TokenScales token_scales(unsigned scale_b) {
    const int lane = threadIdx.x % 32;
    TokenScales t;
    gather(t.scale, scale_b, twin_token_scale_lane(lane, 0), twin_token_scale_lane(lane, 1));
    return t;
  }

  template <int kBlock>
  static __device__ __forceinline__ void mma(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2],
                                             const RowScales& rows, const TokenScales& tokens) {
    float partial[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(partial[0]), "+f"(partial[1]), "+f"(partial[2]), "+f"(partial[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      d[i] = fmaf(partial[i], rows.scale[kBlock][i / 2] * tokens.scale[kBlock][i % 2], d[i]);
    }
  }
};

// The arch's form: the tensor cores' block scaling where it exists.
#if defined(MXMOE_HAS_BLOCK_SCALED_MMA)
using BlockScaledStep = BlockScaledMmaSm120;
#else
using BlockScaledStep = BlockScaledMmaTwin<TwinScaleLanes::kIsa>;
#endif

}  // namespace mxmoe::kernels
#endif

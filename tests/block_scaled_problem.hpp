// A random problem for the block-scaled inner step's tests (CPU emulation and GPU probe): packed
// records of 16-row tiles x 64 K, 8 MXFP8 tokens (each 32-K block of codes in MMA order,
// kernels/block_scaled_mma.cuh), and both operands dequantised for the dense product.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "common/random.hpp"
#include "format/mxfp4_records.hpp"
#include "kernels/block_scaled_mma.cuh"
#include "mxmoe/mx_format.hpp"

namespace mxmoe::test {

struct BlockScaledProblem {
  RecordGeometry g;
  std::vector<uint8_t> records;                    // row tiles x one 64-K record
  std::vector<uint8_t> token_codes, token_scales;  // [8][64] E4M3 in MMA order, [8][2] E8M0
  std::vector<float> weights, tokens;              // dense [rows][64], [8][64]

  // Sum over K of weight row `row` times token `token` (`absolute`: of the products' magnitudes),
  // in double.
  double dense(int row, int token, bool absolute = false) const {
    double sum = 0;
    for (int k = 0; k < 64; ++k) {
      const double product = static_cast<double>(weights[row * 64 + k]) * tokens[token * 64 + k];
      sum += absolute ? std::fabs(product) : product;
    }
    return sum;
  }
};

// Weight scales 110-139 and tokens in [-13.7, 13.7] times 2^-4 .. 2^4 per 32-K block (so that the
// tokens' scales differ and a step that takes one token's scale for another's shows): every
// product finite.
inline BlockScaledProblem random_block_scaled_problem(uint64_t seed, int row_tiles) {
  BlockScaledProblem p{{1, 16 * row_tiles, 64}, {}, {}, {}, {}, {}};
  SplitMix64 rng(seed);
  std::vector<uint8_t> blocks(static_cast<size_t>(p.g.rows) * 32), scales(static_cast<size_t>(p.g.rows) * 2);
  for (auto& b : blocks) b = static_cast<uint8_t>(rng.next());
  for (auto& s : scales) s = static_cast<uint8_t>(110 + rng.next() % 30);
  p.records = pack_records(p.g, RowOrder::kIdentity, blocks, scales);
  p.weights.resize(static_cast<size_t>(p.g.rows) * 64);
  dequantize_mxfp4(blocks, scales, p.weights);

  std::vector<float> x(8 * 64);
  for (size_t block = 0; block < x.size() / 32; ++block) {
    const float magnitude = std::ldexp(0.0137f, static_cast<int>(rng.next() % 9) - 4);
    for (int i = 0; i < 32; ++i) x[block * 32 + i] = static_cast<float>(static_cast<int>(rng.next() % 2001) - 1000) * magnitude;
  }
  std::vector<uint8_t> codes(x.size());
  p.token_scales.resize(8 * 2);
  quantize_mxfp8(x, codes, p.token_scales);
  p.tokens.resize(x.size());
  dequantize_mxfp8(codes, p.token_scales, p.tokens);
  p.token_codes.resize(codes.size());
  for (int n = 0; n < 8; ++n) {
    for (int k = 0; k < 64; ++k) {
      const int block = k / kernels::kScaleBlock;
      p.token_codes[n * 64 + k] = codes[n * 64 + kernels::kScaleBlock * block + kernels::mma_order_k(k % kernels::kScaleBlock)];
    }
  }
  return p;
}

}  // namespace mxmoe::test

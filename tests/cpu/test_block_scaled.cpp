// The block-scaled inner step's host half (kernels/block_scaled_mma.cuh): its fragment model is a
// bijection onto the warp's registers, and an emulation of both forms of the MMA (the SM12x
// instruction's scale selection and the twin's software scales) over records packed by the
// repacker and MXFP8 token rows quantised by the CPU format code gives the dense product.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <set>
#include <vector>

#include "block_scaled_problem.hpp"
#include "kernels/block_scaled_mma.cuh"
#include "mxmoe/mx_format.hpp"

namespace mxmoe {
namespace {

using kernels::kScaleBlock;

TEST(BlockScaled, FragmentModelIsABijection) {
  std::set<int> positions, a_bytes, b_bytes;
  for (int p = 0; p < kScaleBlock; ++p) positions.insert(kernels::mma_order_k(p));
  EXPECT_EQ(positions.size(), 32u);
  EXPECT_EQ(*positions.rbegin(), 31);
  for (int row = 0; row < 16; ++row) {
    for (int p = 0; p < kScaleBlock; ++p) {
      const auto s = kernels::mma_k32_a_byte(row, p);
      a_bytes.insert((s.lane * 4 + s.reg) * 4 + s.byte);
    }
  }
  for (int p = 0; p < kScaleBlock; ++p) {
    for (int token = 0; token < 8; ++token) {
      const auto s = kernels::mma_k32_b_byte(p, token);
      ASSERT_LT(s.reg, 2);
      b_bytes.insert((s.lane * 2 + s.reg) * 4 + s.byte);
    }
  }
  EXPECT_EQ(a_bytes.size(), 32u * 4 * 4);
  EXPECT_EQ(b_bytes.size(), 32u * 2 * 4);
  std::set<int> scale_lanes;
  for (int row = 0; row < 16; ++row) scale_lanes.insert(kernels::scale_a_lane(row, 0));
  EXPECT_EQ(scale_lanes.size(), 16u);
}

TEST(BlockScaled, E2m1CodesBecomeTheSameE4m3Values) {
  for (unsigned code = 0; code < 16; ++code) {
    // One code in every element: each byte of each register decodes to the code's value.
    unsigned words[4] = {};
    for (int w = 0; w < 4; ++w) {
      for (int reg = 0; reg < 4; ++reg) {
        for (int half = 0; half < 2; ++half) words[w] |= kernels::e2m1_place_code(code, reg, half);
      }
    }
    for (int block = 0; block < 2; ++block) {
      for (int r = 0; r < 4; ++r) {
        const unsigned bytes = kernels::e4m3_a_register(words, block, r);
        for (int i = 0; i < 4; ++i) {
          EXPECT_EQ(decode_e4m3(static_cast<uint8_t>(bytes >> (8 * i))), decode_e2m1(static_cast<uint8_t>(code)))
              << "code " << code << " register " << r << " byte " << i;
        }
      }
    }
  }
}

using Problem = test::BlockScaledProblem;

// What lane `lane` hands one block's MMA: A (record row tile `row_tile`), B (the tokens' words at
// bytes 4 t and 16 + 4 t of the block) and the record's scale word.
struct LaneRegisters {
  unsigned a[4], b[2], scale_word;
};
LaneRegisters lane_registers(const Problem& p, int row_tile, int block, int lane) {
  LaneRegisters r;
  const uint8_t* record = p.records.data() + static_cast<size_t>(row_tile) * kernels::kRecordBytes;
  unsigned words[4];
  std::memcpy(words, record + 16 * lane, 16);
  for (int i = 0; i < 4; ++i) r.a[i] = kernels::e4m3_a_register(words, block, i);
  const uint8_t* row = p.token_codes.data() + (lane / 4) * 64 + kScaleBlock * block;
  std::memcpy(&r.b[0], row + 4 * (lane % 4), 4);
  std::memcpy(&r.b[1], row + 16 + 4 * (lane % 4), 4);
  std::memcpy(&r.scale_word, record + kernels::kRecordValueBytes + 4 * (lane / 4), 4);
  return r;
}

uint8_t byte_of(unsigned word, int byte) { return static_cast<uint8_t>(word >> (8 * byte)); }

// The instruction as the PTX ISA describes it, from the registers the fragment model names:
// sum over positions of A x B, times the selected scales. `twin`: the partial sums first, then the
// lane's own scales (BlockScaledMmaTwin); else the SM12x selection with {byte 2 block, thread 0}.
double emulate(const std::vector<LaneRegisters>& warp, const Problem& p, int block, int row, int token, bool twin) {
  double sum = 0;
  for (int position = 0; position < kScaleBlock; ++position) {
    const auto a = kernels::mma_k32_a_byte(row, position);
    const auto b = kernels::mma_k32_b_byte(position, token);
    sum += static_cast<double>(decode_e4m3(byte_of(warp[a.lane].a[a.reg], a.byte))) *
           decode_e4m3(byte_of(warp[b.lane].b[b.reg], b.byte));
  }
  const int byte = 2 * block;
  if (twin) {
    // The D lane of (row, token) applies its own scale word's row byte and its tokens' codes.
    const int lane = 4 * (row % 8) + (token % 8) / 2;
    const unsigned row_code = byte_of(warp[lane].scale_word, byte + row / 8);
    const unsigned token_code = p.token_scales[token * 2 + block];
    return sum * kernels::e8m0_to_float(row_code) * kernels::e8m0_to_float(token_code);
  }
  const int a_lane = kernels::scale_a_lane(row, 0), b_lane = kernels::scale_b_lane(token, 0);
  const unsigned scale_a = kernels::scale_a_register(warp[a_lane].scale_word, a_lane);
  // Token n's scale register in lane 4 n: its codes of blocks 0 and 1 in bytes 0 and 2.
  const unsigned scale_b = p.token_scales[(b_lane / 4) * 2] | (p.token_scales[(b_lane / 4) * 2 + 1] << 16);
  return sum * kernels::e8m0_to_float(byte_of(scale_a, byte)) * kernels::e8m0_to_float(byte_of(scale_b, byte));
}

TEST(BlockScaled, EmulatedMmasOfRecordsAndMxfp8TokensAreTheDenseProduct) {
  for (uint64_t seed : {1u, 2u, 3u}) {
    const Problem p = test::random_block_scaled_problem(seed, 2);
    for (int row_tile = 0; row_tile < p.g.row_tiles(); ++row_tile) {
      for (bool twin : {false, true}) {
        double result[16][8] = {};
        for (int block = 0; block < 2; ++block) {
          std::vector<LaneRegisters> warp;
          for (int lane = 0; lane < 32; ++lane) warp.push_back(lane_registers(p, row_tile, block, lane));
          for (int row = 0; row < 16; ++row) {
            for (int token = 0; token < 8; ++token) result[row][token] += emulate(warp, p, block, row, token, twin);
          }
        }
        for (int row = 0; row < 16; ++row) {
          for (int token = 0; token < 8; ++token) {
            const double dense = p.dense(16 * row_tile + row, token);
            EXPECT_NEAR(result[row][token], dense, 1e-9 * (1 + std::fabs(dense)))
                << "seed " << seed << (twin ? " twin" : " sm120") << " row " << 16 * row_tile + row << " token "
                << token;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace mxmoe

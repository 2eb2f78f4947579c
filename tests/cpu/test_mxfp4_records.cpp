// The packed record layout: round trips, and an emulation of what a warp's dequantized fragments
// hold, checked against the m16n8k16 A-fragment table of the PTX ISA (written out here on its own).
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cctype>
#include <cmath>
#include <cstring>
#include <random>
#include <set>
#include <string>

#include "common/random.hpp"
#include "format/mxfp4_records.hpp"
#include "format/record_layout.hpp"
#include "kernels/mxfp4_fragment.cuh"
#include "mxmoe/bf16.hpp"
#include "mxmoe/mx_format.hpp"

namespace mxmoe {
namespace {

struct Matrix {
  RecordGeometry g;
  std::vector<uint8_t> blocks, scales;
};

Matrix random_matrix(int experts, int rows, int k, uint64_t seed) {
  Matrix m{{experts, rows, k}, {}, {}};
  SplitMix64 rng(seed);
  m.blocks.resize(static_cast<size_t>(experts) * rows * k / 2);
  m.scales.resize(static_cast<size_t>(experts) * rows * k / 32);
  for (auto& b : m.blocks) b = static_cast<uint8_t>(rng.next());
  for (auto& s : m.scales) s = static_cast<uint8_t>(rng.next());  // every scale code, NaN included
  return m;
}

class Records : public ::testing::TestWithParam<RowOrder> {};

TEST_P(Records, RoundTripIncludingKPadding) {
  for (int k : {64, 96, 2880 / 10}) {
    const Matrix m = random_matrix(3, 48, k, 7 + k);
    const auto packed = pack_records(m.g, GetParam(), m.blocks, m.scales);
    EXPECT_EQ(packed.size(), 3u * 3 * ((k + 63) / 64) * kernels::kRecordBytes);
    std::vector<uint8_t> blocks(m.blocks.size()), scales(m.scales.size());
    unpack_records(m.g, GetParam(), packed, blocks, scales);
    EXPECT_EQ(blocks, m.blocks) << k;
    EXPECT_EQ(scales, m.scales) << k;
  }
}

// m16n8k16 A fragment (PTX ISA, "Matrix Fragments for mma.m16n8k16" with .bf16): register i of
// lane l holds elements a(2i) (low 16 bits) and a(2i+1); a0..a7 sit at
// row = groupID + 8 * ((index / 2) % 2), col = 2 * threadID_in_group + (index % 2) + 8 * (index / 4).
struct Position {
  int row, col;
};
Position a_fragment(int lane, int index) {
  const int group = lane / 4, thread_in_group = lane % 4;
  return {group + 8 * ((index / 2) % 2), 2 * thread_in_group + (index % 2) + 8 * (index / 4)};
}

// The layout's own table is the ISA's: a lane's word j holds its A fragment of the k-step at 16 j,
// and the quad's scale word names each of its rows' two 32-K blocks once.
TEST(Records, ElementTableIsTheAFragmentAndScaleWordsCoverTheirQuadsRows) {
  for (int lane = 0; lane < 32; ++lane) {
    for (int j = 0; j < 4; ++j) {
      for (int reg = 0; reg < 4; ++reg) {
        for (int half = 0; half < 2; ++half) {
          const kernels::RecordPlace e = kernels::record_element(lane, j, reg, half);
          const Position p = a_fragment(lane, 2 * reg + half);
          EXPECT_EQ(e.row, p.row) << lane << " " << j << " " << reg << " " << half;
          EXPECT_EQ(e.k, 16 * j + p.col) << lane << " " << j << " " << reg << " " << half;
        }
      }
    }
  }
  std::set<std::pair<int, int>> blocks;
  for (int g = 0; g < 8; ++g) {
    for (int byte = 0; byte < 4; ++byte) {
      const kernels::RecordPlace s = kernels::record_scale_element(g, byte);
      EXPECT_TRUE(s.row == g || s.row == g + 8) << g << " " << byte;  // the rows of quad g's lanes
      EXPECT_EQ(s.k % kMxBlock, 0);
      blocks.insert({s.row, s.k});
    }
  }
  EXPECT_EQ(blocks.size(), static_cast<size_t>(kernels::kRecordRows * kernels::kRecordK / kMxBlock));
}

TEST_P(Records, DequantizedFragmentsAreTheMatrixTiles) {
  const RowOrder order = GetParam();
  Matrix m = random_matrix(2, 32, 128, 99);
  for (auto& s : m.scales) s = static_cast<uint8_t>(100 + s % 40);  // finite scales: compare values
  const auto packed = pack_records(m.g, order, m.blocks, m.scales);
  std::vector<float> dense(m.blocks.size() * 2);
  dequantize_mxfp4(m.blocks, m.scales, dense);

  for (int e = 0; e < m.g.experts; ++e) {
    for (int rt = 0; rt < m.g.row_tiles(); ++rt) {
      for (int kt = 0; kt < m.g.k_tiles(); ++kt) {
        const uint8_t* record =
            packed.data() + ((static_cast<size_t>(e) * m.g.row_tiles() + rt) * m.g.k_tiles() + kt) * kernels::kRecordBytes;
        for (int lane = 0; lane < 32; ++lane) {
          uint32_t scale_word;
          std::memcpy(&scale_word, record + kernels::kRecordValueBytes + 4 * (lane / 4), 4);
          for (int j = 0; j < 4; ++j) {
            uint32_t word;
            std::memcpy(&word, record + 16 * lane + 4 * j, 4);
            for (int reg = 0; reg < 4; ++reg) {
              // What the kernel does: the pair's bits, times 2^126, times the row's block scale.
              const uint32_t bits = kernels::e2m1_pair_bits(word, reg);
              const bool upper_rows = reg == 1 || reg == 3;
              const uint32_t scale = (scale_word >> (8 * (2 * (j / 2) + upper_rows))) & 0xFF;
              const float factor = bf16_to_float(Bf16{static_cast<uint16_t>(kernels::e8m0_to_bf16_bits(scale))});
              for (int half = 0; half < 2; ++half) {
                const float v = bf16_to_float(Bf16{static_cast<uint16_t>(bits >> (16 * half))}) * 0x1p126f * factor;
                const Position p = a_fragment(lane, 2 * reg + half);
                const int row = m.g.checkpoint_row(16 * rt + p.row, order);
                const int k = 64 * kt + 16 * j + p.col;
                ASSERT_EQ(v, dense[(static_cast<size_t>(e) * m.g.rows + row) * m.g.k + k])
                    << "expert " << e << " tile " << rt << "/" << kt << " lane " << lane << " reg " << reg;
              }
            }
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Orders, Records, ::testing::ValuesIn(kRowOrders), [](const auto& info) {
  std::string name = row_order_name(info.param);
  for (char& c : name) c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return name;
});

TEST(Records, Fc1RowOrdersAreBijectionsPairingGluWithLinear) {
  constexpr int kRows = 5760, kIntermediate = kRows / 2;
  for (const bool concatenated : {false, true}) {
    std::set<int> seen;
    for (int packed = 0; packed < kRows; ++packed) {
      const int row = kernels::fc1_checkpoint_row(packed, kRows, concatenated);
      seen.insert(row);
      if (packed % 16 < 8) {
        const int output = 8 * (packed / 16) + packed % 8;  // glu(output) here, lin(output) 8 rows on
        EXPECT_EQ(row, concatenated ? output : 2 * output);
        EXPECT_EQ(kernels::fc1_checkpoint_row(packed + 8, kRows, concatenated),
                  concatenated ? kIntermediate + output : 2 * output + 1);
      }
    }
    EXPECT_EQ(seen.size(), static_cast<size_t>(kRows)) << concatenated;
    EXPECT_EQ(*seen.rbegin(), kRows - 1) << concatenated;
  }
}

TEST(Records, ScaleBitsDecodeEveryE8m0Code) {
  for (int s = 0; s < 256; ++s) {
    const float f = bf16_to_float(Bf16{static_cast<uint16_t>(kernels::e8m0_to_bf16_bits(s))});
    if (s == 255) {
      EXPECT_TRUE(std::isnan(f));
    } else {
      EXPECT_EQ(f, decode_e8m0(static_cast<uint8_t>(s))) << s;
    }
  }
}

// The one-add range test against the per-byte definition: every code in each byte position with
// the other three bytes drawn from the edges of the range and random codes.
TEST(Records, ScaleWordRangeTestMatchesEveryByteInOneToOneTwentyEight) {
  const uint32_t edges[] = {0, 1, 2, 64, 127, 128, 129, 200, 254, 255};
  std::mt19937 rng(7);
  auto expected = [](uint32_t word) {
    for (int i = 0; i < 4; ++i) {
      const uint32_t s = (word >> (8 * i)) & 0xFFu;
      if (s < 1 || s > 128) return false;
    }
    return true;
  };
  int checked = 0, in_range = 0;
  for (int position = 0; position < 4; ++position) {
    for (uint32_t s = 0; s < 256; ++s) {
      for (int trial = 0; trial < 64; ++trial) {
        uint32_t word = 0;
        for (int i = 0; i < 4; ++i) {
          const uint32_t other = trial % 2 == 0 ? edges[rng() % 10] : rng() % 256;
          word |= (i == position ? s : other) << (8 * i);
        }
        EXPECT_EQ(kernels::scale_codes_take_one_multiply(word), expected(word)) << std::hex << word;
        in_range += expected(word) ? 1 : 0;
        ++checked;
      }
    }
  }
  EXPECT_GT(in_range, checked / 50);  // both outcomes exercised
}

// A matrix's scales take one multiply where every code is in [1, 128]; one code outside (0, 129,
// 255) anywhere makes the whole matrix take two.
TEST(Records, MatrixScalesTakeOneMultiplyOnlyWhereEveryCodeIsInRange) {
  std::vector<uint8_t> scales(1000);
  for (size_t i = 0; i < scales.size(); ++i) scales[i] = static_cast<uint8_t>(1 + i % 128);
  EXPECT_TRUE(scales_take_one_multiply(scales));
  EXPECT_TRUE(scales_take_one_multiply({}));
  for (const uint8_t code : {0, 129, 200, 255}) {
    for (const size_t at : {size_t{0}, size_t{517}, scales.size() - 1}) {
      std::vector<uint8_t> bad = scales;
      bad[at] = code;
      EXPECT_FALSE(scales_take_one_multiply(bad)) << "code " << int{code} << " at " << at;
    }
  }
}

// The eight elements' code bits tile the 32-bit word: each bit belongs to exactly one.
TEST(Records, CodeBitsTileTheWord) {
  uint64_t seen = 0;
  for (int reg = 0; reg < 4; ++reg) {
    for (int half = 0; half < 2; ++half) {
      const uint32_t bits = kernels::e2m1_place_code(15, reg, half);
      EXPECT_EQ(std::popcount(bits), 4) << reg << " " << half;
      EXPECT_EQ(seen & bits, 0u) << reg << " " << half;
      seen |= bits;
    }
  }
  EXPECT_EQ(seen, 0xFFFFFFFFu);
}

TEST(Records, PairBitsTimesTwoTo126DecodeEveryE2m1Code) {
  for (uint32_t lo = 0; lo < 16; ++lo) {
    for (uint32_t hi = 0; hi < 16; ++hi) {
      for (int reg = 0; reg < 4; ++reg) {
        // The other registers' elements hold the complement codes, so a bit read from the wrong
        // place shows.
        uint32_t word = kernels::e2m1_place_code(lo, reg, 0) | kernels::e2m1_place_code(hi, reg, 1);
        for (int other = 0; other < 4; ++other) {
          if (other != reg) word |= kernels::e2m1_place_code(15 - lo, other, 0) | kernels::e2m1_place_code(15 - hi, other, 1);
        }
        EXPECT_EQ(kernels::e2m1_code_at(word, reg, 0), lo);
        EXPECT_EQ(kernels::e2m1_code_at(word, reg, 1), hi);
        const uint32_t bits = kernels::e2m1_pair_bits(word, reg);
        EXPECT_EQ(bf16_to_float(Bf16{static_cast<uint16_t>(bits)}) * 0x1p126f, decode_e2m1(lo)) << reg;
        EXPECT_EQ(bf16_to_float(Bf16{static_cast<uint16_t>(bits >> 16)}) * 0x1p126f, decode_e2m1(hi)) << reg;
      }
    }
  }
}

TEST(Records, BiasesFollowTheRowOrder) {
  const RecordGeometry g{2, 32, 64};
  std::vector<uint16_t> bias(64);
  for (int i = 0; i < 64; ++i) bias[i] = float_to_bf16(static_cast<float>(i)).bits;
  const auto packed = pack_row_vector(g, RowOrder::kGluLinSplit, bias);
  EXPECT_EQ(packed[0], 0.0f);   // glu of output 0
  EXPECT_EQ(packed[8], 1.0f);   // linear of output 0
  EXPECT_EQ(packed[1], 2.0f);   // glu of output 1
  EXPECT_EQ(packed[32 + 16], 32.0f + 16.0f);  // expert 1, glu of output 8
}

}  // namespace
}  // namespace mxmoe

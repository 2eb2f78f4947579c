// The block-scaled path's host half: the inner step's fragment model (kernels/block_scaled_mma.cuh)
// is a bijection onto the warp's registers, and an emulation of both forms of the MMA (the SM12x
// instruction's scale selection and the twin's software scales) over records packed by the
// repacker and MXFP8 token rows quantised by the CPU format code gives the dense product; the
// MXFP8 row layout hands each lane its B registers; the first-use check's decisions; and the fault
// build the check's GPU test uses.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <set>
#include <vector>

#include "block_scaled_problem.hpp"
#include "format/mxfp8_rows.hpp"
#include "jit/kernel_binary.hpp"
#include "kernels/block_scaled_family.hpp"
#include "kernels/block_scaled_mma.cuh"
#include "kernels/family_registry.hpp"
#include "kernels/mxfp8_quantize.cuh"
#include "mxmoe/error.hpp"
#include "mxmoe/mx_format.hpp"
#include "runner/block_scaled_check.hpp"

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

// Token n's scale-B register (every lane of quad n holds it): its codes of blocks 0 and 1 in
// bytes 0 and 2.
unsigned token_scale_register(const Problem& p, int token) {
  return p.token_scales[token * 2] | (static_cast<unsigned>(p.token_scales[token * 2 + 1]) << 16);
}

enum class Form { kSm120, kTwin, kTwinRowsOfOneLane };

// The instruction as the PTX ISA describes it, from the registers the fragment model names:
// sum over positions of A x B, times the selected scales, byte 2 block of the scale registers of
// the lanes {thread-id 0} selects (kSm120), or of the lanes the twin reads them from (the D lane of
// (row, token) shuffles from twin_row_scale_lane and twin_token_scale_lane).
double emulate(const std::vector<LaneRegisters>& warp, const Problem& p, int block, int row, int token, Form form) {
  double sum = 0;
  for (int position = 0; position < kScaleBlock; ++position) {
    const auto a = kernels::mma_k32_a_byte(row, position);
    const auto b = kernels::mma_k32_b_byte(position, token);
    sum += static_cast<double>(decode_e4m3(byte_of(warp[a.lane].a[a.reg], a.byte))) *
           decode_e4m3(byte_of(warp[b.lane].b[b.reg], b.byte));
  }
  int a_lane = kernels::scale_a_lane(row, 0), b_lane = kernels::scale_b_lane(token, 0);
  if (form != Form::kSm120) {
    const int d_lane = 4 * (row % 8) + (token % 8) / 2;
    const auto lanes = form == Form::kTwin ? kernels::TwinScaleLanes::kIsa : kernels::TwinScaleLanes::kRowsOfOneLane;
    a_lane = kernels::twin_row_scale_lane(d_lane, row / 8, lanes);
    b_lane = kernels::twin_token_scale_lane(d_lane, token % 2);
  }
  const unsigned scale_a = kernels::scale_a_register(warp[a_lane].scale_word, a_lane);
  const unsigned scale_b = token_scale_register(p, b_lane / 4);
  const int byte = 2 * block;
  return sum * kernels::e8m0_to_float(byte_of(scale_a, byte)) * kernels::e8m0_to_float(byte_of(scale_b, byte));
}

// Both forms' products of a problem's row tile, summed over its two blocks: [16][8].
std::vector<double> emulate_tile(const Problem& p, int row_tile, Form form) {
  std::vector<double> result(16 * 8, 0.0);
  for (int block = 0; block < 2; ++block) {
    std::vector<LaneRegisters> warp;
    for (int lane = 0; lane < 32; ++lane) warp.push_back(lane_registers(p, row_tile, block, lane));
    for (int row = 0; row < 16; ++row) {
      for (int token = 0; token < 8; ++token) result[row * 8 + token] += emulate(warp, p, block, row, token, form);
    }
  }
  return result;
}

TEST(BlockScaled, EmulatedMmasOfRecordsAndMxfp8TokensAreTheDenseProduct) {
  for (uint64_t seed : {1u, 2u, 3u}) {
    const Problem p = test::random_block_scaled_problem(seed, 2);
    for (int row_tile = 0; row_tile < p.g.row_tiles(); ++row_tile) {
      for (Form form : {Form::kSm120, Form::kTwin}) {
        const std::vector<double> result = emulate_tile(p, row_tile, form);
        for (int row = 0; row < 16; ++row) {
          for (int token = 0; token < 8; ++token) {
            const double dense = p.dense(16 * row_tile + row, token);
            EXPECT_NEAR(result[row * 8 + token], dense, 1e-9 * (1 + std::fabs(dense)))
                << "seed " << seed << (form == Form::kTwin ? " twin" : " sm120") << " row " << 16 * row_tile + row
                << " token " << token;
          }
        }
      }
    }
  }
}

// The twin reads its scales from the lanes the instruction selects, so that both forms take the
// same scale registers: for every accumulator of every lane, the same source lanes.
TEST(BlockScaled, TwinReadsTheScalesTheInstructionSelects) {
  for (int lane = 0; lane < 32; ++lane) {
    for (int i = 0; i < 4; ++i) {
      const int row = lane / 4 + 8 * (i / 2), token = 2 * (lane % 4) + i % 2;
      EXPECT_EQ(kernels::twin_row_scale_lane(lane, i / 2, kernels::TwinScaleLanes::kIsa), kernels::scale_a_lane(row, 0));
      EXPECT_EQ(kernels::twin_token_scale_lane(lane, i % 2), kernels::scale_b_lane(token, 0));
    }
  }
}

// The self-check's fault (rows g and g + 8 scaled alike) gives the wrong product wherever the two
// rows' scales differ, which random records make most of the time.
TEST(BlockScaled, TheTwinsWrongScaleLanesGiveAnotherProduct) {
  const Problem p = test::random_block_scaled_problem(4, 1);
  const std::vector<double> result = emulate_tile(p, 0, Form::kTwinRowsOfOneLane);
  int wrong = 0;
  for (int row = 0; row < 16; ++row) {
    for (int token = 0; token < 8; ++token) {
      const double dense = p.dense(row, token);
      wrong += std::fabs(result[row * 8 + token] - dense) > 1e-6 * (1 + std::fabs(dense));
    }
  }
  EXPECT_GT(wrong, 16);
}

// MXFP8 rows as packed for the tiles: the 16 bytes at 16 t of a row's slice are lane t's B
// registers of blocks 0 and 1 (by the fragment model, position 4 t + i + 16 r of register r byte i,
// holding the block's k = mma_order_k(position)); a half slice past K is zeros; the scale words are
// slice-major [s(b0), 0, s(b1), 0]; and unpacking gives back what was packed.
TEST(Mxfp8Rows, EachLaneFindsItsBRegistersInItsSixteenBytes) {
  const int rows = 5, k = 96, k_tiles = 2;
  SplitMix64 rng(7);
  std::vector<float> x(rows * k);
  for (auto& v : x) v = static_cast<float>(rng.normal() * 3);
  std::vector<uint8_t> codes(x.size()), scales(x.size() / kMxBlock);
  quantize_mxfp8(x, codes, scales);
  const std::vector<uint8_t> packed = pack_mxfp8_rows(codes, scales, rows, k);
  ASSERT_EQ(packed.size(), static_cast<size_t>(kernels::mxfp8_rows_bytes(rows, k)));
  for (int row = 0; row < rows; ++row) {
    for (int kt = 0; kt < k_tiles; ++kt) {
      const uint8_t* slice = packed.data() + (row * k_tiles + kt) * kernels::kMxfp8SliceBytes;
      for (int t = 0; t < 4; ++t) {
        for (int block = 0; block < 2; ++block) {
          for (int r = 0; r < 2; ++r) {
            for (int i = 0; i < 4; ++i) {
              const int position = 4 * t + i + 16 * r;
              const auto b = kernels::mma_k32_b_byte(position, 0);
              ASSERT_EQ(b.lane % 4, t);
              ASSERT_EQ(b.reg, r);
              const uint8_t got = slice[16 * t + 8 * block + 4 * r + i];
              const int column = 64 * kt + 32 * block + kernels::mma_order_k(position);
              ASSERT_EQ(got, column < k ? codes[row * k + column] : 0) << "row " << row << " column " << column;
            }
          }
        }
      }
      const uint8_t* word = packed.data() + kernels::mxfp8_codes_bytes(rows, k_tiles) + 4 * (kt * rows + row);
      EXPECT_EQ(word[0], scales[row * 3 + 2 * kt]);
      EXPECT_EQ(word[2], 2 * kt + 1 < 3 ? scales[row * 3 + 2 * kt + 1] : 0);
      EXPECT_EQ(word[1] | word[3], 0);
    }
  }
  std::vector<uint8_t> codes_back(codes.size()), scales_back(scales.size());
  unpack_mxfp8_rows(packed, rows, k, codes_back, scales_back);
  EXPECT_EQ(codes_back, codes);
  EXPECT_EQ(scales_back, scales);
  EXPECT_THROW(pack_mxfp8_rows(codes, scales, rows, 95), Error);
  EXPECT_THROW(pack_mxfp8_rows(codes, scales, rows + 1, k), Error);
}

// The first-use check runs on the 12.x archs unless forced everywhere, and passes two outputs
// only where they agree to fp32 rounding and are all finite.
TEST(BlockScaledCheck, RunsOnSm12xOrWhenForcedAndJudgesByNorm) {
  for (const Arch& arch : supported_archs()) {
    EXPECT_EQ(block_scaled_check_applies(BlockScaledCheck::kOnSm12x, arch), arch.major == 12) << arch.name;
    EXPECT_TRUE(block_scaled_check_applies(BlockScaledCheck::kAlways, arch)) << arch.name;
  }
  SplitMix64 rng(3);
  std::vector<float> expected(512);
  for (auto& v : expected) v = static_cast<float>(rng.normal());
  std::vector<float> got = expected;
  EXPECT_TRUE(judge_block_scaled_check(got, expected).passed);
  EXPECT_EQ(judge_block_scaled_check(got, expected).rel_difference, 0.0);
  for (auto& v : got) v *= 1.0f + 1e-6f;  // fp32 summation order
  EXPECT_TRUE(judge_block_scaled_check(got, expected).passed);
  got = expected;
  for (size_t i = 0; i < got.size(); i += 16) got[i] *= 2.0f;  // one misplaced scale in 16
  EXPECT_FALSE(judge_block_scaled_check(got, expected).passed);
  EXPECT_GT(judge_block_scaled_check(got, expected).rel_difference, 0.1);
  got = expected;
  got[100] = NAN;
  EXPECT_FALSE(judge_block_scaled_check(got, expected).passed);
  EXPECT_FALSE(judge_block_scaled_check({}, {}).passed);
  EXPECT_FALSE(judge_block_scaled_check(std::span(got).first(10), expected).passed);
  EXPECT_EQ(activations_of(block_scaled_check_reference()), ActivationFormat::kBf16);
}

// MXMOE_BLOCK_SCALED_FAULT builds the family with the wrong twin on every arch, under keys of its
// own (so a cache never serves one for the other); anything else in it is an error naming it.
TEST(BlockScaledCheck, TheFaultBuildIsAnotherKernel) {
  const Tactic t = parse_tactic("bsmma.r128x32.w4x1.s4.k1");
  const std::string variable(kBlockScaledFaultVariable);
  unsetenv(variable.c_str());
  EXPECT_EQ(block_scaled_step(), "mxmoe::kernels::BlockScaledStep");
  const std::string normal_key = kernel_key(t, arch_by_name("sm_120a"));
  EXPECT_NE(t.family->instantiation(t).fc2.find("BlockScaledStep"), std::string::npos);
  setenv(variable.c_str(), std::string(kBlockScaledFaultRowScaleLanes).c_str(), 1);
  EXPECT_NE(t.family->instantiation(t).fc2.find("TwinScaleLanes::kRowsOfOneLane"), std::string::npos);
  EXPECT_NE(kernel_key(t, arch_by_name("sm_120a")), normal_key);
  setenv(variable.c_str(), "typo", 1);
  try {
    block_scaled_step();
    ADD_FAILURE() << "a fault it does not know was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(variable), std::string::npos) << e.what();
  }
  unsetenv(variable.c_str());
  EXPECT_EQ(kernel_key(t, arch_by_name("sm_120a")), normal_key);
}

}  // namespace
}  // namespace mxmoe

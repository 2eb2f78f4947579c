// The load kernels' steps (load/repack_records.cuh, load/quantize_experts.cuh) run on the CPU as a
// CTA runs them, each phase for every thread before the next, item after item: the repack against
// pack_records and scales_take_one_multiply, the quantiser against the CPU quantiser. The staging
// is poisoned before every item and the outputs before the run, so a byte read before it was staged
// or never written shows. tests/gpu/test_gpu_load.cpp runs the same cases on the device.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/random.hpp"
#include "format/mxfp4_records.hpp"
#include "load/quantize_experts.cuh"
#include "load/repack_records.cuh"
#include "mxmoe/layer_weights.hpp"
#include "mxmoe/mx_format.hpp"
#include "quantizer_inputs.hpp"

namespace mxmoe {
namespace {

struct Repacked {
  std::vector<uint8_t> records;
  bool out_of_range = false;
};

Repacked emulate_repack(const RecordGeometry& g, RowOrder order, const std::vector<uint8_t>& blocks,
                        const std::vector<uint8_t>& scales) {
  Repacked r{std::vector<uint8_t>(g.bytes(), 0xA5)};
  const load::RepackArgs a = load::repack_args(g, order, blocks.data(), scales.data(), r.records.data());
  auto stage = std::make_unique<load::RepackStage>();
  for (long long item = 0; item < a.items; ++item) {
    std::memset(stage.get(), 0xEE, sizeof(load::RepackStage));
    for (int t = 0; t < load::kRepackThreads; ++t) r.out_of_range |= load::stage_repack_item(a, item, t, *stage);
    for (int t = 0; t < load::kRepackThreads; ++t) load::write_record(a, item, t / 32, t % 32, *stage);
  }
  return r;
}

void expect_repack_matches(const RecordGeometry& g, const std::vector<uint8_t>& blocks,
                           const std::vector<uint8_t>& scales, const std::string& what) {
  for (RowOrder order : kRowOrders) {
    const Repacked got = emulate_repack(g, order, blocks, scales);
    const std::vector<uint8_t> expected = pack_records(g, order, blocks, scales);
    ASSERT_EQ(got.records.size(), expected.size());
    const auto at = std::mismatch(got.records.begin(), got.records.end(), expected.begin());
    ASSERT_TRUE(at.first == got.records.end())
        << what << " " << row_order_name(order) << ": record "
        << (at.first - got.records.begin()) / kernels::kRecordBytes << " byte "
        << (at.first - got.records.begin()) % kernels::kRecordBytes;
    EXPECT_EQ(!got.out_of_range, scales_take_one_multiply(scales)) << what;
  }
}

std::vector<uint8_t> random_bytes(size_t n, uint64_t seed, int lo = 0, int count = 256) {
  SplitMix64 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(lo + static_cast<int>(rng.below(count)));
  return v;
}

TEST(LoadKernelSteps, RepackOfEveryCodeUnderEveryScaleIsPackRecords) {
  // Row r's block b has scale (r + 131 b) % 256 and holds every code twice.
  const RecordGeometry g{1, 256, 64};
  std::vector<uint8_t> blocks(256 * 32), scales(256 * 2);
  for (int r = 0; r < 256; ++r) {
    for (int b = 0; b < 2; ++b) {
      scales[r * 2 + b] = static_cast<uint8_t>((r + 131 * b) % 256);
      for (int i = 0; i < kMxBlock; ++i) {
        const int element = r * 64 + b * kMxBlock + i;
        blocks[element / 2] |= static_cast<uint8_t>(((i + r + 3 * b) % 16) << (4 * (element % 2)));
      }
    }
  }
  expect_repack_matches(g, blocks, scales, "every code x every scale");
}

TEST(LoadKernelSteps, RepackOfOddKAndGptOssShapesIsPackRecords) {
  uint64_t seed = 20;
  for (const RecordGeometry& g : {RecordGeometry{5, 320, 96}, RecordGeometry{5, 96, 160}, RecordGeometry{2, 32, 32},
                                  RecordGeometry{3, 48, 608}, RecordGeometry{1, 5760, 2880}}) {
    const size_t values = static_cast<size_t>(g.experts) * g.rows * g.k;
    const std::vector<uint8_t> blocks = random_bytes(values / 2, ++seed);
    const std::string what =
        std::string("E") + std::to_string(g.experts) + " rows " + std::to_string(g.rows) + " K " + std::to_string(g.k);
    expect_repack_matches(g, blocks, random_bytes(values / kMxBlock, ++seed), what + ", all scales");
    std::vector<uint8_t> in_range = random_bytes(values / kMxBlock, ++seed, 1, 128);
    expect_repack_matches(g, blocks, in_range, what + ", in-range scales");
    in_range.back() = 129;
    expect_repack_matches(g, blocks, in_range, what + ", one code 129 at the end");
  }
}

TEST(LoadKernelSteps, PackedRowValuesArePackRowVectors) {
  const RecordGeometry g{3, 320, 96};
  const std::vector<Bf16> bf16 = make_activations(g.experts, g.rows, 4);
  const auto* bits = reinterpret_cast<const uint16_t*>(bf16.data());
  for (RowOrder order : kRowOrders) {
    const std::vector<float> expected = pack_row_vector(g, order, std::span(bits, bf16.size()));
    for (size_t i = 0; i < expected.size(); ++i) {
      ASSERT_EQ(load::packed_row_value(bits, g.rows, static_cast<int>(order), static_cast<long long>(i)), expected[i])
          << row_order_name(order) << " " << i;
    }
  }
}

// The quantiser's steps over dense [experts, k, rows] given as T (uint16_t: bf16 bits, or float).
template <typename T>
test::Quantized emulate_quantize(const std::vector<T>& dense, int experts, int k, int rows) {
  test::Quantized q{std::vector<uint8_t>(dense.size() / 2, 0xA5), std::vector<uint8_t>(dense.size() / kMxBlock, 0xA5)};
  const load::QuantizeArgs a = load::quantize_args(dense.data(), experts, k, rows, q.blocks.data(), q.scales.data());
  auto stage = std::make_unique<load::QuantizeStage>();
  for (long long item = 0; item < a.items; ++item) {
    for (auto& row : stage->tile) std::fill(std::begin(row), std::end(row), NAN);
    for (int t = 0; t < load::kQuantizeThreads; ++t) load::stage_quantize_item<T>(a, item, t, *stage);
    for (int t = 0; t < load::kQuantizeThreads; ++t) load::encode_quantize_item(a, item, t / 32, t % 32, *stage);
    for (int t = 0; t < load::kQuantizeThreads; ++t) load::write_quantize_item(a, item, t, *stage);
  }
  return q;
}

TEST(LoadKernelSteps, QuantiserIsTheCpuQuantiserInBf16AndFp32) {
  struct Case {
    int experts, k, rows;
  };
  uint64_t seed = 30;
  for (const Case c : {Case{3, 96, 320}, Case{2, 160, 96}, Case{1, 2880, 320}}) {
    const std::string what =
        std::string("[") + std::to_string(c.experts) + ", " + std::to_string(c.k) + ", " + std::to_string(c.rows) + "]";
    const std::vector<float> values = test::hard_dense_experts(c.experts, c.k, c.rows, ++seed);
    const test::Quantized fp32 = emulate_quantize(values, c.experts, c.k, c.rows);
    const test::Quantized fp32_cpu = test::quantize_dense_on_cpu(values, c.experts, c.k, c.rows);
    EXPECT_EQ(fp32.scales, fp32_cpu.scales) << "F32 " << what;
    EXPECT_EQ(fp32.blocks, fp32_cpu.blocks) << "F32 " << what;

    const std::vector<Bf16> bf16 = test::to_bf16(values);
    std::vector<uint16_t> bits(bf16.size());
    for (size_t i = 0; i < bf16.size(); ++i) bits[i] = bf16[i].bits;
    const test::Quantized got = emulate_quantize(bits, c.experts, c.k, c.rows);
    const test::Quantized cpu = test::quantize_dense_on_cpu(test::to_float(bf16), c.experts, c.k, c.rows);
    EXPECT_EQ(got.scales, cpu.scales) << "BF16 " << what;
    EXPECT_EQ(got.blocks, cpu.blocks) << "BF16 " << what;
  }
}

}  // namespace
}  // namespace mxmoe

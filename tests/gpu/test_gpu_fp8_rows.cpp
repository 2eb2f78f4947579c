// The GPU's FP8 rounding of bf16 rows (route/fp8_round_rows_kernel.cuh) against the CPU rule
// (round_to_fp8_activations), bit for bit: random rows at many magnitudes, rows whose length ends
// in a short 128-block, blocks below the 1e-4 floor, blocks at E4M3's midpoints (ties to even),
// blocks holding a NaN or an infinity, in place and out of place, and a row count that leaves the
// rows past it alone. The GEMV-style kernels' rounding of the rows they stage: FC1's output on x
// as given equals, bit for bit, the same kernel's on x rounded by the CPU. And a runner asked for
// FP8 activations plans them at every T and computes the FP8 reference's output, not the bf16
// one's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/random.hpp"
#include "gpu_test_support.hpp"
#include "kernels/family_registry.hpp"
#include "mxmoe/bf16.hpp"
#include "mxmoe/mx_format.hpp"
#include "mxmoe/reference.hpp"
#include "runner/route_launch.hpp"
#include "runner/workspace.hpp"

namespace mxmoe {
namespace {

using namespace test;  // NOLINT: the shared GPU test helpers

constexpr uint16_t kPoison = 0xFFFF;  // a bf16 NaN the kernel never writes

std::vector<Bf16> hard_rows(int rows, int row_length, uint64_t seed) {
  SplitMix64 rng(seed);
  std::vector<Bf16> values(static_cast<size_t>(rows) * row_length);
  for (int r = 0; r < rows; ++r) {
    const double magnitude = std::ldexp(1.0, static_cast<int>(r * 13 % 80) - 40);
    for (int j = 0; j < row_length; ++j) {
      values[static_cast<size_t>(r) * row_length + j] = float_to_bf16(static_cast<float>(rng.normal() * magnitude));
    }
  }
  const int blocks = (row_length + 127) / 128;
  auto block = [&](int r, int b) { return values.data() + static_cast<size_t>(r) * row_length + 128 * b; };
  auto block_length = [&](int b) { return std::min(128, row_length - 128 * b); };
  // Only the rows that exist (one token's x is one row). Row 0: block 0 with amax 448 and ties between
  // E4M3 neighbours (to even: 1.0625 -> 1, 1.1875 -> 1.25, -3.375 -> -3.5, 232 -> 224, 432 -> 448, 3 x
  // 2^-10 -> 2^-8 below the normals) with the bf16s just above and below each; block 1 under the 1e-4
  // floor; block 2 all zeros, one -0.
  Bf16* b0 = block(0, 0);
  b0[0] = float_to_bf16(448.0f);
  const float ties[] = {1.0625f, 1.1875f, -3.375f, 232.0f, 432.0f, 0.0029296875f};
  for (int i = 0; i < 6; ++i) {
    const uint16_t bits = float_to_bf16(ties[i]).bits;
    b0[1 + 3 * i] = Bf16{bits};
    b0[2 + 3 * i] = Bf16{static_cast<uint16_t>(bits + 1)};
    b0[3 + 3 * i] = Bf16{static_cast<uint16_t>(bits - 1)};
  }
  if (blocks > 1) {
    for (int j = 0; j < block_length(1); ++j) block(0, 1)[j] = float_to_bf16(static_cast<float>(rng.normal() * 1e-6));
    if (rows > 1) block(1, 1)[17] = float_to_bf16(NAN);  // row 1: a NaN in block 1
  }
  if (blocks > 2) {
    for (int j = 0; j < block_length(2); ++j) block(0, 2)[j] = float_to_bf16(0.0f);
    block(0, 2)[5] = float_to_bf16(-0.0f);
    if (rows > 1) block(1, 2)[3] = float_to_bf16(INFINITY);  // row 1: an infinity in block 2
  }
  if (rows > 2) block(2, 0)[block_length(0) - 1] = float_to_bf16(-INFINITY);  // row 2: -infinity in block 0
  return values;
}

std::vector<Bf16> cpu_rounded(const std::vector<Bf16>& values, int row_length) {
  std::vector<float> wide(values.size());
  for (size_t i = 0; i < values.size(); ++i) wide[i] = bf16_to_float(values[i]);
  round_activation_rows(ActivationFormat::kFp8, wide, row_length);
  std::vector<Bf16> out(values.size());
  for (size_t i = 0; i < wide.size(); ++i) {
    out[i] = float_to_bf16(wide[i]);
    EXPECT_TRUE(std::isnan(wide[i]) || bf16_to_float(out[i]) == wide[i]) << "not exact in bf16 at " << i;
  }
  return out;
}

void expect_same(const std::vector<Bf16>& gpu, const std::vector<Bf16>& cpu, size_t first, size_t last,
                 const char* what) {
  size_t wrong = 0, first_wrong = 0;
  for (size_t i = first; i < last; ++i) {
    const bool nan_gpu = std::isnan(bf16_to_float(gpu[i])), nan_cpu = std::isnan(bf16_to_float(cpu[i]));
    const bool same = nan_cpu ? nan_gpu && gpu[i].bits != kPoison : gpu[i].bits == cpu[i].bits;
    if (!same && wrong++ == 0) first_wrong = i;
  }
  EXPECT_EQ(wrong, 0u) << what << ": first at " << first_wrong << " (gpu " << bf16_to_float(gpu[first_wrong])
                       << " bits " << gpu[first_wrong].bits << ", cpu " << bf16_to_float(cpu[first_wrong]) << ")";
}

TEST(GpuFp8Rows, RoundAsTheCpuBitForBit) {
  MXMOE_REQUIRE_GPU();
  for (const int row_length : {352, 2880, 4096, 96}) {
    const int rows = 37;
    const std::vector<Bf16> values = hard_rows(rows, row_length, 5 + row_length);
    const std::vector<Bf16> expected = cpu_rounded(values, row_length);
    DeviceArray<Bf16> in(values), out(values.size());
    out.fill_bytes(0xFF);
    launch_fp8_round_rows(reinterpret_cast<const __nv_bfloat16*>(in.get()), reinterpret_cast<__nv_bfloat16*>(out.get()),
                          row_length, rows, nullptr, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    expect_same(out.to_host(), expected, 0, values.size(), "out of place");
    EXPECT_EQ(in.to_host().front().bits, values.front().bits) << "the input is left alone";

    // In place, only the first `count` rows (the count in device memory, as the routing's).
    const int count = 20;
    DeviceArray<int> d_count(std::vector<int>{count});
    auto* rows_ptr = reinterpret_cast<__nv_bfloat16*>(in.get());
    launch_fp8_round_rows(rows_ptr, rows_ptr, row_length, rows, d_count.get(), nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<Bf16> in_place = in.to_host();
    const size_t split = static_cast<size_t>(count) * row_length;
    expect_same(in_place, expected, 0, split, "in place");
    EXPECT_EQ(std::memcmp(in_place.data() + split, values.data() + split, (values.size() - split) * 2), 0)
        << row_length << ": rows past the count were written";
  }
}

// A GEMV-style FC1 with FP8 activations rounds x's rows as it stages them (no rounding launch):
// its output rows equal the same tactic's with bf16 activations on x rounded by the CPU, bit for
// bit, over the hard rows above (ties, blocks under the floor, NaN and infinities), a short last
// 128-block (H = 2880, 96), and several passes of staged tokens per expert (T = 37 on 5 experts);
// past 16 tokens the stream-K GEMV's rows come rounded by the launch, which must agree too.
TEST(GpuFp8Staging, Fc1OnStagedRowsEqualsFc1OnRoundedRows) {
  MXMOE_REQUIRE_GPU();
  for (const MoeShape& shape : {model_shape("gpt-oss-20b"), MoeShape{5, 3, 96, 160, 1}}) {
    const auto& layer = test_layer(shape, 17);
    for (const char* name : {"gemv.r64x8.w4x2.u2.k1", "gemv.r64x16.w4x1.u4.k1", "sk.r384x8.w24.u2.k1"}) {
      const Tactic t = parse_tactic(name);
      for (const int tokens : {1, 7, 8, 16, 37}) {
        const std::string what = shape.describe() + " " + name + " T=" + std::to_string(tokens);
        // The stream-K GEMV rounds in its staging up to 16 tokens, past them by the launch.
        ASSERT_EQ(t.family->rounds_fp8_when_staging(t, tokens), t.family == &gemv_family() || tokens <= 16) << what;
        const int pairs = tokens * shape.top_k, outputs = shape.intermediate;
        const std::vector<Bf16> x = hard_rows(tokens, shape.hidden, 61 + tokens);
        const std::vector<float> logits = random_logits(tokens, shape.num_experts, 62 + tokens);
        auto fc1_rows = [&](const std::vector<Bf16>& input, ActivationFormat activations) {
          DeviceArray<Bf16> d_x(input);
          DeviceArray<float> d_logits(logits);
          DeviceArray<Bf16> out(static_cast<size_t>(tokens) * shape.hidden);
          DeviceArray<unsigned char> workspace(layer.runner->workspace_size(tokens));
          workspace.fill_bytes(0xFF);
          const LayerPlan plan{t, t, activations};
          layer.runner->forward(reinterpret_cast<const __nv_bfloat16*>(d_x.get()), d_logits.get(),
                                reinterpret_cast<__nv_bfloat16*>(out.get()), tokens, workspace.get(), workspace.size(),
                                nullptr, &plan, ForwardPart::kFc1);
          EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
          const size_t at = WorkspaceLayout::of(shape, shape.num_experts, tokens).activation;
          return copy_back(reinterpret_cast<const Bf16*>(static_cast<const unsigned char*>(workspace.get()) + at),
                           static_cast<size_t>(pairs) * outputs);
        };
        const std::vector<Bf16> staged = fc1_rows(x, ActivationFormat::kFp8);
        const std::vector<Bf16> rounded = fc1_rows(cpu_rounded(x, shape.hidden), ActivationFormat::kBf16);
        size_t wrong = 0, unwritten = 0;
        for (size_t i = 0; i < staged.size(); ++i) {
          const bool nan = std::isnan(bf16_to_float(staged[i])) && std::isnan(bf16_to_float(rounded[i]));
          wrong += !nan && staged[i].bits != rounded[i].bits;
          unwritten += staged[i].bits == kPoison;  // the kernels write NaN as 0x7FFF
        }
        EXPECT_EQ(wrong, 0u) << what;
        EXPECT_EQ(unwritten, 0u) << what;
      }
    }
  }
}

TEST(GpuFp8Runner, AskedForFp8ItPlansAndComputesIt) {
  MXMOE_REQUIRE_GPU();
  for (const char* model : {"gpt-oss-20b", "deepseek-v4-flash"}) {
    const MoeShape shape = model_shape(model);
    const auto& layer = test_layer(shape, 17);
    const MoeRunner runner(layer.weights, {.activations = ActivationFormat::kFp8});
    EXPECT_EQ(runner.activations(), ActivationFormat::kFp8);
    for (int tokens : {1, 8, 200, 1100}) {
      const std::string what = std::string(model) + " T=" + std::to_string(tokens);
      EXPECT_EQ(runner.plan(tokens).activations, ActivationFormat::kFp8) << what;
      const std::vector<Bf16> x = make_activations(tokens, shape.hidden, 41 + tokens);
      const std::vector<float> logits = random_logits(tokens, shape.num_experts, 42 + tokens);
      const GpuResult g = run_gpu(runner, x, tokens, &logits, nullptr);  // the runner's own plan
      expect_close(g.out, reference_forward_from_logits(layer.weights, x, tokens, logits,
                                                        {.activations = ActivationFormat::kFp8}).out,
                   what, kFp8RelativeError);
      // The rows were rounded: the bf16 reference is farther than the FP8 bound (~2e-2 away).
      std::vector<float> got(g.out.size());
      for (size_t i = 0; i < got.size(); ++i) got[i] = bf16_to_float(g.out[i]);
      const std::vector<float> bf16 = reference_forward_from_logits(layer.weights, x, tokens, logits).out;
      EXPECT_GT(relative_error(got, std::vector<double>(bf16.begin(), bf16.end())), 3 * kFp8RelativeError) << what;
    }
  }
}

}  // namespace
}  // namespace mxmoe

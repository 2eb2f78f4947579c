// The workspace's layout rules and the tensor-map encoder's argument checks (both host-only).
#include <gtest/gtest.h>

#include "device/tensor_map.hpp"
#include "kernels/mxfp8_quantize.cuh"
#include "mxmoe/error.hpp"
#include "mxmoe/tactic.hpp"
#include "runner/workspace.hpp"
#include "test_support.hpp"

namespace mxmoe {
namespace {

// The gathered FC1 input shares FC2's output region: it must lie wholly inside it.
TEST(Workspace, SortedInputFitsInsideExpertOutput) {
  for (const char* model : {"gpt-oss-20b", "gpt-oss-120b"}) {
    const MoeShape shape = model_shape(model);
    for (int tokens : {1, 7, 300, 4096}) {
      const WorkspaceLayout w = WorkspaceLayout::of(shape, shape.num_experts, tokens);
      const size_t pairs = static_cast<size_t>(tokens) * shape.top_k;
      EXPECT_GE(w.sorted_input, w.expert_out) << model << " T=" << tokens;
      EXPECT_LE(w.sorted_input + pairs * shape.hidden * 2, w.expert_out + kMaxKSplit * pairs * shape.hidden * 4)
          << model << " T=" << tokens;
      EXPECT_EQ(w.sorted_input % 256, 0u);
    }
  }
}

// With MXFP8 activations FC1's input (MXFP8 rows of K = H) lies in the same region, and its
// output (K = I) in the activation region, which holds it even where 64-K slices pad I = 32.
TEST(Workspace, Mxfp8RowsFitTheirRegions) {
  for (const MoeShape& shape : {model_shape("gpt-oss-20b"), model_shape("gpt-oss-120b"), MoeShape{5, 3, 96, 160, 1},
                                MoeShape{4, 2, 32, 32, 1}}) {
    for (int tokens : {1, 7, 300}) {
      const WorkspaceLayout w = WorkspaceLayout::of(shape, shape.num_experts, tokens);
      const long long pairs = static_cast<long long>(tokens) * shape.top_k;
      EXPECT_LE(w.sorted_input + kernels::mxfp8_rows_bytes(pairs, shape.hidden),
                w.expert_out + kMaxKSplit * pairs * shape.hidden * 4)
          << shape.describe() << " T=" << tokens;
      EXPECT_LE(w.activation + kernels::mxfp8_rows_bytes(pairs, shape.intermediate), w.expert_out)
          << shape.describe() << " T=" << tokens;
      EXPECT_LE(w.activation + pairs * shape.intermediate * 2, w.expert_out) << shape.describe() << " T=" << tokens;
    }
  }
}

TEST(TensorMap, BadArgumentsNameTheProblem) {
  alignas(16) static unsigned char buffer[64];
  auto expect_error = [](auto encode, const char* what) {
    try {
      encode();
      ADD_FAILURE() << what << ": no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("test map"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("16-byte aligned"), std::string::npos) << e.what();
    }
  };
  expect_error([&] { return bf16_rows_map(buffer + 2, 64, 4, 8, "test map"); }, "misaligned base");
  expect_error([&] { return bf16_rows_map(buffer, 60, 4, 8, "test map"); }, "columns not a multiple of 8");
  expect_error([&] { return bf16_rows_map(buffer, 64, 0, 8, "test map"); }, "no rows");
  expect_error([&] { return bf16_rows_map(buffer, 64, 4, 257, "test map"); }, "box over 256 rows");
  expect_error([&] { return records_map(buffer + 8, 2, 4, 2, 4, "test map"); }, "misaligned records");
  expect_error([&] { return records_map(buffer, 0, 4, 2, 4, "test map"); }, "no experts");
  expect_error([&] { return records_map(buffer, 2, 0, 2, 4, "test map"); }, "no row tiles");
  expect_error([&] { return records_map(buffer, 2, 4, 0, 4, "test map"); }, "no K tiles");
  expect_error([&] { return records_map(buffer, 2, 4, 2, 0, "test map"); }, "empty box");
}

}  // namespace
}  // namespace mxmoe

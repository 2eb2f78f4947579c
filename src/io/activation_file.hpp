// A batch's activations read from, and a layer's output written to, files a framework writes and
// reads easily (`mxmoe run --input FILE --output FILE`):
//   .safetensors  input: x [T, H] BF16, F16 or F32 (named "x", or the file's only tensor) and,
//                 optionally, router_logits [T, E] F32; output: y [T, H] BF16
//   .npy          input: x [T, H] float32, float16 or uint16 (bf16 bits); output: float32 [T, H]
//                 (every value a bf16, exactly)
// Inputs in float32 or float16 are rounded to bf16 (to nearest even), as the layer takes them.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <vector>

#include "mxmoe/bf16.hpp"

namespace mxmoe {

struct ActivationInput {
  std::vector<Bf16> x;  // [num_tokens, hidden]
  int num_tokens = 0;
  std::optional<std::vector<float>> router_logits;  // [num_tokens, num_experts]
};

// Throws Error naming the file, the tensor and what was expected.
ActivationInput read_activations(const std::string& path, int hidden, int num_experts);
void write_output(const std::string& path, std::span<const Bf16> y, int num_tokens, int hidden);

}  // namespace mxmoe

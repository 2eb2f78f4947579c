// The shape of one gpt-oss MoE layer and the named model presets.
//
// The layer, as openai/gpt-oss gpt_oss/torch/model.py (MLPBlock.forward) and Hugging Face
// transformers models/gpt_oss/modeling_gpt_oss.py (GptOssTopKRouter, GptOssExperts) compute it,
// for one token x [H] (already normalised; the pre-norm and the residual `x + t` stay with the caller):
//   logits = x W_gate^T + b_gate                     W_gate [E, H]
//   top-k over logits (k = 4), softmax over the k selected logits only
//   h = W1[e] x + b1[e]                               W1 [2I, H]: even rows glu, odd rows linear
//   glu = min(h[0::2], 7), lin = clamp(h[1::2], -7, 7)
//   a = glu * sigmoid(1.702 * glu) * (lin + 1)        [I]
//   y = sum over the k experts of weight * (W2[e] a + b2[e])    W2 [H, I]
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace mxmoe {

inline constexpr float kSwigluAlpha = 1.702f;  // gpt-oss swiglu(alpha=1.702)
inline constexpr float kSwigluLimit = 7.0f;    // config swiglu_limit
inline constexpr int kMaxTopK = 32;

struct MoeShape {
  int num_experts = 0;
  int top_k = 0;
  int hidden = 0;        // H
  int intermediate = 0;  // I
  int num_layers = 1;

  int fc1_rows() const { return 2 * intermediate; }
  // Bytes one expert occupies in the checkpoint layout: E2M1 values at half a byte, one E8M0 scale
  // per 32 values, bf16 biases. The decode floor counts these per touched expert.
  size_t fc1_bytes_per_expert() const;
  size_t fc2_bytes_per_expert() const;
  size_t expert_bytes() const { return fc1_bytes_per_expert() + fc2_bytes_per_expert(); }

  // Throws Error naming the bad field: H and I must be positive multiples of 32, 1 <= top_k <=
  // min(num_experts, kMaxTopK).
  void validate() const;
  std::string describe() const;  // "E=32 k=4 H=2880 I=2880"
  bool operator==(const MoeShape&) const = default;
};

struct ModelPreset {
  std::string_view name;
  MoeShape shape;
};

std::span<const ModelPreset> model_presets();
// Throws Error listing the known names when `name` is not one of them.
MoeShape model_shape(std::string_view name);

}  // namespace mxmoe

// The shape of one MoE layer (its sizes and its LayerSpec) and the named model presets.
//
// The gpt-oss layer (the default spec; layer_spec.hpp has the general form and DeepSeek-V4's), as
// openai/gpt-oss gpt_oss/torch/model.py (MLPBlock.forward) and Hugging Face transformers
// models/gpt_oss/modeling_gpt_oss.py (GptOssTopKRouter, GptOssExperts) compute it, for one token
// x [H] (already normalised; the pre-norm and the residual `x + t` stay with the caller):
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

#include "mxmoe/layer_spec.hpp"

namespace mxmoe {

inline constexpr float kSwigluAlpha = kGptOssSpec.activation.alpha;  // gpt-oss swiglu(alpha=1.702)
inline constexpr float kSwigluLimit = kGptOssSpec.activation.limit;  // gpt-oss config swiglu_limit
inline constexpr int kMaxTopK = 32;

struct MoeShape {
  int num_experts = 0;
  int top_k = 0;
  int hidden = 0;        // H
  int intermediate = 0;  // I
  int num_layers = 1;
  // A member of the shape rather than of the weights: everything that is handed a layer's shape (the
  // reference, shards, the loader, plans, tactics, cache keys) then sees what the layer computes, and
  // two layers are equal only when both agree. MoeShape{E, k, H, I, L} is a gpt-oss layer.
  LayerSpec spec;

  constexpr MoeShape() = default;
  constexpr MoeShape(int num_experts, int top_k, int hidden, int intermediate, int num_layers = 1,
                     LayerSpec spec = {})
      : num_experts(num_experts), top_k(top_k), hidden(hidden), intermediate(intermediate), num_layers(num_layers),
        spec(spec) {}

  int fc1_rows() const { return 2 * intermediate; }
  // Bytes one expert occupies in the checkpoint layout: E2M1 values at half a byte, one E8M0 scale
  // per 32 values, bf16 biases where the spec has them. The decode floor counts these per touched expert.
  size_t fc1_bytes_per_expert() const;
  size_t fc2_bytes_per_expert() const;
  size_t expert_bytes() const { return fc1_bytes_per_expert() + fc2_bytes_per_expert(); }

  // Throws Error naming the bad field: H and I must be positive multiples of 32, 1 <= top_k <=
  // min(num_experts, kMaxTopK), and the spec valid (LayerSpec::validate).
  void validate() const;
  // "E=32 k=4 H=2880 I=2880" for the default (gpt-oss) spec, the spec appended otherwise.
  std::string describe() const;
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

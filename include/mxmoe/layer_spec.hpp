// What a MoE layer computes besides its sizes: the experts' activation, how their FC1 rows pair gate
// with up, whether they carry biases, and how the router picks and weighs them. Every part of mxmoe
// reads these as data, so a model family is a spec, not a branch.
//
// One expert on one token x [H], W1 [2I, H] holding I gate rows and I up rows:
//   gate = W1_gate x + b1_gate, up = W1_up x + b1_up          (b1, b2: only where expert_biases)
//   gate = min(gate, limit), up = clamp(up, -limit, limit)
//   a = gate * sigmoid(alpha * gate) * (up + up_offset)         [I]
//   y = W2 a + b2                                                W2 [H, I]
// gpt-oss (openai gpt_oss/torch/model.py, transformers GptOssExperts): alpha 1.702, limit 7, up + 1,
// biases, gate and up rows interleaved. DeepSeek-V4 (DeepSeek's inference/model.py Expert, transformers
// DeepseekV4Experts): h = silu(min(gate, 10)) * clamp(up, -10, 10), i.e. alpha 1, limit 10, up + 0, no
// biases, gate rows then up rows ([w1; w3], transformers' gate_up_proj.chunk(2)). The one formula
// covers both, and alpha 1 and offset 0 are exact in float, so it computes SiLU-clamped bit for bit.
//
// The routers, for logits l = x W_gate^T [R] (R routed experts) in float32:
//   kSoftmaxTopK (gpt-oss): l += router_bias (bf16, part of the logits); the top-k of l; weights the
//     softmax over the k chosen logits.
//   kSqrtSoftplus (DeepSeek-V4 score layers, transformers DeepseekV4TopKRouter): s = sqrt(softplus(l));
//     the top-k of s + selection_bias (fp32 [R], used to choose only); weights the chosen s divided by
//     their sum, times routed_scaling.
//   kCallerTopK: the layer has no router mxmoe can evaluate (DeepSeek-V4's hash-routed layers choose
//     from token ids): the caller passes experts and weights (the engine form).
// Ties in the top-k go to the lower expert index; NaN ranks below every number.
#pragma once

#include <cstdint>
#include <string>

namespace mxmoe {

struct SwigluActivation {
  float alpha = 1.702f;
  float limit = 7.0f;  // gate clamped above, up clamped to +-limit; infinity for no clamp
  float up_offset = 1.0f;
  bool operator==(const SwigluActivation&) const = default;
};

// How FC1's 2I rows hold the gate and up rows of intermediate column j. The layer's weights are in
// this order; the GPU records are always interleaved (the repack to records reorders rows), so every
// kernel epilogue sees (gate, up) as adjacent rows whatever the checkpoint's order.
enum class GateUpLayout : uint8_t {
  kInterleaved,   // row 2j gate, row 2j + 1 up (gpt-oss)
  kConcatenated,  // row j gate, row I + j up (DeepSeek-V4's [w1; w3], transformers' gate_up_proj)
};

enum class RouterKind : uint8_t { kSoftmaxTopK, kSqrtSoftplus, kCallerTopK };

struct LayerSpec {
  SwigluActivation activation;
  GateUpLayout gate_up = GateUpLayout::kInterleaved;
  bool expert_biases = true;  // b1 [E, 2I] and b2 [E, H], bf16
  RouterKind router = RouterKind::kSoftmaxTopK;
  float routed_scaling = 1.0f;  // multiplies the kSqrtSoftplus weights

  // Throws Error naming the bad field: alpha finite and positive, limit positive, up_offset finite,
  // routed_scaling finite and positive and 1 unless the router is kSqrtSoftplus, known enums.
  void validate() const;
  // "swiglu(alpha=1, limit=10, up+0) [gate; up] no-bias sqrt-softplus*1.5"
  std::string describe() const;
  bool operator==(const LayerSpec&) const = default;
};

// The default LayerSpec is gpt-oss's.
inline constexpr LayerSpec kGptOssSpec{};
constexpr LayerSpec deepseek_v4_spec(float routed_scaling) {
  return LayerSpec{SwigluActivation{1.0f, 10.0f, 0.0f}, GateUpLayout::kConcatenated, false, RouterKind::kSqrtSoftplus,
                   routed_scaling};
}

// FC1's rows of intermediate column j of a layer with `intermediate` columns.
constexpr int64_t fc1_gate_row(GateUpLayout layout, int64_t j) {
  return layout == GateUpLayout::kInterleaved ? 2 * j : j;
}
constexpr int64_t fc1_up_row(GateUpLayout layout, int64_t intermediate, int64_t j) {
  return layout == GateUpLayout::kInterleaved ? 2 * j + 1 : intermediate + j;
}

}  // namespace mxmoe

// The CPU reference of the whole MoE layer as its spec describes it (layer_spec.hpp: gpt-oss,
// DeepSeek-V4): the oracle of every GPU test and the CPU backend of `mxmoe run`.
//
// Precision: bf16 activations in, MXFP4 weights decoded exactly to float32, float32 accumulation
// and float32 intermediates (router logits and scores, expert weights, FC1 output, activation, expert
// outputs), one rounding to bf16 at the end. PyTorch's reference rounds logits, the softmax and every
// intermediate to bf16; we keep them in float32 so that the reference is a well-defined function
// that a float64 evaluation confirms to 1e-5, and GPU kernels are judged against that.
// Top-k ties go to the lower expert index (torch.topk leaves ties unspecified).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "mxmoe/bf16.hpp"
#include "mxmoe/layer_weights.hpp"
#include "mxmoe/mx_format.hpp"

namespace mxmoe {

// A routing's expert id for a slot that goes to no expert (an engine's padding): it adds nothing.
inline constexpr int32_t kNoExpert = -1;

// Expert ids are the layer's (routed) experts: an expert-parallel shard's pairs routed to experts it
// does not hold add nothing, as do pairs routed to kNoExpert.
struct Routing {
  int num_tokens = 0;
  int top_k = 0;
  std::vector<int32_t> experts;  // [T, k], by descending selection key, ties to the lower expert
  std::vector<float> weights;    // [T, k], as the spec's router weighs them
};

// logits [T, R] = x W_gate^T (+ router_bias for RouterKind::kSoftmaxTopK), float32 (R: the routed
// experts, the layer's E but for a shard). Throws Error for a caller-routed layer, which has no router.
std::vector<float> router_logits(const MoeLayerWeights& weights, std::span<const Bf16> x, int num_tokens);
// RouterKind::kSoftmaxTopK: top-k of the logits + softmax over the k chosen, per token. NaN logits
// rank below every number.
Routing route(std::span<const float> logits, int num_tokens, int num_experts, int top_k);
// RouterKind::kSqrtSoftplus: scores s = sqrt(softplus(l)) (softplus as torch's, l beyond 20 taken as
// is), top-k of s + selection_bias [num_experts], weights s / (sum of the k chosen s) * routed_scaling.
Routing route_sqrt_softplus(std::span<const float> logits, std::span<const float> selection_bias, int num_tokens,
                            int num_experts, int top_k, float routed_scaling);
// The layer's router (its spec's kind) on logits [T, R]. Throws Error for a caller-routed layer.
Routing route_layer(const MoeLayerWeights& weights, std::span<const float> logits, int num_tokens);

// How close the float32 reference must be to the float64 evaluation, by norm.
inline constexpr double kReferenceRelTolerance = 1e-5;
// How close a layer with MXFP8 activations must be to the float64 evaluation of bf16 activations,
// by norm: two roundings to E4M3 (3 mantissa bits, up to 2^-4 of each element) stand between them;
// at the gpt-oss shapes with unit-normal x the error is ~5.3e-2 (docs/block-scaled.md).
inline constexpr double kMxfp8ActivationRelTolerance = 1e-1;
// How close a layer with rounded activations (MXFP8, FP8) must be to the float64 evaluation that
// rounds the same rows: only an element whose float32 and float64 values fall on either side of a
// rounding boundary differs, by one E4M3 quantum (2^-4 of it); 7e-8 at small synthetic shapes.
inline constexpr double kSameRoundingRelTolerance = 1e-3;

struct ReferenceOptions {
  int threads = 0;  // 0: MXMOE_THREADS or all cores
  bool keep_intermediates = false;
  // kMxfp8 / kFp8: each pair's FC1 input (its token's x) and FC2 input (the SwiGLU output)
  // rounded to MXFP8 per 32 along K or to FP8 per 128 (round_activation_rows) before the GEMM, as
  // a layer with those activations computes; the router reads x as it is. `activation` then holds
  // the rounded values.
  ActivationFormat activations = ActivationFormat::kBf16;
};

struct ReferenceResult {
  Routing routing;
  std::vector<float> out;     // [T, H] float32, before the final rounding
  std::vector<Bf16> out_bf16; // [T, H]
  // With keep_intermediates, per (token, slot) in routing order, i.e. row t * k + slot:
  std::vector<float> fc1_out;     // [T * k, 2I] W1 x + b1 in the weights' row order, before the activation
  std::vector<float> activation;  // [T * k, I]
  std::vector<float> expert_out;  // [T * k, H] W2 a + b2, before the routing weight
};

// The three entry points differ only in where the routing comes from; the first two take the
// layer's router (the spec's), and throw Error for a caller-routed layer.
ReferenceResult reference_forward(const MoeLayerWeights& weights, std::span<const Bf16> x, int num_tokens,
                                  const ReferenceOptions& options = {});
ReferenceResult reference_forward_from_logits(const MoeLayerWeights& weights, std::span<const Bf16> x,
                                              int num_tokens, std::span<const float> logits,
                                              const ReferenceOptions& options = {});
ReferenceResult reference_forward_routed(const MoeLayerWeights& weights, std::span<const Bf16> x, Routing routing,
                                         const ReferenceOptions& options = {});

// A deliberately plain evaluation of the same layer: one thread, float64 everywhere, every weight
// decoded element by element. Slow (about 0.1 s per token at the gpt-oss shape); for checks. With
// `activations` other than bf16, each pair's FC1 and FC2 inputs are rounded as the reference rounds
// them (round_activation_rows on the float of each float64 value), the rest staying float64.
struct Float64Result {
  std::vector<int32_t> experts;  // [T, k]
  std::vector<double> weights;   // [T, k]
  std::vector<double> out;       // [T, H]
};
Float64Result evaluate_layer_f64(const MoeLayerWeights& weights, std::span<const Bf16> x, int num_tokens,
                                 ActivationFormat activations = ActivationFormat::kBf16);

// ||a - b|| / ||b|| over all elements (0 when both are zero; infinity when b is zero and a is not;
// NaN anywhere gives NaN, which fails every comparison).
double relative_error(std::span<const float> a, std::span<const double> b);

// Per-element check of a bf16 output against float64 values: each element must lie within half a
// bf16 ulp of its expected value, plus `abs_slack` for the error of the computation before rounding.
struct Bf16RoundingCheck {
  size_t failures = 0;
  size_t first_failure = 0;  // element index, when failures > 0
  double worst_ratio = 0.0;  // max |out - expected| / (half an ulp + abs_slack); above 1 fails
};
Bf16RoundingCheck check_bf16_rounding(std::span<const Bf16> out, std::span<const double> expected, double abs_slack);

}  // namespace mxmoe

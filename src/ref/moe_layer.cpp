// The threaded float32 reference of the whole MoE layer.
//
// Work is grouped by expert so that each weight row is decoded once and dotted with every token
// routed to that expert: FC1 in (expert, 64-row chunk) items, then the activation, then FC2 in
// (expert, 64-row chunk) items, then the weighted sum over each token's k slots in slot order (so the
// result does not depend on the thread count).
#include <algorithm>
#include <string>

#include "common/parallel.hpp"
#include "mxmoe/error.hpp"
#include "mxmoe/mx_format.hpp"
#include "mxmoe/reference.hpp"
#include "ref/swiglu.hpp"

namespace mxmoe {
namespace {

constexpr int kRowsPerItem = 64;

// Eight partial sums: vectorises and keeps the float32 rounding error near sqrt(K/8) ulps.
float dot(const float* a, const float* b, int n) {
  float acc[8] = {};
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  }
  for (; i < n; ++i) acc[0] += a[i] * b[i];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

void decode_row(const uint8_t* blocks, const uint8_t* scales, int k, float* out) {
  for (int b = 0; b < k / kMxBlock; ++b) {
    decode_mxfp4_block(blocks + b * kMxfp4BlockBytes, scales[b], out + b * kMxBlock);
  }
}

// One expert-grouped MXFP4 matmul: out[pair][row] = W[expert][row] . in[pair] + bias[expert][row]
// (no bias where `bias` is empty) for every (token, slot) pair routed to the expert.
void grouped_matmul(const std::vector<std::vector<int32_t>>& pairs_of_expert, std::span<const uint8_t> blocks,
                    std::span<const uint8_t> scales, std::span<const Bf16> bias, int rows, int k,
                    const std::vector<float>& in, std::vector<float>& out, int threads) {
  const int chunks_per_expert = (rows + kRowsPerItem - 1) / kRowsPerItem;
  const size_t bytes_per_row = static_cast<size_t>(k) / 2, scales_per_row = static_cast<size_t>(k) / kMxBlock;
  parallel_for(pairs_of_expert.size() * chunks_per_expert, threads, [&](size_t item) {
    const size_t expert = item / chunks_per_expert;
    const auto& pairs = pairs_of_expert[expert];
    if (pairs.empty()) return;
    const int row_begin = static_cast<int>(item % chunks_per_expert) * kRowsPerItem;
    const int row_end = std::min(rows, row_begin + kRowsPerItem);
    std::vector<float> w(k);
    for (int row = row_begin; row < row_end; ++row) {
      const size_t global_row = expert * rows + row;
      decode_row(blocks.data() + global_row * bytes_per_row, scales.data() + global_row * scales_per_row, k, w.data());
      const float b = bias.empty() ? 0.0f : bf16_to_float(bias[global_row]);
      for (int32_t pair : pairs) {
        out[static_cast<size_t>(pair) * rows + row] = dot(in.data() + static_cast<size_t>(pair) * k, w.data(), k) + b;
      }
    }
  });
}

}  // namespace

ReferenceResult reference_forward_routed(const MoeLayerWeights& weights, std::span<const Bf16> x, Routing routing,
                                         const ReferenceOptions& options) {
  const MoeShape& shape = weights.shape;
  weights.validate();
  const int t_count = routing.num_tokens, k = routing.top_k, h = shape.hidden, i = shape.intermediate;
  if (k != shape.top_k || routing.experts.size() != static_cast<size_t>(t_count) * k ||
      routing.weights.size() != routing.experts.size()) {
    throw Error("reference: routing is not [" + std::to_string(t_count) + ", " + std::to_string(shape.top_k) + "]");
  }
  if (x.size() != static_cast<size_t>(t_count) * h) {
    throw Error("reference: x has " + std::to_string(x.size()) + " elements, expected " + std::to_string(t_count) +
                " x " + std::to_string(h));
  }
  const size_t pairs = static_cast<size_t>(t_count) * k;
  const std::vector<int32_t> local = weights.local_experts();
  std::vector<std::vector<int32_t>> pairs_of_expert(shape.num_experts);
  std::vector<bool> held(pairs);  // pairs whose expert these weights hold: the others add nothing
  for (size_t p = 0; p < pairs; ++p) {
    const int32_t expert = routing.experts[p];
    if (expert < kNoExpert || expert >= static_cast<int32_t>(local.size())) {
      throw Error("reference: routing selects expert " + std::to_string(expert) + " of " +
                  std::to_string(local.size()));
    }
    if (expert == kNoExpert || local[expert] < 0) continue;
    held[p] = true;
    pairs_of_expert[local[expert]].push_back(static_cast<int32_t>(p));
  }

  // Inputs per pair: FC1 reads its token's x, so give every pair its own float row.
  std::vector<float> x_pairs(pairs * h);
  for (size_t p = 0; p < pairs; ++p) {
    for (int j = 0; j < h; ++j) x_pairs[p * h + j] = bf16_to_float(x[(p / k) * h + j]);
  }
  round_activation_rows(options.activations, x_pairs, h);
  ReferenceResult result;
  result.fc1_out.resize(pairs * shape.fc1_rows());
  grouped_matmul(pairs_of_expert, weights.fc1_blocks, weights.fc1_scales, weights.fc1_bias, shape.fc1_rows(), h,
                 x_pairs, result.fc1_out, options.threads);
  x_pairs = {};

  result.activation.resize(pairs * i);
  const LayerSpec& spec = shape.spec;
  for (size_t p = 0; p < pairs; ++p) {
    const float* h1 = result.fc1_out.data() + p * shape.fc1_rows();
    for (int j = 0; j < i; ++j) {
      result.activation[p * i + j] =
          swiglu(spec.activation, h1[fc1_gate_row(spec.gate_up, j)], h1[fc1_up_row(spec.gate_up, i, j)]);
    }
  }
  round_activation_rows(options.activations, result.activation, i);
  result.expert_out.resize(pairs * h);
  grouped_matmul(pairs_of_expert, weights.fc2_blocks, weights.fc2_scales, weights.fc2_bias, h, i, result.activation,
                 result.expert_out, options.threads);

  result.out.assign(static_cast<size_t>(t_count) * h, 0.0f);
  result.out_bf16.resize(result.out.size());
  for (int t = 0; t < t_count; ++t) {
    for (int s = 0; s < k; ++s) {
      if (!held[static_cast<size_t>(t) * k + s]) continue;
      const float w = routing.weights[t * k + s];
      const float* y = result.expert_out.data() + (static_cast<size_t>(t) * k + s) * h;
      for (int j = 0; j < h; ++j) result.out[static_cast<size_t>(t) * h + j] += w * y[j];
    }
  }
  for (size_t j = 0; j < result.out.size(); ++j) result.out_bf16[j] = float_to_bf16(result.out[j]);
  if (!options.keep_intermediates) {
    result.fc1_out = {};
    result.activation = {};
    result.expert_out = {};
  }
  result.routing = std::move(routing);
  return result;
}

ReferenceResult reference_forward_from_logits(const MoeLayerWeights& weights, std::span<const Bf16> x,
                                              int num_tokens, std::span<const float> logits,
                                              const ReferenceOptions& options) {
  return reference_forward_routed(weights, x, route_layer(weights, logits, num_tokens), options);
}

ReferenceResult reference_forward(const MoeLayerWeights& weights, std::span<const Bf16> x, int num_tokens,
                                  const ReferenceOptions& options) {
  return reference_forward_from_logits(weights, x, num_tokens, router_logits(weights, x, num_tokens), options);
}

}  // namespace mxmoe

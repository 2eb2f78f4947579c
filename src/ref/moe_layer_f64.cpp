// The plain float64 evaluation that checks the float32 reference: one thread, no grouping, every
// weight decoded on its own through the scalar E2M1 and E8M0 decoders, each router written out from
// its definition (layer_spec.hpp).
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>

#include "mxmoe/error.hpp"
#include "mxmoe/mx_format.hpp"
#include "mxmoe/reference.hpp"
#include "ref/swiglu.hpp"

namespace mxmoe {
namespace {

double weight_at(std::span<const uint8_t> blocks, std::span<const uint8_t> scales, size_t row, int k, int col) {
  const size_t element = row * k + col;
  const uint8_t byte = blocks[element / 2];
  const uint8_t code = (col % 2 == 0) ? (byte & 0xF) : (byte >> 4);
  return static_cast<double>(decode_e2m1(code)) * decode_e8m0(scales[element / kMxBlock]);
}

double bias_at(std::span<const Bf16> bias, size_t row) { return bias.empty() ? 0.0 : bf16_to_float(bias[row]); }

// softplus(l) = log(1 + e^l), written to stay finite for large l.
double softplus(double logit) { return std::max(logit, 0.0) + std::log1p(std::exp(-std::fabs(logit))); }

// One token's experts (by descending key, ties to the lower expert, NaN last) and weights.
void route_token(const LayerSpec& spec, std::span<const double> logits, std::span<const float> selection_bias,
                 std::span<int32_t> experts, std::span<double> weights) {
  const int e = static_cast<int>(logits.size()), k = static_cast<int>(experts.size());
  std::vector<double> score(e), key(e);
  for (int ex = 0; ex < e; ++ex) {
    score[ex] = spec.router == RouterKind::kSqrtSoftplus ? std::sqrt(softplus(logits[ex])) : logits[ex];
    key[ex] = spec.router == RouterKind::kSqrtSoftplus ? score[ex] + selection_bias[ex] : score[ex];
    if (std::isnan(key[ex])) key[ex] = -std::numeric_limits<double>::infinity();
  }
  std::vector<int32_t> order(e);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return key[a] > key[b]; });
  std::copy_n(order.begin(), k, experts.begin());
  if (spec.router == RouterKind::kSqrtSoftplus) {
    double sum = 0.0;
    for (int slot = 0; slot < k; ++slot) sum += score[order[slot]];
    for (int slot = 0; slot < k; ++slot) weights[slot] = score[order[slot]] / sum * spec.routed_scaling;
  } else {
    double sum = 0.0;
    for (int slot = 0; slot < k; ++slot) sum += std::exp(key[order[slot]] - key[order[0]]);
    for (int slot = 0; slot < k; ++slot) weights[slot] = std::exp(key[order[slot]] - key[order[0]]) / sum;
  }
}

}  // namespace

Float64Result evaluate_layer_f64(const MoeLayerWeights& w, std::span<const Bf16> x, int num_tokens,
                                 ActivationFormat activations) {
  w.validate();
  const MoeShape& s = w.shape;
  if (s.spec.router == RouterKind::kCallerTopK) {
    throw Error("evaluate_layer_f64: the layer (" + s.describe() + ") is routed by its caller");
  }
  const int e = w.num_routed_experts(), k = s.top_k, h = s.hidden, i = s.intermediate;
  const std::vector<int32_t> local = w.local_experts();
  if (num_tokens < 0 || x.size() != static_cast<size_t>(num_tokens) * h) {
    throw Error("evaluate_layer_f64: x has " + std::to_string(x.size()) + " elements, expected " +
                std::to_string(num_tokens) + " x " + std::to_string(h));
  }
  Float64Result r;
  r.experts.resize(static_cast<size_t>(num_tokens) * k);
  r.weights.resize(r.experts.size());
  r.out.assign(static_cast<size_t>(num_tokens) * h, 0.0);
  std::vector<double> logits(e), h1(2 * i), act(i);
  std::vector<float> x_rounded(h), act_rounded(i);  // the experts' inputs, as `activations` rounds them
  for (int t = 0; t < num_tokens; ++t) {
    auto xt = [&](int j) { return static_cast<double>(bf16_to_float(x[static_cast<size_t>(t) * h + j])); };
    for (int j = 0; j < h; ++j) x_rounded[j] = static_cast<float>(xt(j));
    round_activation_rows(activations, x_rounded, h);
    for (int ex = 0; ex < e; ++ex) {
      double acc = bias_at(w.router_bias, ex);
      for (int j = 0; j < h; ++j) acc += xt(j) * bf16_to_float(w.router_weight[static_cast<size_t>(ex) * h + j]);
      logits[ex] = acc;
    }
    const size_t first = static_cast<size_t>(t) * k;
    route_token(s.spec, logits, w.router_selection_bias, std::span(r.experts).subspan(first, k),
                std::span(r.weights).subspan(first, k));
    for (int slot = 0; slot < k; ++slot) {
      const int ex = r.experts[first + slot];
      const double weight = r.weights[first + slot];
      if (local[ex] < 0) continue;  // an expert-parallel shard's pair for another shard
      for (int row = 0; row < 2 * i; ++row) {
        const size_t global_row = static_cast<size_t>(local[ex]) * 2 * i + row;
        double acc = bias_at(w.fc1_bias, global_row);
        for (int j = 0; j < h; ++j) acc += weight_at(w.fc1_blocks, w.fc1_scales, global_row, h, j) * x_rounded[j];
        h1[row] = acc;
      }
      for (int j = 0; j < i; ++j) {
        act[j] = swiglu(s.spec.activation, h1[fc1_gate_row(s.spec.gate_up, j)], h1[fc1_up_row(s.spec.gate_up, i, j)]);
      }
      if (activations != ActivationFormat::kBf16) {
        for (int j = 0; j < i; ++j) act_rounded[j] = static_cast<float>(act[j]);
        round_activation_rows(activations, act_rounded, i);
        for (int j = 0; j < i; ++j) act[j] = act_rounded[j];
      }
      for (int row = 0; row < h; ++row) {
        const size_t global_row = static_cast<size_t>(local[ex]) * h + row;
        double acc = bias_at(w.fc2_bias, global_row);
        for (int j = 0; j < i; ++j) acc += weight_at(w.fc2_blocks, w.fc2_scales, global_row, i, j) * act[j];
        r.out[static_cast<size_t>(t) * h + row] += weight * acc;
      }
    }
  }
  return r;
}

}  // namespace mxmoe

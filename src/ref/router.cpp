// Routers of the CPU reference: logits, and each RouterKind's choice and weights (layer_spec.hpp).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "common/parallel.hpp"
#include "mxmoe/error.hpp"
#include "mxmoe/reference.hpp"

namespace mxmoe {
namespace {

void check_routing_args(const char* what, std::span<const float> logits, int num_tokens, int num_experts, int top_k) {
  if (num_tokens < 0 || logits.size() != static_cast<size_t>(num_tokens) * num_experts) {
    throw Error(std::string(what) + ": logits have " + std::to_string(logits.size()) + " elements, expected " +
                std::to_string(num_tokens) + " x " + std::to_string(num_experts));
  }
  if (top_k < 1 || top_k > num_experts) {
    throw Error(std::string(what) + ": top_k " + std::to_string(top_k) + " is not in [1, " +
                std::to_string(num_experts) + "]");
  }
}

// The first top_k of `order` become the experts with the largest keys, by descending key, ties to the
// lower index, NaN below every number.
void select_top_k(const float* keys, int top_k, std::vector<int32_t>& order) {
  auto rank_key = [&](int32_t expert) { return std::isnan(keys[expert]) ? -INFINITY : keys[expert]; };
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + top_k, order.end(), [&](int32_t a, int32_t b) {
    const float ka = rank_key(a), kb = rank_key(b);
    return ka > kb || (ka == kb && a < b);
  });
}

// torch.nn.functional.softplus (beta 1, threshold 20), then the square root.
float sqrt_softplus(float logit) { return std::sqrt(logit > 20.0f ? logit : std::log1p(std::exp(logit))); }

}  // namespace

std::vector<float> router_logits(const MoeLayerWeights& weights, std::span<const Bf16> x, int num_tokens) {
  weights.validate();
  if (weights.shape.spec.router == RouterKind::kCallerTopK) {
    throw Error("router_logits: the layer (" + weights.shape.describe() + ") is routed by its caller");
  }
  const int e = weights.num_routed_experts(), h = weights.shape.hidden;
  if (num_tokens < 0 || x.size() != static_cast<size_t>(num_tokens) * h) {
    throw Error("router_logits: x has " + std::to_string(x.size()) + " elements, expected " +
                std::to_string(num_tokens) + " x " + std::to_string(h));
  }
  const bool logit_bias = !weights.router_bias.empty();
  std::vector<float> logits(static_cast<size_t>(num_tokens) * e);
  parallel_for(num_tokens, 0, [&](size_t t) {
    for (int expert = 0; expert < e; ++expert) {
      float acc = 0.0f;
      for (int j = 0; j < h; ++j) {
        acc += bf16_to_float(x[t * h + j]) * bf16_to_float(weights.router_weight[static_cast<size_t>(expert) * h + j]);
      }
      logits[t * e + expert] = logit_bias ? acc + bf16_to_float(weights.router_bias[expert]) : acc;
    }
  });
  return logits;
}

Routing route(std::span<const float> logits, int num_tokens, int num_experts, int top_k) {
  check_routing_args("route", logits, num_tokens, num_experts, top_k);
  Routing r{num_tokens, top_k, std::vector<int32_t>(static_cast<size_t>(num_tokens) * top_k),
            std::vector<float>(static_cast<size_t>(num_tokens) * top_k)};
  std::vector<int32_t> order(num_experts);
  for (int t = 0; t < num_tokens; ++t) {
    const float* row = logits.data() + static_cast<size_t>(t) * num_experts;
    select_top_k(row, top_k, order);
    const float max_logit = row[order[0]];
    float sum = 0.0f;
    for (int s = 0; s < top_k; ++s) {
      r.experts[t * top_k + s] = order[s];
      r.weights[t * top_k + s] = std::exp(row[order[s]] - max_logit);
      sum += r.weights[t * top_k + s];
    }
    for (int s = 0; s < top_k; ++s) r.weights[t * top_k + s] /= sum;
  }
  return r;
}

Routing route_sqrt_softplus(std::span<const float> logits, std::span<const float> selection_bias, int num_tokens,
                            int num_experts, int top_k, float routed_scaling) {
  check_routing_args("route_sqrt_softplus", logits, num_tokens, num_experts, top_k);
  if (selection_bias.size() != static_cast<size_t>(num_experts)) {
    throw Error("route_sqrt_softplus: selection bias has " + std::to_string(selection_bias.size()) +
                " elements, expected " + std::to_string(num_experts));
  }
  Routing r{num_tokens, top_k, std::vector<int32_t>(static_cast<size_t>(num_tokens) * top_k),
            std::vector<float>(static_cast<size_t>(num_tokens) * top_k)};
  std::vector<int32_t> order(num_experts);
  std::vector<float> scores(num_experts), keys(num_experts);
  for (int t = 0; t < num_tokens; ++t) {
    const float* row = logits.data() + static_cast<size_t>(t) * num_experts;
    for (int e = 0; e < num_experts; ++e) {
      scores[e] = sqrt_softplus(row[e]);
      keys[e] = scores[e] + selection_bias[e];
    }
    select_top_k(keys.data(), top_k, order);
    float sum = 0.0f;
    for (int s = 0; s < top_k; ++s) sum += scores[order[s]];
    for (int s = 0; s < top_k; ++s) {
      r.experts[t * top_k + s] = order[s];
      r.weights[t * top_k + s] = scores[order[s]] / sum * routed_scaling;
    }
  }
  return r;
}

Routing route_layer(const MoeLayerWeights& weights, std::span<const float> logits, int num_tokens) {
  const MoeShape& shape = weights.shape;
  switch (shape.spec.router) {
    case RouterKind::kSoftmaxTopK:
      return route(logits, num_tokens, weights.num_routed_experts(), shape.top_k);
    case RouterKind::kSqrtSoftplus:
      return route_sqrt_softplus(logits, weights.router_selection_bias, num_tokens, weights.num_routed_experts(),
                                 shape.top_k, shape.spec.routed_scaling);
    case RouterKind::kCallerTopK:
      break;
  }
  throw Error("route_layer: the layer (" + shape.describe() + ") is routed by its caller");
}

}  // namespace mxmoe

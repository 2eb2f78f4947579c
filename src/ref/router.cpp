// Router of the CPU reference: logits, top-k and the softmax over the selected logits.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "common/parallel.hpp"
#include "mxmoe/error.hpp"
#include "mxmoe/reference.hpp"

namespace mxmoe {

std::vector<float> router_logits(const MoeLayerWeights& weights, std::span<const Bf16> x, int num_tokens) {
  weights.validate();
  const int e = weights.num_routed_experts(), h = weights.shape.hidden;
  if (num_tokens < 0 || x.size() != static_cast<size_t>(num_tokens) * h) {
    throw Error("router_logits: x has " + std::to_string(x.size()) + " elements, expected " +
                std::to_string(num_tokens) + " x " + std::to_string(h));
  }
  std::vector<float> logits(static_cast<size_t>(num_tokens) * e);
  parallel_for(num_tokens, 0, [&](size_t t) {
    for (int expert = 0; expert < e; ++expert) {
      float acc = 0.0f;
      for (int j = 0; j < h; ++j) {
        acc += bf16_to_float(x[t * h + j]) * bf16_to_float(weights.router_weight[static_cast<size_t>(expert) * h + j]);
      }
      logits[t * e + expert] = acc + bf16_to_float(weights.router_bias[expert]);
    }
  });
  return logits;
}

Routing route(std::span<const float> logits, int num_tokens, int num_experts, int top_k) {
  if (num_tokens < 0 || logits.size() != static_cast<size_t>(num_tokens) * num_experts) {
    throw Error("route: logits have " + std::to_string(logits.size()) + " elements, expected " +
                std::to_string(num_tokens) + " x " + std::to_string(num_experts));
  }
  if (top_k < 1 || top_k > num_experts) {
    throw Error("route: top_k " + std::to_string(top_k) + " is not in [1, " + std::to_string(num_experts) + "]");
  }
  Routing r{num_tokens, top_k, std::vector<int32_t>(static_cast<size_t>(num_tokens) * top_k),
            std::vector<float>(static_cast<size_t>(num_tokens) * top_k)};
  std::vector<int32_t> order(num_experts);
  for (int t = 0; t < num_tokens; ++t) {
    const float* row = logits.data() + static_cast<size_t>(t) * num_experts;
    auto rank_key = [&](int32_t expert) { return std::isnan(row[expert]) ? -INFINITY : row[expert]; };
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + top_k, order.end(), [&](int32_t a, int32_t b) {
      const float ka = rank_key(a), kb = rank_key(b);
      return ka > kb || (ka == kb && a < b);
    });
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

}  // namespace mxmoe

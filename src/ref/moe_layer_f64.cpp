// The plain float64 evaluation that checks the float32 reference: one thread, no grouping, every
// weight decoded on its own through the scalar E2M1 and E8M0 decoders.
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

}  // namespace

Float64Result evaluate_layer_f64(const MoeLayerWeights& w, std::span<const Bf16> x, int num_tokens) {
  w.validate();
  const MoeShape& s = w.shape;
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
  std::vector<int32_t> order(e);
  for (int t = 0; t < num_tokens; ++t) {
    auto xt = [&](int j) { return static_cast<double>(bf16_to_float(x[static_cast<size_t>(t) * h + j])); };
    for (int ex = 0; ex < e; ++ex) {
      double acc = bf16_to_float(w.router_bias[ex]);
      for (int j = 0; j < h; ++j) acc += xt(j) * bf16_to_float(w.router_weight[static_cast<size_t>(ex) * h + j]);
      logits[ex] = std::isnan(acc) ? -std::numeric_limits<double>::infinity() : acc;
    }
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
    double sum = 0.0;
    for (int slot = 0; slot < k; ++slot) sum += std::exp(logits[order[slot]] - logits[order[0]]);
    for (int slot = 0; slot < k; ++slot) {
      const int ex = order[slot];
      const double weight = std::exp(logits[ex] - logits[order[0]]) / sum;
      r.experts[t * k + slot] = ex;
      r.weights[t * k + slot] = weight;
      if (local[ex] < 0) continue;  // an expert-parallel shard's pair for another shard
      for (int row = 0; row < 2 * i; ++row) {
        const size_t global_row = static_cast<size_t>(local[ex]) * 2 * i + row;
        double acc = bf16_to_float(w.fc1_bias[global_row]);
        for (int j = 0; j < h; ++j) acc += weight_at(w.fc1_blocks, w.fc1_scales, global_row, h, j) * xt(j);
        h1[row] = acc;
      }
      for (int j = 0; j < i; ++j) act[j] = gpt_oss_swiglu(h1[2 * j], h1[2 * j + 1]);
      for (int row = 0; row < h; ++row) {
        const size_t global_row = static_cast<size_t>(local[ex]) * h + row;
        double acc = bf16_to_float(w.fc2_bias[global_row]);
        for (int j = 0; j < i; ++j) acc += weight_at(w.fc2_blocks, w.fc2_scales, global_row, i, j) * act[j];
        r.out[static_cast<size_t>(t) * h + row] += weight * acc;
      }
    }
  }
  return r;
}

}  // namespace mxmoe

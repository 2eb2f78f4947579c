#include "mxmoe/layer_weights.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "common/parallel.hpp"
#include "common/random.hpp"
#include "mxmoe/error.hpp"
#include "mxmoe/mx_format.hpp"

namespace mxmoe {
namespace {

void check_size(const char* tensor, size_t got, size_t expected, const MoeShape& shape) {
  if (got != expected) {
    throw Error("layer weights (" + shape.describe() + "): " + tensor + " has " + std::to_string(got) +
                " elements, expected " + std::to_string(expected));
  }
}

// The synthetic weights' E8M0 exponent for a K-long dot product whose inputs have second moment
// `input_power`, aiming at outputs of standard deviation `target_std`: uniform E2M1 codes have
// E[v^2] = 8.5625 and the +-1 scale jitter below multiplies the variance by 1.75.
int synthetic_scale_exponent(int k, double input_power, double target_std) {
  const double unit_scale_std = std::sqrt(k * 8.5625 * 1.75 * input_power);
  return static_cast<int>(std::lround(std::log2(target_std / unit_scale_std)));
}

// E[a^2] of the activation for gate and up independent N(0, std^2): a midpoint rule over +-8 std.
double activation_second_moment(const SwigluActivation& activation, double std) {
  constexpr int kPoints = 4000;
  const double limit = activation.limit, alpha = activation.alpha, offset = activation.up_offset;
  double weight_sum = 0.0, gate_power = 0.0, up_power = 0.0;
  for (int p = 0; p < kPoints; ++p) {
    const double z = -8.0 + 16.0 * (p + 0.5) / kPoints, weight = std::exp(-0.5 * z * z);
    const double gate = std::min(std * z, limit), up = std::clamp(std * z, -limit, limit);
    const double gate_part = gate / (1.0 + std::exp(-alpha * gate));
    weight_sum += weight;
    gate_power += weight * gate_part * gate_part;
    up_power += weight * (up + offset) * (up + offset);
  }
  return gate_power / weight_sum * (up_power / weight_sum);
}

// FC1 outputs of std 3/7 of the limit put about 1% of the gate and up values past the clamp. FC2 is
// scaled for unit outputs from the activation's second moment: 40 for gpt-oss's at std 3 (a rounded
// estimate that fixes gpt-oss's synthetic weights), any other activation's scaled by its second moment
// relative to gpt-oss's.
struct SyntheticScales {
  int fc1_exponent, fc2_exponent;
};
SyntheticScales synthetic_scales(const MoeShape& shape) {
  const SwigluActivation& activation = shape.spec.activation;
  const double fc1_std = std::isfinite(activation.limit) ? activation.limit * 3.0 / 7.0 : 3.0;
  const double power = 40.0 * (activation_second_moment(activation, fc1_std) /
                               activation_second_moment(kGptOssSpec.activation, 3.0));
  return {synthetic_scale_exponent(shape.hidden, 1.0, fc1_std), synthetic_scale_exponent(shape.intermediate, power, 1.0)};
}

// Expert tensors that the weights own (synthetic, quantised or sharded here).
struct OwnedExperts {
  std::vector<uint8_t> fc1_blocks, fc1_scales, fc2_blocks, fc2_scales;

  // Points the weights' expert views at these tensors and makes the weights keep them alive.
  static void attach(std::shared_ptr<OwnedExperts> experts, MoeLayerWeights& w) {
    w.fc1_blocks = experts->fc1_blocks;
    w.fc1_scales = experts->fc1_scales;
    w.fc2_blocks = experts->fc2_blocks;
    w.fc2_scales = experts->fc2_scales;
    w.storage = std::move(experts);
  }
};

// Fills one expert's blocks with uniform codes and its scales with base_exponent + {-1, 0, +1}.
void fill_expert(std::span<uint8_t> blocks, std::span<uint8_t> scales, int base_exponent, uint64_t seed) {
  SplitMix64 rng(seed);
  size_t i = 0;
  for (; i + 8 <= blocks.size(); i += 8) {
    const uint64_t bits = rng.next();
    for (int b = 0; b < 8; ++b) blocks[i + b] = static_cast<uint8_t>(bits >> (8 * b));
  }
  for (; i < blocks.size(); ++i) blocks[i] = static_cast<uint8_t>(rng.next());
  for (auto& s : scales) s = static_cast<uint8_t>(kE8m0Bias + base_exponent + static_cast<int>(rng.below(3)) - 1);
}

std::vector<Bf16> normal_bf16(size_t count, double stddev, uint64_t seed) {
  SplitMix64 rng(seed);
  std::vector<Bf16> out(count);
  for (auto& v : out) v = float_to_bf16(static_cast<float>(stddev * rng.normal()));
  return out;
}

}  // namespace

std::vector<int32_t> MoeLayerWeights::local_experts() const {
  std::vector<int32_t> local(num_routed_experts(), -1);
  for (int e = 0; e < shape.num_experts; ++e) local[global_experts.empty() ? e : global_experts[e]] = e;
  return local;
}

void MoeLayerWeights::validate() const {
  shape.validate();
  const size_t e = shape.num_experts, h = shape.hidden, i = shape.intermediate, rows1 = shape.fc1_rows();
  const size_t routed = num_routed_experts();
  if (!global_experts.empty()) {
    check_size("global_experts", global_experts.size(), e, shape);
    std::vector<bool> seen(routed);
    for (int32_t g : global_experts) {
      if (g < 0 || static_cast<size_t>(g) >= routed || seen[g]) {
        throw Error("layer weights (" + shape.describe() + "): global_experts holds " + std::to_string(g) +
                    ", which is not a new expert of the " + std::to_string(routed) + " routed");
      }
      seen[g] = true;
    }
  }
  const LayerSpec& spec = shape.spec;
  const bool routes = spec.router != RouterKind::kCallerTopK;
  check_size("router_weight", router_weight.size(), routes ? routed * h : 0, shape);
  check_size("router_bias", router_bias.size(), spec.router == RouterKind::kSoftmaxTopK ? routed : 0, shape);
  check_size("router_selection_bias", router_selection_bias.size(),
             spec.router == RouterKind::kSqrtSoftplus ? routed : 0, shape);
  check_size("fc1_blocks", fc1_blocks.size(), e * rows1 * h / 2, shape);
  check_size("fc1_scales", fc1_scales.size(), e * rows1 * h / kMxBlock, shape);
  check_size("fc1_bias", fc1_bias.size(), spec.expert_biases ? e * rows1 : 0, shape);
  check_size("fc2_blocks", fc2_blocks.size(), e * h * i / 2, shape);
  check_size("fc2_scales", fc2_scales.size(), e * h * i / kMxBlock, shape);
  check_size("fc2_bias", fc2_bias.size(), spec.expert_biases ? e * h : 0, shape);
}

MoeLayerWeights quantize_bf16_experts(const MoeShape& shape, std::vector<Bf16> router_weight,
                                      std::vector<Bf16> router_bias, std::span<const Bf16> gate_up,
                                      std::vector<Bf16> gate_up_bias, std::span<const Bf16> down,
                                      std::vector<Bf16> down_bias) {
  shape.validate();
  const size_t e = shape.num_experts, h = shape.hidden, i = shape.intermediate, rows1 = shape.fc1_rows();
  check_size("gate_up", gate_up.size(), e * h * rows1, shape);
  check_size("down", down.size(), e * i * h, shape);
  auto storage = std::make_shared<OwnedExperts>();
  storage->fc1_blocks.resize(e * rows1 * h / 2);
  storage->fc1_scales.resize(e * rows1 * h / kMxBlock);
  storage->fc2_blocks.resize(e * h * i / 2);
  storage->fc2_scales.resize(e * h * i / kMxBlock);
  // Output rows [row0, row0 + 16) of expert `expert` of a [E, K, rows] tensor: gathered along K (16
  // contiguous values per K step) and quantised row by row.
  constexpr size_t kRowsPerJob = 16;
  auto quantize_rows = [](std::span<const Bf16> dense, size_t expert, size_t row0, size_t k, size_t rows,
                          std::vector<uint8_t>& blocks, std::vector<uint8_t>& scales) {
    std::vector<float> values(kRowsPerJob * k);
    for (size_t j = 0; j < k; ++j) {
      const Bf16* src = dense.data() + (expert * k + j) * rows + row0;
      for (size_t r = 0; r < kRowsPerJob; ++r) values[r * k + j] = bf16_to_float(src[r]);
    }
    for (size_t r = 0; r < kRowsPerJob; ++r) {
      const size_t at = expert * rows + row0 + r;
      quantize_mxfp4(std::span(values).subspan(r * k, k), std::span(blocks).subspan(at * k / 2, k / 2),
                     std::span(scales).subspan(at * k / kMxBlock, k / kMxBlock));
    }
  };
  // Row counts are multiples of 16: 2I and H are multiples of 32.
  const size_t jobs_per_expert = (rows1 + h) / kRowsPerJob;
  parallel_for(e * jobs_per_expert, 0, [&](size_t job) {
    const size_t expert = job / jobs_per_expert, row0 = job % jobs_per_expert * kRowsPerJob;
    if (row0 < rows1) {
      quantize_rows(gate_up, expert, row0, h, rows1, storage->fc1_blocks, storage->fc1_scales);
    } else {
      quantize_rows(down, expert, row0 - rows1, i, h, storage->fc2_blocks, storage->fc2_scales);
    }
  });
  MoeLayerWeights w;
  w.shape = shape;
  w.router_weight = std::move(router_weight);
  w.router_bias = std::move(router_bias);
  w.fc1_bias = std::move(gate_up_bias);
  w.fc2_bias = std::move(down_bias);
  OwnedExperts::attach(std::move(storage), w);
  w.validate();
  return w;
}

MoeLayerWeights tensor_parallel_shard(const MoeLayerWeights& weights, int rank, int world) {
  weights.validate();
  const MoeShape& full = weights.shape;
  if (world < 1 || rank < 0 || rank >= world || full.intermediate / world < 1) {
    throw Error("tensor-parallel shard: rank " + std::to_string(rank) + " of " + std::to_string(world) +
                " is not a shard of I = " + std::to_string(full.intermediate));
  }
  const size_t e = full.num_experts, h = full.hidden, i = full.intermediate;
  const size_t first = i * rank / world, end = i * (rank + 1) / world;  // own columns
  const size_t block_first = first / kMxBlock * kMxBlock, block_end = (end + kMxBlock - 1) / kMxBlock * kMxBlock;
  MoeShape shape = full;
  shape.intermediate = static_cast<int>(block_end - block_first);
  const size_t shard_i = shape.intermediate, own = shape.fc1_rows();
  auto own_column = [&](size_t column) { return column >= first && column < end; };

  auto storage = std::make_shared<OwnedExperts>();
  storage->fc1_blocks.assign(e * own * h / 2, 0);
  // The zero row pairs of columns not its own get scale 2^0, not code 0: their values are zero at
  // any scale, and an in-range code keeps the matrix on the kernels' one-multiply path
  // (scales_take_one_multiply).
  storage->fc1_scales.assign(e * own * h / kMxBlock, static_cast<uint8_t>(kE8m0Bias));
  storage->fc2_blocks.assign(e * h * shard_i / 2, 0);
  storage->fc2_scales.assign(e * h * shard_i / kMxBlock, 0);
  MoeLayerWeights shard;
  shard.shape = shape;
  shard.router_weight = weights.router_weight;
  shard.router_bias = weights.router_bias;
  shard.router_selection_bias = weights.router_selection_bias;
  shard.global_experts = weights.global_experts;
  shard.routed_experts = weights.routed_experts;
  const bool biases = shape.spec.expert_biases;
  if (biases) {
    shard.fc1_bias.assign(e * own, Bf16{});
    shard.fc2_bias = rank == 0 ? weights.fc2_bias : std::vector<Bf16>(e * h, Bf16{});
  }
  // FC1: the (gate, up) rows of each own column; the other pairs stay zero.
  const GateUpLayout layout = shape.spec.gate_up;
  const size_t row_bytes = h / 2, row_scales = h / kMxBlock;
  for (size_t x = 0; x < e; ++x) {
    for (size_t column = block_first; column < block_end; ++column) {
      if (!own_column(column)) continue;
      const size_t shard_column = column - block_first;
      const std::pair<size_t, size_t> rows[2] = {
          {fc1_gate_row(layout, column), fc1_gate_row(layout, shard_column)},
          {fc1_up_row(layout, i, column), fc1_up_row(layout, shard_i, shard_column)}};
      for (const auto& [from_row, to_row] : rows) {
        const size_t from = x * 2 * i + from_row, to = x * own + to_row;
        std::copy_n(weights.fc1_blocks.begin() + from * row_bytes, row_bytes,
                    storage->fc1_blocks.begin() + to * row_bytes);
        std::copy_n(weights.fc1_scales.begin() + from * row_scales, row_scales,
                    storage->fc1_scales.begin() + to * row_scales);
        if (biases) shard.fc1_bias[to] = weights.fc1_bias[from];
      }
    }
  }
  // FC2: each row's blocks over the shard's columns, the codes of columns not its own zeroed.
  for (size_t row = 0; row < e * h; ++row) {
    for (size_t column = block_first; column < block_end; ++column) {
      if (column % kMxBlock == 0) {
        storage->fc2_scales[row * (shard_i / kMxBlock) + (column - block_first) / kMxBlock] =
            weights.fc2_scales[row * (i / kMxBlock) + column / kMxBlock];
      }
      if (!own_column(column)) continue;
      const uint8_t byte = weights.fc2_blocks[row * (i / 2) + column / 2];
      const uint8_t code = column % 2 ? byte >> 4 : byte & 0x0F;
      storage->fc2_blocks[row * (shard_i / 2) + (column - block_first) / 2] |=
          static_cast<uint8_t>(code << (4 * (column % 2)));
    }
  }
  OwnedExperts::attach(std::move(storage), shard);
  shard.validate();
  return shard;
}

MoeLayerWeights expert_shard(const MoeLayerWeights& weights, std::span<const int32_t> experts) {
  weights.validate();
  if (!weights.global_experts.empty()) throw Error("expert shard: these weights are already an expert-parallel shard");
  const MoeShape& full = weights.shape;
  if (experts.size() < static_cast<size_t>(full.top_k)) {
    throw Error("expert shard: " + std::to_string(experts.size()) + " experts, fewer than the layer's top-k (" +
                std::to_string(full.top_k) + ")");
  }
  std::vector<bool> seen(full.num_experts);
  for (int32_t g : experts) {
    if (g < 0 || g >= full.num_experts || seen[g]) {
      throw Error("expert shard: expert " + std::to_string(g) + " is " +
                  (g < 0 || g >= full.num_experts ? "not one of the layer's " + std::to_string(full.num_experts)
                                                  : std::string("given twice")));
    }
    seen[g] = true;
  }
  MoeLayerWeights shard;
  shard.shape = full;
  shard.shape.num_experts = static_cast<int>(experts.size());
  shard.routed_experts = full.num_experts;
  shard.global_experts.assign(experts.begin(), experts.end());
  shard.router_weight = weights.router_weight;
  shard.router_bias = weights.router_bias;
  shard.router_selection_bias = weights.router_selection_bias;
  const bool biases = full.spec.expert_biases;
  if (biases) {
    shard.fc1_bias.resize(experts.size() * full.fc1_rows());
    shard.fc2_bias.resize(experts.size() * full.hidden);
  }
  auto storage = std::make_shared<OwnedExperts>();
  auto take = [&](std::span<const uint8_t> from, std::vector<uint8_t>& to) {
    const size_t per_expert = from.size() / full.num_experts;
    to.resize(per_expert * experts.size());
    for (size_t e = 0; e < experts.size(); ++e) {
      std::copy_n(from.begin() + experts[e] * per_expert, per_expert, to.begin() + e * per_expert);
    }
  };
  take(weights.fc1_blocks, storage->fc1_blocks);
  take(weights.fc1_scales, storage->fc1_scales);
  take(weights.fc2_blocks, storage->fc2_blocks);
  take(weights.fc2_scales, storage->fc2_scales);
  for (size_t e = 0; e < experts.size() && biases; ++e) {
    std::copy_n(weights.fc1_bias.begin() + experts[e] * full.fc1_rows(), full.fc1_rows(),
                shard.fc1_bias.begin() + e * full.fc1_rows());
    std::copy_n(weights.fc2_bias.begin() + experts[e] * full.hidden, full.hidden,
                shard.fc2_bias.begin() + e * full.hidden);
  }
  OwnedExperts::attach(std::move(storage), shard);
  shard.validate();
  return shard;
}

MoeLayerWeights expert_parallel_shard(const MoeLayerWeights& weights, int rank, int world) {
  const int routed = weights.num_routed_experts();
  if (world < 1 || rank < 0 || rank >= world || routed / world < 1) {
    throw Error("expert-parallel shard: rank " + std::to_string(rank) + " of " + std::to_string(world) +
                " is not a shard of " + std::to_string(routed) + " experts");
  }
  std::vector<int32_t> experts;
  for (int e = routed * rank / world; e < routed * (rank + 1) / world; ++e) experts.push_back(e);
  return expert_shard(weights, experts);
}

MoeLayerWeights make_synthetic_layer(const MoeShape& shape, uint64_t seed) {
  shape.validate();
  const size_t e = shape.num_experts, h = shape.hidden, i = shape.intermediate, rows1 = shape.fc1_rows();
  auto storage = std::make_shared<OwnedExperts>();
  storage->fc1_blocks.resize(e * rows1 * h / 2);
  storage->fc1_scales.resize(e * rows1 * h / kMxBlock);
  storage->fc2_blocks.resize(e * h * i / 2);
  storage->fc2_scales.resize(e * h * i / kMxBlock);

  const auto [fc1_exponent, fc2_exponent] = synthetic_scales(shape);
  parallel_for(2 * e, 0, [&](size_t job) {
    const size_t expert = job / 2;
    const uint64_t stream = derive_seed(seed, job);
    if (job % 2 == 0) {
      fill_expert(std::span(storage->fc1_blocks).subspan(expert * rows1 * h / 2, rows1 * h / 2),
                  std::span(storage->fc1_scales).subspan(expert * rows1 * h / kMxBlock, rows1 * h / kMxBlock),
                  fc1_exponent, stream);
    } else {
      fill_expert(std::span(storage->fc2_blocks).subspan(expert * h * i / 2, h * i / 2),
                  std::span(storage->fc2_scales).subspan(expert * h * i / kMxBlock, h * i / kMxBlock), fc2_exponent,
                  stream);
    }
  });

  MoeLayerWeights w;
  w.shape = shape;
  const LayerSpec& spec = shape.spec;
  if (spec.router != RouterKind::kCallerTopK) {
    w.router_weight = normal_bf16(e * h, 1.0 / std::sqrt(static_cast<double>(h)), derive_seed(seed, 2 * e));
  }
  if (spec.router == RouterKind::kSoftmaxTopK) w.router_bias = normal_bf16(e, 0.1, derive_seed(seed, 2 * e + 1));
  if (spec.router == RouterKind::kSqrtSoftplus) {
    // About the spread of the scores, so that the bias changes some tokens' choice.
    SplitMix64 rng(derive_seed(seed, 2 * e + 1));
    w.router_selection_bias.resize(e);
    for (auto& b : w.router_selection_bias) b = static_cast<float>(0.1 * rng.normal());
  }
  if (spec.expert_biases) {
    w.fc1_bias = normal_bf16(e * rows1, 0.5, derive_seed(seed, 2 * e + 2));
    w.fc2_bias = normal_bf16(e * h, 0.1, derive_seed(seed, 2 * e + 3));
  }
  OwnedExperts::attach(std::move(storage), w);
  return w;
}

std::vector<Bf16> make_activations(int num_tokens, int hidden, uint64_t seed) {
  return normal_bf16(static_cast<size_t>(num_tokens) * hidden, 1.0, seed);
}

uint64_t layer_seed(uint64_t seed, int layer) { return derive_seed(seed, static_cast<uint64_t>(layer)); }

// Distinct from every layer_seed stream: layers stay below 2^32.
uint64_t activation_seed(uint64_t seed, int layer) {
  return derive_seed(seed, (uint64_t{1} << 32) + static_cast<uint64_t>(layer));
}

}  // namespace mxmoe

// One MoE layer's weights in the checkpoint layout (the gpt-oss original and Hugging Face MXFP4
// checkpoints store the expert tensors identically; only the names differ). Which tensors are present
// is the shape's spec's (layer_spec.hpp); an absent one is empty:
//   router_weight [E, H] bf16                        (absent for RouterKind::kCallerTopK)
//   router_bias [E] bf16, added to the logits        (RouterKind::kSoftmaxTopK only: gpt-oss)
//   router_selection_bias [E] fp32, added to the scores to choose experts, never to weigh them
//                                                    (RouterKind::kSqrtSoftplus only: DeepSeek-V4's
//                                                    gate.bias, transformers' e_score_correction_bias)
//   fc1_blocks [E, 2I, H/32, 16] uint8 (E2M1 pairs, low nibble = even element along H)
//   fc1_scales [E, 2I, H/32] uint8 (E8M0); rows gate and up in the spec's GateUpLayout
//   fc2_blocks [E, H, I/32, 16] uint8, fc2_scales [E, H, I/32] uint8
//   fc1_bias [E, 2I] bf16 (FC1's row order), fc2_bias [E, H] bf16   (LayerSpec::expert_biases only)
// An expert-parallel shard holds E of the layer's R experts (expert_parallel_shard): its router is
// the whole layer's, [R, H], so the routing picks among all R, and pairs routed to experts it does
// not hold contribute nothing.
// The large uint8 tensors are views: `storage` keeps alive whatever they point into (host vectors
// for synthetic weights, mapped files for a checkpoint), so a 1.6 GB gpt-oss-120b layer is never
// copied on load.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "mxmoe/bf16.hpp"
#include "mxmoe/moe_shape.hpp"

namespace mxmoe {

struct MoeLayerWeights {
  MoeShape shape;
  std::vector<Bf16> router_weight;
  std::vector<Bf16> router_bias;
  std::vector<float> router_selection_bias;
  std::vector<Bf16> fc1_bias;
  std::vector<Bf16> fc2_bias;
  std::span<const uint8_t> fc1_blocks;
  std::span<const uint8_t> fc1_scales;
  std::span<const uint8_t> fc2_blocks;
  std::span<const uint8_t> fc2_scales;
  std::shared_ptr<const void> storage;
  // Files mapped at `base` (open as `fd`, both kept alive by `storage`) that the expert views may lie
  // in: a load reads a view that lies in one from the file with pread rather than through the
  // mapping, which takes no page faults and leaves none of the file resident in this process. Empty
  // for weights held in memory; a view outside every listed file is read through its address.
  struct MappedFile {
    const uint8_t* base;
    uint64_t bytes;
    int fd;
  };
  std::vector<MappedFile> mapped_files;
  // An expert-parallel shard's local expert e is the layer's expert global_experts[e], of
  // routed_experts. A whole layer: empty and 0.
  std::vector<int32_t> global_experts;
  int routed_experts = 0;

  // The experts the routing picks among: the layer's (R), which a shard's router scores.
  int num_routed_experts() const { return global_experts.empty() ? shape.num_experts : routed_experts; }
  // [num_routed_experts()]: each routed expert's local expert, -1 where this shard does not hold it.
  std::vector<int32_t> local_experts() const;

  // Throws Error naming the first tensor whose size disagrees with `shape`, or a bad expert list.
  void validate() const;
};

// A layer whose experts are dense bf16, as transformers holds them (GptOssExperts, and what it
// writes after Mxfp4Config(dequantize=True)): gate_up [E, H, 2I] (x @ gate_up; gate and linear
// columns interleaved), down [E, I, H]; gate_up_bias [E, 2I], down_bias [E, H]. The experts are
// quantised to MXFP4 by the OCP rules (mx_format.hpp), one scale per 32 values along each output
// row's input dimension. Weights that were MXFP4 before they were dequantised come back with the
// same values exactly (every value of such a block is representable at the block's new scale).
// Throws Error naming a tensor whose size disagrees with `shape`.
MoeLayerWeights quantize_bf16_experts(const MoeShape& shape, std::vector<Bf16> router_weight,
                                      std::vector<Bf16> router_bias, std::span<const Bf16> gate_up,
                                      std::vector<Bf16> gate_up_bias, std::span<const Bf16> down,
                                      std::vector<Bf16> down_bias);

// Rank `rank` of `world` tensor-parallel shards of a layer: it holds the intermediate columns
// [I rank / world, I (rank + 1) / world), i.e. their gate and up rows of FC1 (in the layer's
// GateUpLayout) and their columns of FC2, widened to whole 32-column scale blocks with zeros in the
// columns that are not its own (an FC2 column of zeros adds nothing; so does an FC1 row pair of zeros
// with zero bias, whose activation is 0). FC2's bias, where the layer has one, is rank 0's alone. Every shard routes as the layer does, and the
// shards' outputs sum to the layer's. Throws Error for a rank outside [0, world) or a world with
// fewer than one column per rank.
MoeLayerWeights tensor_parallel_shard(const MoeLayerWeights& weights, int rank, int world);

// The shard of a layer that holds the experts `experts` (ids of the layer's, distinct, ascending or
// not: local expert e is experts[e]), with the layer's router. Throws Error for fewer ids than the
// top-k, an id outside the layer, a repeated id, or weights that are already an expert-parallel shard.
MoeLayerWeights expert_shard(const MoeLayerWeights& weights, std::span<const int32_t> experts);
// Rank `rank` of `world` expert-parallel shards: the experts [R rank / world, R (rank + 1) / world).
// Throws Error for a rank outside [0, world) or a world with fewer than one expert per rank.
MoeLayerWeights expert_parallel_shard(const MoeLayerWeights& weights, int rank, int world);

// Seeded random weights of the given shape and spec: uniform E2M1 codes, E8M0 scales chosen so that
// FC1 outputs have a standard deviation of 3/7 of the activation's limit (about 1% of them reach the
// clamp) and the layer output is O(1) for unit-normal activations; the tensors the spec has (biases,
// router bias or selection bias) and no others. Deterministic in (shape, seed), whatever the thread
// count.
MoeLayerWeights make_synthetic_layer(const MoeShape& shape, uint64_t seed);

// Seeded unit-normal activations [num_tokens, H] in bf16.
std::vector<Bf16> make_activations(int num_tokens, int hidden, uint64_t seed);

// The seeds `mxmoe run --seed S --layer N` uses: synthetic checkpoints written with seed S hold
// make_synthetic_layer(shape, layer_seed(S, N)) as layer N, so a run from the file and a run from
// the embedded shape see the same weights.
uint64_t layer_seed(uint64_t seed, int layer);
uint64_t activation_seed(uint64_t seed, int layer);

}  // namespace mxmoe

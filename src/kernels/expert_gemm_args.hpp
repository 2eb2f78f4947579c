// The arguments of the expert kernels (plain data, shared by the host launcher and the kernels; no
// headers, so that NVRTC compiles it as it is). bf16 tensors are raw 16-bit words.
#pragma once

#include "device/tensor_map_param.hpp"
#include "route/route_buffers.hpp"

namespace mxmoe::kernels {

// FC1's epilogue, the layer's SwiGLU (layer_spec.hpp's SwigluActivation) in the form it computes:
// glu = min(glu, limit), lin = clamp(lin, -limit, limit),
// out = glu / (1 + 2^(minus_alpha_log2e glu)) * (lin + up_offset).
// And, for the block-scaled family, how FC1 quantises its outputs into FC2's MXFP8 rows.
struct SwigluArgs {
  float minus_alpha_log2e;  // -alpha log2(e)
  float limit;
  float up_offset;
  // 1: as FP8 activations (bf16, then one scale per 128 columns, ActivationFormat::kFp8; FC1's
  // tile rows a multiple of 256); 0: MXFP8 (per 32). The other families write bf16 rows.
  int fp8_output;
};

// How FC2 writes its outputs.
struct Fc2Output {
  long long split_stride;  // elements between k-split partials
  // FC2 in one K split, as a per-stage launch: its outputs are final, so it writes them as bf16
  // [pairs, rows], half the bytes the un-permute reads back. 0: fp32 (K-split partials, or the
  // fused layer, which sums its own fp32 rows).
  int output_bf16;
};

// What one stage's epilogue alone reads. A union, so that a stage's arguments are no larger than
// before the SwiGLU's constants were arguments: the fused layer copies them to shared memory, and
// one more word there makes ptxas spill its sm_120a FC1 loop.
union StageEpilogue {
  SwigluArgs swiglu;  // FC1
  Fc2Output fc2;      // FC2
};

struct ExpertGemmArgs {
  const unsigned char* records;  // [E][rows / 16][k_tiles] records
  const float* bias;             // [E][rows], packed row order
  // bf16. FC1: x [T, K], or for a family that reads it in sorted rows (KernelFamily::
  // reads_sorted_input) x gathered into sorted-row order [pairs, K]; FC2: activation [pairs, K] in
  // sorted-row order.
  const void* input;
  const int* sorted_pairs;  // FC1 reads x row sorted_pairs[row] / top_k (x as given); FC2 its own row
  int top_k;
  int rows;     // FC1: 2 I; FC2: H
  int k;        // FC1: H; FC2: I (a multiple of 32)
  int k_tiles;  // ceil(k / 64)
  int staged_rows;  // GEMV-style families: token rows staged per pass, min(kTokens, the batch's tokens)
  int num_experts;
  const int* expert_offsets;  // [E + 1]
  const int* active_experts;  // [E + 1]
  const int* tile_offsets;    // [E + 1] for the kernel's token-tile size (tiled and stream-K families)
  void* output;               // FC1: bf16 [pairs, rows / 2]; FC2: fp32 [k_split][pairs, rows], or bf16
  StageEpilogue epilogue;
  // 1 (FC1 only): a GEMV plan's batch of at most kSmallBatchPairs pairs routes itself, with no
  // routing kernel: every CTA computes its part of the routing in shared memory from the layer's
  // RouteInput (the router logits or the caller's top-k; LayerArgs::source, a kernel argument of its
  // own; expert_gemm.cuh), and CTA (0, 0, 0) writes the whole of it to `route` before it lets FC2
  // launch, for FC2, the un-permute and the caller (MoeRunner::routing). 0: the routing in `route`.
  int routes_itself;
  int num_tokens;
  RouteBuffers route;
  // The stream-K GEMV (expert_gemv_streamk.cuh): per CTA, the partial sums of its first piece
  // (threads x tokens / 2 floats) and a flag that they are written (the routing zeroes it).
  float* stream_partials;
  int* stream_flags;
};

// What a GEMV-style kernel (the gemv and sk families) takes beside its stage's ExpertGemmArgs, as
// a kernel argument of its own (LayerArgs says why not in ExpertGemmArgs).
struct GemvOptions {
  int scales_one_multiply;  // LayerArgs::scales_one_multiply of the stage
  int round_fp8;            // LayerArgs::rounds_staged_fp8 of the stage
};

// The stream-K GEMV runs at most this many CTAs (one per SM); the workspace holds per stage that
// many flags, after the fused layer's schedule, and partial sums of up to kMaxStreamThreads x 16
// tokens / 2 floats each.
constexpr int kMaxStreamCtas = 192;
constexpr int kMaxStreamThreads = 768;
constexpr int kStreamPartialFloats = kMaxStreamThreads * 8;

// A layer's arguments: both stages', the un-permute's inputs, and the fused layer's schedule
// (expert_layer_fused.cuh), whose counters the routing zeroes. A per-stage kernel takes its stage's.
struct LayerArgs {
  ExpertGemmArgs fc1, fc2;    // fc2.output: fp32 [k_split][pairs, H] (the fused layer: no K split)
  const float* topk_weights;  // [pairs]
  const int* pair_rows;       // [pairs]
  int num_tokens;
  void* out;                  // bf16 [T, H]
  int* schedule;              // fused_schedule_words(E, H): ticket, FC1 items done per slot, FC2 items done per group
  // Per stage (FC1, FC2): 1 where every scale code of its records lies in [1, 128]
  // (scale_codes_take_one_multiply: all real weights), so that a kernel may dequantise every
  // record with one multiply without testing its scales (the wgmma family, as a kernel argument);
  // 0 where some does not, or it is not known. (Not in ExpertGemmArgs: the fused layer copies
  // those to shared memory, and one more word there makes ptxas spill its sm_120a FC1 loop.)
  int scales_one_multiply[2];
  // Per stage: 1 where the stage's kernel rounds the token rows it stages to FP8 activations' values
  // (ActivationFormat::kFp8, kernels/fp8_rounding.cuh) in place of a rounding launch before it
  // (KernelFamily::rounds_fp8_when_staging).
  int rounds_staged_fp8[2];
  // Where a batch that routes itself (ExpertGemmArgs::routes_itself) takes its routing from: the
  // router logits and the layer's router, or the caller's top-k, and the map to local experts. The
  // GEMV takes it as a kernel argument of its own. (Not in ExpertGemmArgs: four words more there
  // made ptxas spill 32 more bytes in the fused layer's sm_100a FC1 loop.)
  RouteInput source;
};

// The schedule's length for E experts and H hidden rows (every FC2 column group has >= 16 rows).
constexpr int fused_schedule_words(int num_experts, int hidden) { return 1 + num_experts + (hidden + 15) / 16; }

}  // namespace mxmoe::kernels

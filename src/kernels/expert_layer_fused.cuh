// The fused decode layer: FC1 (with the SwiGLU), FC2 and the weighted un-permute of a small batch
// in one launch after the routing, so that no kernel boundary (drain, flush, ramp-up) separates
// the two weight streams.
//
// The CTAs take work items by ticket from one counter: first every FC1 item (slot-major: active
// expert slot s, column group g, the GEMV's work for one CTA), then every FC2 item (slot-major
// too). An FC2 item needs all of its expert's FC1 items: it issues its first weight batch, then
// waits on its slot's counter. The last FC2 item of a column group (over all slots) un-permutes
// that group's rows for every token. Every FC1 ticket is handed out before any FC2 ticket and an
// FC1 item waits on nothing, so a waiting CTA only ever waits on running ones, however many CTAs
// are resident: no deadlock.
//
// Grid (expert_layer_fused_family.cpp): the CTAs that fit on the device at once (more would only
// queue), at most one per item. Budget: the two GEMVs' (every touched expert's records once, 0.53
// bytes per weight, plus the activations from L2), the un-permute's top_k fp32 rows of H per token
// from L2, and 2-3 atomics per item.
#pragma once

#include "kernels/expert_gemv.cuh"

namespace mxmoe::kernels {

// Dynamic shared memory: the larger of its two stages' GEMV needs (FC1's K is H, FC2's is I), then
// its control block (the item's ticket and stage arguments), then a copy of the routing's active
// list and expert offsets (2 (E + 1) ints).
constexpr int kFusedControlBytes = 256;
constexpr int fused_control_offset(int tokens, int rows, int fc1_k_tiles, int fc2_k_tiles, int columns, int warps_k) {
  const int fc1 = gemv_smem_bytes(tokens, rows, fc1_k_tiles, 1, columns, warps_k);
  const int fc2 = gemv_smem_bytes(tokens, rows, fc2_k_tiles, 1, columns, warps_k);
  return align16(fc1 > fc2 ? fc1 : fc2);
}
constexpr int fused_smem_bytes(int tokens, int rows, int fc1_k_tiles, int fc2_k_tiles, int columns, int warps_k,
                               int num_experts) {
  return fused_control_offset(tokens, rows, fc1_k_tiles, fc2_k_tiles, columns, warps_k) + kFusedControlBytes +
         8 * (num_experts + 1);
}

}  // namespace mxmoe::kernels

#if defined(__CUDACC__)
namespace mxmoe::kernels {

// Counts one item done once every store of the CTA is visible device-wide. Thread 0 gets the
// count before its addition.
__device__ __forceinline__ int count_item_done(int* counter) {
  __threadfence();
  __syncthreads();
  return threadIdx.x == 0 ? atomicAdd(counter, 1) : 0;
}

// Thread 0 waits until `counter` reaches `target`; then the whole CTA may read what the counted
// items wrote (through L2).
__device__ __forceinline__ void wait_for_count(const int* counter, int target) {
  if (threadIdx.x == 0) {
    while (load_acquire(counter) < target) __nanosleep(100);
    __threadfence();
  }
  __syncthreads();
}

// out[t][row] = sum over slots s of w(t, s) * y[row(t, s)][row] for rows [row_begin, row_end) of
// every token, slots in order, as unpermute_kernel sums fp32 rows (the fused layer's FC2 writes
// fp32: its args.fc2.epilogue.fc2.output_bf16 is 0); a slot that goes to no expert adds nothing.
__device__ __forceinline__ void unpermute_rows(const LayerArgs& a, int row_begin, int row_end) {
  const auto* y = static_cast<const float*>(a.fc2.output);
  auto* out = static_cast<unsigned short*>(a.out);
  const int hidden = a.fc2.rows, top_k = a.fc2.top_k, rows = row_end - row_begin;
  for (int i = threadIdx.x; i < a.num_tokens * rows; i += blockDim.x) {
    const int token = i / rows, row = row_begin + i % rows;
    float acc = 0.0f;
    for (int s = 0; s < top_k; ++s) {
      const int pair = token * top_k + s, pair_row = a.pair_rows[pair];
      if (pair_row >= 0) acc += a.topk_weights[pair] * __ldcg(y + static_cast<long long>(pair_row) * hidden + row);
    }
    out[static_cast<long long>(token) * hidden + row] = float_to_bf16_bits(acc);
  }
}

// Where a ticket's item lies: FC1 items [0, fc1_items), then FC2 items up to `items`, each
// slot-major over the stage's column groups.
template <int kColumns>
struct FusedItem {
  bool fc1;
  int slot, group, fc1_groups, items;
  __device__ __forceinline__ FusedItem(const LayerArgs& a, int active, int ticket) {
    fc1_groups = (a.fc1.rows / kRecordRows + kColumns - 1) / kColumns;
    const int fc2_groups = (a.fc2.rows / kRecordRows + kColumns - 1) / kColumns;
    const int fc1_items = active * fc1_groups;
    items = fc1_items + active * fc2_groups;
    fc1 = ticket < fc1_items;
    const int index = fc1 ? ticket : ticket - fc1_items, groups = fc1 ? fc1_groups : fc2_groups;
    slot = index / groups;
    group = index % groups;
  }
};

// What the CTA shares about its current item, past the GEMV's shared memory.
struct FusedControl {
  ExpertGemmArgs stage;  // the item's stage, its routing pointers at the shared copy below
  int ticket, last_of_group;
};
static_assert(sizeof(FusedControl) <= kFusedControlBytes, "the control block outgrew its shared-memory budget");

// One copy of the GEMV serves both stages (`fc1` is a run-time value here): with one inlined
// copy per stage, ptxas keeps values common to both live across either's weight loop and spills.
// The item's stage arguments are copied to shared memory, so no register holds which of the two
// it reads, and so is the routing's active list and offsets (once per CTA), so an item starts
// without a dependent round trip. A CTA's first ticket is its index; it asks for its next one as
// soon as an item's first weight batch is out, so that the atomic's round trip hides behind the
// item. (A CTA so holds a ticket while it works: the one it holds is later than the one it works
// on, so an FC1 ticket is only ever held behind an FC1 item, which waits on nothing.)
template <int kColumns, int kWarpsK, int kTokens, int kUnroll>
__global__ void __launch_bounds__(kColumns * kWarpsK * 32, (kGemvMinBlocks<kColumns, kWarpsK, kUnroll>))
    expert_layer_fused_kernel(LayerArgs args) {
  const int experts = args.fc1.num_experts;
  unsigned char* const control_at = dynamic_smem() + fused_control_offset(kTokens, args.fc1.staged_rows, args.fc1.k_tiles,
                                                                          args.fc2.k_tiles, kColumns, kWarpsK);
  FusedControl& control = *reinterpret_cast<FusedControl*>(control_at);
  int* const active_experts = reinterpret_cast<int*>(control_at + kFusedControlBytes);  // [E + 1]
  int* const expert_offsets = active_experts + experts + 1;                              // [E + 1]
  int* const fc1_done = args.schedule + 1;                 // [E]: FC1 items done per slot
  int* const fc2_done = args.schedule + 1 + experts;       // [FC2 column groups]: FC2 items done per group
  wait_for_prerequisite_grids();  // the routing, which also zeroed the schedule
  allow_dependent_grids();
  for (int e = threadIdx.x; e <= experts; e += blockDim.x) {
    active_experts[e] = args.fc1.active_experts[e];
    expert_offsets[e] = args.fc1.expert_offsets[e];
  }
  if (threadIdx.x == 0) control.ticket = blockIdx.x;
  for (;;) {
    __syncthreads();  // the previous item is done with shared memory; the routing copy and `ticket` are in
    const int active = active_experts[experts];
    const FusedItem<kColumns> item(args, active, control.ticket);
    if (item.items == 0 && blockIdx.x == 0) unpermute_rows(args, 0, args.fc2.rows);  // no pair has an expert here
    if (control.ticket >= item.items) return;
    if (threadIdx.x == 0) {
      control.stage = item.fc1 ? args.fc1 : args.fc2;
      control.stage.active_experts = active_experts;
      control.stage.expert_offsets = expert_offsets;
    }
    __syncthreads();
    int next = 0;
    gemv_columns<kColumns, kWarpsK, kTokens, kUnroll>(
        control.stage, gemv_work(control.stage, item.slot, 0, 1), item.group, 0, item.fc1,
        GemvOptions{.scales_one_multiply = args.scales_one_multiply[item.fc1 ? 0 : 1], .round_fp8 = 0}, [&] {
          if (threadIdx.x == 0) next = gridDim.x + atomicAdd(args.schedule, 1);
          if (!item.fc1) wait_for_count(fc1_done + item.slot, item.fc1_groups);
        });
    const FusedItem<kColumns> done(args, active_experts[experts], control.ticket);
    const int before = count_item_done(done.fc1 ? fc1_done + done.slot : fc2_done + done.group);
    if (threadIdx.x == 0) {
      control.ticket = next;
      control.last_of_group = !done.fc1 && before == active_experts[experts] - 1;
    }
    __syncthreads();
    if (!control.last_of_group) continue;
    __threadfence();
    const int row_begin = done.group * kColumns * kRecordRows;
    unpermute_rows(args, row_begin, min(args.fc2.rows, row_begin + kColumns * kRecordRows));
  }
}

}  // namespace mxmoe::kernels
#endif

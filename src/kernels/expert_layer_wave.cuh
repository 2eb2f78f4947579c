// The one-token layer in one resident wave (decode, T = 1): the routing, FC1 with the SwiGLU, FC2
// and the weighted un-permute in one launch of one CTA per SM, so that both stages' weights are
// one stream, with one ramp-up and one drain, and no kernel boundary.
//
// FC2 cannot start before every FC1 output of its expert exists, but its weights can be read
// before. Each CTA owns FC2 row tiles c, c + CTAs, ... of every slot's expert and bulk-copies those
// columns (a column: one row tile's records over all of K, contiguous) into shared memory as soon
// as it has routed: at most 2 tiles x 4 slots x 24.5 KB for gpt-oss on 132 SMs. Meanwhile its warps
// stream its share of FC1's columns through registers (the GEMV's two-batch pipeline); the shares
// are chosen so that every CTA reads about as many records over both stages (wave_fc1_unit_begin).
// The CTA writes its FC1 outputs, all CTAs meet at a grid barrier, and each stages the activations
// (top_k rows of I, from L2) and multiplies its FC2 columns from shared memory. As it owns its row
// tiles for every slot, it also sums the slots with their weights and writes those output rows.
//
// Within a stage, a CTA's records (units of k_tiles records, one per column) are flattened and
// split evenly over its warps. A warp's share touches at most `segments` units; it leaves one
// partial sum per unit in shared memory, and a unit's sum adds its warps' partials in warp order,
// so the result is bit-identical run after run.
//
// Grid: one CTA per SM, all resident (a cooperative launch). The grid barrier's word belongs to
// the module, and is a multiple of 2^31 again after every barrier.
// Budget: every touched expert's records once (0.53 bytes per weight); per CTA the token's x (2 H
// bytes) and the activations (2 top_k I bytes) from L2, and one atomic.
#pragma once

#include "kernels/expert_gemv.cuh"
#include "kernels/smem_bytes.hpp"

namespace mxmoe::kernels {

__device__ unsigned wave_barrier_arrivals;  // zero when the module is loaded

// Waits until every CTA of the grid (all resident) has arrived; their global writes before it are
// then visible to every CTA. CTA 0 adds 2^31 - (CTAs - 1), the others 1, so that the word's top bit
// flips exactly when the last one arrives, and its low bits are zero again.
__device__ __forceinline__ void grid_barrier() {
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned add = blockIdx.x == 0 ? 0x80000000u - (gridDim.x - 1) : 1u;
    __threadfence();
    const unsigned before = atomicAdd(&wave_barrier_arrivals, add);
    for (;;) {
      unsigned now;
      asm volatile("ld.acquire.gpu.b32 %0, [%1];\n" : "=r"(now) : "l"(&wave_barrier_arrivals) : "memory");
      if ((before ^ now) & 0x80000000u) break;
    }
  }
  __syncthreads();
}

// A warp's share of a stage's `records` (its units' records, flattened): [begin, end).
struct WaveShare {
  int begin, end;
  __device__ __forceinline__ WaveShare(int warp, int warps, int records)
      : begin(warp * records / warps), end((warp + 1) * records / warps) {}
};

// Token 0's column of a warp's accumulator tile (lanes of quad column 0 hold rows g and g + 8) as
// its partial sum of the `segment`th unit its share touches.
__device__ __forceinline__ void store_wave_partial(float* partials, int segments, int segment, const float (&acc)[4]) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane % 4 == 0) {
    float* p = partials + (warp * segments + segment) * kRecordRows;
    p[lane / 4] = acc[0];
    p[lane / 4 + 8] = acc[2];
  }
}

// Row `row` of unit `unit`'s sum: the partials of the warps whose shares touch the unit, in warp
// order. Share w touches records [u k, (u + 1) k) iff it begins below (u + 1) k and ends above u k.
__device__ __forceinline__ float wave_unit_row(const float* partials, int segments, int records, int k_tiles, int unit,
                                               int row) {
  const int warps = blockDim.x / 32;
  const int first = ((unit * k_tiles + 1) * warps + records - 1) / records - 1;
  const int last = min(warps - 1, ((unit + 1) * k_tiles * warps + records - 1) / records - 1);
  float sum = 0.0f;
  for (int w = max(first, 0); w <= last; ++w) {
    const WaveShare s(w, warps, records);
    if (s.begin < s.end) sum += partials[(w * segments + unit - s.begin / k_tiles) * kRecordRows + row];
  }
  return sum;
}

// Stages `rows` rows of `k` bf16 (`source_stride` apart) at `stride` in shared memory, zeros past k
// up to `k_len`; the whole CTA takes part and waits for its own copies (synchronise to read).
__device__ __forceinline__ void stage_wave_rows(unsigned short* staged, int stride, const unsigned short* source,
                                                long long source_stride, int rows, int k, int k_len) {
  const int chunks_per_row = k_len / 8;
  for (int c = threadIdx.x; c < rows * chunks_per_row; c += blockDim.x) {
    const int row = c / chunks_per_row, at = 8 * (c % chunks_per_row);
    const bool valid = at < k;
    cp_async_16(staged + row * stride + at, source + row * source_stride + (valid ? at : 0), valid);
  }
  cp_async_commit();
  cp_async_wait<0>();
}

// Records [first, last) of a global column through the GEMV's two-batch pipeline; `batch_a` holds
// the first batch, issued by the caller.
template <int kUnroll>
__device__ __forceinline__ void multiply_streamed_records(float (&acc)[1][4], const unsigned char* column, int first,
                                                          int last, RecordBatch<kUnroll>& batch_a,
                                                          const unsigned (&b_row)[1]) {
  const int lane = threadIdx.x % 32;
  RecordBatch<kUnroll> batch_b;
  for (int i = first; i < last; i += 2 * kUnroll) {
    batch_b.load(column, i + kUnroll, last, true, lane);
    multiply_batch<8>(acc, batch_a, i, last, b_row);
    batch_a.load(column, i + 2 * kUnroll, last, true, lane);
    multiply_batch<8>(acc, batch_b, i + kUnroll, last, b_row);
  }
}

template <int kWarps, int kUnroll>
__global__ void __launch_bounds__(kWarps * 32, 1) expert_layer_wave_kernel(WaveLayerArgs args) {
  const ExpertGemmArgs& fc1 = args.fc1;
  const ExpertGemmArgs& fc2 = args.fc2;
  const WaveLayout& layout = args.layout;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, top_k = fc1.top_k;
  const int cta = blockIdx.x, ctas = gridDim.x;
  unsigned char* const smem = dynamic_smem();
  int* const slot_experts = reinterpret_cast<int*>(smem + layout.route);
  float* const slot_weights = reinterpret_cast<float*>(slot_experts + kSmallBatchPairs);
  int* const counts = slot_experts + 2 * kSmallBatchPairs;  // the routing writer's [E] and [E + 1]
  unsigned char* const scratch = smem + layout.scratch;
  const unsigned records_barrier = shared_address(smem + layout.barrier);
  const int fc1_row_tiles = fc1.rows / kRecordRows, fc2_row_tiles = fc2.rows / kRecordRows;
  const int k1 = fc1.k_tiles, k2 = fc2.k_tiles, intermediate = fc1.rows / 2;

  wait_for_prerequisite_grids();  // the logits
  allow_dependent_grids();
  if (threadIdx.x == 0) {
    mbarrier_init(records_barrier, 1);
    fence_mbarrier_init();
  }
  if (warp == 0) select_token_experts(fc1.route_logits, 0, fc1.num_experts, top_k, slot_experts, slot_weights);
  __syncthreads();

  // FC2's columns of the CTA's row tiles, column v = (tile cta + (v / top_k) CTAs, slot v % top_k).
  const int owned_tiles = fc2_row_tiles / ctas + (cta < fc2_row_tiles % ctas ? 1 : 0);
  const int fc2_units = owned_tiles * top_k;
  const unsigned fc2_column_bytes = static_cast<unsigned>(k2 * kRecordBytes);
  if (warp == 0 && fc2_units > 0) {
    if (lane == 0) mbarrier_arrive_expect_tx(records_barrier, fc2_units * fc2_column_bytes);
    __syncwarp();
    for (int v = lane; v < fc2_units; v += 32) {
      const long long tile = cta + static_cast<long long>(v / top_k) * ctas;
      bulk_copy_counted(shared_address(smem + v * fc2_column_bytes),
                        fc2.records + (slot_experts[v % top_k] * fc2_row_tiles + tile) * fc2_column_bytes,
                        fc2_column_bytes, records_barrier);
    }
  }
  if (cta == 0 && warp == kWarps - 1) {  // the routing, for the caller
    permute_small_batch(slot_experts, top_k, fc1.num_experts, counts, counts + fc1.num_experts, fc1.route);
    if (lane < top_k) fc1.route.topk_weights[lane] = slot_weights[lane];
  }

  // FC1: units [unit_begin, unit_end), unit u = (slot u / FC1 row tiles, that row tile's column).
  const int unit_begin = wave_fc1_unit_begin(cta, ctas, top_k, fc1_row_tiles, k1, fc2_row_tiles, k2);
  const int unit_end = wave_fc1_unit_begin(cta + 1, ctas, top_k, fc1_row_tiles, k1, fc2_row_tiles, k2);
  const int fc1_records = (unit_end - unit_begin) * k1;
  auto fc1_column = [&](int local_unit) {
    const int unit = unit_begin + local_unit;
    const long long column = static_cast<long long>(slot_experts[unit / fc1_row_tiles]) * fc1_row_tiles +
                             unit % fc1_row_tiles;
    return fc1.records + column * k1 * kRecordBytes;
  };
  auto* const x_row = reinterpret_cast<unsigned short*>(scratch);
  float* const fc1_partials = reinterpret_cast<float*>(scratch + layout.fc1_partials);
  const WaveShare fc1_share(warp, kWarps, fc1_records);
  RecordBatch<kUnroll> batch;
  if (fc1_share.begin < fc1_share.end) {  // the first batch before the staging
    const int first = fc1_share.begin % k1;
    batch.load(fc1_column(fc1_share.begin / k1), first, min(k1, first + fc1_share.end - fc1_share.begin), true, lane);
  }
  stage_wave_rows(x_row, k1 * 64 + 8, static_cast<const unsigned short*>(fc1.input), 0, 1, fc1.k, k1 * 64);
  __syncthreads();
  {
    const unsigned b_row[1] = {shared_address(x_row) + 16 * (lane / 8)};
    for (int at = fc1_share.begin, segment = 0; at < fc1_share.end; ++segment) {
      const int first = at % k1, last = min(k1, first + fc1_share.end - at);
      const unsigned char* column = fc1_column(at / k1);
      if (segment > 0) batch.load(column, first, last, true, lane);
      float acc[1][4] = {};
      multiply_streamed_records<kUnroll>(acc, column, first, last, batch, b_row);
      store_wave_partial(fc1_partials, layout.fc1_segments, segment, acc[0]);
      at += last - first;
    }
  }
  __syncthreads();
  auto* const activation = static_cast<unsigned short*>(fc1.output);  // [top_k][I]
  for (int i = threadIdx.x; i < (unit_end - unit_begin) * 8; i += blockDim.x) {
    const int local_unit = i / 8, g = i % 8, unit = unit_begin + local_unit;
    const int slot = unit / fc1_row_tiles, tile = unit % fc1_row_tiles;
    const float* bias = fc1.bias + static_cast<long long>(slot_experts[slot]) * fc1.rows + 16 * tile;
    const float glu = wave_unit_row(fc1_partials, layout.fc1_segments, fc1_records, k1, local_unit, g) + bias[g];
    const float lin = wave_unit_row(fc1_partials, layout.fc1_segments, fc1_records, k1, local_unit, g + 8) + bias[g + 8];
    activation[static_cast<long long>(slot) * intermediate + 8 * tile + g] = float_to_bf16_bits(gpt_oss_swiglu(glu, lin));
  }
  grid_barrier();  // every FC1 output is written

  // FC2 from shared memory, then the weighted sum over the slots of the CTA's rows.
  const int stride2 = k2 * 64 + 8;
  auto* const activation_rows = reinterpret_cast<unsigned short*>(scratch);
  float* const fc2_partials = reinterpret_cast<float*>(scratch + layout.fc2_partials);
  stage_wave_rows(activation_rows, stride2, activation, intermediate, top_k, fc2.k, k2 * 64);
  if (fc2_units > 0) mbarrier_wait(records_barrier, 0);
  __syncthreads();
  const int fc2_records = fc2_units * k2;
  const WaveShare fc2_share(warp, kWarps, fc2_records);
  for (int at = fc2_share.begin, segment = 0; at < fc2_share.end; ++segment) {
    const int unit = at / k2, first = at % k2, last = min(k2, first + fc2_share.end - at);
    const unsigned char* column = smem + unit * fc2_column_bytes;
    const unsigned b_row[1] = {shared_address(activation_rows + (unit % top_k) * stride2) + 16 * (lane / 8)};
    float acc[1][4] = {};
    for (int r = first; r < last; ++r) {
      const unsigned char* record = column + r * kRecordBytes;
      multiply_record<8>(acc, *reinterpret_cast<const uint4*>(record + 16 * lane),
                         *reinterpret_cast<const unsigned*>(record + kRecordValueBytes + 4 * (lane / 4)), b_row, r);
    }
    store_wave_partial(fc2_partials, layout.fc2_segments, segment, acc[0]);
    at += last - first;
  }
  __syncthreads();
  auto* const out = static_cast<unsigned short*>(args.out);
  for (int i = threadIdx.x; i < owned_tiles * kRecordRows; i += blockDim.x) {
    const int owned = i / kRecordRows, row = 16 * (cta + owned * ctas) + i % kRecordRows;
    float sum = 0.0f;
    for (int slot = 0; slot < top_k; ++slot) {
      const float y = wave_unit_row(fc2_partials, layout.fc2_segments, fc2_records, k2, owned * top_k + slot,
                                    i % kRecordRows) +
                      fc2.bias[static_cast<long long>(slot_experts[slot]) * fc2.rows + row];
      sum += slot_weights[slot] * y;
    }
    out[row] = float_to_bf16_bits(sum);
  }
}

}  // namespace mxmoe::kernels

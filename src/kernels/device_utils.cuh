// Device helpers shared by the kernels: tensor-core MMA, ldmatrix, cp.async, streaming loads and
// bf16 arithmetic, each a thin wrapper over one PTX instruction. No headers: the expert kernels are
// compiled by NVRTC from these sources, where the toolkit's headers may not exist.
#pragma once

namespace mxmoe::kernels {

// d += a * b; m16n8k16, bf16 inputs, fp32 accumulators (row-major A, column-major B). Not volatile:
// a pure function of registers, which the compiler may schedule around the dequantisation.
__device__ __forceinline__ void mma_bf16_m16n8k16(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  asm(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The kernel's dynamic shared memory (one declaration, so every kernel agrees on its type).
__device__ __forceinline__ unsigned char* dynamic_smem() {
  extern __shared__ __align__(16) unsigned char mxmoe_dynamic_smem[];
  return mxmoe_dynamic_smem;
}

__device__ __forceinline__ unsigned shared_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// Four 8x8 bf16 matrices; lanes 8 i .. 8 i + 7 give the row addresses of matrix i, as shared-window
// addresses (shared_address): kept in a 32-bit register, an address costs one add per use, where a
// generic pointer costs a conversion each time.
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], unsigned row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(row));
}

// 16 bytes global -> shared, bypassing L1; with `valid` false the destination is zero-filled and
// nothing is read (the source must still be a valid address).
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(smem)), "l"(gmem),
               "r"(valid ? 16 : 0));
}
// 4 bytes global -> shared (through L1: no 4-byte form bypasses it), zero-filled when not `valid`.
__device__ __forceinline__ void cp_async_4(void* smem, const void* gmem, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(shared_address(smem)), "l"(gmem),
               "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// mbarrier-completed bulk copies (sm_90+): `bytes` (a multiple of 16, 16-byte aligned ends) from
// global memory to this CTA's shared memory, counted against the barrier's transaction bytes.
__device__ __forceinline__ void mbarrier_init(unsigned barrier, unsigned arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(barrier), "r"(arrivals) : "memory");
}
__device__ __forceinline__ void fence_mbarrier_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
// One arrival on the barrier that also expects `bytes` more transaction bytes in this phase.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(unsigned barrier, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(barrier), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbarrier_arrive(unsigned barrier) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(barrier) : "memory");
}
__device__ __forceinline__ void bulk_copy_to_shared(unsigned destination, const void* source, unsigned bytes,
                                                    unsigned barrier) {
  mbarrier_arrive_expect_tx(barrier, bytes);
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   destination),
               "l"(source), "r"(bytes), "r"(barrier)
               : "memory");
}
// Spins until the barrier's phase of parity `parity` has completed.
__device__ __forceinline__ void mbarrier_wait(unsigned barrier, unsigned parity) {
  unsigned done = 0;
  while (!done) {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(barrier), "r"(parity)
        : "memory");
  }
}

// Streamed weights: read once, so keep them out of L1. A warp reads a record's 544 contiguous bytes,
// then the next record's, so L2 is asked to fetch whole 256-byte blocks (docs/performance.md, "The
// heuristic's decisions").
__device__ __forceinline__ uint4 load_stream_16(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}
__device__ __forceinline__ unsigned load_stream_4(const void* p) {
  unsigned v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.u32 %0, [%1];\n" : "=r"(v) : "l"(p));
  return v;
}

// A device-scope flag or counter in global memory: a release store (the writer's earlier stores
// are visible before it) and an acquire load (the reader's later loads see what came before it).
__device__ __forceinline__ void store_release(int* flag, int value) {
  asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(flag), "r"(value) : "memory");
}
__device__ __forceinline__ int load_acquire(const int* flag) {
  int value;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(value) : "l"(flag) : "memory");
  return value;
}

// Programmatic dependent launch (sm_90+). A kernel launched with programmatic stream
// serialization may start while its predecessor runs; `wait` blocks until the predecessor grids
// have completed and their writes are visible (a no-op without such a launch). `allow` lets this
// grid's dependents start launching; every mxmoe kernel calls it right after its own wait, so a
// started kernel implies that everything two launches back has completed.
__device__ __forceinline__ void wait_for_prerequisite_grids() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
__device__ __forceinline__ void allow_dependent_grids() { asm volatile("griddepcontrol.launch_dependents;\n" ::); }

// Thread block clusters (sm_90 and later): every thread of every CTA of the cluster arrives, then
// waits until all have; shared-memory writes before it are visible to the cluster's reads after it.
__device__ __forceinline__ void cluster_barrier() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
__device__ __forceinline__ unsigned cluster_rank() {
  unsigned rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
  return rank;
}
// The float at `p` (this CTA's shared memory) in the shared memory of the cluster's CTA `rank`.
__device__ __forceinline__ float load_cluster_shared(const float* p, unsigned rank) {
  unsigned address;
  float v;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(address) : "r"(shared_address(p)), "r"(rank));
  asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(address) : "memory");
  return v;
}

__device__ __forceinline__ unsigned bf16x2_mul(unsigned a, unsigned b) {
  unsigned d;
  asm("mul.rn.bf16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

// The special-function unit's 2^x and 1/x with subnormal inputs and results flushed to zero: one
// MUFU each, where the IEEE-subnormal forms add a range test and two rescaling multiplies.
__device__ __forceinline__ float exp2_approx_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float reciprocal_approx_ftz(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
// min and max that return NaN when either operand is NaN (one FMNMX each, sm_80+).
__device__ __forceinline__ float min_nan(float a, float b) {
  float y;
  asm("min.NaN.f32 %0, %1, %2;\n" : "=f"(y) : "f"(a), "f"(b));
  return y;
}
__device__ __forceinline__ float max_nan(float a, float b) {
  float y;
  asm("max.NaN.f32 %0, %1, %2;\n" : "=f"(y) : "f"(a), "f"(b));
  return y;
}

__device__ __forceinline__ float bf16_bits_to_float(unsigned short bits) {
  return __uint_as_float(static_cast<unsigned>(bits) << 16);
}

// Round to nearest even; NaN stays NaN.
__device__ __forceinline__ unsigned short float_to_bf16_bits(float v) {
  unsigned short bits;
  asm("cvt.rn.bf16.f32 %0, %1;\n" : "=h"(bits) : "f"(v));
  return bits;
}

}  // namespace mxmoe::kernels

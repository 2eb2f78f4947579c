// Hopper warpgroup MMA (sm_90a only): the wgmma.mma_async wrappers mxmoe uses, A from registers
// (dequantised weights) and B from shared memory (activations) through a matrix descriptor, the
// tensor copies that fill shared memory, and the fences and register-count changes that go with them. No
// toolkit headers, as in device_utils.cuh.
//
// A warpgroup is 4 consecutive warps. m64nNk16 with A in registers: warp w of the group holds
// rows 16 w .. 16 w + 15 of A in the m16n8k16 A fragment layout (format/record_layout.hpp), and its
// accumulators d[4 i .. 4 i + 3] are the m16n8 accumulator tile of columns 8 i .. 8 i + 7
// (expert_gemm.cuh's store_accumulator_groups takes them as they are).
#pragma once

#include "kernels/expert_gemm_args.hpp"

namespace mxmoe::kernels {

// B is N rows x 64 bf16 of K (128 bytes a row) in the 128-byte swizzle, as a tensor copy with
// CU_TENSOR_MAP_SWIZZLE_128B writes it (device/tensor_map.hpp): row n at n * 128, its 16-byte
// chunk c at chunk c ^ (n % 8); 1024-byte aligned, 8-row groups 1024 bytes apart.

// One box of a 2-D tensor map (a __grid_constant__ kernel parameter) at element coordinates
// (column, row) into shared memory at `destination`; the box's full size counts on `barrier`,
// zeros included where it reaches past the tensor.
__device__ __forceinline__ void tensor_copy_2d(unsigned destination, const TensorMap& map, int column, int row,
                                               unsigned barrier) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
          destination),
      "l"(reinterpret_cast<unsigned long long>(&map)), "r"(column), "r"(row), "r"(barrier)
      : "memory");
}

// One box of a 4-D tensor map at element coordinates (x, y, z, w), as tensor_copy_2d.
__device__ __forceinline__ void tensor_copy_4d(unsigned destination, const TensorMap& map, int x, int y, int z, int w,
                                               unsigned barrier) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];\n" ::"r"(destination),
      "l"(reinterpret_cast<unsigned long long>(&map)), "r"(x), "r"(y), "r"(z), "r"(w), "r"(barrier)
      : "memory");
}

// The descriptor of such a tile at shared-window address `address` (K-major, 128-byte swizzle:
// layout type 1 in bits 62-63; stride between 8-row groups 1024 bytes in bits 32-45; the leading
// offset, unused by this layout, 16). K step j (16 bf16, 32 bytes) is the descriptor + 2 j.
__device__ __forceinline__ unsigned long long wgmma_descriptor_sw128(unsigned address) {
  return static_cast<unsigned long long>((address & 0x3FFFFu) >> 4) | (1ull << 16) | ((1024ull >> 4) << 32) |
         (1ull << 62);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
// Keeps the compiler from moving accesses of `value` across the asynchronous MMAs.
__device__ __forceinline__ void fence_operand(float& value) { asm volatile("" : "+f"(value)::"memory"); }

// The warpgroup's registers per thread from here on (a multiple of 8 in [24, 256]).
template <int kRegisters>
__device__ __forceinline__ void registers_decrease() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}
template <int kRegisters>
__device__ __forceinline__ void registers_increase() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}

// d = a * B + (accumulate ? d : 0): m64nNk16, bf16 inputs, fp32 accumulators, B K-major, for every N
// that is a multiple of 8 (kN / 2 accumulators per thread, 4 for each 8 columns). `d` may be longer
// than the accumulators it writes (its first ones), so that one accumulator array serves MMAs of
// several widths.
//
// An asm statement needs a literal operand list, so the lists are spelled by macros 8 columns at a
// time: MXMOE_WGMMA_D<c> lists the first 4 c accumulators as operands %0 .. %(4 c - 1),
// MXMOE_WGMMA_S<c> names them in the instruction, and the width's four A registers, the B
// descriptor and the accumulate flag follow as operands 4 c .. 4 c + 5.
template <int kN>
struct WgmmaBf16;

#define MXMOE_WGMMA_D(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3])
#define MXMOE_WGMMA_D1 MXMOE_WGMMA_D(0)
#define MXMOE_WGMMA_D2 MXMOE_WGMMA_D1, MXMOE_WGMMA_D(4)
#define MXMOE_WGMMA_D3 MXMOE_WGMMA_D2, MXMOE_WGMMA_D(8)
#define MXMOE_WGMMA_D4 MXMOE_WGMMA_D3, MXMOE_WGMMA_D(12)
#define MXMOE_WGMMA_D5 MXMOE_WGMMA_D4, MXMOE_WGMMA_D(16)
#define MXMOE_WGMMA_D6 MXMOE_WGMMA_D5, MXMOE_WGMMA_D(20)
#define MXMOE_WGMMA_D7 MXMOE_WGMMA_D6, MXMOE_WGMMA_D(24)
#define MXMOE_WGMMA_D8 MXMOE_WGMMA_D7, MXMOE_WGMMA_D(28)
#define MXMOE_WGMMA_D9 MXMOE_WGMMA_D8, MXMOE_WGMMA_D(32)
#define MXMOE_WGMMA_D10 MXMOE_WGMMA_D9, MXMOE_WGMMA_D(36)
#define MXMOE_WGMMA_D11 MXMOE_WGMMA_D10, MXMOE_WGMMA_D(40)
#define MXMOE_WGMMA_D12 MXMOE_WGMMA_D11, MXMOE_WGMMA_D(44)
#define MXMOE_WGMMA_D13 MXMOE_WGMMA_D12, MXMOE_WGMMA_D(48)
#define MXMOE_WGMMA_D14 MXMOE_WGMMA_D13, MXMOE_WGMMA_D(52)
#define MXMOE_WGMMA_D15 MXMOE_WGMMA_D14, MXMOE_WGMMA_D(56)
#define MXMOE_WGMMA_D16 MXMOE_WGMMA_D15, MXMOE_WGMMA_D(60)
#define MXMOE_WGMMA_D17 MXMOE_WGMMA_D16, MXMOE_WGMMA_D(64)
#define MXMOE_WGMMA_D18 MXMOE_WGMMA_D17, MXMOE_WGMMA_D(68)
#define MXMOE_WGMMA_D19 MXMOE_WGMMA_D18, MXMOE_WGMMA_D(72)
#define MXMOE_WGMMA_D20 MXMOE_WGMMA_D19, MXMOE_WGMMA_D(76)
#define MXMOE_WGMMA_D21 MXMOE_WGMMA_D20, MXMOE_WGMMA_D(80)
#define MXMOE_WGMMA_D22 MXMOE_WGMMA_D21, MXMOE_WGMMA_D(84)
#define MXMOE_WGMMA_D23 MXMOE_WGMMA_D22, MXMOE_WGMMA_D(88)
#define MXMOE_WGMMA_D24 MXMOE_WGMMA_D23, MXMOE_WGMMA_D(92)
#define MXMOE_WGMMA_D25 MXMOE_WGMMA_D24, MXMOE_WGMMA_D(96)
#define MXMOE_WGMMA_D26 MXMOE_WGMMA_D25, MXMOE_WGMMA_D(100)
#define MXMOE_WGMMA_D27 MXMOE_WGMMA_D26, MXMOE_WGMMA_D(104)
#define MXMOE_WGMMA_D28 MXMOE_WGMMA_D27, MXMOE_WGMMA_D(108)
#define MXMOE_WGMMA_D29 MXMOE_WGMMA_D28, MXMOE_WGMMA_D(112)
#define MXMOE_WGMMA_D30 MXMOE_WGMMA_D29, MXMOE_WGMMA_D(116)
#define MXMOE_WGMMA_D31 MXMOE_WGMMA_D30, MXMOE_WGMMA_D(120)
#define MXMOE_WGMMA_D32 MXMOE_WGMMA_D31, MXMOE_WGMMA_D(124)
#define MXMOE_WGMMA_S1 "%0, %1, %2, %3"
#define MXMOE_WGMMA_S2 MXMOE_WGMMA_S1 ", %4, %5, %6, %7"
#define MXMOE_WGMMA_S3 MXMOE_WGMMA_S2 ", %8, %9, %10, %11"
#define MXMOE_WGMMA_S4 MXMOE_WGMMA_S3 ", %12, %13, %14, %15"
#define MXMOE_WGMMA_S5 MXMOE_WGMMA_S4 ", %16, %17, %18, %19"
#define MXMOE_WGMMA_S6 MXMOE_WGMMA_S5 ", %20, %21, %22, %23"
#define MXMOE_WGMMA_S7 MXMOE_WGMMA_S6 ", %24, %25, %26, %27"
#define MXMOE_WGMMA_S8 MXMOE_WGMMA_S7 ", %28, %29, %30, %31"
#define MXMOE_WGMMA_S9 MXMOE_WGMMA_S8 ", %32, %33, %34, %35"
#define MXMOE_WGMMA_S10 MXMOE_WGMMA_S9 ", %36, %37, %38, %39"
#define MXMOE_WGMMA_S11 MXMOE_WGMMA_S10 ", %40, %41, %42, %43"
#define MXMOE_WGMMA_S12 MXMOE_WGMMA_S11 ", %44, %45, %46, %47"
#define MXMOE_WGMMA_S13 MXMOE_WGMMA_S12 ", %48, %49, %50, %51"
#define MXMOE_WGMMA_S14 MXMOE_WGMMA_S13 ", %52, %53, %54, %55"
#define MXMOE_WGMMA_S15 MXMOE_WGMMA_S14 ", %56, %57, %58, %59"
#define MXMOE_WGMMA_S16 MXMOE_WGMMA_S15 ", %60, %61, %62, %63"
#define MXMOE_WGMMA_S17 MXMOE_WGMMA_S16 ", %64, %65, %66, %67"
#define MXMOE_WGMMA_S18 MXMOE_WGMMA_S17 ", %68, %69, %70, %71"
#define MXMOE_WGMMA_S19 MXMOE_WGMMA_S18 ", %72, %73, %74, %75"
#define MXMOE_WGMMA_S20 MXMOE_WGMMA_S19 ", %76, %77, %78, %79"
#define MXMOE_WGMMA_S21 MXMOE_WGMMA_S20 ", %80, %81, %82, %83"
#define MXMOE_WGMMA_S22 MXMOE_WGMMA_S21 ", %84, %85, %86, %87"
#define MXMOE_WGMMA_S23 MXMOE_WGMMA_S22 ", %88, %89, %90, %91"
#define MXMOE_WGMMA_S24 MXMOE_WGMMA_S23 ", %92, %93, %94, %95"
#define MXMOE_WGMMA_S25 MXMOE_WGMMA_S24 ", %96, %97, %98, %99"
#define MXMOE_WGMMA_S26 MXMOE_WGMMA_S25 ", %100, %101, %102, %103"
#define MXMOE_WGMMA_S27 MXMOE_WGMMA_S26 ", %104, %105, %106, %107"
#define MXMOE_WGMMA_S28 MXMOE_WGMMA_S27 ", %108, %109, %110, %111"
#define MXMOE_WGMMA_S29 MXMOE_WGMMA_S28 ", %112, %113, %114, %115"
#define MXMOE_WGMMA_S30 MXMOE_WGMMA_S29 ", %116, %117, %118, %119"
#define MXMOE_WGMMA_S31 MXMOE_WGMMA_S30 ", %120, %121, %122, %123"
#define MXMOE_WGMMA_S32 MXMOE_WGMMA_S31 ", %124, %125, %126, %127"
#define MXMOE_WGMMA_BF16(n, c, a0, a1, a2, a3, b, accumulate)                                                   \
  template <>                                                                                                        \
  struct WgmmaBf16<n> {                                                                                              \
    template <int kAccumulators>                                                                                     \
    static __device__ __forceinline__ void run(float (&d)[kAccumulators], const unsigned (&a)[4],                    \
                                               unsigned long long b_descriptor, bool accumulate_d) {                 \
      static_assert(kAccumulators >= 4 * (c), "m64n" #n "k16 writes 4 accumulators per thread per 8 columns");      \
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #accumulate ", 0;\n"                                         \
                   "wgmma.mma_async.sync.aligned.m64n" #n "k16.f32.bf16.bf16 {" MXMOE_WGMMA_S##c "}, {%" #a0         \
                   ", %" #a1 ", %" #a2 ", %" #a3 "}, %" #b ", p, 1, 1, 0;\n}\n"                                       \
                   : MXMOE_WGMMA_D##c                                                                                \
                   : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_descriptor),                                 \
                     "r"(static_cast<int>(accumulate_d)));                                                           \
    }                                                                                                                \
  };
MXMOE_WGMMA_BF16(8, 1, 4, 5, 6, 7, 8, 9)
MXMOE_WGMMA_BF16(16, 2, 8, 9, 10, 11, 12, 13)
MXMOE_WGMMA_BF16(24, 3, 12, 13, 14, 15, 16, 17)
MXMOE_WGMMA_BF16(32, 4, 16, 17, 18, 19, 20, 21)
MXMOE_WGMMA_BF16(40, 5, 20, 21, 22, 23, 24, 25)
MXMOE_WGMMA_BF16(48, 6, 24, 25, 26, 27, 28, 29)
MXMOE_WGMMA_BF16(56, 7, 28, 29, 30, 31, 32, 33)
MXMOE_WGMMA_BF16(64, 8, 32, 33, 34, 35, 36, 37)
MXMOE_WGMMA_BF16(72, 9, 36, 37, 38, 39, 40, 41)
MXMOE_WGMMA_BF16(80, 10, 40, 41, 42, 43, 44, 45)
MXMOE_WGMMA_BF16(88, 11, 44, 45, 46, 47, 48, 49)
MXMOE_WGMMA_BF16(96, 12, 48, 49, 50, 51, 52, 53)
MXMOE_WGMMA_BF16(104, 13, 52, 53, 54, 55, 56, 57)
MXMOE_WGMMA_BF16(112, 14, 56, 57, 58, 59, 60, 61)
MXMOE_WGMMA_BF16(120, 15, 60, 61, 62, 63, 64, 65)
MXMOE_WGMMA_BF16(128, 16, 64, 65, 66, 67, 68, 69)
MXMOE_WGMMA_BF16(136, 17, 68, 69, 70, 71, 72, 73)
MXMOE_WGMMA_BF16(144, 18, 72, 73, 74, 75, 76, 77)
MXMOE_WGMMA_BF16(152, 19, 76, 77, 78, 79, 80, 81)
MXMOE_WGMMA_BF16(160, 20, 80, 81, 82, 83, 84, 85)
MXMOE_WGMMA_BF16(168, 21, 84, 85, 86, 87, 88, 89)
MXMOE_WGMMA_BF16(176, 22, 88, 89, 90, 91, 92, 93)
MXMOE_WGMMA_BF16(184, 23, 92, 93, 94, 95, 96, 97)
MXMOE_WGMMA_BF16(192, 24, 96, 97, 98, 99, 100, 101)
MXMOE_WGMMA_BF16(200, 25, 100, 101, 102, 103, 104, 105)
MXMOE_WGMMA_BF16(208, 26, 104, 105, 106, 107, 108, 109)
MXMOE_WGMMA_BF16(216, 27, 108, 109, 110, 111, 112, 113)
MXMOE_WGMMA_BF16(224, 28, 112, 113, 114, 115, 116, 117)
MXMOE_WGMMA_BF16(232, 29, 116, 117, 118, 119, 120, 121)
MXMOE_WGMMA_BF16(240, 30, 120, 121, 122, 123, 124, 125)
MXMOE_WGMMA_BF16(248, 31, 124, 125, 126, 127, 128, 129)
MXMOE_WGMMA_BF16(256, 32, 128, 129, 130, 131, 132, 133)
#undef MXMOE_WGMMA_BF16
#undef MXMOE_WGMMA_D
#undef MXMOE_WGMMA_D1
#undef MXMOE_WGMMA_D2
#undef MXMOE_WGMMA_D3
#undef MXMOE_WGMMA_D4
#undef MXMOE_WGMMA_D5
#undef MXMOE_WGMMA_D6
#undef MXMOE_WGMMA_D7
#undef MXMOE_WGMMA_D8
#undef MXMOE_WGMMA_D9
#undef MXMOE_WGMMA_D10
#undef MXMOE_WGMMA_D11
#undef MXMOE_WGMMA_D12
#undef MXMOE_WGMMA_D13
#undef MXMOE_WGMMA_D14
#undef MXMOE_WGMMA_D15
#undef MXMOE_WGMMA_D16
#undef MXMOE_WGMMA_D17
#undef MXMOE_WGMMA_D18
#undef MXMOE_WGMMA_D19
#undef MXMOE_WGMMA_D20
#undef MXMOE_WGMMA_D21
#undef MXMOE_WGMMA_D22
#undef MXMOE_WGMMA_D23
#undef MXMOE_WGMMA_D24
#undef MXMOE_WGMMA_D25
#undef MXMOE_WGMMA_D26
#undef MXMOE_WGMMA_D27
#undef MXMOE_WGMMA_D28
#undef MXMOE_WGMMA_D29
#undef MXMOE_WGMMA_D30
#undef MXMOE_WGMMA_D31
#undef MXMOE_WGMMA_D32
#undef MXMOE_WGMMA_S1
#undef MXMOE_WGMMA_S2
#undef MXMOE_WGMMA_S3
#undef MXMOE_WGMMA_S4
#undef MXMOE_WGMMA_S5
#undef MXMOE_WGMMA_S6
#undef MXMOE_WGMMA_S7
#undef MXMOE_WGMMA_S8
#undef MXMOE_WGMMA_S9
#undef MXMOE_WGMMA_S10
#undef MXMOE_WGMMA_S11
#undef MXMOE_WGMMA_S12
#undef MXMOE_WGMMA_S13
#undef MXMOE_WGMMA_S14
#undef MXMOE_WGMMA_S15
#undef MXMOE_WGMMA_S16
#undef MXMOE_WGMMA_S17
#undef MXMOE_WGMMA_S18
#undef MXMOE_WGMMA_S19
#undef MXMOE_WGMMA_S20
#undef MXMOE_WGMMA_S21
#undef MXMOE_WGMMA_S22
#undef MXMOE_WGMMA_S23
#undef MXMOE_WGMMA_S24
#undef MXMOE_WGMMA_S25
#undef MXMOE_WGMMA_S26
#undef MXMOE_WGMMA_S27
#undef MXMOE_WGMMA_S28
#undef MXMOE_WGMMA_S29
#undef MXMOE_WGMMA_S30
#undef MXMOE_WGMMA_S31
#undef MXMOE_WGMMA_S32

}  // namespace mxmoe::kernels

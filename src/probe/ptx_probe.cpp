// The probe table: one translation unit per instruction, each with operands of the right kinds and
// counts (registers, shared memory, an initialised mbarrier, a tensor map) so that a target can
// reject it only for the instruction itself.
#include "probe/ptx_probe.hpp"

#include <algorithm>
#include <array>
#include <string>

#include "jit/nvrtc_compiler.hpp"
#include "mxmoe/error.hpp"

namespace mxmoe {
namespace {

// The operands every warp-level block-scaled mma takes after D, A, B and C: the A scales with their
// byte and thread selectors, then the B scales with theirs.
constexpr std::string_view kBlockScaleMma = R"cu(
extern "C" __global__ void probe(float* out, const unsigned* in) {
  const unsigned a0 = in[0], a1 = in[1], a2 = in[2], a3 = in[3], b0 = in[4], b1 = in[5];
  const unsigned scale_a = in[6], scale_b = in[7];
  const unsigned short byte_id = 0, thread_id = 0;
  float d0, d1, d2, d3;
  asm volatile("$INSTRUCTION "
               "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13}, "
               "{%14}, {%15, %16}, {%17}, {%18, %19};\n"
               : "=f"(d0), "=f"(d1), "=f"(d2), "=f"(d3)
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(0.f), "f"(0.f), "f"(0.f), "f"(0.f),
                 "r"(scale_a), "h"(byte_id), "h"(thread_id), "r"(scale_b), "h"(byte_id), "h"(thread_id));
  out[threadIdx.x] = d0 + d1 + d2 + d3;
}
)cu";

// The same for the unscaled m16n8 mmas with four A, two B and four f32 accumulator registers.
constexpr std::string_view kMma = R"cu(
extern "C" __global__ void probe(float* out, const unsigned* in) {
  const unsigned a0 = in[0], a1 = in[1], a2 = in[2], a3 = in[3], b0 = in[4], b1 = in[5];
  float d0, d1, d2, d3;
  asm volatile("$INSTRUCTION "
               "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"
               : "=f"(d0), "=f"(d1), "=f"(d2), "=f"(d3)
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(0.f), "f"(0.f), "f"(0.f), "f"(0.f));
  out[threadIdx.x] = d0 + d1 + d2 + d3;
}
)cu";

// Warp-level loads into four or two registers from a shared tile, each lane naming one 16-byte row.
constexpr std::string_view kLdmatrix4 = R"cu(
extern "C" __global__ void probe(unsigned* out, const uint4* in) {
  __shared__ __align__(128) uint4 tile[64];
  tile[threadIdx.x % 64] = in[threadIdx.x % 64];
  __syncthreads();
  const unsigned row = static_cast<unsigned>(__cvta_generic_to_shared(&tile[threadIdx.x % 32]));
  unsigned r0, r1, r2, r3;
  asm volatile("$INSTRUCTION {%0, %1, %2, %3}, [%4];\n" : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(row));
  out[threadIdx.x] = r0 ^ r1 ^ r2 ^ r3;
}
)cu";

constexpr std::string_view kLdmatrix2 = R"cu(
extern "C" __global__ void probe(unsigned* out, const uint4* in) {
  __shared__ __align__(128) uint4 tile[64];
  tile[threadIdx.x % 64] = in[threadIdx.x % 64];
  __syncthreads();
  const unsigned row = static_cast<unsigned>(__cvta_generic_to_shared(&tile[threadIdx.x % 32]));
  unsigned r0, r1;
  asm volatile("$INSTRUCTION {%0, %1}, [%2];\n" : "=r"(r0), "=r"(r1) : "r"(row));
  out[threadIdx.x] = r0 ^ r1;
}
)cu";

// Launch bounds give ptxas the register count at entry; without them it drops setmaxnreg with a
// performance note (C7508), and the probe would pass without the instruction having been assembled.
constexpr std::string_view kSetmaxnreg = R"cu(
extern "C" __global__ void __launch_bounds__(384, 1) probe(float* out) {
  if (threadIdx.x / 128 == 0) {
    asm volatile("$INSTRUCTION;\n" ::: "memory");
  }
  out[threadIdx.x] = static_cast<float>(threadIdx.x);
}
)cu";

constexpr std::string_view kCpAsyncBulk = R"cu(
extern "C" __global__ void probe(float* out, const float* in) {
  __shared__ __align__(128) float tile[32];
  __shared__ __align__(8) unsigned long long bar;
  const unsigned tile_addr = static_cast<unsigned>(__cvta_generic_to_shared(tile));
  const unsigned bar_addr = static_cast<unsigned>(__cvta_generic_to_shared(&bar));
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(bar_addr));
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], 128;\n" ::"r"(bar_addr) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], 128, [%2];\n"
                 ::"r"(tile_addr), "l"(in), "r"(bar_addr) : "memory");
  }
  asm volatile("{\n"
               ".reg .pred done;\n"
               "wait:\n"
               "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], 0;\n"
               "@!done bra wait;\n"
               "}\n" ::"r"(bar_addr) : "memory");
  out[threadIdx.x] = tile[threadIdx.x % 32];
}
)cu";

// NVRTC has no cuda.h, so the tensor map is an opaque 128-byte parameter of CUtensorMap's alignment.
constexpr std::string_view kCpAsyncBulkTensor = R"cu(
struct alignas(64) TensorMap { unsigned char bytes[128]; };

extern "C" __global__ void probe(const __grid_constant__ TensorMap map, float* out) {
  __shared__ __align__(128) float tile[32 * 32];
  __shared__ __align__(8) unsigned long long bar;
  const unsigned tile_addr = static_cast<unsigned>(__cvta_generic_to_shared(tile));
  const unsigned bar_addr = static_cast<unsigned>(__cvta_generic_to_shared(&bar));
  const unsigned long long map_addr = reinterpret_cast<unsigned long long>(&map);
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(bar_addr));
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const int x = 32 * blockIdx.x, y = 32 * blockIdx.y;
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], 4096;\n" ::"r"(bar_addr) : "memory");
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3}], [%4];\n"
                 ::"r"(tile_addr), "l"(map_addr), "r"(x), "r"(y), "r"(bar_addr) : "memory");
  }
  asm volatile("{\n"
               ".reg .pred done;\n"
               "wait:\n"
               "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], 0;\n"
               "@!done bra wait;\n"
               "}\n" ::"r"(bar_addr) : "memory");
  out[threadIdx.x] = tile[threadIdx.x];
}
)cu";

constexpr std::string_view kCpAsync = R"cu(
extern "C" __global__ void probe(uint4* out, const uint4* in) {
  __shared__ __align__(128) uint4 tile[128];
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(&tile[threadIdx.x % 128]));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(in + threadIdx.x % 128) : "memory");
  asm volatile("cp.async.commit_group;\n" ::: "memory");
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
  __syncthreads();
  out[threadIdx.x] = tile[(threadIdx.x + 1) % 128];
}
)cu";

constexpr std::string_view kStmatrix = R"cu(
extern "C" __global__ void probe(uint4* out, const unsigned* in) {
  __shared__ __align__(128) uint4 tile[32];
  const unsigned row = static_cast<unsigned>(__cvta_generic_to_shared(&tile[threadIdx.x % 32]));
  const unsigned r0 = in[0], r1 = in[1], r2 = in[2], r3 = in[3];
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n"
               ::"r"(row), "r"(r0), "r"(r1), "r"(r2), "r"(r3) : "memory");
  __syncwarp();
  out[threadIdx.x] = tile[(threadIdx.x + 1) % 32];
}
)cu";

// One warpgroup: bf16 A and B from shared memory through descriptors, a 64x16 f32 accumulator in
// eight registers per thread.
constexpr std::string_view kWgmma = R"cu(
extern "C" __global__ void __launch_bounds__(128) probe(float* out) {
  __shared__ __align__(1024) unsigned short a[64 * 16], b[16 * 16];
  const unsigned long long a_addr = static_cast<unsigned>(__cvta_generic_to_shared(a));
  const unsigned long long b_addr = static_cast<unsigned>(__cvta_generic_to_shared(b));
  // Start address and leading/stride byte offsets in 16-byte units, no swizzle.
  const unsigned long long desc_a = ((a_addr & 0x3FFFF) >> 4) | (8ull << 16) | (64ull << 32);
  const unsigned long long desc_b = ((b_addr & 0x3FFFF) >> 4) | (8ull << 16) | (64ull << 32);
  float d[8] = {};
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
  asm volatile("{\n"
               ".reg .pred accumulate;\n"
               "setp.ne.b32 accumulate, %10, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
               "{%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, accumulate, 1, 1, 0, 0;\n"
               "}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
               : "l"(desc_a), "l"(desc_b), "r"(1));
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
  float sum = 0.f;
  for (float v : d) sum += v;
  out[threadIdx.x] = sum;
}
)cu";

constexpr std::string_view kTcgen05Alloc = R"cu(
extern "C" __global__ void probe(unsigned* out) {
  __shared__ unsigned tmem_base;
  if (threadIdx.x / 32 == 0) {
    const unsigned slot = static_cast<unsigned>(__cvta_generic_to_shared(&tmem_base));
    asm volatile("tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [%0], 32;\n" ::"r"(slot) : "memory");
    asm volatile("tcgen05.relinquish_alloc_permit.cta_group::1.sync.aligned;\n" ::: "memory");
  }
  __syncthreads();
  out[threadIdx.x] = tmem_base;
  __syncthreads();
  if (threadIdx.x / 32 == 0) {
    asm volatile("tcgen05.dealloc.cta_group::1.sync.aligned.b32 %0, 32;\n" ::"r"(tmem_base) : "memory");
  }
}
)cu";

// One thread issues an MMA whose A and B are in shared memory and whose accumulator (and scales, for
// the block-scaled kinds) are in tensor memory, then commits it to an mbarrier. The tensor-memory
// addresses come in as parameters so that only the MMA and its commit are tcgen05 instructions.
constexpr std::string_view kTcgen05Mma = R"cu(
extern "C" __global__ void probe(unsigned* out, unsigned tmem_d, unsigned tmem_scale_a, unsigned tmem_scale_b,
                                 unsigned idesc) {
  __shared__ __align__(1024) unsigned char a[128 * 64], b[64 * 64];
  __shared__ __align__(8) unsigned long long bar;
  const unsigned bar_addr = static_cast<unsigned>(__cvta_generic_to_shared(&bar));
  if (threadIdx.x == 0) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(bar_addr));
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned long long a_addr = static_cast<unsigned>(__cvta_generic_to_shared(a));
    const unsigned long long b_addr = static_cast<unsigned>(__cvta_generic_to_shared(b));
    // Start address and leading/stride byte offsets in 16-byte units, no swizzle, descriptor version 1.
    const unsigned long long desc_a = ((a_addr & 0x3FFFF) >> 4) | (8ull << 16) | (64ull << 32) | (1ull << 46);
    const unsigned long long desc_b = ((b_addr & 0x3FFFF) >> 4) | (8ull << 16) | (64ull << 32) | (1ull << 46);
    asm volatile("{\n"
                 ".reg .pred accumulate;\n"
                 "setp.ne.b32 accumulate, %4, 0;\n"
                 "$INSTRUCTION;\n"
                 "}\n" ::"r"(tmem_d), "l"(desc_a), "l"(desc_b), "r"(idesc), "r"(0), "r"(tmem_scale_a),
                 "r"(tmem_scale_b) : "memory");
    asm volatile("tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.b64 [%0];\n"
                 ::"r"(bar_addr) : "memory");
  }
  asm volatile("{\n"
               ".reg .pred done;\n"
               "wait:\n"
               "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], 0;\n"
               "@!done bra wait;\n"
               "}\n" ::"r"(bar_addr) : "memory");
  out[threadIdx.x] = a[threadIdx.x] + b[threadIdx.x];
}
)cu";

// Float pairs to packed FP4 (E2M1) and to power-of-two scales (UE8M0): what quantising activations
// to MX formats on the GPU takes.
constexpr std::string_view kCvtE2m1 = R"cu(
extern "C" __global__ void probe(unsigned* out, const float* in) {
  const float x0 = in[0], x1 = in[1], x2 = in[2], x3 = in[3];
  unsigned packed;
  asm volatile("{\n"
               ".reg .b8 lo, hi;\n"
               "cvt.rn.satfinite.e2m1x2.f32 lo, %2, %1;\n"
               "cvt.rn.satfinite.e2m1x2.f32 hi, %4, %3;\n"
               "mov.b32 %0, {lo, hi, lo, hi};\n"
               "}\n"
               : "=r"(packed) : "f"(x0), "f"(x1), "f"(x2), "f"(x3));
  out[threadIdx.x] = packed;
}
)cu";

constexpr std::string_view kCvtUe8m0 = R"cu(
extern "C" __global__ void probe(unsigned short* out, const float* in) {
  unsigned short scales;
  asm volatile("cvt.rp.satfinite.ue8m0x2.f32 %0, %2, %1;\n" : "=h"(scales) : "f"(in[0]), "f"(in[1]));
  out[threadIdx.x] = scales;
}
)cu";

struct ProbeSpec {
  std::string_view name, group;
  std::string_view shape;        // the translation unit, with $INSTRUCTION where the instruction goes
  std::string_view instruction;  // empty where the shape holds the instruction itself
  std::string_view needs;
};

constexpr std::string_view kLdmatrixNewShapes = "sm_100a/sm_101a/sm_120a";
constexpr std::string_view kWarpBlockScale = "sm_120a/sm_121a";
constexpr std::string_view kSetmaxnregTargets = "sm_90a, sm_10xa/f, sm_12xa/f";
constexpr std::string_view kTcgen05Targets = "sm_100a/f, sm_103a/f, sm_110a/f";

constexpr std::array<ProbeSpec, 24> kSpecs{{
    {"ldmatrix.m8n8.x4.b16", "ldmatrix", kLdmatrix4, "ldmatrix.sync.aligned.m8n8.x4.shared.b16", "sm_75+"},
    {"ldmatrix.m8n8.x4.trans.b16", "ldmatrix", kLdmatrix4, "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16",
     "sm_75+"},
    {"ldmatrix.m16n16.x1.trans.b8", "ldmatrix", kLdmatrix2, "ldmatrix.sync.aligned.m16n16.x1.trans.shared.b8",
     kLdmatrixNewShapes},
    {"ldmatrix.m8n16.x4.b8x16.b4x16_p64", "ldmatrix", kLdmatrix4,
     "ldmatrix.sync.aligned.m8n16.x4.shared.b8x16.b4x16_p64", kLdmatrixNewShapes},
    {"ldmatrix.m16n16.x1.trans.b8x16.b4x16_p64", "ldmatrix", kLdmatrix2,
     "ldmatrix.sync.aligned.m16n16.x1.trans.shared.b8x16.b4x16_p64", kLdmatrixNewShapes},
    {"stmatrix.m8n8.x4.b16", "stmatrix", kStmatrix, "", "sm_90+"},
    {"cp.async.cg.16", "copy", kCpAsync, "", "sm_80+"},
    {"cp.async.bulk", "copy", kCpAsyncBulk, "", "sm_90+"},
    {"cp.async.bulk.tensor.2d", "copy", kCpAsyncBulkTensor, "", "sm_90+"},
    {"mma.m16n8k16.bf16", "mma", kMma, "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32", "sm_80+"},
    {"mma.m16n8k32.e4m3", "mma", kMma, "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32", "sm_89+"},
    {"mma.f8f6f4.m16n8k32.e2m1", "mma", kMma, "mma.sync.aligned.kind::f8f6f4.m16n8k32.row.col.f32.e2m1.e2m1.f32",
     kWarpBlockScale},
    {"mma.mxf8f6f4.1X.e4m3.e2m1.ue8m0", "mma.block_scale", kBlockScaleMma,
     "mma.sync.aligned.kind::mxf8f6f4.block_scale.scale_vec::1X.m16n8k32.row.col.f32.e4m3.e2m1.f32.ue8m0",
     kWarpBlockScale},
    {"mma.mxf4.2X.e2m1.ue8m0", "mma.block_scale", kBlockScaleMma,
     "mma.sync.aligned.kind::mxf4.block_scale.scale_vec::2X.m16n8k64.row.col.f32.e2m1.e2m1.f32.ue8m0",
     kWarpBlockScale},
    {"mma.mxf4nvf4.2X.e2m1.ue8m0", "mma.block_scale", kBlockScaleMma,
     "mma.sync.aligned.kind::mxf4nvf4.block_scale.scale_vec::2X.m16n8k64.row.col.f32.e2m1.e2m1.f32.ue8m0",
     kWarpBlockScale},
    {"mma.mxf4nvf4.4X.e2m1.ue4m3", "mma.block_scale", kBlockScaleMma,
     "mma.sync.aligned.kind::mxf4nvf4.block_scale.scale_vec::4X.m16n8k64.row.col.f32.e2m1.e2m1.f32.ue4m3",
     kWarpBlockScale},
    {"wgmma.m64n16k16.bf16", "wgmma", kWgmma, "", "sm_90a"},
    {"tcgen05.alloc/dealloc", "tcgen05", kTcgen05Alloc, "", kTcgen05Targets},
    {"tcgen05.mma.kind::f16", "tcgen05", kTcgen05Mma,
     "tcgen05.mma.cta_group::1.kind::f16 [%0], %1, %2, %3, accumulate", kTcgen05Targets},
    {"tcgen05.mma.mxf4.block_scale.block32", "tcgen05", kTcgen05Mma,
     "tcgen05.mma.cta_group::1.kind::mxf4.block_scale.block32 [%0], %1, %2, %3, [%5], [%6], accumulate",
     kTcgen05Targets},
    {"cvt.e2m1x2.f32", "cvt", kCvtE2m1, "", "sm_100a/sm_101a/sm_120a"},
    {"cvt.ue8m0x2.f32", "cvt", kCvtUe8m0, "", "sm_100a/sm_101a/sm_120a"},
    {"setmaxnreg.inc", "setmaxnreg", kSetmaxnreg, "setmaxnreg.inc.sync.aligned.u32 232", kSetmaxnregTargets},
    {"setmaxnreg.dec", "setmaxnreg", kSetmaxnreg, "setmaxnreg.dec.sync.aligned.u32 40", kSetmaxnregTargets},
}};

// The sources with their instructions in place, built once; the probes' views point into them, so
// the table is never copied.
class ProbeTable {
 public:
  ProbeTable() {
    constexpr std::string_view kPlaceholder = "$INSTRUCTION";
    for (size_t i = 0; i < kSpecs.size(); ++i) {
      const ProbeSpec& spec = kSpecs[i];
      sources_[i] = spec.shape;
      if (const size_t at = sources_[i].find(kPlaceholder); at != std::string::npos) {
        sources_[i].replace(at, kPlaceholder.size(), spec.instruction);
      }
      probes_[i] = {spec.name, spec.group, sources_[i], spec.needs};
    }
  }
  ProbeTable(const ProbeTable&) = delete;
  ProbeTable& operator=(const ProbeTable&) = delete;
  std::span<const PtxProbe> probes() const { return probes_; }

 private:
  std::array<std::string, kSpecs.size()> sources_;
  std::array<PtxProbe, kSpecs.size()> probes_;
};

// The line that says why: ptxas and NVRTC put "error" in it; the "ptxas ..., line N; error :" prefix
// is dropped because the line number is in a generated file the user never sees.
std::string first_error_line(const std::string& log) {
  std::string_view first_line;
  size_t start = 0;
  while (start < log.size()) {
    size_t end = log.find('\n', start);
    if (end == std::string::npos) end = log.size();
    const std::string_view line(log.data() + start, end - start);
    start = end + 1;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    if (first_line.empty()) first_line = line;
    const size_t error_at = line.find("error");
    if (error_at == std::string_view::npos) continue;
    std::string_view message = line.substr(error_at + 5);
    message.remove_prefix(std::min(message.find_first_not_of(" \t:"), message.size()));
    return std::string(message.empty() ? line : message);
  }
  return first_line.empty() ? "NVRTC failed and wrote no log" : std::string(first_line);
}

}  // namespace

std::span<const PtxProbe> ptx_probes() {
  static const ProbeTable table;
  return table.probes();
}

const PtxProbe& ptx_probe_by_name(std::string_view name) {
  for (const auto& p : ptx_probes()) {
    if (p.name == name) return p;
  }
  throw Error("no PTX probe named '" + std::string(name) + "'");
}

ProbeOutcome run_probe(const PtxProbe& probe, std::string_view target) {
  const CompileResult result = compile_cuda({std::string(probe.source), {}, std::string(target)});
  if (result.ok) return {true, ""};
  return {false, first_error_line(result.log)};
}

}  // namespace mxmoe

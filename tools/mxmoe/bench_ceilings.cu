// Ceiling measurements: a streaming-read kernel, a cuBLAS bf16 GEMM and a cuBLASLt FP8 GEMM, each
// timed with events after a warm-up, median of the repetitions.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <vector>

#include "bench_ceilings.hpp"
#include "tools_internal.hpp"

namespace mxmoe::cli {
namespace {

constexpr size_t kReadBytes = size_t{4} << 30;
constexpr int kMatmulN = 8192;
constexpr int kRepetitions = 10;

// Budget: reads `count` x 16 bytes once, writes nothing (the XOR is kept alive by a branch that is
// never taken on real data). Four independent loads per iteration keep enough bytes in flight.
__global__ void stream_read_kernel(const uint4* data, size_t count, unsigned* sink) {
  unsigned acc = 0;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < count; i += 4 * stride) {
    const uint4 a = __ldcs(data + i), b = __ldcs(data + i + stride), c = __ldcs(data + i + 2 * stride),
                d = __ldcs(data + i + 3 * stride);
    acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
  }
  for (; i < count; i += stride) {
    const uint4 a = __ldcs(data + i);
    acc ^= a.x ^ a.y ^ a.z ^ a.w;
  }
  if (acc == 0x9e3779b9u) *sink = acc;
}

// Random data from a hash of the index: `value(h)` of the element's 32-bit hash h.
template <typename T, typename Value>
__global__ void fill_random(T* data, size_t count, unsigned seed, Value value) {
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    unsigned h = static_cast<unsigned>(i) * 0x9e3779b1u ^ seed;
    h ^= h >> 16;
    h *= 0x85ebca6bu;
    h ^= h >> 13;
    data[i] = value(h);
  }
}
// bf16 uniform in [-1, 1) (never zeros), and E4M3 bytes of magnitude below 2^8 (exponent field at
// most 14: never NaN).
struct RandomBf16 {
  __device__ __nv_bfloat16 operator()(unsigned h) const { return __float2bfloat16(static_cast<float>(h) * 0x1p-31f - 1.0f); }
};
struct RandomE4m3 {
  __device__ unsigned char operator()(unsigned h) const { return static_cast<unsigned char>(h & 0xF7u); }
};

struct Measured {
  double ms = 0;
  ClockReport clocks;  // over the timed repetitions
};

template <typename Launch>
Measured median_ms(ClockMonitor& monitor, Launch launch) {
  cudaEvent_t start, stop;
  cuda_check(cudaEventCreate(&start), "cudaEventCreate");
  cuda_check(cudaEventCreate(&stop), "cudaEventCreate");
  for (int i = 0; i < 3; ++i) launch();
  std::vector<float> ms;
  monitor.start();
  for (int i = 0; i < kRepetitions; ++i) {
    cuda_check(cudaEventRecord(start), "cudaEventRecord");
    launch();
    cuda_check(cudaEventRecord(stop), "cudaEventRecord");
    cuda_check(cudaEventSynchronize(stop), "ceiling measurement");
    float t = 0.0f;
    cuda_check(cudaEventElapsedTime(&t, start, stop), "cudaEventElapsedTime");
    ms.push_back(t);
  }
  const ClockReport clocks = monitor.stop();
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(ms.begin(), ms.end());
  return {ms[ms.size() / 2], clocks};
}

void cublas_check(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) throw Error(std::string(what) + ": cuBLAS status " + std::to_string(status));
}

// The E4M3 GEMM D = A^T B (n x n x n; FP8 wants A transposed), bf16 out, fp32 accumulation without
// cuBLASLt's fast (reduced-precision) accumulation, timed as the bf16 one. Throws on any cuBLASLt
// refusal; the caller records why.
Measured fp8_matmul_ms(ClockMonitor& monitor, int sms) {
  const size_t n = kMatmulN, elements = n * n;
  DeviceBuffer a(elements, "FP8 matmul A"), b(elements, "FP8 matmul B"), out(elements * 2, "FP8 matmul D");
  constexpr size_t kWorkspaceBytes = size_t{32} << 20;
  DeviceBuffer workspace(kWorkspaceBytes, "cuBLASLt workspace");
  fill_random<<<sms * 4, 256>>>(static_cast<unsigned char*>(a.get()), elements, 3u, RandomE4m3{});
  fill_random<<<sms * 4, 256>>>(static_cast<unsigned char*>(b.get()), elements, 4u, RandomE4m3{});
  cuda_check(cudaGetLastError(), "random fill");
  cublasLtHandle_t handle = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a_layout = nullptr, b_layout = nullptr, d_layout = nullptr;
  cublasLtMatmulPreference_t preference = nullptr;
  auto release = [&] {
    if (preference) cublasLtMatmulPreferenceDestroy(preference);
    if (d_layout) cublasLtMatrixLayoutDestroy(d_layout);
    if (b_layout) cublasLtMatrixLayoutDestroy(b_layout);
    if (a_layout) cublasLtMatrixLayoutDestroy(a_layout);
    if (desc) cublasLtMatmulDescDestroy(desc);
    if (handle) cublasLtDestroy(handle);
  };
  try {
    cublas_check(cublasLtCreate(&handle), "cublasLtCreate");
    cublas_check(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
    const cublasOperation_t transpose = CUBLAS_OP_T, keep = CUBLAS_OP_N;
    cublas_check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof(transpose)),
                 "FP8 matmul: transpose A");
    cublas_check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &keep, sizeof(keep)),
                 "FP8 matmul: B as it is");
    cublas_check(cublasLtMatrixLayoutCreate(&a_layout, CUDA_R_8F_E4M3, n, n, n), "FP8 matmul: A layout");
    cublas_check(cublasLtMatrixLayoutCreate(&b_layout, CUDA_R_8F_E4M3, n, n, n), "FP8 matmul: B layout");
    cublas_check(cublasLtMatrixLayoutCreate(&d_layout, CUDA_R_16BF, n, n, n), "FP8 matmul: D layout");
    cublas_check(cublasLtMatmulPreferenceCreate(&preference), "cublasLtMatmulPreferenceCreate");
    cublas_check(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                      &kWorkspaceBytes, sizeof(kWorkspaceBytes)),
                 "FP8 matmul: workspace");
    cublasLtMatmulHeuristicResult_t heuristic{};
    int found = 0;
    cublas_check(cublasLtMatmulAlgoGetHeuristic(handle, desc, a_layout, b_layout, d_layout, d_layout, preference, 1,
                                                &heuristic, &found),
                 "FP8 matmul: cublasLtMatmulAlgoGetHeuristic");
    if (found == 0) throw Error("FP8 matmul: cuBLASLt has no algorithm for it here");
    const float alpha = 1.0f, beta = 0.0f;
    const Measured m = median_ms(monitor, [&] {
      cublas_check(cublasLtMatmul(handle, desc, &alpha, a.get(), a_layout, b.get(), b_layout, &beta, out.get(), d_layout,
                                  out.get(), d_layout, &heuristic.algo, workspace.get(), kWorkspaceBytes, nullptr),
                   "cublasLtMatmul");
    });
    release();
    return m;
  } catch (...) {
    release();
    throw;
  }
}

}  // namespace

Ceilings measure_ceilings() {
  Ceilings c;
  ClockMonitor monitor;  // one NVML session for both ceilings
  int device = 0, sms = 0;
  cuda_check(cudaGetDevice(&device), "cudaGetDevice");
  cuda_check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "multiprocessor count");
  {
    DeviceBuffer buffer(kReadBytes, "read-ceiling buffer"), sink(4, "sink");
    cuda_check(cudaMemset(buffer.get(), 0x5A, kReadBytes), "filling the read-ceiling buffer");
    const auto* data = static_cast<const uint4*>(buffer.get());
    const size_t count = kReadBytes / 16;
    const Measured m = median_ms(monitor, [&] {
      stream_read_kernel<<<sms * 8, 256>>>(data, count, static_cast<unsigned*>(sink.get()));
      cuda_check(cudaGetLastError(), "read-ceiling launch");
    });
    c.read_bytes = kReadBytes;
    c.read_gbs = kReadBytes / (m.ms * 1e-3) / 1e9;
    c.read_clocks = m.clocks;
  }
  {
    const size_t n = kMatmulN, elements = n * n;
    DeviceBuffer a(elements * 2, "matmul A"), b(elements * 2, "matmul B"), out(elements * 2, "matmul C");
    fill_random<<<sms * 4, 256>>>(static_cast<__nv_bfloat16*>(a.get()), elements, 1u, RandomBf16{});
    fill_random<<<sms * 4, 256>>>(static_cast<__nv_bfloat16*>(b.get()), elements, 2u, RandomBf16{});
    cuda_check(cudaGetLastError(), "random fill");
    cublasHandle_t handle;
    cublas_check(cublasCreate(&handle), "cublasCreate");
    const float alpha = 1.0f, beta = 0.0f;
    const Measured m = median_ms(monitor, [&] {
      cublas_check(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, kMatmulN, kMatmulN, kMatmulN, &alpha, a.get(),
                                CUDA_R_16BF, kMatmulN, b.get(), CUDA_R_16BF, kMatmulN, &beta, out.get(), CUDA_R_16BF,
                                kMatmulN, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                   "cublasGemmEx");
    });
    cublasDestroy(handle);
    c.matmul_n = kMatmulN;
    c.bf16_tflops = 2.0 * n * n * n / (m.ms * 1e-3) / 1e12;
    c.bf16_clocks = m.clocks;
  }
  int major = 0, minor = 0;
  cuda_check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), "compute capability");
  cuda_check(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device), "compute capability");
  if (10 * major + minor < 89) {
    c.fp8_missing = "no FP8 tensor cores before sm_89";
  } else {
    try {
      const Measured m = fp8_matmul_ms(monitor, sms);
      c.fp8_tflops = 2.0 * kMatmulN * static_cast<double>(kMatmulN) * kMatmulN / (m.ms * 1e-3) / 1e12;
      c.fp8_clocks = m.clocks;
    } catch (const Error& e) {
      c.fp8_missing = e.what();
    }
  }
  return c;
}

DeviceReport describe_device() {
  DeviceReport r;
  int device = 0;
  cuda_check(cudaGetDevice(&device), "cudaGetDevice");
  cudaDeviceProp prop{};
  cuda_check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  r.name = prop.name;
  r.sm_major = prop.major;
  r.sm_minor = prop.minor;
  r.multiprocessors = prop.multiProcessorCount;
  cudaDriverGetVersion(&r.driver_version);
  int khz = 0;
  if (cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, device) == cudaSuccess) r.max_sm_clock_mhz = khz / 1000;
  // Current clocks through NVML (clock_monitor.hpp), which ships with the driver: 0 without it.
  const CurrentClocks clocks = read_current_clocks();
  r.sm_clock_mhz = clocks.sm_mhz;
  r.memory_clock_mhz = clocks.memory_mhz;
  return r;
}

}  // namespace mxmoe::cli

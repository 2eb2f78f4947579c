// The ceilings `mxmoe bench` reports every figure against, measured in the same run on the same
// device (docs/benchmarking.md): streaming-read bandwidth, the bf16 matmul rate, and the FP8 (E4M3)
// matmul rate where the device has FP8 tensor cores.
#pragma once

#include <string>

#include "clock_monitor.hpp"

namespace mxmoe::cli {

struct Ceilings {
  double read_gbs = 0.0;       // GB/s reading a multi-GB buffer with 16-byte loads
  double bf16_tflops = 0.0;    // cuBLAS bf16 GEMM, fp32 accumulation, random data
  double fp8_tflops = 0.0;     // cuBLASLt E4M3 x E4M3 GEMM to bf16, fp32 accumulation; 0: none (fp8_missing says why)
  std::string fp8_missing;
  size_t read_bytes = 0;
  int matmul_n = 0;
  ClockReport read_clocks, bf16_clocks, fp8_clocks;  // the card's clock and power while each was timed
};

Ceilings measure_ceilings();

// What the benchmark records about the device: name, clocks as read through NVML (0 where NVML
// is not available), driver version.
struct DeviceReport {
  std::string name;
  int sm_major = 0, sm_minor = 0, multiprocessors = 0;
  int driver_version = 0;
  unsigned sm_clock_mhz = 0, memory_clock_mhz = 0, max_sm_clock_mhz = 0;
};
DeviceReport describe_device();

}  // namespace mxmoe::cli

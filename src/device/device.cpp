#include <cuda_runtime.h>

#include "mxmoe/device.hpp"

namespace mxmoe {

std::vector<GpuInfo> list_gpus() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" / "no device" error
    return {};
  }
  std::vector<GpuInfo> gpus;
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    gpus.push_back({i, prop.name, prop.major, prop.minor, prop.multiProcessorCount, prop.totalGlobalMem});
  }
  return gpus;
}

}  // namespace mxmoe

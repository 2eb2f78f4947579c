// The GPUs the CUDA runtime can see. Where there is no driver or no device the list is empty: the
// library builds and runs its CPU paths on machines with the CUDA toolkit but no GPU.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace mxmoe {

struct GpuInfo {
  int index = 0;
  std::string name;
  int sm_major = 0, sm_minor = 0;
  int multiprocessors = 0;
  size_t memory_bytes = 0;
};

std::vector<GpuInfo> list_gpus();  // never throws

}  // namespace mxmoe

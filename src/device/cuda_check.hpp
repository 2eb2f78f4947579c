// CUDA runtime errors as mxmoe::Error, with the operation named; allocation failures say so plainly.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "mxmoe/error.hpp"

namespace mxmoe {

inline void cuda_check(cudaError_t status, const std::string& what) {
  if (status == cudaSuccess) return;
  cudaGetLastError();  // clear a non-sticky error so that later calls do not report it again
  if (status == cudaErrorMemoryAllocation) throw Error(what + ": out of device memory");
  throw Error(what + ": " + cudaGetErrorString(status));
}

// Launches `kernel` with programmatic stream serialization: it may start while the previous kernel
// on the stream drains, and waits in griddepcontrol.wait (every mxmoe kernel does) before reading
// what that kernel wrote. Inside a CUDA graph the dependency becomes a programmatic edge.
inline void launch_programmatic(const void* kernel, dim3 grid, dim3 block, void** args, size_t smem,
                                cudaStream_t stream, const std::string& what) {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = 1;
  cuda_check(cudaLaunchKernelExC(&config, kernel, args), what);
}

// One device allocation, freed on destruction.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(size_t bytes, const std::string& what) : bytes_(bytes) {
    cuda_check(cudaMalloc(&ptr_, bytes), what + " (" + std::to_string(bytes) + " bytes)");
  }
  ~DeviceBuffer() {
    if (ptr_) cudaFree(ptr_);
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace mxmoe

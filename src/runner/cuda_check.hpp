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

// CUDA runtime errors as mxmoe::Error, with the operation named; allocation failures say so plainly.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <utility>

#include "mxmoe/device_layer.hpp"
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
// what that kernel wrote. Inside a CUDA graph the dependency becomes a programmatic edge. CTAs are
// grouped in clusters of `cluster` where that is more than one CTA.
inline void launch_programmatic(const void* kernel, dim3 grid, dim3 block, void** args, size_t smem,
                                cudaStream_t stream, const std::string& what, dim3 cluster = dim3(1, 1, 1)) {
  cudaLaunchAttribute attributes[2] = {};
  attributes[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attributes[0].val.programmaticStreamSerializationAllowed = 1;
  attributes[1].id = cudaLaunchAttributeClusterDimension;
  attributes[1].val.clusterDim = {cluster.x, cluster.y, cluster.z};
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = attributes;
  config.numAttrs = cluster.x * cluster.y * cluster.z > 1 ? 2 : 1;
  cuda_check(cudaLaunchKernelExC(&config, kernel, args), what);
}

// One device allocation, freed on destruction: from the caller's allocator where it has callbacks,
// else from cudaMalloc.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  // Throws Error naming `what` and the bytes when the allocation fails (the allocator returns null
  // or memory that is not 256-byte aligned, cudaMalloc runs out of memory) or the allocator has one
  // callback without the other.
  DeviceBuffer(size_t bytes, const std::string& what, const DeviceAllocator& allocator = {})
      : bytes_(bytes), allocator_(allocator) {
    const std::string described = what + " (" + std::to_string(bytes) + " bytes)";
    if (!allocator_.allocate != !allocator_.release) {
      throw Error(described + ": the allocator has " + (allocator_.allocate ? "no release" : "no allocate") +
                  " callback");
    }
    if (!allocator_.allocate) {
      cuda_check(cudaMalloc(&ptr_, bytes), described);
    } else if (bytes > 0) {
      ptr_ = allocator_.allocate(bytes, allocator_.context);
      if (!ptr_) throw Error(described + ": the allocator returned no memory");
      if (reinterpret_cast<uintptr_t>(ptr_) % 256 != 0) {
        allocator_.release(ptr_, bytes_, allocator_.context);
        ptr_ = nullptr;
        throw Error(described + ": the allocator returned memory that is not 256-byte aligned");
      }
    }
  }
  ~DeviceBuffer() {
    if (!ptr_) return;
    if (allocator_.release) {
      allocator_.release(ptr_, bytes_, allocator_.context);
    } else {
      cudaFree(ptr_);
    }
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_), allocator_(o.allocator_) { o.ptr_ = nullptr; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
    std::swap(allocator_, o.allocator_);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  DeviceAllocator allocator_;
};

}  // namespace mxmoe

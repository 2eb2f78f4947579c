// Helpers for the GPU tests: skipping without a GPU, device arrays, and synthetic layers shared by
// the tests of one process (a gpt-oss-120b layer is 1.6 GB to generate and pack).
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "mxmoe/device.hpp"
#include "mxmoe/reference.hpp"
#include "mxmoe/runner.hpp"

#define MXMOE_REQUIRE_GPU()                                                        \
  do {                                                                             \
    if (mxmoe::list_gpus().empty()) GTEST_SKIP() << "no CUDA GPU visible: skipped"; \
  } while (0)

#define MXMOE_CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << cudaGetErrorString(cudaGetLastError())

namespace mxmoe::test {

template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(size_t count) : count_(count) {
    if (cudaMalloc(&ptr_, std::max<size_t>(count, 1) * sizeof(T)) != cudaSuccess) throw std::bad_alloc();
  }
  explicit DeviceArray(const std::vector<T>& host) : DeviceArray(host.size()) {
    cudaMemcpy(ptr_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
  }
  ~DeviceArray() { cudaFree(ptr_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  T* get() const { return static_cast<T*>(ptr_); }
  size_t size() const { return count_; }
  std::vector<T> to_host() const {
    std::vector<T> host(count_);
    cudaMemcpy(host.data(), ptr_, count_ * sizeof(T), cudaMemcpyDeviceToHost);
    return host;
  }
  void fill_bytes(int value) { cudaMemset(ptr_, value, count_ * sizeof(T)); }

 private:
  void* ptr_ = nullptr;
  size_t count_;
};

struct TestLayer {
  MoeLayerWeights weights;
  std::unique_ptr<MoeRunner> runner;
};

// One synthetic layer per (shape, seed), built on first use and kept for the process.
inline const TestLayer& test_layer(const MoeShape& shape, uint64_t seed) {
  static std::map<std::string, std::unique_ptr<TestLayer>> cache;
  const std::string key = shape.describe() + "/" + std::to_string(seed);
  auto& slot = cache[key];
  if (!slot) {
    slot = std::make_unique<TestLayer>();
    slot->weights = make_synthetic_layer(shape, seed);
    slot->runner = std::make_unique<MoeRunner>(slot->weights);
  }
  return *slot;
}

}  // namespace mxmoe::test

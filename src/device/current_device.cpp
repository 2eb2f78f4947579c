#include "device/current_device.hpp"

#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <tuple>

#include "device/cuda_check.hpp"

namespace mxmoe {

DeviceArch current_device_arch() {
  int device = 0, major = 0, minor = 0, sms = 0;
  cuda_check(cudaGetDevice(&device), "cudaGetDevice");
  cuda_check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), "compute capability");
  cuda_check(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device), "compute capability");
  cuda_check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "multiprocessor count");
  return {&arch_for_device(major, minor), sms};
}

long long resident_ctas(const void* kernel, int threads, int smem_bytes) {
  static std::mutex mutex;
  static std::map<std::tuple<int, const void*, int>, long long> known;
  int device = 0;
  cuda_check(cudaGetDevice(&device), "cudaGetDevice");
  std::lock_guard lock(mutex);
  const auto key = std::make_tuple(device, kernel, smem_bytes);
  if (const auto it = known.find(key); it != known.end()) return it->second;
  int sms = 0, per_sm = 0;
  cuda_check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "multiprocessor count");
  cuda_check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, static_cast<size_t>(smem_bytes)),
             "kernel occupancy");
  return known.emplace(key, static_cast<long long>(per_sm) * sms).first->second;
}

}  // namespace mxmoe

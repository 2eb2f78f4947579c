#include "runner/expert_modules.hpp"

#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <tuple>

#include "jit/kernel_cache.hpp"
#include "kernels/smem_bytes.hpp"
#include "runner/cuda_check.hpp"

namespace mxmoe {

DeviceArch current_device_arch() {
  int device = 0, major = 0, minor = 0, sms = 0;
  cuda_check(cudaGetDevice(&device), "cudaGetDevice");
  cuda_check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), "compute capability");
  cuda_check(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device), "compute capability");
  cuda_check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "multiprocessor count");
  return {&arch_for_device(major, minor), sms};
}

const ExpertKernels& expert_kernels(const Tactic& tactic) {
  static std::mutex mutex;
  static std::map<std::tuple<int, std::string>, ExpertKernels> loaded;
  int device = 0;
  cuda_check(cudaGetDevice(&device), "cudaGetDevice");
  const Tactic binary_tactic = tactic.binary();
  std::lock_guard lock(mutex);
  const auto key = std::make_tuple(device, binary_tactic.name());
  if (const auto it = loaded.find(key); it != loaded.end()) return it->second;

  const DeviceArch d = current_device_arch();
  const KernelBinary binary = default_kernel_cache().get(binary_tactic, *d.arch).binary;
  cudaLibrary_t library;
  cuda_check(cudaLibraryLoadData(&library, binary.cubin->data(), nullptr, nullptr, 0, nullptr, nullptr, 0),
             "loading " + binary.tactic + " for " + binary.arch);
  cudaKernel_t kernels[2];
  for (int i = 0; i < 2; ++i) {
    cuda_check(cudaLibraryGetKernel(&kernels[i], library, binary.kernel_names[i].c_str()),
               "finding " + binary.kernel_names[i]);
    // The GEMVs' shared memory grows with K (known only at launch): allow the device's whole
    // opt-in amount; a tile kernel needs exactly its stages.
    const int smem = binary_tactic.family != KernelFamily::kMmaTile
                         ? d.arch->smem_per_block
                         : kernels::mma_tile_smem_bytes(binary_tactic.tile_rows, binary_tactic.tile_tokens,
                                                        binary_tactic.stages);
    cuda_check(cudaFuncSetAttribute(reinterpret_cast<const void*>(kernels[i]), cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    smem),
               "shared memory limit of " + binary.tactic);
  }
  return loaded.emplace(key, ExpertKernels{reinterpret_cast<const void*>(kernels[0]),
                                           reinterpret_cast<const void*>(kernels[1])})
      .first->second;
}

}  // namespace mxmoe

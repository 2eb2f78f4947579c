#include "runner/expert_modules.hpp"

#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <tuple>

#include "device/cuda_check.hpp"
#include "device/current_device.hpp"
#include "jit/kernel_cache.hpp"
#include "kernels/family_registry.hpp"

namespace mxmoe {

const ExpertKernels& expert_kernels(const Tactic& tactic) {
  static std::mutex mutex;
  // Keyed by the kernels' name expression too: a family may instantiate a tactic with another
  // variant of its kernels (the block-scaled family's fault build, block_scaled_family.hpp).
  static std::map<std::tuple<int, std::string, std::string>, ExpertKernels> loaded;
  int device = 0;
  cuda_check(cudaGetDevice(&device), "cudaGetDevice");
  const Tactic binary_tactic = tactic.binary();
  const std::string variant = binary_tactic.family->instantiation(binary_tactic).fc2;
  std::lock_guard lock(mutex);
  const auto key = std::make_tuple(device, binary_tactic.name(), variant);
  if (const auto it = loaded.find(key); it != loaded.end()) return it->second;

  const DeviceArch d = current_device_arch();
  const KernelBinary binary = default_kernel_cache().get(binary_tactic, *d.arch).binary;
  cudaLibrary_t library;
  cuda_check(cudaLibraryLoadData(&library, binary.cubin->data(), nullptr, nullptr, 0, nullptr, nullptr, 0),
             "loading " + binary.tactic + " for " + binary.arch);
  cudaKernel_t kernels[2];
  const int smem_limit = binary_tactic.family->smem_limit(binary_tactic, *d.arch);
  for (int i = 0; i < 2; ++i) {
    cuda_check(cudaLibraryGetKernel(&kernels[i], library, binary.kernel_names[i].c_str()),
               "finding " + binary.kernel_names[i]);
    cuda_check(cudaFuncSetAttribute(reinterpret_cast<const void*>(kernels[i]),
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, smem_limit),
               "shared memory limit of " + binary.tactic);
  }
  return loaded
      .emplace(key, ExpertKernels{reinterpret_cast<const void*>(kernels[0]), reinterpret_cast<const void*>(kernels[1])})
      .first->second;
}

}  // namespace mxmoe
